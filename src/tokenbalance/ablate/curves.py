"""A grid's curves as small multiples: a column per row against its baseline (grey), a line of panels per metric
(:data:`METRICS`); mean over complete seeds with a 95% t band, training metrics EMA-smoothed. docs/ablate.md
("Outputs")."""

from __future__ import annotations

import math
import statistics
import textwrap
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from tokenbalance.ablate.grid import GRID_METHODS, GridMethod, GridPlan
from tokenbalance.ablate.results import CellResult
from tokenbalance.ablate.stats import t_quantile
from tokenbalance.diagnostics.plots import colour, new_figure
from tokenbalance.diagnostics.plotted import save_png

EMA = 0.8  # the paper's Figure 4 uses 0.95 over hundreds of steps; a grid has tens to hundreds
BASELINE_COLOUR = "0.45"
LEVEL = 0.95
PANEL_WIDTH = 1.5  # inches per column
MIN_WIDTH = 4.5  # inches: a grid of one or two columns is widened to this, room for its key in lines
KEY_LINE_WIDTH = 7.5  # inches the key needs on one line (five columns); a narrower figure wraps it


@dataclass(frozen=True)
class Metric:
    key: str
    kind: str  # "train" or "eval"
    name: str  # the y-label of its line of panels
    unit: str  # added to the y-label where the name does not say it


METRICS = (
    Metric("reward/mean", "train", "training reward", ""),
    Metric("eval/greedy/acc", "eval", "held-out accuracy\n(greedy)", ""),
    Metric("response/len_mean", "train", "response length", "tokens"),
    Metric("loss/entropy", "train", "policy entropy", "nats / token"),
    Metric("diag/bucket0/token_frac", "train", "lowest-bucket\ntoken share", ""),
    Metric("diag/bucket0/grad_share", "train", "lowest-bucket share\nof |dL/dz|²", ""),
)


def ema(values: list[float], weight: float = EMA) -> list[float]:
    out, current = [], None
    for value in values:
        current = value if current is None else weight * current + (1 - weight) * value
        out.append(current)
    return out


@dataclass(frozen=True)
class Band:
    """A row's metric over its seeds at the steps every seed logged: the mean and its 95% t interval ``mean -+
    t_{0.975, n-1} sd / sqrt(n)`` (sample sd; ``low == high == mean`` for one seed)."""

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
    n = len(series)
    t = t_quantile(0.5 + LEVEL / 2, n - 1) / math.sqrt(n) if n > 1 else 0.0  # one quantile for every step
    means = [statistics.fmean(c) for c in columns]
    halves = [t * statistics.stdev(c) if n > 1 else 0.0 for c in columns]
    return Band(steps, means, [m - h for m, h in zip(means, halves)], [m + h for m, h in zip(means, halves)], n)


def _draw(ax, band: Band | None, colour_: str, marker: str | None) -> None:
    if band is None:
        return
    if band.seeds > 1:
        ax.fill_between(band.steps, band.low, band.high, color=colour_, alpha=0.18, linewidth=0)
    ax.plot(band.steps, band.mean, color=colour_, linewidth=1.1, marker=marker, markersize=2.5)


def row_colour(key: str, index: int) -> str:
    """A grid row's colour: the same in every figure for the rows :data:`GRID_METHODS` knows (its place there), the
    ``index``-th colour after them for another row."""
    rows = list(GRID_METHODS)
    return colour(rows.index(key) if key in rows else len(rows) + index)


def compared_rows(plan: GridPlan) -> list[tuple[str, GridMethod, GridMethod | None]]:
    """``(colour, row, its baseline row)`` for every row that is not a baseline in the grid."""
    by_key = {m.key: m for m in plan.methods}
    baselines = {m.baseline for m in plan.methods if m.baseline in by_key}
    return [
        (row_colour(m.key, i), m, by_key.get(m.baseline) if m.baseline else None)
        for i, m in enumerate(plan.methods)
        if m.key not in baselines
    ]


def _seeds(results: list[CellResult], row: str) -> str:
    """``"8 seeds"``: how many complete cells ``row`` has."""
    n = sum(1 for r in results if r.complete and r.cell.method.key == row)
    return f"{n} seed{'' if n == 1 else 's'}"


def _key(fig: Figure, plan: GridPlan, results: list[CellResult], baselines: set[GridMethod]) -> None:
    """The figure's title and legend: what a line and a band are, which grey row is the baseline."""
    grey = "grey: the row's baseline"
    if len(baselines) == 1:
        (base,) = baselines
        grey = f"grey: {base.label}, the baseline ({_seeds(results, base.key)})"
    handles = [
        Line2D([], [], color="black", linewidth=1.1, label="line: mean over the row's seeds"),
        Patch(color="black", alpha=0.18, linewidth=0, label=f"band: {LEVEL:.0%} t interval of the mean"),
        Line2D([], [], color=BASELINE_COLOUR, linewidth=1.1, label=grey),
    ]
    title = (
        f"grid {plan.preset.name}: each row (colour) against its baseline; training metrics smoothed "
        f"per seed (EMA {EMA}), held-out accuracy as evaluated"
    )
    wide = fig.get_figwidth() >= KEY_LINE_WIDTH
    fig.legend(
        handles=handles,
        loc="outside upper center",
        ncols=3 if wide else 1,
        fontsize=7,
        frameon=False,
        title=title if wide else "\n".join(textwrap.wrap(title, int(12 * fig.get_figwidth()))),
        title_fontsize=8,
    )


def curves_figure(plan: GridPlan, results: list[CellResult]) -> Figure:
    """The small multiples; with no row to compare, each row stands alone. A metric a row never logged is marked "no
    data" in its panel."""
    columns = compared_rows(plan) or [(row_colour(m.key, i), m, None) for i, m in enumerate(plan.methods)]
    baselines = {base for _, _, base in columns if base is not None}
    fig = new_figure(len(METRICS), len(columns), max(PANEL_WIDTH, MIN_WIDTH / len(columns)), 1.15)
    axes = fig.subplots(len(METRICS), len(columns), sharex=True, sharey="row", squeeze=False)
    for c, (hue, row, baseline) in enumerate(columns):
        title = "\n".join(textwrap.wrap(row.label, 22)) + f"\n({_seeds(results, row.key)})"
        if baseline is not None and len(baselines) > 1:
            title += f"\nvs {baseline.label} ({_seeds(results, baseline.key)})"
        axes[0][c].set_title(title, fontsize=7, color=hue)
    for r, metric in enumerate(METRICS):
        marker = "o" if metric.kind == "eval" else None
        for c, (hue, row, baseline) in enumerate(columns):
            ax = axes[r][c]
            base = seed_band(results, baseline.key, metric) if baseline is not None else None
            own = seed_band(results, row.key, metric)
            _draw(ax, base, BASELINE_COLOUR, marker)
            _draw(ax, own, hue, marker)
            if own is None:
                ax.text(
                    0.5,
                    0.5,
                    "no data" if base is None else f"no data for {row.label}",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    fontsize=6,
                    color="0.3",
                    bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"},
                )
            if c == 0:
                ax.set_ylabel(metric.name + (f"\n({metric.unit})" if metric.unit else ""), fontsize=7)
            if r == len(METRICS) - 1:
                ax.set_xlabel("RL step", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3)
    _key(fig, plan, results, baselines)
    return fig


def reward_curves(plan: GridPlan, results: list[CellResult], path: Path) -> Path:
    """Write :func:`curves_figure` to ``path`` (PNG, with its fingerprint)."""
    return save_png(curves_figure(plan, results), path)
