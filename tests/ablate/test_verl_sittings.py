"""The verl grid's scripts at work, with fake preset scripts in place of verl (bash only, seconds).

A fake ``examples/verl/kk_*.sh`` records its arguments, writes the metric lines it is told to the
file verl's logger would write (``VERL_FILE_LOGGER_PATH``), optionally waits, and exits with the
status it is told. The scripts keep the cell's state with ``python -m tokenbalance.run.cell``: this
interpreter comes first on PATH, as a cluster node's environment has it. The real launch through
verl's trainer: tests/integrations/test_verl_grid_e2e.py.
"""

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenbalance.cli import main
from tokenbalance.outputs import MANIFEST, written_files

FAKE_PRESET = """echo "fake launch of $MODEL"
printf '%s\\n' "$MODEL" "$@" > "$RECORD.$(basename "${VERL_FILE_LOGGER_PATH:-dry-run}")"
for step in ${FAKE_STEPS:-}; do printf '{"step":%s,"data":{"timing_s/step":1.5}}\\n' "$step" >> "$VERL_FILE_LOGGER_PATH"; done
if [[ -n "${FAKE_SLEEP:-}" ]]; then sleep "$FAKE_SLEEP" & echo $! > "$RECORD.sleeper"; wait; fi
exit "${FAKE_EXIT:-0}"
"""
GRID = ["ablate", "--runner", "verl", "--preset", "kk-smoke", "--methods", "grpo,ar", "--seeds", "0"]
GRID += ["--verl-models", "3b"]
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the `python` the scripts run


@pytest.fixture
def work(tmp_path):
    """A repository root with fake preset scripts, and the grid written beside it."""
    root = tmp_path / "work"
    fake = root / "examples" / "verl"
    fake.mkdir(parents=True)
    (fake / "common.sh").write_text("")
    for name in ("kk_method.sh",):  # the script every cell launches
        (fake / name).write_text(FAKE_PRESET)
    out = tmp_path / "out"
    assert main([*GRID, "--out", str(out)]) == 0
    return {"root": root, "grid": out / "verl", "record": root / "record"}


def run(work, script, *args, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "PATH": PATH, "RECORD": str(work["record"]), **env}
    return subprocess.run(["bash", str(script), *args], cwd=work["root"], env=full, capture_output=True, text=True)


def cell(work, name="grpo-3b-seed0"):
    return work["grid"] / "cells" / name


def status(work, name="grpo-3b-seed0") -> str:
    return (cell(work, name) / "STATUS").read_text().strip()


def recorded(work, sitting: int, name="grpo-3b-seed0") -> list[str]:
    return (work["root"] / f"record.metrics.sitting-{sitting}.jsonl").read_text().splitlines()


def test_a_failed_sitting_says_where_and_the_next_resumes_into_its_own_file(work):
    script = cell(work) / "run.sh"
    done = run(work, script, FAKE_STEPS="0 1 2", FAKE_EXIT="3")
    assert done.returncode == 3
    assert status(work).startswith("failed at step 3: exit status 3 in sitting 1 on ")
    assert status(work).endswith("; steps up to 2 logged")
    first = (cell(work) / "metrics.sitting-1.jsonl").read_text()
    done = run(work, script, FAKE_STEPS="2 3 4")
    assert done.returncode == 0, done.stderr
    assert status(work).startswith("completed: sitting 2 on ")
    assert (cell(work) / "metrics.sitting-1.jsonl").read_text() == first  # the earlier sitting's metrics stay
    assert [line.split(",")[0] for line in (cell(work) / "metrics.sitting-2.jsonl").read_text().splitlines()] == [
        '{"step":2',
        '{"step":3',
        '{"step":4',
    ]
    assert "trainer.resume_mode=auto" in recorded(work, 2)
    again = run(work, script, FAKE_STEPS="9")
    assert again.returncode == 0 and "(skipped)" in again.stdout
    assert not (cell(work) / "metrics.sitting-3.jsonl").exists()


def test_the_cell_runs_its_launch_with_extra_overrides_between_its_checkpoints_and_its_own(work):
    """The cell's checkpoint directory comes before the extra overrides (a user's
    trainer.default_local_dir moves it), the cell's seed, name and directories after them."""
    done = run(work, cell(work, "ar-3b-seed0") / "run.sh", "trainer.total_epochs=1", "a=b c")
    assert done.returncode == 0, done.stderr
    directory = cell(work, "ar-3b-seed0")
    assert recorded(work, 1) == [
        "3b",  # MODEL from the launch line (the fake preset prints it first)
        f"trainer.default_local_dir={directory}/checkpoints",
        "trainer.total_epochs=1",
        "a=b c",
        "trainer.experiment_name=ar-3b-seed0",
        "data.seed=0",
        "actor_rollout_ref.rollout.seed=0",
        "trainer.resume_mode=auto",
        "trainer.logger=[console,file]",
        f"hydra.run.dir={directory}/hydra",
        f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={directory}/metrics.sitting-1.jsonl",
    ]
    assert "fake launch of 3b" in done.stdout and "fake launch of 3b" in (directory / "train.log").read_text()


def test_the_driver_goes_on_past_a_failed_cell_and_lists_it(work):
    done = run(work, work["grid"] / "run_grid.sh", FAKE_STEPS="0 1", FAKE_EXIT="1")
    assert done.returncode == 1
    assert "failed cells (run this script again to resume them): grpo-3b-seed0 ar-3b-seed0" in done.stderr
    assert status(work, "ar-3b-seed0").startswith("failed at step 2: exit status 1 in sitting 1")  # it ran
    done = run(work, work["grid"] / "run_grid.sh", FAKE_STEPS="1 2")
    assert done.returncode == 0, done.stderr
    assert "grpo-3b-seed0: completed: sitting 2" in done.stdout and "ar-3b-seed0: completed: sitting 2" in done.stdout


def test_a_stopped_cell_ends_its_whole_launch_and_says_so(work):
    """SIGTERM to run.sh (Slurm's time limit, scancel) stops the launch's process group, down to the
    preset's own child, marks the cell failed, and run.sh ends by the same signal."""
    env = {**os.environ, "PATH": PATH, "RECORD": str(work["record"]), "FAKE_STEPS": "0 1", "FAKE_SLEEP": "300"}
    process = subprocess.Popen(["bash", str(cell(work) / "run.sh")], cwd=work["root"], env=env)
    sleeper = work["root"] / "record.sleeper"
    deadline = time.monotonic() + 30
    while not sleeper.exists() or not sleeper.read_text().strip():
        assert time.monotonic() < deadline, "the fake launch did not start"
        time.sleep(0.1)
    words = status(work).split()
    assert words[:3] == ["running:", "sitting", "1"]
    os.kill(int(words[words.index("pid") + 1]), signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    assert status(work).startswith("failed at step 2: stopped by SIGTERM in sitting 1")
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the preset's child (a grandchild of run.sh) ends with its group
            os.kill(int(sleeper.read_text()), 0)
            time.sleep(0.1)


def test_one_sitting_of_a_cell_at_a_time(work):
    with open(cell(work) / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a sitting elsewhere holds it
        done = run(work, cell(work) / "run.sh", FAKE_STEPS="0")
    assert done.returncode == 75 and "another process runs this cell (not started)" in done.stderr
    assert status(work) == "not started" and not (cell(work) / "metrics.sitting-1.jsonl").exists()


def test_a_dry_run_changes_nothing(work):
    done = run(work, work["grid"] / "run_grid.sh", DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    directory = cell(work, "ar-3b-seed0")
    assert (work["root"] / "record.dry-run").read_text().splitlines()[1:] == [  # the sitting's, but its files
        f"trainer.default_local_dir={directory}/checkpoints",
        "trainer.experiment_name=ar-3b-seed0",
        "data.seed=0",
        "actor_rollout_ref.rollout.seed=0",
        "trainer.resume_mode=auto",
        "trainer.logger=[console,file]",
    ]
    assert status(work) == "not started" and sorted(p.name for p in cell(work).iterdir()) == ["STATUS", "run.sh"]


@pytest.mark.parametrize("value", ["true", "yes", "YES", "1"])
def test_every_true_looking_dry_run_is_a_dry_run(work, value):
    """The driver and a cell alone: ``DRY_RUN=true`` / ``yes`` compose and change nothing, as ``1``."""
    for script in (work["grid"] / "run_grid.sh", cell(work) / "run.sh"):
        done = run(work, script, DRY_RUN=value)
        assert done.returncode == 0, done.stderr
        assert (work["root"] / "record.dry-run").is_file()
        (work["root"] / "record.dry-run").unlink()
    assert status(work) == "not started" and sorted(p.name for p in cell(work).iterdir()) == ["STATUS", "run.sh"]


@pytest.mark.parametrize("script", ["run_grid.sh", "cells/grpo-3b-seed0/run.sh", "slurm_array.sh"])
def test_a_dry_run_value_that_is_not_yes_or_no_is_refused_before_anything(work, script):
    done = run(
        work, work["grid"] / script, DRY_RUN="maybe", SLURM_ARRAY_TASK_ID="0", SLURM_SUBMIT_DIR=str(work["root"])
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "DRY_RUN must be 1/true/yes (a dry run) or 0/false/no/unset (a real sitting), got 'maybe'; nothing started"
    ]
    assert status(work) == "not started" and not list(work["root"].glob("record*"))
    assert not (cell(work) / ".lock").exists()


def test_a_real_sitting_passes_dry_run_0_to_the_launch(work):
    (work["root"] / "examples" / "verl" / "kk_method.sh").write_text('echo "DRY_RUN=$DRY_RUN" > "$RECORD.env"\n')
    done = run(work, cell(work) / "run.sh", DRY_RUN="no")
    assert done.returncode == 0, done.stderr
    assert (work["root"] / "record.env").read_text() == "DRY_RUN=0\n" and status(work).startswith("completed")


def test_a_slurm_task_runs_its_line_of_cells_txt(work):
    done = run(work, work["grid"] / "slurm_array.sh", SLURM_ARRAY_TASK_ID="1", SLURM_SUBMIT_DIR=str(work["root"]))
    assert done.returncode == 0, done.stderr
    assert status(work, "ar-3b-seed0").startswith("completed: sitting 1") and status(work) == "not started"
    done = run(work, work["grid"] / "slurm_array.sh", SLURM_ARRAY_TASK_ID="2", SLURM_SUBMIT_DIR=str(work["root"]))
    assert done.returncode == 2 and "array task 2: no line 3 in" in done.stderr
    env = {key: value for key, value in os.environ.items() if key != "SLURM_ARRAY_TASK_ID"}
    done = subprocess.run(["bash", str(work["grid"] / "slurm_array.sh")], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "submit this script with sbatch" in done.stderr


def test_a_grid_written_with_a_relative_out_runs_from_the_repository_root(work, tmp_path, monkeypatch):
    """``--out rel`` written in one directory, submitted from the repository root (where Slurm
    runs each task): the grid is not below the submit directory, so the tasks find it by the absolute
    path it was written at."""
    (tmp_path / "written-here").mkdir()
    monkeypatch.chdir(tmp_path / "written-here")
    assert main([*GRID, "--out", "rel"]) == 0
    grid_dir = tmp_path / "written-here" / "rel" / "verl"
    slurm = (grid_dir / "slurm_array.sh").read_text()
    assert "\nDEFAULT_GRID_DIR=rel/verl\n" in slurm and f"\nWRITTEN_GRID_DIR={grid_dir}\n" in slurm
    for task in ("0", "1"):
        done = run(work, grid_dir / "slurm_array.sh", SLURM_ARRAY_TASK_ID=task, SLURM_SUBMIT_DIR=str(work["root"]))
        assert done.returncode == 0, done.stderr
    assert all(
        (grid_dir / "cells" / c / "STATUS").read_text().startswith("completed")
        for c in ("grpo-3b-seed0", "ar-3b-seed0")
    )


HOSTILE = "a b'c\"d $(touch PWNED) `touch PWNED2` ${HOME} \\ newline\nhere ünï"


def test_every_embedded_value_is_data(tmp_path):
    """Written under a hostile --out, the scripts run (DRY_RUN, fake presets) and create nothing they
    were not asked to; the Slurm script's default grid directory is the path exactly; a real sitting
    refuses the directory that hydra could not parse, before anything starts."""
    out = tmp_path / HOSTILE
    assert main([*GRID, "--methods", "grpo", "--out", str(out)]) == 0
    grid_dir = out / "verl"
    assert written_files(out) == {"verl"} and (out / MANIFEST).is_file()
    for script in ("run_grid.sh", "slurm_array.sh", "run_cell.sh", "cells/grpo-3b-seed0/run.sh"):
        assert os.access(grid_dir / script, os.X_OK), script
    root = tmp_path / "work"
    (root / "examples" / "verl").mkdir(parents=True)
    (root / "examples" / "verl" / "common.sh").write_text("")
    (root / "examples" / "verl" / "kk_method.sh").write_text(FAKE_PRESET)
    work = {"root": root, "grid": grid_dir, "record": root / "record"}
    done = run(work, grid_dir / "run_grid.sh", DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    assert "trainer.experiment_name=grpo-3b-seed0" in (root / "record.dry-run").read_text().splitlines()
    probe = (
        (grid_dir / "slurm_array.sh")
        .read_text()
        .replace('cd "$', 'printf "%s" "$GRID_DIR" > "$RECORD.dir"; exit 0; cd "$', 1)
    )
    (root / "probe.sh").write_text(probe)
    assert run(work, root / "probe.sh").returncode == 0
    assert (root / "record.dir").read_text() == str(grid_dir)
    done = run(work, grid_dir / "cells" / "grpo-3b-seed0" / "run.sh", FAKE_STEPS="0")
    assert done.returncode == 2 and "characters hydra cannot take in an override" in done.stderr
    assert (grid_dir / "cells" / "grpo-3b-seed0" / "STATUS").read_text() == "not started\n"
    assert not list(tmp_path.rglob("PWNED*"))
    assert sorted(p.name for p in root.iterdir()) == ["examples", "probe.sh", "record.dir", "record.dry-run"]
