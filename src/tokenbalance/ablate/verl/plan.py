"""The verl grid's own plan, ``OUT/verl/plan.json``: its preset, rows (as ``--methods`` names them),
seeds and models, written with the scripts; ``--report-only`` reports it (or the part of it the flags
ask for) instead of rebuilding it from flags. docs/ablate.md "The grid at paper scale".
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenbalance.outputs import write_text_atomic

PLAN_FILE = "plan.json"
CELLS_FILE = "cells.txt"


def write_plan(grid_dir: Path, preset: str, methods: list[str], seeds: list[int], models: list[str]) -> None:
    plan = {"preset": preset, "methods": methods, "seeds": seeds, "models": models}
    write_text_atomic(Path(grid_dir) / PLAN_FILE, json.dumps(plan, indent=1) + "\n")


def read_plan(grid_dir: Path) -> dict | None:
    """The recorded plan; None for a grid written before plans were kept; ``ValueError`` naming the file
    when it is not one."""
    path = Path(grid_dir) / PLAN_FILE
    if not path.is_file():
        return None
    try:
        plan = json.loads(path.read_text())
        checked = {
            "preset": str(plan["preset"]),
            "methods": [str(word) for word in plan["methods"]],
            "seeds": [int(seed) for seed in plan["seeds"]],
            "models": [str(model) for model in plan["models"]],
        }
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--report-only: {path} is not the grid's plan ({err}); write the grid again") from None
    return checked


def chosen(flag: str, given: list | None, planned: list) -> list:
    """The flag's items (each in the plan), or the plan's when the flag was not given."""
    if given is None:
        return list(planned)
    missing = [item for item in given if item not in planned]
    if missing:
        raise ValueError(
            f"--report-only {flag}: {missing[0]} is not in the grid's plan ({PLAN_FILE}: "
            f"{','.join(map(str, planned))}); leave {flag} out to report the whole grid"
        )
    return list(given)


def written_cells(grid_dir: Path) -> list[str]:
    try:
        return (Path(grid_dir) / CELLS_FILE).read_text().split()
    except OSError:
        return []


def check_cells_written(grid_dir: Path, names: list[str]) -> None:
    """``ValueError`` naming the first requested cell the grid did not write (``cells.txt``)."""
    written = set(written_cells(grid_dir))
    missing = [name for name in names if name not in written]
    if missing:
        raise ValueError(
            f"--report-only: cell {missing[0]} is not in the grid ({Path(grid_dir) / CELLS_FILE}; "
            f"{len(missing)} requested cell(s) missing): report the grid as written (leave --methods, --seeds and "
            "--verl-models out), or write these cells first"
        )
