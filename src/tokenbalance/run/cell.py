"""A verl grid cell's sittings, with the local run's lock and statuses: ``python -m tokenbalance.run.cell
begin|end|status CELL_DIR``, run by the cell's ``run_cell.sh`` (ablate/verl/cell_script.py) on the node.

A cell directory holds ``STATUS`` (one line: ``not started``, ``running: ...``, ``completed: ...``, ``failed at
step N: WHY ...``; WHY ``stopped on request (STOP_REQUESTED): ...`` after :data:`STOP_FILE` stopped it), one
verl metrics file per sitting (``metrics.sitting-<k>.jsonl``: verl's logger truncates the file it opens),
``.lock`` (:class:`~tokenbalance.run.lock.RunLock`, held on the shell's descriptor so the launch keeps it) and
``launch.json`` (:mod:`.cell_launch`). Standard library only. docs/ablate.md "The grid at paper scale".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.outputs import write_text_atomic
from tokenbalance.run import cell_launch
from tokenbalance.run.lock import RunLock
from tokenbalance.run.state import NOT_STARTED, RunStatus

STATUS_FILE = "STATUS"
# a sitting's stop request (`touch cells/<cell>/STOP_REQUESTED`): our verl trainers save the completed step
# and end (integrations/verl/stop.py), writing what they did into it; each sitting removes an earlier one
STOP_FILE = "STOP_REQUESTED"
SITTING = re.compile(r"^metrics\.sitting-(\d+)\.jsonl$")
LOCKED_EXIT = 75  # EX_TEMPFAIL: another sitting holds the cell
HYDRA_SAFE = re.compile(r"^[A-Za-z0-9._/+@%:~-]+$")  # what hydra takes unquoted in an override value
_LOGGED_STEP = re.compile(rb'^\{"step":(\d+)', re.MULTILINE)  # verl writes {"step":N,...} per line
_RUNNING = re.compile(rf"^{RunStatus.RUNNING.value}: sitting \d+ on (?P<host>\S+) pid (?P<pid>\d+)")


def sitting_metrics(cell_dir: Path, sitting: int) -> Path:
    return Path(cell_dir) / f"metrics.sitting-{sitting}.jsonl"


def sitting_of(metrics: Path) -> int | None:
    """The sitting number of a metrics file's name; None for any other name."""
    match = SITTING.match(Path(metrics).name)
    return int(match.group(1)) if match else None


def sitting_files(cell_dir: Path) -> list[Path]:
    """The cell's metrics files in sitting order."""
    numbered = [(n, p) for p in Path(cell_dir).glob("metrics.sitting-*.jsonl") if (n := sitting_of(p)) is not None]
    return [path for _, path in sorted(numbered)]


def next_sitting(cell_dir: Path) -> int:
    """The newest sitting's number + 1 (1 for a cell that has not run)."""
    return max((sitting_of(path) or 0 for path in sitting_files(cell_dir)), default=0) + 1


def last_logged_step(cell_dir: Path) -> int:
    """The highest step any sitting logged (a torn line's too, as far as its step is written); 0 when none."""
    steps = [int(m.group(1)) for path in sitting_files(cell_dir) for m in _LOGGED_STEP.finditer(path.read_bytes())]
    return max(steps, default=0)


def status_line(cell_dir: Path) -> str | None:
    """The first line of ``STATUS`` as written (bytes that are not UTF-8 replaced); None without one."""
    path = Path(cell_dir) / STATUS_FILE
    if not path.is_file():
        return None
    return (path.read_text(errors="replace").splitlines() or [""])[0].strip()


def line_status(line: str | None) -> RunStatus | None:
    """The :class:`RunStatus` a STATUS line starts with; None for ``not started`` or anything else."""
    return next((status for status in RunStatus if (line or "").startswith(status.value)), None)


def has_run(cell_dir: Path) -> bool:
    """The cell has a sitting: a metrics file, or a STATUS other than "not started"."""
    line = status_line(cell_dir)
    return (line is not None and line != NOT_STARTED) or bool(sitting_files(cell_dir))


def cell_status(cell_dir: Path) -> str:
    """The STATUS line as shown; a "running" one whose process on this host is gone reads "stopped: ..."."""
    line = status_line(cell_dir)
    if line is None:
        return NOT_STARTED if not Path(cell_dir).exists() else "no STATUS file"
    running = _RUNNING.match(line)
    if running and running.group("host") == socket.gethostname() and not _alive(int(running.group("pid"))):
        return f"stopped: {line.removeprefix('running: ')}; its process is gone (run the cell again to resume)"
    return line


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def write_status(cell_dir: Path, line: str) -> None:
    write_text_atomic(Path(cell_dir) / STATUS_FILE, line + "\n")


@dataclass(frozen=True)
class Launch:
    """What a sitting launches: the cell's ``model`` (``3b``) and its hub name, the ``LAUNCH`` words,
    the sitting's extra ``overrides``, the cell's default ``checkpoints`` directory and the checkpoints
    to ``keep`` there unless an override says otherwise."""

    model: str
    hub_name: str
    words: tuple[str, ...]
    overrides: tuple[str, ...]
    checkpoints: Path
    keep: str


def check_launch(cell_dir: Path, launch: Launch, env: Mapping[str, str], root: Path) -> tuple[str, dict]:
    """The cell's model path and launch record; ``ValueError`` (one phrase) for an override of a key the
    cell sets itself, a model path that names another model's, or a record that differs from the one the
    cell's earlier sittings launched (a resume would mix two experiments)."""
    overrides = list(launch.overrides)
    cell_launch.check_overrides(overrides)
    path = cell_launch.model_path(launch.model, launch.hub_name, env)
    record = cell_launch.launch_record(list(launch.words), overrides, launch.model, path, env, root)
    earlier = cell_launch.read_record(cell_dir)
    change = cell_launch.record_change(earlier, record) if earlier is not None and has_run(cell_dir) else None
    if change:
        raise ValueError(
            f"{change} since the cell's earlier sittings ({cell_launch.LAUNCH_RECORD}): resuming would mix two "
            f"experiments in one cell; run it as before, or move {cell_dir} away to start it again"
        )
    return path, record


def refuse(cell: str, err: ValueError) -> None:
    print(f"== {cell}: {err}; nothing started", file=sys.stderr)
    raise SystemExit(2)


def begin(
    cell_dir: Path,
    cell: str,
    *,
    pid: int,
    lock_fd: int,
    say: Callable[[str], None],
    launch: Launch | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[Path, str | None] | None:
    """Begin a sitting: None for a completed cell (skipped); else the cell's lock taken on the shell's
    ``lock_fd``, STATUS "running" and the sitting's metrics file returned, with the model path when
    ``launch`` is given (its record kept, its checkpoint directory claimed and pruned to the kept ones).
    ``SystemExit`` with the status ``run.sh`` ends with when the directory cannot go into a hydra
    override or the launch is refused (2), or another process holds the cell (:data:`LOCKED_EXIT`)."""
    line = status_line(cell_dir)
    if line_status(line) is RunStatus.COMPLETED:
        say(f"== {cell}: {line} (skipped)")
        return None
    if not HYDRA_SAFE.match(str(cell_dir)):
        print(
            f"== {cell}: the cell directory's path has characters hydra cannot take in an override (only letters, "
            "digits and ._/+@%:~- are safe): move the grid directory and run it there",
            file=sys.stderr,
        )
        raise SystemExit(2)
    try:
        RunLock(cell_dir).acquire(fd=lock_fd, pid=pid, command=f"{Path(cell_dir) / 'run.sh'}")
    except ValueError:
        print(f"== {cell}: another process runs this cell ({line or ''}); not started", file=sys.stderr)
        raise SystemExit(LOCKED_EXIT) from None
    path = None
    if launch is not None:
        try:
            path, record = check_launch(cell_dir, launch, os.environ if env is None else env, Path.cwd())
            checkpoints = cell_launch.checkpoint_dir(launch.checkpoints, list(launch.overrides))
            own = checkpoints.resolve() == (Path(cell_dir) / "checkpoints").resolve()
            cell_launch.claim_checkpoints(checkpoints, cell, own)
        except ValueError as err:
            refuse(cell, err)
        write_text_atomic(Path(cell_dir) / cell_launch.LAUNCH_RECORD, json.dumps(record, indent=1) + "\n")
        removed = cell_launch.prune_checkpoints(
            checkpoints, cell_launch.keep_setting(list(launch.overrides), launch.keep)
        )
        if removed:
            say(f"== {cell}: removed the checkpoints {', '.join(removed)} (kept: the newest the retention allows)")
        if last_logged_step(cell_dir) and not (checkpoints / cell_launch.TRACKER).is_file():
            say(f"== {cell}: no checkpoint in {checkpoints}: this sitting starts again at step 1")
    stop = Path(cell_dir) / STOP_FILE
    if stop.is_file():
        stop.unlink()
        say(f"== {cell}: removed {STOP_FILE} (a stop request answers the sitting it was made in)")
    sitting = next_sitting(cell_dir)
    metrics = sitting_metrics(cell_dir, sitting)
    write_status(cell_dir, f"{RunStatus.RUNNING}: sitting {sitting} on {socket.gethostname()} pid {pid} since {_now()}")
    say(f"== {cell}: sitting {sitting} (metrics: {metrics})")
    return metrics, path


def end(
    cell_dir: Path, cell: str, *, metrics: Path, exit_status: int, signal_name: str, say: Callable[[str], None]
) -> None:
    """End the sitting whose metrics file is ``metrics``: STATUS "completed" (the launch exited 0 and
    was not stopped), else "failed at step N" (N the step after the last one any sitting logged), why
    as :func:`failure_reason` says."""
    sitting = sitting_of(metrics)
    if sitting is None:
        raise ValueError(f"{metrics}: not a sitting's metrics file (metrics.sitting-<k>.jsonl)")
    where = f"sitting {sitting} on {socket.gethostname()} at {_now()}"
    if exit_status == 0 and not signal_name:
        write_status(cell_dir, f"{RunStatus.COMPLETED}: {where}")
        say(f"== {cell}: completed")
        return
    last = last_logged_step(cell_dir)
    why, request = failure_reason(cell_dir, exit_status, signal_name)
    line = f"{RunStatus.FAILED} at step {last + 1}: {why} in {where}; steps up to {last} logged{request}"
    write_status(cell_dir, line)
    print(f"== {cell}: {status_line(cell_dir)}", file=sys.stderr)


def stop_answer(cell_dir: Path) -> str | None:
    """The trainer's answer in :data:`STOP_FILE` ("" before it answered); None when no stop was requested."""
    try:
        text = (Path(cell_dir) / STOP_FILE).read_text(errors="replace")
    except OSError:
        return None
    return " ".join(text.split())[:200]


def failure_reason(cell_dir: Path, exit_status: int, signal_name: str) -> tuple[str, str]:
    """Why a sitting failed, and what to add after its STATUS line about a stop request: "stopped on
    request" when the trainer answered it and the launch ended by itself; else the signal or the exit
    status, with the request's fate after the line."""
    answer = stop_answer(cell_dir)
    if answer and not signal_name:
        return f"stopped on request ({STOP_FILE}): {answer}", ""
    why = f"stopped by SIG{signal_name}" if signal_name else f"exit status {exit_status}"
    if answer is None:
        return why, ""
    return why, f"; {STOP_FILE}: {answer or 'not answered by the trainer'}"


def add_launch_options(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--model", required=required, help="the cell's model (3b, 7b): MODEL_PATH_<MODEL> names it")
    parser.add_argument("--hub-name", default="", help="the model's hub name, taken when MODEL_PATH_<MODEL> is unset")
    parser.add_argument("--launch", action="append", default=[], help="one word of the cell's LAUNCH (repeated)")
    parser.add_argument("--checkpoints", type=Path, help="the cell's checkpoint directory unless an override sets one")
    parser.add_argument("--keep", default="1", help="checkpoints kept (KEEP_CHECKPOINTS) unless an override says")


def launch_of(args: argparse.Namespace, overrides: list[str]) -> Launch | None:
    if args.model is None:
        return None
    checkpoints = args.checkpoints or Path(args.cell_dir) / "checkpoints"
    return Launch(args.model, args.hub_name, tuple(args.launch), tuple(overrides), checkpoints, args.keep)


def main(argv: list[str] | None = None) -> int:
    """The command line; the words after ``--`` are the sitting's extra hydra overrides."""
    words = list(sys.argv[1:] if argv is None else argv)
    overrides = words[words.index("--") + 1 :] if "--" in words else []
    words = words[: words.index("--")] if "--" in words else words
    parser = argparse.ArgumentParser(prog="python -m tokenbalance.run.cell", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    first = commands.add_parser("begin", help="begin a sitting; prints its metrics file (nothing: skipped)")
    checked = commands.add_parser("check", help="check a sitting's launch (a dry run); prints the model path")
    last = commands.add_parser("end", help="end the sitting: STATUS completed or failed")
    shown = commands.add_parser("status", help="print the cell's STATUS as the report shows it")
    for sub in (first, checked, last, shown):
        sub.add_argument("cell_dir", type=Path)
    for sub in (first, checked, last):
        sub.add_argument("cell", help="the cell's name, for the messages")
    for sub in (first, last):
        sub.add_argument("--say-fd", type=int, default=1, help="where the messages go (the shell's stdout)")
    first.add_argument("--pid", type=int, required=True, help="the sitting's process (run.sh)")
    first.add_argument("--lock-fd", type=int, required=True, help="the shell's open descriptor of CELL_DIR/.lock")
    add_launch_options(first, required=False)
    add_launch_options(checked, required=True)
    last.add_argument("--metrics", type=Path, required=True, help="the sitting's metrics file (begin's)")
    last.add_argument("--exit", type=int, required=True, dest="exit_status", help="the launch's exit status")
    last.add_argument("--signal", default="", dest="signal_name", help="the signal that stopped it (TERM, ...)")
    args = parser.parse_args(words)
    if args.command == "status":
        print(cell_status(args.cell_dir))
        return 0
    if args.command == "check":
        launch = launch_of(args, overrides)
        assert launch is not None  # --model is required
        try:
            path, _ = check_launch(args.cell_dir, launch, os.environ, Path.cwd())
        except ValueError as err:
            refuse(args.cell, err)
        print(path)
        return 0
    with open(args.say_fd, "w", closefd=False) as out:

        def say(text: str) -> None:
            print(text, file=out, flush=True)

        if args.command == "begin":
            begun = begin(
                args.cell_dir, args.cell, pid=args.pid, lock_fd=args.lock_fd, say=say, launch=launch_of(args, overrides)
            )
            metrics, trained = begun or (None, None)
            print(metrics or "")
            if trained is not None:
                print(trained)
        else:
            ended = {"metrics": args.metrics, "exit_status": args.exit_status, "signal_name": args.signal_name}
            end(args.cell_dir, args.cell, **ended, say=say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
