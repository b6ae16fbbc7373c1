"""The verl grid end to end on CPU: written by the command, run by its driver through verl's own
trainer, one cell killed and resumed, the table built from the cells' verl logs.

A 2-row (GRPO, + AR) x 1-seed x 2-step grid on the tiny model of the CPU harness
(``tests/integrations/verl_cpu``): ``tokenbalance ablate --runner verl`` writes it; the test runs
``OUT/verl/run_grid.sh`` from the repository root, as a user does, with the harness's CPU overrides
as the driver's extra hydra overrides (less the keys a cell sets itself: model path, logger,
directories; the model comes as ``MODEL_PATH_3B``) and a
validation split by people count (data sources ``kk_logic2`` and ``kk_logic3``; sampled, before
training and at step 2) and a checkpoint every step.

First sitting: the GRPO cell's reward (``verl_cpu/grid_reward.py``) pauses inside step 2, once its
step-1 checkpoint exists; the test sends its ``run.sh`` SIGTERM (as Slurm's time limit does). The cell
must say ``failed at step 2: stopped by SIGTERM``, the driver must go on to the + AR cell, run it
and end with exit status 1 naming the failed cell. Second sitting: the driver skips the completed
cell and resumes the GRPO cell from its step-1 checkpoint into a second metrics file. Then
``--report-only`` builds the table, whose numbers must equal the validation scores in the cells'
logs, and the resumed cell's metrics must cover every step. (At this scale both rows log the same
validation values after their two steps: the random policy's samples do not change between the two
updates. That the table keeps rows apart is checked on hand-made logs, tests/ablate/test_verl_report.py.)

Marked ``slow`` (three verl launches, minutes; the wall time of each sitting is printed with ``-s``).
"""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integrations.verl_cpu.stack import require_verl_stack

require_verl_stack("the verl grid end-to-end test")

from tests.integrations.verl_cpu.launch import REPO_ROOT, _kill_group, child_env, cpu_overrides, prepare_inputs
from tokenbalance.ablate.verl.results import merged_steps, read_sitting
from tokenbalance.cli import main
from tokenbalance.run.cell_launch import CELL_KEYS, override_key

pytestmark = pytest.mark.slow

GRID_REWARD = REPO_ROOT / "tests" / "integrations" / "verl_cpu" / "grid_reward.py"
GRID = ["ablate", "--runner", "verl", "--preset", "kk-smoke", "--methods", "grpo,ar", "--seeds", "0"]
GRID += ["--verl-models", "3b"]
KILLED, OTHER = "grpo-3b-seed0", "ar-3b-seed0"
LEVELS = (2, 3)
CELL_OWNED = {*CELL_KEYS, "trainer.default_local_dir"}  # a shared checkpoint directory would be refused
SITTING_TIMEOUT_S = 900  # two launches of ~90-100 s each here; a wrong Ray CPU count hangs silently


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict:
    """Write the grid, run it twice (a cell killed in the first sitting), build the report."""
    root = tmp_path_factory.mktemp("verl_grid")
    inputs = prepare_inputs(root / "inputs")
    validation = root / "inputs" / "val_{n}ppl.parquet"
    arguments = ["gen-data", "kk", "--people", "2-3", "--split", "test", "--count", "2", "--template", "plain"]
    assert main([*arguments, "--per-level-source", "--out", str(validation), "--quiet"]) == 0
    out = root / "grid"
    assert main([*GRID, "--out", str(out)]) == 0
    grid_dir = out / "verl"
    val_files = ",".join(str(validation).replace("{n}", str(n)) for n in LEVELS)
    harness = cpu_overrides(inputs, root / "unused", ranks=1, steps=2)
    overrides = [
        *(word for word in harness if override_key(word) not in CELL_OWNED),  # the cell sets these itself
        f"data.val_files=[{val_files}]",
        f"reward.custom_reward_function.path={GRID_REWARD}",
        "trainer.val_before_train=True",
        # sampled validation: greedy responses of the random tiny policy score alike everywhere, and the
        # report must find the mode in the cell's composed config (mean@1 of a sampled validation)
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "trainer.test_freq=2",
        "trainer.save_freq=1",
    ]
    paused = root / "paused"
    pause = {
        "GRID_TEST_PAUSE_AFTER": str(grid_dir / "cells" / KILLED / "checkpoints" / "latest_checkpointed_iteration.txt"),
        "GRID_TEST_PAUSED": str(paused),
    }
    pause_overrides = [f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={value}" for key, value in pause.items()]
    # each model's path (the cells pass it to the preset scripts); the harness's FSDP runs without offload
    model = {"MODEL_PATH_3B": str(inputs["model"]), "OFFLOAD": "0"}
    # the same overrides in both sittings (a resume with others is refused); the pause happens once
    first = run_driver(grid_dir, [*overrides, *pause_overrides], model, stop_when=paused)
    second = run_driver(grid_dir, [*overrides, *pause_overrides], model)
    report = main([*GRID, "--out", str(out), "--report-only"])
    return {"dir": grid_dir, "first": first, "second": second, "report": report}


def run_driver(grid_dir: Path, overrides: list[str], env_extra: dict[str, str], stop_when: Path | None = None) -> dict:
    """``bash run_grid.sh overrides`` from the repository root, in its own session; with ``stop_when``,
    SIGTERM to the killed cell's run.sh once that file exists. Returns exit status, output, wall time.
    Whatever still runs at the end is stopped: each running cell through its run.sh (whose trap stops
    the launch's process group), then the driver's session."""
    ray_tmp = tempfile.mkdtemp(prefix="tbray-")  # Ray's socket paths must stay short
    env = {
        **os.environ,
        **child_env(grid_dir),
        "RAY_TMPDIR": ray_tmp,
        **env_extra,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # the preset scripts' python
    }
    log = grid_dir.parent / f"driver-{time.monotonic_ns()}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(
            ["bash", str(grid_dir / "run_grid.sh"), *overrides],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            if stop_when is not None:
                stop_cell(process, grid_dir / "cells" / KILLED / "STATUS", stop_when, start)
            returncode = process.wait(timeout=max(1.0, SITTING_TIMEOUT_S - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            returncode = -signal.SIGKILL
        finally:
            stop_running_cells(grid_dir)
            _kill_group(process.pid)
    wall_s = time.monotonic() - start
    print(f"verl grid sitting: exit {returncode}, {wall_s:.0f} s wall")
    return {"returncode": returncode, "output": log.read_text(errors="replace"), "wall_s": wall_s}


def stop_cell(process: subprocess.Popen, status: Path, paused: Path, start: float) -> None:
    """Wait until the cell's reward has paused inside step 2, then SIGTERM the cell's run.sh (its STATUS names the pid)."""
    while not paused.exists():
        assert process.poll() is None, "the driver ended before the cell paused"
        assert time.monotonic() - start < SITTING_TIMEOUT_S, "the cell never reached its pause in step 2"
        time.sleep(0.5)
    line = status.read_text().split()
    assert line[:2] == ["running:", "sitting"], line
    os.kill(int(line[line.index("pid") + 1]), signal.SIGTERM)


def stop_running_cells(grid_dir: Path) -> None:
    for path in grid_dir.glob("cells/*/STATUS"):
        words = path.read_text().split()
        if words[:1] == ["running:"] and process_alive(pid := int(words[words.index("pid") + 1])):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.5)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def status(grid: dict, cell: str) -> str:
    return (grid["dir"] / "cells" / cell / "STATUS").read_text().strip()


def test_a_killed_cell_is_marked_failed_and_the_driver_goes_on(grid):
    first = grid["first"]
    assert first["returncode"] == 1, first["output"][-4000:]
    assert "failed cells (run this script again to resume them): grpo-3b-seed0" in first["output"]
    killed = grid["dir"] / "cells" / KILLED
    # the kill came inside step 2: the first sitting logged the validation before training and step 1
    assert [step for step, _ in read_sitting(killed / "metrics.sitting-1.jsonl")] == [0, 1]
    assert f"{OTHER}: completed: sitting 1" in first["output"]
    assert f"{KILLED}: failed at step 2: stopped by SIGTERM in sitting 1" in first["output"]


def test_the_second_sitting_resumes_the_killed_cell_and_skips_the_completed_one(grid):
    second = grid["second"]
    assert second["returncode"] == 0, second["output"][-4000:]
    assert status(grid, KILLED).startswith("completed: sitting 2")
    assert status(grid, OTHER).startswith("completed: sitting 1")
    assert f"== {OTHER}: completed: sitting 1" in second["output"] and "(skipped)" in second["output"]
    assert not (grid["dir"] / "cells" / OTHER / "metrics.sitting-2.jsonl").exists()
    killed = grid["dir"] / "cells" / KILLED
    # verl resumed from the step-1 checkpoint: it validated there again, then ran step 2 only
    assert [step for step, _ in read_sitting(killed / "metrics.sitting-2.jsonl")] == [1, 2]
    steps = merged_steps(killed)
    trained = [step for step, data in steps.items() if "timing_s/step" in data]
    assert trained == [1, 2], "the resumed cell's metrics do not cover every step"
    first_step_1 = dict(read_sitting(killed / "metrics.sitting-1.jsonl"))[1]
    assert steps[1]["actor/pg_loss"] == first_step_1["actor/pg_loss"]  # the first sitting's step 1 is kept


def logged_accuracy(grid: dict, cell: str, step: int) -> dict[int, float]:
    data = merged_steps(grid["dir"] / "cells" / cell)[step]
    return {n: data[f"val-aux/kk_logic{n}/correct/mean@1"] for n in LEVELS}


def test_the_table_equals_the_cells_logged_validation_scores(grid):
    assert grid["report"] == 0
    report = grid["dir"] / "report-3b"
    with open(report / "accuracy.csv") as table:
        rows = {(r["mode"], r["row"], r["column"]): r for r in csv.DictReader(table)}
    assert {mode for mode, _, _ in rows} == {"sample"}
    expected = {
        "grpo": logged_accuracy(grid, KILLED, 2),
        "ar": logged_accuracy(grid, OTHER, 2),
        "start": logged_accuracy(grid, KILLED, 0),
    }
    assert expected["start"] == logged_accuracy(grid, OTHER, 0)  # both rows start from the same policy
    assert len({value for values in expected.values() for value in values.values()}) > 1  # not all equal
    for row, values in expected.items():
        for n, value in values.items():
            assert float(rows[("sample", row, f"eval/sample/acc_{n}")]["mean"]) == value, (row, n)
        average = float(rows[("sample", row, "eval/sample/acc")]["mean"])
        assert average == math.fsum(values.values()) / len(values), row
    difference = float(rows[("sample", "ar", "eval/sample/acc_3")]["diff_mean"])
    assert difference == expected["ar"][3] - expected["grpo"][3]
    text = (report / "results.md").read_text()
    assert "cells complete: 2 of 2" in text and "sittings per cell: grpo-3b-seed0 2, ar-3b-seed0 1" in text
    assert "| 2 people | 3 people | Avg |" in text
    assert (report / "reward_curves.png").stat().st_size > 0
