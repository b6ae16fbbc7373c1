"""The training-reward curves of a grid, overlaid: one line per row, the mean over its complete
seeds at each step (thin), and its exponential moving average (bold; the paper's Figure 4 smooths
with EMA 0.95 over hundreds of steps, a grid of tens of steps with 0.8). REINFORCE++ rows dashed."""

from __future__ import annotations

from pathlib import Path

from tokenbalance.ablate.grid import GridPlan
from tokenbalance.ablate.results import CellResult
from tokenbalance.diagnostics.plots import colour, finish_axes, new_figure

PANELS = (
    ("reward/mean", "training reward (mean over seeds)", "reward"),
    ("reward/acc", "training accuracy (full reward)", "share"),
)
EMA = 0.8


def seed_mean(results: list[CellResult], row: str, key: str) -> tuple[list[int], list[float]]:
    """Mean over the row's complete cells at every step they all logged."""
    series = [dict(zip(*r.series(key))) for r in results if r.complete and r.cell.method.key == row]
    if not series:
        return [], []
    steps = sorted(set.intersection(*(set(s) for s in series)))
    return steps, [sum(s[step] for s in series) / len(series) for step in steps]


def ema(values: list[float], weight: float = EMA) -> list[float]:
    out, current = [], None
    for value in values:
        current = value if current is None else weight * current + (1 - weight) * value
        out.append(current)
    return out


def reward_curves(plan: GridPlan, results: list[CellResult], path: Path) -> Path:
    fig = new_figure(1, len(PANELS), 5.2, 3.6)
    axes = fig.subplots(1, len(PANELS))
    for ax, (key, title, ylabel) in zip(axes, PANELS):
        for i, row in enumerate(plan.methods):
            steps, values = seed_mean(results, row.key, key)
            style = "--" if row.baseline == "rpp" or row.key == "rpp" else "-"
            if not steps:
                ax.plot([], [], color=colour(i), linestyle=style, label=f"{row.label} (no data)")
                continue
            seeds = sum(1 for r in results if r.complete and r.cell.method.key == row.key)
            ax.plot(steps, values, color=colour(i), linestyle=style, linewidth=0.6, alpha=0.35)
            ax.plot(steps, ema(values), color=colour(i), linestyle=style, linewidth=1.6, label=f"{row.label} ({seeds})")
        finish_axes(ax, f"{title}; bold: EMA {EMA}", ylabel)
    fig.suptitle(f"grid {plan.preset.name}: training curves (legend: seeds per row)", fontsize=10)
    fig.savefig(path, format="png", dpi=110)
    return path
