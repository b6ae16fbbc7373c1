"""The committed grids' records still report with today's code: every cell of every grid that
docs/results/figures.json draws is restored by ``ablate --report-only --records`` (none runs), so a
change to a config default, the embedded policy's cache key or the record format that would orphan
them (the cells would all count as another experiment's) fails here, not on a user's fresh clone."""

import pytest

from tests.ablate.test_redraw import MANIFEST
from tokenbalance.ablate.redraw import read_figures
from tokenbalance.cli import main

GRIDS = [entry for entry in read_figures(MANIFEST) if entry["draw"] == "grid"]


@pytest.mark.parametrize("grid", GRIDS, ids=[entry["preset"] for entry in GRIDS])
def test_every_committed_record_reports_with_todays_code(grid, tmp_path, capsys):
    out = tmp_path / "report"
    records = MANIFEST.parent / grid["records"]
    command = ["ablate", "--preset", grid["preset"], "--methods", ",".join(grid["methods"])]
    command += ["--seeds", ",".join(map(str, grid["seeds"])), "--steps", str(grid["steps"])]
    command += ["--model", grid["model"]] if "model" in grid else []  # a real model's grid: not on this machine
    command += [arg for override in grid.get("set", []) for arg in ("--set", override)]
    assert main([*command, "--report-only", "--records", str(records), "--out", str(out), "--no-figure"]) == 0
    cells = len(grid["methods"]) * len(grid["seeds"])
    report = (out / "results.md").read_text()
    assert f"- cells complete: {cells} of {cells}" in report
    assert f"{cells} cell(s) restored from records" in report
