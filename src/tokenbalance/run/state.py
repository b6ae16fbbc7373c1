"""A run directory's files and state: ``run_state.json`` (a :class:`RunStatus` and the step), read and written only
here, and :class:`RunDirState`, read without writing. Standard library only (the verl cell imports it).
docs/training.md "The run directory"."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from tokenbalance.outputs import write_text_atomic
from tokenbalance.run.checkpoints import checkpoint_step
from tokenbalance.run.lock import LOCK_FILE, is_locked

CONFIG_FILE = "config.yaml"
RUN_STATE_FILE = "run_state.json"
# each evaluation's per-example outcomes, one line per (step, mode), so that two runs evaluated on the same examples
# can be compared example by example (McNemar: ablate's paired outcomes)
EVAL_OUTCOMES = "eval_outcomes.jsonl"
LOG_FILE = "train.log"  # the progress lines (trainer/progress.py), appended from the start of each sitting
NOT_A_RUN = (LOCK_FILE, LOG_FILE)  # what a run directory holds before its run has begun (config.yaml)
NOT_STARTED = "not started"  # what a reader shows for a run (or a verl cell) with no state yet


class RunStatus(str, Enum):
    """The ``status`` of ``run_state.json`` (its value is the string on disk)."""

    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, an exit: with the reason
    FAILED = "failed"  # with the error

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object) -> RunStatus | None:
        """The status ``value`` names; None for anything else (a missing or foreign value)."""
        return next((status for status in cls if status.value == value), None)


def read_run_state(run_dir: Path) -> dict:
    """``run_state.json`` as a dict; empty when it is missing or unreadable (a run killed before writing it:
    :class:`RunDirState` then goes by the checkpoints)."""
    try:
        state = json.loads((Path(run_dir) / RUN_STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def run_status(run_dir: Path) -> RunStatus | None:
    """The status ``run_state.json`` records; None when there is none."""
    return RunStatus.parse(read_run_state(run_dir).get("status"))


def write_run_state(run_dir: Path, status: RunStatus, **extra) -> None:
    """Replace ``run_state.json`` (atomically) with ``status`` and ``extra`` (the step, ...)."""
    text = json.dumps({"status": RunStatus(status).value, **extra}, indent=1) + "\n"
    write_text_atomic(Path(run_dir) / RUN_STATE_FILE, text)


def resume_command(run_dir: Path) -> str:
    return f"tokenbalance train --resume {shlex.quote(str(run_dir))}"


def write_end_status(run_dir: Path, err: BaseException) -> None:
    """``run_state.json`` of a run stopped by ``err``: ``interrupted`` (Ctrl-C, SIGTERM, an exit) or ``failed``, with
    the step a resume continues from (its last checkpoint) and the command; left as it is when it cannot be written (a
    full disk: the resume then reports the stale ``running``)."""
    if isinstance(err, KeyboardInterrupt):
        status, cause = RunStatus.INTERRUPTED, {"reason": str(err) or "interrupted (Ctrl-C)"}
    elif isinstance(err, SystemExit):  # asked to exit (e.g. by a library when its output pipe closed)
        status, cause = RunStatus.INTERRUPTED, {"reason": f"exit requested (SystemExit {err.code})"}
    else:
        status, cause = RunStatus.FAILED, {"error": f"{type(err).__name__}: {err}"}
    try:
        write_run_state(run_dir, status, step=checkpoint_step(run_dir), **cause, resume=resume_command(run_dir))
    except OSError:
        pass


def last_logged_step(run_dir: Path) -> int:
    """The step of the last complete record of ``metrics.jsonl`` (0 when there is none, or when the file cannot be
    read: a progress display must not stop on it); a torn last line is passed over."""
    from tokenbalance.diagnostics.sinks import metrics_path, parse_metrics_lines

    try:
        records, _ = parse_metrics_lines(metrics_path(run_dir))
    except (OSError, ValueError):  # missing, not UTF-8, or a malformed line (named by the report)
        return 0
    return int(records[-1][1].get("step", 0)) if records else 0


def has_final_eval(run_dir: Path, step: int) -> bool:
    """Whether ``metrics.jsonl`` holds the evaluation of step ``step`` (a torn last line does not count: a run killed
    while writing it has not recorded it)."""
    from tokenbalance.diagnostics.sinks import metrics_path, parse_metrics_lines

    path = metrics_path(run_dir)
    if not path.is_file():
        return False
    records, _ = parse_metrics_lines(path)
    return any(r.get("kind") == "eval" and r.get("step") == step for _, r in records)


@dataclass(frozen=True)
class RunDirState:
    """What ``path`` holds now (read only): ``has_config`` (``config.yaml``: a run started there), ``has_files``
    (anything but the lock), ``status`` and ``state_step`` from ``run_state.json``, ``resume_step`` (the checkpoint a
    resume continues from, 0 when none) and ``locked`` (a live process holds the run)."""

    path: Path
    has_config: bool
    has_files: bool
    status: RunStatus | None
    state_step: int
    resume_step: int
    locked: bool

    @classmethod
    def read(cls, path: Path) -> RunDirState:
        path = Path(path)
        state = read_run_state(path)
        try:
            state_step = int(state.get("step", 0) or 0)
        except (TypeError, ValueError):
            state_step = 0
        return cls(
            path=path,
            has_config=(path / CONFIG_FILE).is_file(),
            has_files=path.is_dir() and any(e.name not in NOT_A_RUN for e in path.iterdir()),
            status=RunStatus.parse(state.get("status")),
            state_step=state_step,
            resume_step=checkpoint_step(path),
            locked=is_locked(path),
        )

    @property
    def completed(self) -> bool:
        return self.status is RunStatus.COMPLETED
