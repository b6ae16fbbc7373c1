"""Every committed figure redrawn from its committed data (``tokenbalance plot --redraw MANIFEST``; docs/results.md,
"Figures"): the manifest lists each figure, its ``draw`` (one of :data:`KINDS`) and its files, relative to it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

from tokenbalance.ablate.testbeds import read_json_list
from tokenbalance.diagnostics.plots import FIGURES, NotDrawn, load_runs, save_figures
from tokenbalance.outputs import check_files_replaceable

# what draws a figure, and the keys its entry needs
KINDS = {
    "runs": ("runs", "labels"),  # a `tokenbalance plot` figure (the file's name) of these run directories
    # a grid's reward_curves from its --records; optional: "model" (the --model its cells started from: nothing loads
    # it, a record names it by its folder's name) and "set" (the grid's --set overrides), for `ablate --report-only`
    "grid": ("preset", "methods", "seeds", "steps", "records"),
    "figure1": ("data",),  # the Figure 1 panels from their measurement, figure1_buckets.json
    "testbeds": ("manifest", "mode"),  # `tokenbalance plot --testbeds MANIFEST --mode MODE`
}


def read_figures(manifest: Path) -> list[dict]:
    """The manifest's entries; one-line ``ValueError`` naming the entry and what is wrong."""
    entries = read_json_list(manifest, "figure", "{figure, draw, ...}")
    for i, entry in enumerate(entries):
        name = entry.get("figure", f"entry {i}") if isinstance(entry, dict) else f"entry {i}"
        if not isinstance(entry, dict) or entry.get("draw") not in KINDS:
            raise ValueError(f"{manifest}: {name}: 'draw' must be one of {', '.join(KINDS)}")
        missing = [key for key in ("figure", *KINDS[entry["draw"]]) if key not in entry]
        if missing:
            raise ValueError(f"{manifest}: {name}: lacks {', '.join(missing)} (draw {entry['draw']!r})")
        if not str(entry["figure"]).endswith(".png"):
            raise ValueError(f"{manifest}: {name}: a committed figure is a .png file")
        if entry["draw"] == "runs" and Path(entry["figure"]).stem not in FIGURES:
            raise ValueError(f"{manifest}: {name}: draw 'runs' names one of {', '.join(FIGURES)}.png")
    return entries


def drawer(entry: dict, base: Path) -> Callable[[], Figure | NotDrawn]:
    """The function that draws ``entry``'s figure from its files (``base``: the manifest's folder)."""
    kind = entry["draw"]
    if kind == "runs":
        return lambda: FIGURES[Path(entry["figure"]).stem](
            load_runs([base / run for run in entry["runs"]], entry["labels"])
        )
    if kind == "grid":
        return lambda: grid_curves(entry, base)
    if kind == "figure1":
        from tokenbalance.ablate import figure1

        return lambda: figure1.figure(figure1.read_json(base / entry["data"]))
    from tokenbalance.ablate.testbeds import gains_figure, testbed_points

    return lambda: gains_figure(testbed_points(base / entry["manifest"], entry["mode"]), entry["mode"])


def grid_curves(entry: dict, base: Path) -> Figure:
    """``reward_curves.png`` of the grid ``entry`` names, from the cells kept in its records."""
    from tokenbalance.ablate.curves import curves_figure
    from tokenbalance.ablate.grid import grid_preset, make_plan
    from tokenbalance.ablate.results import read_cell

    plan = make_plan(grid_preset(entry["preset"]), methods=entry["methods"], seeds=entry["seeds"], steps=entry["steps"])
    records = base / entry["records"]
    return curves_figure(plan, [read_cell(records / cell.name, cell, plan.steps) for cell in plan.cells])


def redraw(manifest: Path, out: Path | None = None, *, log: Callable[[str], None] = print) -> list[Path]:
    """Draw every figure ``manifest`` lists into ``out`` (default: beside the manifest, replacing the committed
    files), each at its path relative to the manifest; returns the files written."""
    entries = read_figures(manifest)
    out = manifest.parent if out is None else out
    folders: dict[Path, dict[str, Callable[[], Figure | NotDrawn]]] = {}
    for entry in entries:
        figure = Path(entry["figure"])
        folders.setdefault(out / figure.parent, {})[figure.stem] = drawer(entry, manifest.parent)
    for folder, makers in folders.items():  # every folder checked before any figure is drawn
        check_files_replaceable(folder, [f"{name}.png" for name in makers], "--out")
    return [path for folder, makers in folders.items() for path in save_figures(folder, makers, ("png",), log=log)]
