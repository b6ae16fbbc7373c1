"""The verl grid's scripts at work, with fake preset scripts in place of verl (bash only, seconds).

A fake ``examples/verl/kk_*.sh`` records its arguments, writes the metric lines it is told to the
file verl's logger would write (``VERL_FILE_LOGGER_PATH``), optionally waits (or waits for the stop
file and answers it as our trainers do), and exits with the status it is told. The scripts keep the cell's state with ``python -m tokenbalance.run.cell``: this
interpreter comes first on PATH, as a cluster node's environment has it. The real launch through
verl's trainer: tests/integrations/test_verl_grid_e2e.py.
"""

import fcntl
import json
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
if [[ -n "${FAKE_ANSWER_STOP:-}" ]]; then  # as our trainers: wait for the stop file, answer in it, fail
  echo $$ > "$RECORD.sleeper"
  until [[ -f "$TOKENBALANCE_STOP_FILE" ]]; do sleep 0.1; done
  echo "checkpoint global_step_1 saved before step 2" > "$TOKENBALANCE_STOP_FILE"
  exit 1
fi
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


pytestmark = pytest.mark.usefixtures("online")


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
        f"++ray_kwargs.ray_init.runtime_env.env_vars.TOKENBALANCE_STOP_FILE={directory}/STOP_REQUESTED",
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


MODEL_PRESET = 'echo "$MODEL_PATH" > "$RECORD.model"\nexit "${FAKE_EXIT:-0}"\n'


def test_each_cell_trains_its_own_models_path_and_records_it(work):
    (work["root"] / "examples" / "verl" / "kk_method.sh").write_text(MODEL_PRESET)
    done = run(work, cell(work) / "run.sh", MODEL_PATH_3B="/m/3b", MODEL_PATH_7B="/m/7b")
    assert done.returncode == 0, done.stderr
    assert (work["root"] / "record.model").read_text() == "/m/3b\n"
    record = json.loads((cell(work) / "launch.json").read_text())
    assert (record["MODEL"], record["MODEL_PATH"]) == ("3b", "/m/3b")
    done = run(work, cell(work, "ar-3b-seed0") / "run.sh")  # no copy named: the hub's model
    assert (work["root"] / "record.model").read_text() == "Qwen/Qwen2.5-3B-Instruct\n"


@pytest.mark.parametrize("dry_run", ["0", "1"])
def test_one_model_path_for_every_model_is_refused_before_anything(work, dry_run):
    (work["root"] / "examples" / "verl" / "kk_method.sh").write_text(MODEL_PRESET)
    done = run(work, cell(work) / "run.sh", MODEL_PATH="/m/3b", DRY_RUN=dry_run)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "== grpo-3b-seed0: MODEL_PATH='/m/3b' would train every model's cells on one model; set MODEL_PATH_3B "
        "(this cell's 3b) and the other models' MODEL_PATH_<MODEL> instead; nothing started"
    ]
    assert status(work) == "not started" and not (work["root"] / "record.model").exists()


def test_a_resume_that_changed_what_decides_the_numbers_is_refused_naming_it(work):
    script = cell(work) / "run.sh"
    assert run(work, script, FAKE_STEPS="0 1", FAKE_EXIT="3", DATA_DIR="/data/a").returncode == 3
    for env, changed in (
        ({"DATA_DIR": "/data/b"}, 'DATA_DIR changed ("/data/a" -> "/data/b")'),
        ({"DATA_DIR": "/data/a", "N_GPUS": "8"}, 'N_GPUS changed ("4" -> "8")'),
        ({"DATA_DIR": "/data/a", "MODEL_PATH_3B": "/m/3b"}, 'MODEL_PATH changed ("Qwen/Qwen2.5-3B-Instruct" -> '),
    ):
        for dry_run in ("1", "0"):  # a dry run says so before a job is submitted
            done = run(work, script, DRY_RUN=dry_run, **env)
            assert done.returncode == 2 and f"== grpo-3b-seed0: {changed}" in done.stderr, done.stderr
            assert "since the cell's earlier sittings (launch.json): resuming would mix two experiments" in done.stderr
    done = run(work, script, "trainer.total_epochs=9", DATA_DIR="/data/a")
    assert done.returncode == 2 and 'extra overrides changed ([] -> ["trainer.total_epochs=9"])' in done.stderr
    common = work["root"] / "examples" / "verl" / "common.sh"
    common.write_text("# edited\n")
    done = run(work, script, DATA_DIR="/data/a")
    assert done.returncode == 2 and "examples/verl/common.sh was edited (sha256 " in done.stderr
    common.write_text("")
    assert status(work).startswith("failed at step 2") and not (cell(work) / "metrics.sitting-2.jsonl").exists()
    done = run(work, script, FAKE_STEPS="1 2", DATA_DIR="/data/a")  # as before: it resumes
    assert done.returncode == 0 and status(work).startswith("completed: sitting 2"), done.stderr


def test_an_override_of_a_key_the_cell_sets_is_refused(work):
    done = run(work, cell(work) / "run.sh", "data.seed=5")
    assert done.returncode == 2 and "the override 'data.seed=5' sets data.seed, which the cell sets itself" in (
        done.stderr
    )
    assert status(work) == "not started"


def test_checkpoints_go_where_the_user_says_and_keep_only_what_resume_needs(work, tmp_path):
    scratch = tmp_path / "scratch"
    done = run(work, cell(work) / "run.sh", FAKE_STEPS="0 1", FAKE_EXIT="1", CHECKPOINT_ROOT=str(scratch))
    assert f"trainer.default_local_dir={scratch}/grpo-3b-seed0" in recorded(work, 1)
    assert (scratch / "grpo-3b-seed0" / ".tokenbalance-cell").read_text() == "grpo-3b-seed0\n"
    for step in (20, 40, 60):  # what verl left behind over sittings
        (scratch / "grpo-3b-seed0" / f"global_step_{step}").mkdir()
    (scratch / "grpo-3b-seed0" / "latest_checkpointed_iteration.txt").write_text("60")
    done = run(work, cell(work) / "run.sh", FAKE_STEPS="2", CHECKPOINT_ROOT=str(scratch))
    assert done.returncode == 0, done.stderr
    assert "removed the checkpoints global_step_20, global_step_40" in done.stdout
    assert sorted(p.name for p in (scratch / "grpo-3b-seed0").glob("global_step_*")) == ["global_step_60"]
    shared = f"trainer.default_local_dir={scratch / 'grpo-3b-seed0'}"  # one directory for every cell: refused
    done = run(work, cell(work, "ar-3b-seed0") / "run.sh", shared)
    assert done.returncode == 2 and f"the checkpoint directory {scratch / 'grpo-3b-seed0'} is cell grpo-3b-seed0's" in (
        done.stderr
    )


def slurm_run(work, grid_dir, **env) -> subprocess.Popen:
    fake_bin = work["root"] / "bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "scontrol").write_text('#!/usr/bin/env bash\necho "$@" > "$RECORD.scontrol"\n')
    (fake_bin / "scontrol").chmod(0o755)
    full = {
        **os.environ,
        "PATH": f"{fake_bin}{os.pathsep}{PATH}",
        "RECORD": str(work["record"]),
        "SLURM_SUBMIT_DIR": str(work["root"]),
        "SLURM_ARRAY_JOB_ID": "77",
        **env,
    }
    return subprocess.Popen(
        ["bash", str(grid_dir / "slurm_array.sh")], cwd=work["root"], env=full, stderr=subprocess.PIPE, text=True
    )


def wait_for_the_launch(work) -> None:
    sleeper = work["root"] / "record.sleeper"
    deadline = time.monotonic() + 30
    while not sleeper.exists() or not sleeper.read_text().strip():
        assert time.monotonic() < deadline, "the fake launch did not start"
        time.sleep(0.1)


def grace_timers(seconds: str) -> list[list[str]]:
    """The processes of slurm_array.sh's grace timers of ``seconds`` (``bash -c ... grace SECONDS PID``
    and its ``sleep SECONDS``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if (words[:2] == ["bash", "-c"] and words[3:5] == ["grace", seconds]) or words[:2] == ["sleep", seconds]:
            found.append(words)
    return found


@pytest.mark.parametrize(("restarts", "requeued"), [("0", True), ("8", False)])
def test_a_task_near_its_time_limit_stops_its_cell_and_requeues_itself(work, restarts, requeued):
    """Slurm's ``--signal=B:USR1@900`` before the time limit: the task asks the cell to stop
    (STOP_REQUESTED); a launch that does not answer within STOP_GRACE_S is stopped (STATUS failed,
    stopped by SIGTERM) and the task requeues itself, unless it has been requeued MAX_REQUEUES times."""
    slurm = (work["grid"] / "slurm_array.sh").read_text()
    assert "\n#SBATCH --exclusive\n" in slurm and "\n#SBATCH --requeue\n" in slurm
    assert "\n#SBATCH --signal=B:USR1@900\n" in slurm
    env = {"SLURM_ARRAY_TASK_ID": "0", "FAKE_STEPS": "0 1", "FAKE_SLEEP": "300", "SLURM_RESTART_COUNT": restarts}
    process = slurm_run(work, work["grid"], **env, MAX_REQUEUES="8", STOP_GRACE_S="1")
    wait_for_the_launch(work)
    process.send_signal(signal.SIGUSR1)
    _, err = process.communicate(timeout=30)
    assert status(work).startswith("failed at step 2: stopped by SIGTERM in sitting 1")
    assert status(work).endswith("; steps up to 1 logged; STOP_REQUESTED: not answered by the trainer")
    scontrol = work["root"] / "record.scontrol"
    if requeued:
        assert scontrol.read_text() == "requeue 77_0\n"
    else:
        assert not scontrol.exists() and "after 8 requeues (MAX_REQUEUES)" in err


def test_a_task_near_its_time_limit_lets_its_trainer_stop_with_a_checkpoint_then_requeues(work):
    """USR1: the task touches the cell's STOP_REQUESTED, the launch (as our trainers: it saves, answers
    in the file, ends) stops by itself before the grace (the grid's default, no SIGTERM), STATUS says
    "stopped on request", the grace timer ends with the task, and the task requeues itself."""
    slurm = (work["grid"] / "slurm_array.sh").read_text()
    assert "STOP_GRACE_S:-780}" in slurm  # 900 s lead - 120 s margin
    env = {"SLURM_ARRAY_TASK_ID": "0", "FAKE_STEPS": "0 1", "FAKE_ANSWER_STOP": "1"}
    process = slurm_run(work, work["grid"], **env)
    wait_for_the_launch(work)
    assert status(work).startswith("running: sitting 1")
    process.send_signal(signal.SIGUSR1)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 1, err
    assert status(work).startswith(
        "failed at step 2: stopped on request (STOP_REQUESTED): checkpoint global_step_1 saved before step 2 in sitting 1"
    )
    assert status(work).endswith("; steps up to 1 logged")
    assert (work["root"] / "record.scontrol").read_text() == "requeue 77_0\n"
    deadline = time.monotonic() + 10
    while grace_timers("780"):  # ended with the task (its process group killed)
        assert time.monotonic() < deadline, grace_timers("780")
        time.sleep(0.1)


def test_a_task_that_ends_on_its_own_is_not_requeued(work):
    process = slurm_run(work, work["grid"], SLURM_ARRAY_TASK_ID="0", FAKE_STEPS="0", FAKE_EXIT="1")
    assert process.wait(timeout=60) == 1
    assert not (work["root"] / "record.scontrol").exists() and status(work).startswith("failed at step 1")


def test_a_grid_written_in_the_repository_moves_with_it(work, tmp_path, monkeypatch):
    """Written from the repository root into it, the grid is named relative to it: the repository
    copied elsewhere (a cluster) runs its tasks there; a grid the script cannot find is one line."""
    monkeypatch.chdir(work["root"])
    assert main([*GRID, "--out", "runs/g"]) == 0
    assert "\nDEFAULT_GRID_DIR=runs/g/verl\n" in (work["root"] / "runs/g/verl/slurm_array.sh").read_text()
    moved = tmp_path / "cluster" / "repo"
    moved.parent.mkdir()
    work["root"].rename(moved)
    work = {**work, "root": moved, "record": moved / "record", "grid": moved / "runs" / "g" / "verl"}
    process = slurm_run(work, work["grid"], SLURM_ARRAY_TASK_ID="1")
    assert process.wait(timeout=60) == 0, process.stderr.read() if process.stderr else ""
    assert (work["grid"] / "cells" / "ar-3b-seed0" / "STATUS").read_text().startswith("completed")
    process = slurm_run(work, work["grid"], SLURM_ARRAY_TASK_ID="1", GRID_DIR=str(tmp_path / "nowhere"))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and err.strip().splitlines() == [
        f"array task 1: no grid in {tmp_path / 'nowhere'} (no cells.txt there, from {moved}): submit from the "
        "directory the grid was written from, or name it: sbatch --export=ALL,GRID_DIR=/path/to/verl ..."
    ]
