"""Figures of runs from their ``metrics.jsonl`` (``tokenbalance plot``): ``training``, ``buckets`` (Figure 1 layout),
``buckets_steps`` and ``lld``, runs overlaid; empty panels dropped and named; written by :func:`save_figures`, which
never replaces a user's file. docs/metrics.md ("Plots").

    tokenbalance plot runs/grpo-20261122-101500 runs/ar_lopti-20261122-111500 --out plots/"""

from __future__ import annotations

import functools
import math
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from tokenbalance.diagnostics.edges import DEFAULT_EDGES, interval_label
from tokenbalance.diagnostics.plotted import save_png
from tokenbalance.diagnostics.sinks import metrics_path, parse_metrics_lines, restore_non_finite
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
    """The records of ``run_dir/metrics.jsonl`` (a kept record's ``metrics.jsonl.gz``); ValueError when there is no
    such file, or naming the file and the line when a line before the last is not a JSON object. A torn last line (a
    run killed while writing) is left out and counted in ``skipped_lines``, as a resume drops it."""
    run_dir = Path(run_dir)
    path = metrics_path(run_dir)
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


def finish_axes(ax, title: str, ylabel: str = "", xlabel: str = "step") -> None:
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)
    if xlabel == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=7)
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="best")


DPI = 200  # figures are laid out in inches at a page's width; 200 dpi prints sharp


def new_figure(rows: int, cols: int, width: float, height: float) -> Figure:
    """A ``width`` x ``height`` inch panel per cell at :data:`DPI`, in matplotlib's constrained layout, on the Agg
    canvas (no display, no global backend state)."""
    fig = Figure(figsize=(width * cols, height * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def letter(ax, mark: str, title: str) -> None:
    """A panel's bold letter above its top-left corner, as the paper's figures letter theirs."""
    ax.set_title(title, fontsize=8, loc="left")
    ax.text(-0.02, 1.09, mark, transform=ax.transAxes, fontsize=10, fontweight="bold", va="bottom", ha="right")


@dataclass(frozen=True)
class NotDrawn:
    """A figure there is no data for; ``reason`` says which and how to log it."""

    reason: str


def training_figure(runs: list[Run]) -> Figure:
    fig = new_figure(2, 2, 3.6, 2.6)
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
    finish_axes(axes[1], "training accuracy (full reward)", "share of responses")
    finish_axes(axes[2], "held-out accuracy per difficulty (greedy)", "share of examples")
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


@dataclass(frozen=True)
class BucketStat:
    """One panel of the bucket figures: ``stat`` names its keys (:meth:`keys`); ``unit`` is its y-label (empty where
    the title says it all); ``switch`` is the setting that logs it."""

    stat: str
    title: str
    unit: str
    switch: str

    def keys(self, b: int | str) -> tuple[str, str | None]:
        """The key of bucket ``b`` (``"all"``: every token) and its second one: A < 0 for the mean advantage, before
        the token stage for the gradient share."""
        if self.stat == "grad_norm":
            return ("diag/grad_norm/all" if b == "all" else f"diag/grad_norm/bucket{b}"), None
        if self.stat == "adv_mean":
            return f"diag/bucket{b}/pos/adv_mean", f"diag/bucket{b}/neg/adv_mean"
        if self.stat == "grad_share":
            return f"diag/bucket{b}/grad_share", f"diag/bucket{b}/grad_share_before"
        return f"diag/bucket{b}/{self.stat}", None

    def groups(self, count: int) -> list[int | str]:
        return [*range(count), *(["all"] if self.stat == "grad_norm" else [])]


BUCKET_STATS = (
    BucketStat("token_frac", "token share (log scale)", "", "diagnostics.bucket_stats=true"),
    BucketStat("adv_mean", "mean advantage (hatched: A < 0)", "", "diagnostics.bucket_stats=true"),
    BucketStat("grad_share", "gradient share (dashes: before\nthe token stage)", "", "diagnostics.grad_share=true"),
    BucketStat("grad_norm", "gradient norm, bucket's tokens only", "L2 norm", "diagnostics.grad_norm_every=K"),
    BucketStat("entropy", "entropy (old policy)", "nats", "diagnostics.bucket_stats=true"),
    BucketStat("clip_frac", "clip fraction", "", "diagnostics.bucket_stats=true"),
)
STEPS_KEY = (
    "dashed: A < 0 (mean advantage), before the token stage (gradient share); dotted: all tokens (gradient norm)"
)


def _short(stat: BucketStat) -> str:
    return stat.title.split(" (")[0].split(",")[0]


def _values(stat: BucketStat, runs: list[Run], count: int) -> list[float]:
    """Every finite value ``runs`` logged for ``stat`` (all steps, buckets, both keys)."""
    keys = [k for b in stat.groups(count) for k in stat.keys(b) if k]
    return [v for run in runs for k in keys for v in run.series(k)[1] if math.isfinite(v)]


def dropped_panel(stat: BucketStat, runs: list[Run], count: int) -> str | None:
    """Why ``stat``'s panel is not drawn (no run logged it, or it is 0 everywhere); None to draw it."""
    values = _values(stat, runs, count)
    if not values:
        return f"{_short(stat)} (no run logged it: --set {stat.switch})"
    if all(v == 0 for v in values):
        return f"{_short(stat)} (0 in every bucket of every run)"
    return None


def _panels(runs: list[Run], count: int) -> tuple[list[BucketStat], list[str]]:
    """The panels with data, and a note per dropped one."""
    drawn, dropped = [], []
    for stat in BUCKET_STATS:
        why = dropped_panel(stat, runs, count)
        drawn += [] if why else [stat]
        dropped += [why] if why else []
    return drawn, dropped


def _figure_key(
    fig: Figure, title: str, runs: list[Run], drawn: list[BucketStat], dropped: list[str], count: int
) -> None:
    """The figure's title over one legend for the whole figure (runs by colour; "(no data)" for a run without data in
    any drawn panel) and, at the bottom, the panels dropped. (Constrained layout stacks one element per edge: the
    legend's title is the figure's.)"""
    handles = [
        Line2D(
            [],
            [],
            color=colour(i),
            linewidth=4,
            label=run.name + ("" if any(_values(s, [run], count) for s in drawn) else NO_DATA),
        )
        for i, run in enumerate(runs)
    ]
    fig.legend(
        handles=handles,
        loc="outside upper center",
        ncols=min(len(runs), 3),
        fontsize=7,
        frameon=False,
        title=title,
        title_fontsize=8,
        alignment="center",
    )
    if dropped:
        width = int(fig.get_figwidth() * 17)  # characters of 6 pt text across the figure
        fig.supxlabel(textwrap.fill("not drawn: " + "; ".join(dropped), width), fontsize=6, color="0.3")


def _zeroed(values: list[float]) -> list[float]:
    """Missing values (NaN) as bars of height 0 (:func:`_lacking` names the runs without any)."""
    return [v if math.isfinite(v) else 0.0 for v in values]


def buckets_figure(runs: list[Run]) -> Figure | NotDrawn:
    """Figure 1 layout: per-bucket bars averaged over each run's steps, panels lettered, those without data dropped
    and named; :class:`NotDrawn` when no run logged any bucket statistic."""
    count, labels = _buckets(runs)
    drawn, dropped = _panels(runs, count)
    if not drawn:
        return NotDrawn("no run logged diag/bucket* statistics (--set diagnostics.bucket_stats=true)")
    cols = 2 if len(drawn) == 4 else min(len(drawn), 3)
    rows = -(-len(drawn) // cols)
    fig = new_figure(rows, cols, 2.4, 2.0)
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[len(drawn) :]:
        ax.axis("off")
    width = 0.8 / max(len(runs), 1)
    for n, (ax, stat) in enumerate(zip(axes, drawn)):
        groups = stat.groups(count)
        for i, run in enumerate(runs):
            xs = [g + (i - (len(runs) - 1) / 2) * width for g in range(len(groups))]
            solid = [run.mean(stat.keys(b)[0]) for b in groups]
            second = [run.mean(key) if (key := stat.keys(b)[1]) else math.nan for b in groups]
            log_scale = stat.stat == "token_frac"  # an empty bucket has no bar there
            ax.bar(xs, [v if v > 0 or not log_scale else math.nan for v in _zeroed(solid)], width, color=colour(i))
            if stat.stat == "adv_mean":  # A < 0 below the axis
                ax.bar(xs, _zeroed(second), width, color=colour(i), alpha=0.5, hatch="//")
            elif stat.stat == "grad_share":  # the share before the token stage: a dash across the bar
                left = [x - width / 2 for x in xs]
                ax.hlines(second, left, [x + width for x in left], colors="black", linestyles="--", lw=1)
        if stat.stat == "token_frac":
            ax.set_yscale("log")
        if stat.stat == "adv_mean":
            ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(groups)), [*labels, "all"][: len(groups)], rotation=25, fontsize=6)
        ax.set_xlabel("old-policy probability" + _lacking(stat, runs, drawn, count), fontsize=6)
        ax.set_ylabel(stat.unit, fontsize=7)
        ax.tick_params(which="both", labelsize=6)
        ax.grid(alpha=0.3, axis="y")
        letter(ax, "abcdefgh"[n], stat.title)
    _figure_key(fig, "token statistics by probability bucket, mean over each run's steps", runs, drawn, dropped, count)
    return fig


def _lacking(stat: BucketStat, runs: list[Run], drawn: list[BucketStat], count: int) -> str:
    """``"\n(no data: NAME, ...)"`` for the runs without ``stat`` that have another drawn panel's data (a run without
    any is marked in the legend)."""
    names = [r.name for r in runs if not _values(stat, [r], count) and any(_values(s, [r], count) for s in drawn)]
    return f"\n(no data: {', '.join(names)})" if names else ""


def buckets_steps_figure(runs: list[Run]) -> Figure | NotDrawn:
    """The bucket statistics per step: one row per statistic with data, one column per bucket."""
    count, labels = _buckets(runs)
    drawn, dropped = _panels(runs, count)
    if not drawn:
        return NotDrawn("no run logged diag/bucket* statistics (--set diagnostics.bucket_stats=true)")
    fig = new_figure(len(drawn), count, 1.8, 1.3)
    axes = fig.subplots(len(drawn), count, squeeze=False, sharex=True, sharey="row")
    for row, stat in enumerate(drawn):
        for b in range(count):
            ax = axes[row][b]
            for i, run in enumerate(runs):
                solid, dashed = stat.keys(b)
                _line(ax, run, i, solid, linewidth=0.9, marker="")
                if dashed:
                    _line(ax, run, i, dashed, linestyle="--", linewidth=0.9, marker="")
                if stat.stat == "grad_norm":
                    _line(ax, run, i, "diag/grad_norm/all", linestyle=":", linewidth=0.8, marker="")
            if stat.stat == "token_frac":
                ax.set_yscale("log")
            ax.tick_params(which="both", labelsize=6)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(labels[b], fontsize=8)
            if b == 0:
                unit = f" ({stat.unit})" if stat.unit else ""
                ax.set_ylabel(_short(stat) + unit + _lacking(stat, runs, drawn, count), fontsize=7)
            if row == len(drawn) - 1:
                ax.set_xlabel("step", fontsize=7)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    title = f"token statistics per step by probability bucket (old policy)\n{STEPS_KEY}"
    _figure_key(fig, title, runs, drawn, dropped, count)
    return fig


def lld_figure(runs: list[Run]) -> Figure | NotDrawn:
    if not any(run.has("diag/lld/delta_mean") for run in runs):
        return NotDrawn("no run logged the LLD monitor (train with --set diagnostics.lld=true)")
    fig = new_figure(1, 2, 3.6, 2.6)
    axes = fig.subplots(1, 2)
    for i, run in enumerate(runs):
        if _line(axes[0], run, i, "diag/lld/delta_mean", label=f"{run.name} mean"):
            _line(axes[0], run, i, "diag/lld/delta_p10", label=f"{run.name} p10", linestyle=":")
            _line(axes[0], run, i, "diag/lld/delta_p50", label=f"{run.name} median", linestyle="--")
        _line(axes[1], run, i, "diag/lld/frac_below_eps")
    axes[0].axhline(0.0, color="black", linewidth=0.6)
    finish_axes(axes[0], "LLD: change of log-likelihood of correct responses", "nats per response")
    finish_axes(axes[1], "share of mixed groups with Δ < epsilon", "share of groups")
    return fig


FIGURES: dict[str, Callable[[list[Run]], Figure | NotDrawn]] = {
    "training": training_figure,
    "buckets": buckets_figure,
    "buckets_steps": buckets_steps_figure,
    "lld": lld_figure,
}


def load_runs(run_dirs: list[str | Path], labels: list[str] | None = None) -> list[Run]:
    """The runs of ``run_dirs``, named by ``labels`` in order (default: method and seed, :func:`run_label`)."""
    if not run_dirs:
        raise ValueError("no run directory given")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} label(s) for {len(run_dirs)} run(s); give one per RUN_DIR")
    runs = [load_run(d) for d in run_dirs]
    for run, label in zip(runs, labels or []):
        run.name = label
    _unique_names(runs)
    return runs


def plot_runs(
    run_dirs: list[str | Path],
    out_dir: str | Path | None = None,
    *,
    formats: tuple[str, ...] = FORMATS,
    labels: list[str] | None = None,
    figures: tuple[str, ...] = tuple(FIGURES),
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Write ``figures`` in every format; returns the files written (``out_dir`` default: the first run's ``plots/``).
    ``labels``: the legend's name of each run, in order."""
    runs = load_runs(run_dirs, labels)
    out = Path(out_dir) if out_dir is not None else Path(run_dirs[0]) / "plots"
    makers = {name: functools.partial(FIGURES[name], runs) for name in figures}
    return save_figures(out, makers, formats, log=log)


def save_figures(
    out: Path,
    makers: Mapping[str, Callable[[], Figure | NotDrawn]],
    formats: tuple[str, ...] = FORMATS,
    *,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Draw each figure and write it in every format to ``out``; a file tokenbalance did not write is never replaced
    (checked before drawing); a figure without data is not written (an earlier one of its name removed), and ``log``
    says so. PNGs carry the fingerprint of what they plot (:mod:`.plotted`). Returns the files written."""
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
        if isinstance(fig, NotDrawn):
            stale = [out / f"{name}.{fmt}" for fmt in formats if (out / f"{name}.{fmt}").is_file()]
            for path in stale:  # ours (checked above): an earlier plot's figure of other data
                path.unlink()
            log(f"{name}: not drawn, {fig.reason}" + (f"; removed the earlier {stale[0].name}" if stale else ""))
            continue
        for fmt in formats:
            path = out / f"{name}.{fmt}"
            save_png(fig, path) if fmt == "png" else fig.savefig(path, format=fmt)
            written.append(path)
    return written
