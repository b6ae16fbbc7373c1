"""``run_state.json``: one status enum whose values are the strings on disk, one write and one read,
the same bytes as every committed record, and the state a run directory is read as."""

import json
from pathlib import Path

import pytest

from tokenbalance.run.lock import RunLock
from tokenbalance.run.state import (
    RUN_STATE_FILE,
    RunDirState,
    RunStatus,
    read_run_state,
    run_status,
    write_end_status,
    write_run_state,
)

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_the_status_values_are_the_strings_on_disk():
    assert [s.value for s in RunStatus] == ["running", "completed", "interrupted", "failed"]
    assert (
        RunStatus.COMPLETED == "completed" and f"{RunStatus.FAILED}" == "failed" and str(RunStatus.RUNNING) == "running"
    )
    assert json.dumps({"status": RunStatus.INTERRUPTED}) == '{"status": "interrupted"}'
    assert RunStatus.parse("completed") is RunStatus.COMPLETED
    assert RunStatus.parse("done") is None and RunStatus.parse(None) is None and RunStatus.parse(3) is None


def test_every_committed_record_reads_and_is_written_back_byte_for_byte(tmp_path):
    records = sorted(RESULTS.rglob(RUN_STATE_FILE))
    assert len(records) >= 10
    for record in records:
        state = read_run_state(record.parent)
        assert run_status(record.parent) is RunStatus.COMPLETED, record
        write_run_state(tmp_path, RunStatus.parse(state.pop("status")), **state)
        assert (tmp_path / RUN_STATE_FILE).read_bytes() == record.read_bytes(), record


def test_a_missing_or_foreign_state_reads_empty(tmp_path):
    assert read_run_state(tmp_path) == {} and run_status(tmp_path) is None
    (tmp_path / RUN_STATE_FILE).write_text("[1, 2]")
    assert read_run_state(tmp_path) == {}
    (tmp_path / RUN_STATE_FILE).write_text('{"status": "paused", "step": "x"}')
    state = RunDirState.read(tmp_path)
    assert (state.status, state.state_step, state.completed, state.has_config) == (None, 0, False, False)


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (KeyboardInterrupt("terminated (SIGTERM)"), ("interrupted", "reason", "terminated (SIGTERM)")),
        (KeyboardInterrupt(), ("interrupted", "reason", "interrupted (Ctrl-C)")),
        (SystemExit(3), ("interrupted", "reason", "exit requested (SystemExit 3)")),
        (OSError("disk full"), ("failed", "error", "OSError: disk full")),
    ],
)
def test_the_end_status_says_how_the_run_stopped(tmp_path, err, expected):
    write_end_status(tmp_path, err)
    state = json.loads((tmp_path / RUN_STATE_FILE).read_text())
    status, key, text = expected
    assert (state["status"], state["step"], state[key]) == (status, 0, text)
    assert state["resume"] == f"tokenbalance train --resume {tmp_path}"


def test_the_state_of_a_locked_completed_run(tmp_path):
    (tmp_path / "config.yaml").write_text("")
    write_run_state(tmp_path, RunStatus.COMPLETED, step=4)
    with RunLock(tmp_path):
        state = RunDirState.read(tmp_path)
    assert (state.status, state.state_step, state.resume_step, state.locked) == (RunStatus.COMPLETED, 4, 0, True)
    assert state.completed and state.has_config and state.has_files
    assert not RunDirState.read(tmp_path).locked
