"""The grid's time-left estimate: seconds per step from finished cells, and from running cells until a row has one."""

import json
from pathlib import Path

import pytest

from tokenbalance.ablate import runner
from tokenbalance.ablate.grid import GridPlan, grid_method, grid_preset
from tokenbalance.ablate.progress import GridProgress, StepRates
from tokenbalance.run.state import RunStatus


def test_nothing_measured_gives_no_estimate():
    rates = StepRates()
    rates.note_running("grpo-seed0", "grpo", 30.0, 0)  # started, no step yet
    assert rates.rate("grpo") is None and rates.seconds_left([("grpo", 10)]) is None


def test_running_cells_estimate_until_a_row_has_a_finished_cell():
    rates = StepRates()
    rates.note_running("grpo-seed0", "grpo", 400.0, 4)  # 100 s a step so far
    rates.note_running("ar_lopti-seed0", "ar_lopti", 600.0, 3)  # 200 s a step
    assert rates.rate("grpo") == 100.0 and rates.rate("ar_lopti") == 200.0
    assert rates.rate("nthr") == 150.0  # a row not running: the mean over the rows running
    assert rates.seconds_left([("grpo", 46), ("ar_lopti", 47)]) == pytest.approx(46 * 100 + 47 * 200)
    rates.add("grpo", 5000.0, 50)  # a finished grpo cell: 100 s a step, evaluations included
    rates.note_running("grpo-seed1", "grpo", 300.0, 1)
    assert rates.rate("grpo") == 100.0  # finished cells outrank running ones
    assert rates.rate("ar_lopti") == 200.0  # its own running cell outranks other rows' finished ones
    rates.forget_running("ar_lopti-seed0")
    assert rates.rate("ar_lopti") == 100.0  # now the finished rows' mean


class StepLoggingProcess:
    """Stands in for a cell's child process: each poll logs one more RL step, the third reports it completed."""

    def __init__(self, command, log_path, run_dir):
        self.run_dir, self.polls = Path(run_dir), 0
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def poll(self):
        self.polls += 1
        if self.polls == 3:
            return RunStatus.COMPLETED.value
        with open(self.run_dir / "metrics.jsonl", "a") as out:
            out.write(json.dumps({"step": self.polls, "kind": "train"}) + "\n")
        return None

    def stop(self):
        pass


def test_the_grid_estimates_time_left_from_its_running_cells_before_any_finishes(
    tiny_policy_dir, tmp_path, monkeypatch
):
    seen = []  # (cell, step, seconds left) of every progress update
    monkeypatch.setattr(runner, "CellProcess", StepLoggingProcess)
    monkeypatch.setattr(
        GridProgress, "cell_step", lambda self, name, step, steps, left_s: seen.append((name, step, left_s))
    )
    plan = GridPlan(grid_preset("kk-smoke"), (grid_method("grpo"), grid_method("ar_lopti")), (0,), 4)
    runner.run_grid(plan, tmp_path / "grid", model=str(tiny_policy_dir), jobs=1, progress=False, poll_s=0.0, log=print)
    first = [left for name, step, left in seen if name == "grpo-seed0"]
    assert len(first) == 2 and all(left is not None and left > 0 for left in first)  # no cell had finished
