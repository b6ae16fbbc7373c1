"""A grid's curves over training as small multiples: one column per row of the grid drawn against
its baseline row (grey), one line of panels per metric (training reward, held-out greedy accuracy,
response length, policy entropy, the share of tokens in the lowest probability bucket and its share
of the squared logit-gradient norm, ``diag/bucket0/grad_share``). Each line
is the mean over the row's complete seeds; the band is the range over those seeds. Training
metrics are smoothed per seed with an EMA (the paper's Figure 4 uses 0.95 over hundreds of steps; a
grid of tens of steps uses 0.8); held-out accuracy is drawn as evaluated (every
``train.eval_every`` steps, markers at the evaluations). Every panel of a line shares its y-range.
A metric a cell never logged is marked "no data" in its panel.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.ablate.grid import GridMethod, GridPlan
from tokenbalance.ablate.results import CellResult
from tokenbalance.diagnostics.plots import colour, new_figure

EMA = 0.8
BASELINE_COLOUR = "0.45"


@dataclass(frozen=True)
class Metric:
    key: str
    kind: str  # "train" or "eval"
    title: str
    ylabel: str


METRICS = (
    Metric("reward/mean", "train", f"training reward (EMA {EMA})", "reward"),
    Metric("eval/greedy/acc", "eval", "held-out accuracy, greedy", "accuracy"),
    Metric("response/len_mean", "train", f"response length (EMA {EMA})", "tokens"),
    Metric("loss/entropy", "train", f"policy entropy (EMA {EMA})", "nats / token"),
    Metric("diag/bucket0/token_frac", "train", f"lowest-bucket token share (EMA {EMA})", "share of tokens"),
    Metric("diag/bucket0/grad_share", "train", f"lowest-bucket gradient share (EMA {EMA})", "share of |dL/dz|^2"),
)


def ema(values: list[float], weight: float = EMA) -> list[float]:
    out, current = [], None
    for value in values:
        current = value if current is None else weight * current + (1 - weight) * value
        out.append(current)
    return out


@dataclass(frozen=True)
class Band:
    """A row's metric over its seeds at the steps every seed logged: mean, min and max."""

    steps: list[int]
    mean: list[float]
    low: list[float]
    high: list[float]
    seeds: int


def seed_band(results: list[CellResult], row: str, metric: Metric) -> Band | None:
    """The band of ``row``'s complete cells (None when none logged the metric)."""
    series = []
    for r in results:
        if not (r.complete and r.cell.method.key == row):
            continue
        steps, values = r.series(metric.key) if metric.kind == "train" else r.eval_series(metric.key)
        if steps:
            series.append(dict(zip(steps, ema(values) if metric.kind == "train" else values)))
    if not series:
        return None
    steps = sorted(set.intersection(*(set(s) for s in series)))
    columns = [[s[step] for s in series] for step in steps]
    return Band(
        steps, [sum(c) / len(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns], len(series)
    )


def _draw(ax, band: Band | None, colour_: str, marker: str | None) -> None:
    if band is None:
        return
    ax.fill_between(band.steps, band.low, band.high, color=colour_, alpha=0.18, linewidth=0)
    ax.plot(band.steps, band.mean, color=colour_, linewidth=1.4, marker=marker, markersize=3)


def compared_rows(plan: GridPlan) -> list[tuple[int, GridMethod, GridMethod | None]]:
    """``(colour index, row, its baseline row)`` for every row that is not a baseline in the grid."""
    by_key = {m.key: m for m in plan.methods}
    baselines = {m.baseline for m in plan.methods if m.baseline in by_key}
    return [
        (i, m, by_key.get(m.baseline) if m.baseline else None)
        for i, m in enumerate(plan.methods)
        if m.key not in baselines
    ]


def _seed_count(results: list[CellResult], row: str) -> int:
    return sum(1 for r in results if r.complete and r.cell.method.key == row)


def reward_curves(plan: GridPlan, results: list[CellResult], path: Path) -> Path:
    """Write the small multiples to ``path`` (PNG); with no row to compare, each row stands alone."""
    columns = compared_rows(plan) or [(i, m, None) for i, m in enumerate(plan.methods)]
    fig = new_figure(len(METRICS), len(columns), 2.5, 1.9)
    axes = fig.subplots(len(METRICS), len(columns), sharex=True, sharey="row", squeeze=False)
    for c, (i, row, baseline) in enumerate(columns):
        title = f"{row.label} ({_seed_count(results, row.key)} seeds)"
        if baseline is not None:
            title += f"\nvs {baseline.label} ({_seed_count(results, baseline.key)}, grey)"
        axes[0][c].set_title(title, fontsize=8, color=colour(i))
    for r, metric in enumerate(METRICS):
        marker = "o" if metric.kind == "eval" else None
        for c, (i, row, baseline) in enumerate(columns):
            ax = axes[r][c]
            base = seed_band(results, baseline.key, metric) if baseline is not None else None
            own = seed_band(results, row.key, metric)
            _draw(ax, base, BASELINE_COLOUR, marker)
            _draw(ax, own, colour(i), marker)
            if own is None:
                missing = "no data" if base is None else f"no data for {row.label}"
                ax.text(
                    0.5,
                    0.5,
                    missing,
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    fontsize=7,
                    color="0.3",
                    bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"},
                )
            if c == 0:
                ax.set_ylabel("\n".join([*textwrap.wrap(metric.title, 24), metric.ylabel]), fontsize=7)
            if r == len(METRICS) - 1:
                ax.set_xlabel("RL step", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3)
    fig.suptitle(
        f"grid {plan.preset.name}: each row (colour) against its baseline (grey); line: mean over seeds, "
        "band: range over seeds",
        fontsize=9,
    )
    fig.savefig(path, format="png", dpi=120)
    return path
