"""A verl cell's sittings through ``python -m tokenbalance.run.cell``: a completed cell skipped, one
sitting at a time (the run lock, on the shell's descriptor), sittings counted, STATUS running /
completed / failed at the step after the last one logged, and the STATUS as the report shows it.
The scripts that run it: tests/ablate/test_verl_sittings.py."""

import os
import subprocess
import sys

import pytest

from tokenbalance.run import cell as cell_state
from tokenbalance.run.cell import cell_status, last_logged_step, line_status, main, next_sitting, sitting_files
from tokenbalance.run.lock import LOCK_FILE, RunLock, is_locked
from tokenbalance.run.state import RunStatus


@pytest.fixture
def cell_dir(tmp_path):
    path = tmp_path / "cells" / "grpo-3b-seed0"
    path.mkdir(parents=True)
    (path / "STATUS").write_text("not started\n")
    return path


def begin(cell_dir, capfd) -> tuple[str, str, int]:
    """``begin`` as run_cell.sh runs it: the lock file open in the "shell" (kept open after)."""
    shell = os.open(cell_dir / LOCK_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        assert main(["begin", str(cell_dir), "grpo-3b-seed0", "--pid", str(os.getpid()), "--lock-fd", str(shell)]) == 0
    except SystemExit:  # refused: the "shell" exits
        os.close(shell)
        raise
    out = capfd.readouterr()
    return out.out, out.err, shell


def end(cell_dir, metrics, capfd, *flags) -> tuple[str, str]:
    main(["end", str(cell_dir), "grpo-3b-seed0", "--metrics", metrics, *flags])
    out = capfd.readouterr()
    return out.out, out.err


def status(cell_dir) -> str:
    return (cell_dir / "STATUS").read_text()


def test_a_sitting_takes_the_lock_counts_and_ends_completed(cell_dir, capfd):
    out, _, shell = begin(cell_dir, capfd)
    metrics = str(cell_dir / "metrics.sitting-1.jsonl")
    assert out.splitlines() == [f"== grpo-3b-seed0: sitting 1 (metrics: {metrics})", metrics]
    assert status(cell_dir).startswith(f"running: sitting 1 on {os.uname().nodename} pid {os.getpid()} since ")
    assert is_locked(cell_dir)  # held while the "shell" keeps its descriptor
    out, _ = end(cell_dir, metrics, capfd, "--exit", "0")
    assert out == "== grpo-3b-seed0: completed\n" and status(cell_dir).startswith("completed: sitting 1 on ")
    os.close(shell)
    assert not is_locked(cell_dir)
    out, _, shell = begin(cell_dir, capfd)
    os.close(shell)
    assert out.startswith("== grpo-3b-seed0: completed: sitting 1 on ") and out.endswith(" (skipped)\n\n")


def test_a_failed_sitting_names_the_step_after_the_last_one_logged(cell_dir, capfd):
    (cell_dir / "metrics.sitting-1.jsonl").write_text('{"step":0,"data":{}}\n{"step":1,"data":{}}\n')
    (cell_dir / "metrics.sitting-2.jsonl").write_text('{"step":1,"data":{}}\n{"step":2,"da')  # torn by a kill
    (cell_dir / "metrics.sitting-x.jsonl").write_text('{"step":9,"data":{}}\n')  # not a sitting's name
    assert next_sitting(cell_dir) == 3 and last_logged_step(cell_dir) == 2
    out, _, shell = begin(cell_dir, capfd)
    assert out.splitlines()[-1] == str(cell_dir / "metrics.sitting-3.jsonl")
    _, err = end(cell_dir, out.splitlines()[-1], capfd, "--exit", "0", "--signal", "TERM")
    os.close(shell)
    assert status(cell_dir).startswith("failed at step 3: stopped by SIGTERM in sitting 3 on ")
    assert status(cell_dir).endswith("; steps up to 2 logged\n") and err == f"== grpo-3b-seed0: {status(cell_dir)}"
    _, err = end(cell_dir, str(cell_dir / "metrics.sitting-3.jsonl"), capfd, "--exit", "3")
    assert status(cell_dir).startswith("failed at step 3: exit status 3 in sitting 3 on ")


def test_a_sitting_stopped_on_request_says_so_and_the_next_sitting_removes_the_request(cell_dir, capfd):
    """STOP_REQUESTED (touched by the user or slurm_array.sh; the trainer writes its answer into it):
    answered and ended by itself reads "stopped on request"; a signal or an exit before an answer keeps
    its reason and says what became of the request; a completed launch stays completed."""
    (cell_dir / "metrics.sitting-1.jsonl").write_text('{"step":1,"data":{}}\n{"step":2,"data":{}}\n')
    stop = cell_dir / cell_state.STOP_FILE
    stop.write_text("checkpoint global_step_2 saved before step 3\n")
    out, _, shell = begin(cell_dir, capfd)  # an earlier sitting's request: removed
    assert (
        out.splitlines()[0]
        == "== grpo-3b-seed0: removed STOP_REQUESTED (a stop request answers the sitting it was made in)"
    )
    assert not stop.exists()
    metrics = out.splitlines()[-1]
    stop.write_text("checkpoint global_step_2 saved before step 3\n")
    end(cell_dir, metrics, capfd, "--exit", "1")
    assert status(cell_dir).startswith(
        "failed at step 3: stopped on request (STOP_REQUESTED): checkpoint global_step_2 saved before step 3 in sitting 2 on "
    )
    assert status(cell_dir).endswith("; steps up to 2 logged\n")
    end(cell_dir, metrics, capfd, "--exit", "0", "--signal", "TERM")  # the grace ran out after the answer
    assert status(cell_dir).startswith("failed at step 3: stopped by SIGTERM in sitting 2 on ")
    assert status(cell_dir).endswith(
        "; steps up to 2 logged; STOP_REQUESTED: checkpoint global_step_2 saved before step 3\n"
    )
    stop.write_text("")  # touched, not answered
    end(cell_dir, metrics, capfd, "--exit", "0", "--signal", "TERM")
    assert status(cell_dir).endswith("; steps up to 2 logged; STOP_REQUESTED: not answered by the trainer\n")
    end(cell_dir, metrics, capfd, "--exit", "1")
    assert status(cell_dir).startswith("failed at step 3: exit status 1 in sitting 2 on ")
    assert status(cell_dir).endswith("; STOP_REQUESTED: not answered by the trainer\n")
    end(cell_dir, metrics, capfd, "--exit", "0")
    os.close(shell)
    assert status(cell_dir).startswith("completed: sitting 2 on ")


def test_a_cell_another_process_holds_is_refused(cell_dir, capfd):
    with RunLock(cell_dir), pytest.raises(SystemExit) as stop:
        begin(cell_dir, capfd)
    assert stop.value.code == cell_state.LOCKED_EXIT == 75
    assert capfd.readouterr().err == "== grpo-3b-seed0: another process runs this cell (not started); not started\n"
    assert status(cell_dir) == "not started\n" and sitting_files(cell_dir) == []


def test_a_directory_hydra_cannot_parse_is_refused_before_the_lock(tmp_path, capfd):
    cell_dir = tmp_path / "a b" / "cell"
    cell_dir.mkdir(parents=True)
    with pytest.raises(SystemExit) as stop:
        begin(cell_dir, capfd)
    assert stop.value.code == 2 and "characters hydra cannot take in an override" in capfd.readouterr().err
    assert not (cell_dir / "STATUS").exists() and not is_locked(cell_dir)


def test_status_lines_read_as_run_statuses():
    assert line_status("completed: sitting 2 on node at t") is RunStatus.COMPLETED
    assert line_status("failed at step 3: exit status 1") is RunStatus.FAILED
    assert line_status("running: sitting 1 on node pid 1 since t") is RunStatus.RUNNING
    assert line_status("not started") is None and line_status(None) is None


def test_a_running_cell_whose_process_is_gone_reads_stopped(tmp_path):
    cell = tmp_path / "cell"
    assert cell_status(cell) == "not started"
    cell.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = os.uname().nodename
    (cell / "STATUS").write_text(f"running: sitting 2 on {host} pid {gone.pid} since t\n")
    assert (
        cell_status(cell)
        == f"stopped: sitting 2 on {host} pid {gone.pid} since t; its process is gone (run the cell again to resume)"
    )
    (cell / "STATUS").write_text(f"running: sitting 2 on {host} pid {os.getpid()} since t\n")
    assert cell_status(cell).startswith("running: sitting 2")


def test_the_entry_point_runs_with_the_standard_library_only(cell_dir):
    """A cluster node runs it in the launch's environment: importing it loads no torch, numpy or yaml."""
    code = (
        "import sys; from tokenbalance.run.cell import main; main(['status', sys.argv[1]]); "
        "assert not {'torch', 'numpy', 'yaml'} & set(sys.modules), sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(cell_dir)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "not started\n"
