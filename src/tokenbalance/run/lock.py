"""One process at a time per run directory: an exclusive ``flock`` on ``RUN_DIR/.lock``, which names the holder's pid,
host and start time. The kernel releases it when the holder exits, however it exits, so a lock is never stale.
Standard library only. docs/reliability.md "Guarantees"."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_FILE = ".lock"


def is_locked(run_dir: Path) -> bool:
    """Whether a process holds :class:`RunLock` on ``run_dir`` now (a read-only probe: a shared ``flock`` is refused
    while the exclusive one is held). False without a lock file or ``flock``."""
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
    """``flock(LOCK_EX | LOCK_NB)``, tried a few times: an :func:`is_locked` probe holds a shared lock for
    microseconds and must not make a starting run look taken. OSError when still held."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            if attempt == tries - 1:
                raise
            time.sleep(wait_s)


class RunLock:
    """An exclusive lock on a run directory, held from :meth:`acquire` until :meth:`release` or the end of the
    process. ``ValueError`` naming the holder when another process has it."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def holder(self) -> str:
        """Who holds the lock, as its file names them ("another process" when it names nobody)."""
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        if not isinstance(holder, dict) or not holder:
            return "another process"
        return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, since {holder.get('since', '?')}"

    def acquire(self, *, fd: int | None = None, pid: int | None = None, command: str | None = None) -> RunLock:
        """Take the lock. ``fd``: an open descriptor of the lock file inherited from a shell, locked in place (the
        lock then lasts while the shell and its children keep it open, after this process ends: a verl cell's
        sitting); ``pid`` and ``command`` name that holder."""
        try:
            import fcntl
        except ImportError:  # no flock (Windows): run unlocked
            return self
        if fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            own = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        else:
            own = fd
        try:
            _flock_exclusive(own, fcntl)
        except OSError:
            if fd is None:
                os.close(own)
            raise ValueError(
                f"{self.path.parent} is in use by another tokenbalance process ({self.holder()}); two processes "
                "must not write one run. Wait for it to finish or stop it (the lock is released when it exits)"
            ) from None
        os.ftruncate(own, 0)
        holder = {
            "pid": os.getpid() if pid is None else pid,
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv) if command is None else command,
        }
        os.write(own, (json.dumps(holder) + "\n").encode())
        self._fd = own if fd is None else None
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
