"""Paper Figure 1 layout for two rows on one batch (AR-Lopti, arXiv 2505.12929), sampled from the first seed's start
policy as ``diagnose buckets`` does: :func:`measure` (kept as ``figure1_buckets.json``) and :func:`figure`.
docs/ablate.md, "Figure 1 panels"."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from tokenbalance.ablate.curves import row_colour
from tokenbalance.ablate.grid import GridMethod
from tokenbalance.diagnostics.edges import DEFAULT_EDGES, interval_label
from tokenbalance.diagnostics.plots import letter, new_figure
from tokenbalance.diagnostics.plotted import save_png
from tokenbalance.diagnostics.sinks import dump_json, restore_non_finite

SGD_LR = 1e-3


def figure_prompts(requested: int, available: int) -> tuple[int, str | None]:
    """The prompts the figure's batch takes: ``requested`` (``--figure-prompts``), at most the ``available`` training
    prompts, with a note saying so when it takes fewer."""
    if requested <= available:
        return requested, None
    return available, (
        f"figure 1: {available} prompt(s), all the training data holds (data.rl_count or data.train_file), "
        f"fewer than --figure-prompts {requested}"
    )


def measure(config_file: Path, rows: list[GridMethod], *, prompts: int, edges=DEFAULT_EDGES, log=print) -> dict:
    """The four panels' numbers for ``rows`` on one batch sampled with the cell config ``config_file`` (of ``prompts``
    prompts, or all the training prompts when there are fewer: :func:`figure_prompts`)."""
    import torch

    from tokenbalance.algorithms.presets import get_method
    from tokenbalance.analysis.experiments import bucket_experiment
    from tokenbalance.analysis.probe import method_passes, probe_batch
    from tokenbalance.config import load_config, replace_sections
    from tokenbalance.diagnostics.buckets import bucket_masks, bucket_token_stats
    from tokenbalance.diagnostics.grad_norms import bucket_gradient_norms
    from tokenbalance.diagnostics.step import update_advantages
    from tokenbalance.run.setup import prepare

    methods = {row.key: get_method(row.preset) for row in rows}
    config = replace_sections(load_config(config_file), train={"method": rows[0].preset}, output={"progress": False})
    setup = prepare(config)
    prompts, note = figure_prompts(prompts, len(setup.train_examples))
    if note:
        log(note)
    with_hidden = any(m.needs_hidden_states for m in methods.values())
    batch = probe_batch(config, prompts=prompts, with_hidden=with_hidden, setup=setup)
    mask_BT = batch.mask_BT.bool()
    old_logp_BT = batch.old.logp_BT
    buckets = bucket_masks(old_logp_BT, mask_BT, edges)
    access = batch.access()  # the run's forwards: model.autocast, optim.logit_chunk_tokens
    index = torch.arange(mask_BT.shape[0], device=mask_BT.device)
    out: dict = {
        "edges": list(edges),
        "intervals": [interval_label(edges, b) for b in range(len(edges) - 1)],
        "responses": int(mask_BT.shape[0]),
        "tokens": int(mask_BT.sum()),
        "accuracy": float(batch.correct_B.float().mean()),
        "sgd_lr": SGD_LR,
        "rows": {},
    }
    for row in rows:
        method = methods[row.key]
        passes, _ = method_passes(batch, method)
        adv_BT, policy_BT = update_advantages(passes, mask_BT)
        stats = bucket_token_stats(old_logp_BT, adv_BT, mask_BT, edges)
        masks = {"all": policy_BT} | {f"bucket{b}": m & policy_BT for b, m in enumerate(buckets)}
        batch.model.train()
        norms, _ = bucket_gradient_norms(
            method=method,
            named_params=[(n, p) for n, p in batch.model.named_parameters() if p.requires_grad],
            logp_fn=lambda rows_: access.logp(index[rows_]),
            old_logp_BT=old_logp_BT,
            advantages_BT=adv_BT,
            mask_BT=mask_BT,
            masks=masks,
            micro_batch_rows=batch.micro_batch_rows,
            per_layer=False,
        )
        update = bucket_experiment(batch, edges=edges, lr=SGD_LR, method=method)["all"]
        count = len(edges) - 1
        out["rows"][row.key] = {
            "label": row.label,
            "preset": row.preset,
            "token_frac": [stats[f"diag/bucket{b}/token_frac"] for b in range(count)],
            "adv_pos": [stats[f"diag/bucket{b}/pos/adv_mean"] for b in range(count)],
            "adv_neg": [stats[f"diag/bucket{b}/neg/adv_mean"] for b in range(count)],
            "grad_norm": [norms[f"diag/grad_norm/bucket{b}"] for b in range(count)],
            "grad_norm_all": norms["diag/grad_norm/all"],
            "dp_mean": [b["dp_mean"] for b in update["buckets"]],
            "pos_up_frac": [b["pos_up_frac"] for b in update["buckets"]],
            "update_grad_norm": update["grad_norm"],
        }
    return out


def write_json(path: Path, data: dict) -> None:
    path.write_text(dump_json(data, indent=1) + "\n")


def read_json(path: Path) -> dict:
    return restore_non_finite(json.loads(path.read_text()))


def _finite(values: list[float]) -> list[float]:
    return [v if v == v else 0.0 for v in values]  # NaN (an empty bucket) drawn as no bar


def _mark_empty(ax, counts: list[int], groups: int) -> None:
    """Write "empty" under the x position of every bucket without tokens (its bars would read as 0)."""
    for g, count in enumerate(counts[:groups]):
        if count == 0:
            ax.text(g, 0.02, "empty", transform=ax.get_xaxis_transform(), ha="center", fontsize=6, color="0.35")


def figure(data: dict) -> Figure:
    """The paper's Figure 1 layout, 2 x 3 lettered panels: (a) token share per bucket, (b) mean advantage of positive
    / negative tokens, (c) mean Δp after one SGD step, (d) share of A > 0 tokens that rose (Figure 3), (e) each
    bucket's gradient norm; legend and batch in the sixth. Empty buckets are marked."""
    labels = data["intervals"]
    rows = list(data["rows"].values())
    hues = [row_colour(key, i) for i, key in enumerate(data["rows"])]  # each row's colour in the grid's figures
    count = len(labels)
    tokens = int(data["tokens"])
    counts = [round(f * tokens) if f == f else 0 for f in rows[0]["token_frac"]]
    width = 0.8 / max(len(rows), 1)
    fig = new_figure(2, 3, 2.45, 2.0)
    axes = fig.subplots(2, 3).ravel()

    def bars(ax, key: str, groups: list[str], extra: str | None = None, **style) -> None:
        for i, row in enumerate(rows):
            values = list(row[key]) + ([row[extra]] if extra else [])
            xs = [g + (i - (len(rows) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, _finite(values), width, color=hues[i], label=row["label"], **style)
        ax.set_xticks(range(len(groups)), groups, rotation=25, fontsize=6)
        _mark_empty(ax, counts, count)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3, axis="y")

    shares = [f if f == f and f > 0 else float("nan") for f in rows[0]["token_frac"]]
    bars_a = axes[0].bar(range(count), [s if s == s else 0.0 for s in shares], 0.6, color="0.45")
    axes[0].set_yscale("log")
    axes[0].set_ylim(min((s for s in shares if s == s), default=1e-3) / 3, 2.0)
    for bar, n in zip(bars_a, counts):
        if n:
            axes[0].text(bar.get_x() + bar.get_width() / 2, bar.get_height() * 1.15, f"{n}", ha="center", fontsize=6)
    axes[0].set_xticks(range(count), labels, rotation=25, fontsize=6)
    _mark_empty(axes[0], counts, count)
    axes[0].tick_params(labelsize=6)
    axes[0].grid(alpha=0.3, axis="y")
    letter(axes[0], "a", "token share, log scale (counts on bars)")
    bars(axes[1], "adv_pos", labels)
    for i, row in enumerate(rows):
        xs = [g + (i - (len(rows) - 1) / 2) * width for g in range(count)]
        axes[1].bar(xs, _finite(row["adv_neg"]), width, color=hues[i], alpha=0.5, hatch="//")
    axes[1].axhline(0.0, color="black", linewidth=0.6)
    letter(axes[1], "b", "mean advantage (hatched: A < 0)")
    bars(axes[2], "dp_mean", labels)
    axes[2].axhline(0.0, color="black", linewidth=0.6)
    axes[2].ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    axes[2].yaxis.get_offset_text().set_fontsize(6)
    letter(axes[2], "c", "mean Δp after one SGD step")
    bars(axes[3], "pos_up_frac", labels)
    axes[3].set_ylim(0.0, 1.05)
    letter(axes[3], "d", "share of A > 0 tokens whose p rose")
    bars(axes[4], "grad_norm", [*labels, "all"], extra="grad_norm_all")
    axes[4].set_ylabel("L2 norm", fontsize=7)
    letter(axes[4], "e", "gradient norm, bucket's tokens only")
    for ax in axes[:5]:
        ax.set_xlabel("old-policy probability", fontsize=6)
    handles, names = axes[1].get_legend_handles_labels()
    axes[5].axis("off")
    axes[5].legend(handles, names, loc="center", fontsize=7, frameon=False, title="row", title_fontsize=7)
    axes[5].text(
        0.5,
        0.05,
        f"one batch: {data['responses']} responses, {tokens} tokens,\naccuracy {data['accuracy']:.2f} "
        f"(start policy of the first seed);\n(c)-(e): one SGD step, lr {data['sgd_lr']:g}, from the same parameters",
        ha="center",
        fontsize=6,
        transform=axes[5].transAxes,
    )
    return fig


def plot(data: dict, path: Path) -> Path:
    """Write :func:`figure` to ``path`` (PNG, with its fingerprint)."""
    return save_png(figure(data), path)
