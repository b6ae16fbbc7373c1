"""Plots of training runs from their ``metrics.jsonl`` alone (``tokenbalance plot``).

Four figures, each written as PNG and SVG:

* ``training``: train reward and accuracy, held-out greedy accuracy per difficulty, response length;
* ``buckets``: the AR-Lopti paper's Figure 1 layout as bars per probability bucket, averaged over the
  run's steps: token share (a), mean advantage of positive / negative tokens (b), clip fraction,
  entropy, and the per-bucket gradient norm next to the all-token one (d). The paper shows
  distributions (violins) from dedicated runs; a metrics log holds per-step means, so these are
  means of means;
* ``buckets_steps``: the same statistics per step, one column per bucket;
* ``lld``: the LLD monitor's Δ (mean, 10th percentile, median) and the share of groups below epsilon.

Several runs are overlaid (one colour each, labelled "<method> seed <seed>" from the run's
``config.yaml``, or the directory's name without one; markers at the logged steps). Panels of one
quantity share a y-range (the two accuracies; each statistic across buckets). A run that lacks a
panel's keys (older runs, diagnostics switched off) appears in that panel's legend as "(no data)",
and a figure with no data at all says so; nothing is skipped silently and a missing key never
raises. The figures replace only
files an earlier ``plot`` wrote into the output directory (listed in its
``.tokenbalance-written.json``); a file of the user's of the same name is never replaced. Matplotlib is used through
``Figure`` objects with the Agg canvas, so no display and no global backend state are involved.

    tokenbalance plot runs/grpo-20261122-101500 runs/ar_lopti-20261122-111500 --out plots/
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tokenbalance.diagnostics.edges import DEFAULT_EDGES, interval_label
from tokenbalance.diagnostics.sinks import parse_metrics_lines, restore_non_finite
from tokenbalance.outputs import check_files_replaceable, record_written

FORMATS = ("png", "svg")
NO_DATA = " (no data)"
_BUCKET_KEY = re.compile(r"^diag/bucket(\d+)/")
_EVAL_ACC = re.compile(r"^eval/greedy/acc_(\w+)$")


@dataclass
class Run:
    """One run's records: ``name`` (legend label), ``train`` and ``eval`` records, lines skipped."""

    name: str
    path: Path
    train: list[dict] = field(default_factory=list)
    eval: list[dict] = field(default_factory=list)
    skipped_lines: int = 0

    def series(self, key: str, kind: str = "train") -> tuple[list[float], list[float]]:
        """Steps and values of ``key`` (records without it, or with a non-number, are left out)."""
        steps: list[float] = []
        values: list[float] = []
        for record in self.train if kind == "train" else self.eval:
            value = _number(record.get(key))
            if value is not None:
                steps.append(float(record.get("step", len(steps))))
                values.append(value)
        return steps, values

    def mean(self, key: str) -> float:
        """Mean over the train records of the finite values of ``key`` (NaN when there are none)."""
        _, values = self.series(key)
        finite = [v for v in values if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else float("nan")

    def has(self, key: str, kind: str = "train") -> bool:
        return any(math.isfinite(v) for v in self.series(key, kind)[1])


def _number(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):  # a number written as text
        try:
            return float(value)
        except ValueError:
            return None
    return None


def load_run(run_dir: str | Path) -> Run:
    """The records of ``run_dir/metrics.jsonl``; ValueError when there is no such file, or naming the
    file and the line when a line before the last is not a JSON object. A torn last line (a run
    killed while writing) is left out and counted in ``skipped_lines``, as a resume drops it."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: not a directory (expected a run directory holding metrics.jsonl)")
    if not path.is_file():
        raise ValueError(f"{run_dir}: no metrics.jsonl here (is this a run directory? `tokenbalance train` writes it)")
    run = Run(name=run_label(run_dir), path=run_dir)
    try:
        records, torn = parse_metrics_lines(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}); the file is damaged") from None
    run.skipped_lines = int(torn is not None)
    for _, record in records:
        record = restore_non_finite(record)  # null (older files: "nan") -> nan
        (run.eval if record.get("kind") == "eval" else run.train).append(record)
    return run


def run_label(run_dir: Path) -> str:
    """``<method> seed <seed>`` from the run's ``config.yaml``; the directory's name when it has none."""
    import yaml

    try:
        train = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("train") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        train = {}
    if isinstance(train, dict) and "method" in train and "seed" in train:
        return f"{train['method']} seed {train['seed']}"
    return run_dir.resolve().name


def _unique_names(runs: list[Run]) -> None:
    """Two runs with one label (the same method and seed) are told apart by their directories."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    for run in runs:
        if seen[run.name] > 1:
            run.name = f"{run.name} ({run.path.resolve().parent.name}/{run.path.resolve().name})"


# matplotlib's ten default colours without its grey (C7), which reads as "baseline" or "no data"
PALETTE = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9", "#6a3d9a")


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _line(ax, run: Run, i: int, key: str, *, kind: str = "train", label: str | None = None, **style) -> bool:
    """Plot one series; when it is missing draw an empty handle labelled "(no data)"."""
    steps, values = run.series(key, kind)
    label = run.name if label is None else label
    if not any(math.isfinite(v) for v in values):
        ax.plot([], [], color=colour(i), label=label + NO_DATA, **style)
        return False
    ax.plot(steps, values, color=colour(i), label=label, **({"marker": ".", "markersize": 3} | style))
    return True


def finish_axes(ax, title: str, ylabel: str = "", xlabel: str = "step", fast_legend: bool = False) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=8)
    if xlabel == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper right" if fast_legend else "best")


def new_figure(rows: int, cols: int, width: float, height: float) -> Figure:
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def training_figure(runs: list[Run]) -> Figure:
    fig = new_figure(2, 2, 4.6, 3.2)
    axes = fig.subplots(2, 2).flatten()
    for i, run in enumerate(runs):
        _line(axes[0], run, i, "reward/mean")
        _line(axes[1], run, i, "reward/acc")
        _line(axes[3], run, i, "response/len_mean")
        difficulties = sorted(
            {m.group(1) for r in run.eval for k in r for m in [_EVAL_ACC.match(k)] if m}, key=lambda d: (len(d), d)
        )
        if not difficulties:
            axes[2].plot([], [], color=colour(i), label=run.name + NO_DATA)
        styles = ["-", "--", ":", "-."]
        for j, d in enumerate(difficulties):
            _line(
                axes[2],
                run,
                i,
                f"eval/greedy/acc_{d}",
                kind="eval",
                label=f"{run.name} d={d}",
                linestyle=styles[j % len(styles)],
                marker="o",
                markersize=3,
            )
    finish_axes(axes[0], "training reward (mean)", "reward")
    finish_axes(axes[1], "training accuracy (full reward)", "share")
    finish_axes(axes[2], "held-out accuracy per difficulty (greedy)", "accuracy")
    finish_axes(axes[3], "response length", "tokens")
    _share_y(axes[1], axes[2])  # both accuracies on one scale
    return fig


def _share_y(*axes) -> None:
    """One y-range for panels that show the same quantity, so that their heights compare."""
    low = min(ax.get_ylim()[0] for ax in axes)
    high = max(ax.get_ylim()[1] for ax in axes)
    for ax in axes:
        ax.set_ylim(low, high)


def _buckets(runs: list[Run]) -> tuple[int, list[str]]:
    """Number of buckets found in the runs and their interval labels (from the logged edges)."""
    indices = {int(m.group(1)) for run in runs for r in run.train for k in r for m in [_BUCKET_KEY.match(k)] if m}
    count = max(indices) + 1 if indices else len(DEFAULT_EDGES) - 1
    labels = []
    for b in range(count):
        label = f"bucket {b}"
        for run in runs:
            lo, hi = run.mean(f"diag/bucket{b}/lo"), run.mean(f"diag/bucket{b}/hi")
            if math.isfinite(lo) and math.isfinite(hi):
                label = f"[{lo:.2g}, {hi:.2g}{']' if b == count - 1 else ')'}"
                break
        else:
            if not indices:
                label = interval_label(DEFAULT_EDGES, b)
        labels.append(label)
    return count, labels


BUCKET_STATS = (
    ("token_frac", "token share", "share of valid tokens"),
    ("grad_share", "gradient share (hatched / dashed: before the token stage)", "share of squared logit-gradient norm"),
    ("adv_mean", "mean advantage (pos / neg)", "advantage"),
    ("clip_frac", "clip fraction", "share"),
    ("entropy", "entropy (old policy)", "nats"),
    ("grad_norm", "gradient norm, bucket only (dotted: all tokens)", "L2 norm"),
)


def _bucket_key(stat: str, b: int | str, sign: str = "") -> str:
    if stat == "grad_norm":
        return "diag/grad_norm/all" if b == "all" else f"diag/grad_norm/bucket{b}"
    return f"diag/bucket{b}/{sign}{stat}"


def buckets_figure(runs: list[Run]) -> Figure:
    """Figure 1 layout: per-bucket bars averaged over each run's steps."""
    count, labels = _buckets(runs)
    fig = new_figure(1, len(BUCKET_STATS), 3.6, 3.4)
    axes = fig.subplots(1, len(BUCKET_STATS))
    width = 0.8 / max(len(runs), 1)
    for ax, (stat, title, ylabel) in zip(axes, BUCKET_STATS):
        groups = labels + (["all"] if stat == "grad_norm" else [])
        for i, run in enumerate(runs):
            xs = [g + (i - (len(runs) - 1) / 2) * width for g in range(len(groups))]
            buckets = list(range(count)) + (["all"] if stat == "grad_norm" else [])
            if stat in ("adv_mean", "grad_share"):  # solid A > 0 / after the token stage; hatched A < 0 / before
                if stat == "adv_mean":
                    solid = [run.mean(_bucket_key(stat, b, "pos/")) for b in buckets]
                    hatched = [run.mean(_bucket_key(stat, b, "neg/")) for b in buckets]
                else:
                    solid = [run.mean(_bucket_key(stat, b)) for b in buckets]
                    hatched = [run.mean(_bucket_key("grad_share_before", b)) for b in buckets]
                found = any(math.isfinite(v) for v in solid + hatched)
                ax.bar(
                    xs,
                    [v if math.isfinite(v) else 0.0 for v in solid],
                    width,
                    color=colour(i),
                    label=run.name + ("" if found else NO_DATA),
                )
                hatched = [v if math.isfinite(v) else 0.0 for v in hatched]
                ax.bar(xs, hatched, width, color=colour(i), alpha=0.5, hatch="//")
            else:
                values = [run.mean(_bucket_key(stat, b)) for b in buckets]
                found = any(math.isfinite(v) for v in values)
                ax.bar(
                    xs,
                    [v if math.isfinite(v) else 0.0 for v in values],
                    width,
                    color=colour(i),
                    label=run.name + ("" if found else NO_DATA),
                )
        ax.set_xticks(range(len(groups)), groups, rotation=30, fontsize=7)
        if stat == "adv_mean":
            ax.axhline(0.0, color="black", linewidth=0.6)
        if stat == "grad_norm":
            title = "gradient norm (one bucket's tokens; all)"
        finish_axes(ax, title, ylabel, xlabel="probability bucket (old policy)")
    fig.suptitle(
        "token statistics by probability bucket (mean over steps; hatched: negative advantages, "
        "gradient share before the token stage)",
        fontsize=10,
    )
    return fig


def buckets_steps_figure(runs: list[Run]) -> Figure:
    count, labels = _buckets(runs)
    fig = new_figure(len(BUCKET_STATS), count, 3.2, 2.4)
    axes = fig.subplots(len(BUCKET_STATS), count, squeeze=False)
    for row, (stat, title, ylabel) in enumerate(BUCKET_STATS):
        for b in range(count):
            ax = axes[row][b]
            for i, run in enumerate(runs):
                if stat == "adv_mean":
                    found = _line(ax, run, i, _bucket_key(stat, b, "pos/"), label=f"{run.name} A>0")
                    _line(ax, run, i, _bucket_key(stat, b, "neg/"), label=f"{run.name} A<0", linestyle="--")
                elif stat == "grad_share":
                    found = _line(ax, run, i, _bucket_key(stat, b), label=f"{run.name} after")
                    _line(ax, run, i, _bucket_key("grad_share_before", b), label=f"{run.name} before", linestyle="--")
                else:
                    found = _line(ax, run, i, _bucket_key(stat, b))
                    if stat == "grad_norm" and found:
                        steps, values = run.series("diag/grad_norm/all")
                        ax.plot(steps, values, color=colour(i), linestyle=":", linewidth=0.8)
            finish_axes(
                ax, f"{title.split(' (')[0].split(',')[0]} {labels[b]}", ylabel if b == 0 else "", fast_legend=True
            )
        _share_y(*axes[row])  # one statistic per line of panels: the buckets compare
    return fig


def lld_figure(runs: list[Run]) -> Figure:
    fig = new_figure(1, 2, 4.6, 3.2)
    axes = fig.subplots(1, 2)
    for i, run in enumerate(runs):
        if _line(axes[0], run, i, "diag/lld/delta_mean", label=f"{run.name} mean"):
            _line(axes[0], run, i, "diag/lld/delta_p10", label=f"{run.name} p10", linestyle=":")
            _line(axes[0], run, i, "diag/lld/delta_p50", label=f"{run.name} median", linestyle="--")
        _line(axes[1], run, i, "diag/lld/frac_below_eps")
    axes[0].axhline(0.0, color="black", linewidth=0.6)
    finish_axes(axes[0], "LLD: change of log-likelihood of correct responses", "nats per response")
    finish_axes(axes[1], "share of mixed groups with Δ < epsilon", "share")
    if not any(run.has("diag/lld/delta_mean") for run in runs):
        for ax in axes:
            ax.text(
                0.5,
                0.5,
                "no data: no run logged the LLD monitor\n(train with --set diagnostics.lld=true)",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=8,
                color="0.3",
            )
            ax.set_xticks([])
            ax.set_yticks([])
    return fig


FIGURES = {
    "training": training_figure,
    "buckets": buckets_figure,
    "buckets_steps": buckets_steps_figure,
    "lld": lld_figure,
}


def plot_runs(
    run_dirs: list[str | Path],
    out_dir: str | Path | None = None,
    *,
    formats: tuple[str, ...] = FORMATS,
    labels: list[str] | None = None,
) -> list[Path]:
    """Write every figure in every format; returns the files written (``out_dir`` default:
    the first run's ``plots/``). ``labels``: the legend's name of each run, in order (default:
    method and seed, :func:`run_label`)."""
    if not run_dirs:
        raise ValueError("no run directory given")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} label(s) for {len(run_dirs)} run(s); give one per RUN_DIR")
    runs = [load_run(d) for d in run_dirs]
    for run, label in zip(runs, labels or []):
        run.name = label
    _unique_names(runs)
    out = Path(out_dir) if out_dir is not None else Path(run_dirs[0]) / "plots"
    return save_figures(out, {name: partial(make, runs) for name, make in FIGURES.items()}, formats)


def save_figures(out: Path, makers: dict[str, Callable[[], Figure]], formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Draw each figure and write it in every format to ``out`` (``--out``); a file there that
    tokenbalance did not write is never replaced (checked before drawing). Returns the files."""
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"--format: unknown format {bad[0]!r}; valid: {', '.join(FORMATS)}")
    names = [f"{name}.{fmt}" for name in makers for fmt in formats]
    check_files_replaceable(out, names, "--out")  # a figure file of the user's is never replaced
    out.mkdir(parents=True, exist_ok=True)
    record_written(out, names)  # before writing: a figure half-written by a killed process is still ours
    written = []
    for name, make in makers.items():
        fig = make()
        for fmt in formats:
            path = out / f"{name}.{fmt}"
            fig.savefig(path, format=fmt, dpi=110)
            written.append(path)
    return written
