"""The run directory's safety: who may write it, what a new run may start in, and the repairs a
resume makes after a process was killed.

* :func:`check_new_run_dir`: a new run starts only in a new or empty directory; one holding a run
  (``config.yaml`` with ``run_state.json``, ``metrics.jsonl`` or ``checkpoints/``) is refused with
  the ``--resume`` command, one holding anything else with a request for another directory
  (nothing in it is deleted or overwritten).
* :class:`RunLock`: one process at a time per run directory (an exclusive ``flock`` on
  ``RUN_DIR/.lock``, which names the holder's pid, host and start time; the kernel releases it
  when the holder exits, however it exits, so a lock is never stale).
* :func:`clean_interrupted_writes`: the temporary files and half-written checkpoint folders an
  interrupted process left (names only tokenbalance writes: ``checkpoints/.step_*``,
  ``.config.yaml.*``, ``.run_state.json.*``, ``checkpoints/.latest.*``).
* :func:`recover_latest`: a missing or dangling ``checkpoints/latest`` pointer is re-pointed at the
  newest complete ``step_*`` (a resume never starts over at step 0 over its own checkpoints);
  :func:`verify_checkpoint` reads every file of that checkpoint's headers before the model loads.
* :class:`RunDirState`: what a run directory holds, read without writing anything: its config, its
  status, the step a resume continues from (the trainer's rule, :func:`resume_checkpoint`) and
  whether a live process holds it. ``tokenbalance train --resume`` and the grid both decide from
  it; :func:`last_logged_step` reports progress.
* :data:`RESUMABLE_KEYS` and :func:`changed_setting`: the settings a new sitting of a run may
  change (how long it goes on and how it runs or reports), the same for ``train --resume`` and for
  the grid's cells.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.config import RunConfig, absolute_paths, to_dict
from tokenbalance.outputs import check_writable_dir
from tokenbalance.trainer.checkpoint import (
    OPTIMIZER_FILE,
    STATE_FILE,
    checkpoint_dirs,
    checkpoint_step,
    resume_checkpoint,
    write_text_atomic,
)

LOCK_FILE = ".lock"
LOG_FILE = "train.log"  # the progress lines (trainer/progress.py), appended from the start of each sitting
NOT_A_RUN = (LOCK_FILE, LOG_FILE)  # what a run directory holds before its run has begun (config.yaml)
RUN_STATE_FILE = "run_state.json"
RUN_FILES = ("config.yaml", "metrics.jsonl", RUN_STATE_FILE, "checkpoints")  # a run: the first and another

# What a new sitting of a run may change: how long it goes on and how it runs and reports. Anything
# else would make the continued run a different experiment from the one its checkpoints belong to.
# (train.threads changes the numbers from that step on, not what is computed: docs/training.md.)
RESUMABLE_KEYS = (
    "train.steps",
    "train.eval_every",
    "train.save_every",
    "train.keep_checkpoints",
    "train.device",
    "train.threads",
    "sft.save_every",
    "output.run_dir",
    "output.progress",
    "output.tensorboard",
    "output.wandb",
    "output.wandb_project",
    "output.wandb_entity",
    "output.wandb_name",
    "output.wandb_mode",
)


def changed_setting(saved: RunConfig, planned: RunConfig) -> tuple[str, object, object] | None:
    """The first setting outside :data:`RESUMABLE_KEYS` whose value differs, as (key, saved value,
    planned value); None when a new sitting may continue the run. Paths compare as absolute paths
    (a run saves its config with absolute paths)."""
    before = to_dict(absolute_paths(copy.deepcopy(saved)))
    after = to_dict(absolute_paths(copy.deepcopy(planned)))
    for section, values in after.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            if name not in RESUMABLE_KEYS and before[section].get(key) != value:
                return name, before[section].get(key), value
    return None


def read_run_state(run_dir: Path) -> dict:
    """``run_state.json`` as a dict; empty when it is missing or unreadable (a run killed before
    writing it: :class:`RunDirState` then goes by the checkpoints)."""
    try:
        state = json.loads((Path(run_dir) / RUN_STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def last_logged_step(run_dir: Path) -> int:
    """The step of the last complete record of ``metrics.jsonl`` (0 when there is none, or when the
    file cannot be read: a progress display must not stop on it); a torn last line is passed over."""
    from tokenbalance.diagnostics.sinks import parse_metrics_lines

    try:
        records, _ = parse_metrics_lines(Path(run_dir) / "metrics.jsonl")
    except (OSError, ValueError):  # missing, not UTF-8, or a malformed line (named by the report)
        return 0
    return int(records[-1][1].get("step", 0)) if records else 0


def has_final_eval(run_dir: Path, step: int) -> bool:
    """Whether ``metrics.jsonl`` holds the evaluation of step ``step`` (a torn last line does not
    count: a run killed while writing it has not recorded it)."""
    from tokenbalance.diagnostics.sinks import parse_metrics_lines

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return False
    records, _ = parse_metrics_lines(path)
    return any(r.get("kind") == "eval" and r.get("step") == step for _, r in records)


@dataclass(frozen=True)
class RunDirState:
    """What ``path`` holds now (read only): ``has_config`` (``config.yaml``: a run started there),
    ``has_files`` (anything but the lock), ``status`` and ``state_step`` from ``run_state.json``,
    ``resume_step`` (the checkpoint a resume continues from, 0 when none) and ``locked`` (a live
    process holds the run)."""

    path: Path
    has_config: bool
    has_files: bool
    status: str | None
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
            has_config=(path / "config.yaml").is_file(),
            has_files=path.is_dir() and any(e.name not in NOT_A_RUN for e in path.iterdir()),
            status=state.get("status") if isinstance(state.get("status"), str) else None,
            state_step=state_step,
            resume_step=checkpoint_step(path),
            locked=is_locked(path),
        )

    @property
    def completed(self) -> bool:
        return self.status == "completed"


def check_new_run_dir(run_dir: Path) -> None:
    """``ValueError`` unless a new run may start in ``run_dir`` (module docstring)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--run-dir {run_dir}: is a file, not a directory; choose another --run-dir")
    if run_dir.is_dir():
        entries = sorted(e.name for e in run_dir.iterdir() if e.name not in NOT_A_RUN)
        if "config.yaml" in entries and any(name in RUN_FILES[1:] for name in entries):
            raise ValueError(
                f"{run_dir} already holds a run; pass --resume {run_dir} to continue it or choose another --run-dir"
            )
        if entries:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise ValueError(
                f"--run-dir {run_dir}: the directory exists and holds files tokenbalance did not write ({shown}); "
                "a run starts only in a new or empty directory (nothing is deleted or overwritten). Choose another "
                "--run-dir"
            )
    check_writable_dir(run_dir, "--run-dir")


START_FILES = ("config.yaml", "wandb", "tensorboard")  # what a new run writes before its first status


def undo_failed_start(run_dir: Path) -> list[str]:
    """After a new run failed to start (e.g. W&B did not start) before it wrote its first status:
    remove what the start wrote (:data:`START_FILES`; the directory was new or empty, checked before
    work), so that the same command is accepted again; returns the names removed. A run that wrote
    its status or any metrics is left as it is (it resumes)."""
    if (run_dir / RUN_STATE_FILE).exists() or (run_dir / "metrics.jsonl").exists():
        return []
    removed = []
    for name in START_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def resume_command(run_dir: Path) -> str:
    return f"tokenbalance train --resume {shlex.quote(str(run_dir))}"


def write_end_status(run_dir: Path, err: BaseException) -> None:
    """``run_state.json`` of a run stopped by ``err``: ``interrupted`` (Ctrl-C, SIGTERM, an exit) or
    ``failed``, with the step a resume continues from (its last checkpoint) and the command; left
    as it is when it cannot be written (a full disk: the resume then reports the stale ``running``)."""
    if isinstance(err, KeyboardInterrupt):
        status, cause = "interrupted", {"reason": str(err) or "interrupted (Ctrl-C)"}
    elif isinstance(err, SystemExit):  # asked to exit (e.g. by a library when its output pipe closed)
        status, cause = "interrupted", {"reason": f"exit requested (SystemExit {err.code})"}
    else:
        status, cause = "failed", {"error": f"{type(err).__name__}: {err}"}
    state = {"status": status, "step": checkpoint_step(run_dir), **cause, "resume": resume_command(run_dir)}
    try:
        write_text_atomic(run_dir / "run_state.json", json.dumps(state, indent=1) + "\n")
    except OSError:
        pass


def is_locked(run_dir: Path) -> bool:
    """Whether a process holds :class:`RunLock` on ``run_dir`` now (a read-only probe: a shared
    ``flock`` is refused while the exclusive one is held). False without a lock file or ``flock``."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the probe's shared lock with it


def _flock_exclusive(fd: int, fcntl, tries: int = 5, wait_s: float = 0.05) -> None:
    """``flock(LOCK_EX | LOCK_NB)``, tried a few times: an :func:`is_locked` probe holds a shared
    lock for microseconds and must not make a starting run look taken. OSError when still held."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            if attempt == tries - 1:
                raise
            time.sleep(wait_s)


class RunLock:
    """An exclusive lock on a run directory, held from :meth:`acquire` until :meth:`release` or
    the end of the process. ``ValueError`` naming the holder when another process has it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # no flock (Windows): run unlocked
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _flock_exclusive(fd, fcntl)
        except OSError:
            try:
                holder = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                holder = {}
            os.close(fd)
            who = (
                f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, since {holder.get('since', '?')}"
                if holder
                else "another process"
            )
            raise ValueError(
                f"{self.path.parent} is in use by another tokenbalance process ({who}); two processes must not "
                "write one run. Wait for it to finish or stop it (the lock is released when it exits)"
            ) from None
        os.ftruncate(fd, 0)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv),
        }
        os.write(fd, (json.dumps(holder) + "\n").encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def clean_interrupted_writes(run_dir: Path) -> list[str]:
    """Remove the temporary files and half-written checkpoint folders an interrupted process left
    in ``run_dir`` (only names tokenbalance's own atomic writes use); returns what was removed."""
    removed = []
    candidates = [p for p in run_dir.glob(".config.yaml.*")] + list(run_dir.glob(".run_state.json.*"))
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir():
        candidates += list(checkpoints.glob(".step_*")) + list(checkpoints.glob(".latest.*"))
    for path in sorted(candidates):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path.relative_to(run_dir)))
    return removed


def recover_latest(run_dir: Path) -> str | None:
    """Point ``checkpoints/latest`` at the newest complete checkpoint when it is missing or names
    one that is not complete; returns a note saying so (None when nothing changed). ``ValueError``
    when ``step_*`` folders exist but none is complete (a resume would start over on top of them)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    pointer = root / "latest"
    named = pointer.read_text().strip() if pointer.is_file() else None
    newest = resume_checkpoint(run_dir)
    if newest is not None and newest.name == named:  # latest names a complete checkpoint
        return None
    if newest is None:
        steps = checkpoint_dirs(root)
        if steps:
            raise ValueError(
                f"{root}: no complete checkpoint among {', '.join(p.name for p in steps)} (each needs {STATE_FILE}, "
                f"{OPTIMIZER_FILE} and model/); a resume would start over at step 0 on top of them. Move them out of "
                f"{root} to start the run over"
            )
        return None
    write_text_atomic(pointer, newest.name + "\n")
    why = "was missing" if named is None else f"named {named!r}, which is not a complete checkpoint"
    return f"{pointer} {why}; continuing from {newest.name}, the newest complete checkpoint"


def verify_checkpoint(checkpoint: Path) -> None:
    """Read the headers of every file of ``checkpoint`` (JSON files parsed, safetensors headers
    opened; cheap) so that a damaged checkpoint is named before any model work."""
    from safetensors import safe_open

    def damaged(path: Path, err: BaseException) -> ValueError:
        return ValueError(
            f"{path}: unreadable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); the "
            f"checkpoint {checkpoint.name} is damaged. To resume from the previous complete checkpoint, move "
            f"{checkpoint} out of {checkpoint.parent} (then --resume again)"
        )

    json_files = [checkpoint / STATE_FILE, checkpoint / "model" / "config.json"]
    for path in json_files:
        try:
            json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise damaged(path, err) from None
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
        int(state["step"])
        state["optimizer"]["param_groups"]
    except (KeyError, TypeError, ValueError) as err:
        raise damaged(checkpoint / STATE_FILE, err) from None
    tensors = [checkpoint / OPTIMIZER_FILE, *sorted((checkpoint / "model").glob("*.safetensors"))]
    if len(tensors) == 1:
        raise damaged(checkpoint / "model", FileNotFoundError("no *.safetensors weights"))
    for path in tensors:
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for a bad file
            raise damaged(path, err) from None
