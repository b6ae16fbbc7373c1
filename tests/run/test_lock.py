"""One process per run directory: the lock names its holder, a probe never makes a starting run look
taken, and a shell's descriptor keeps the lock after the process that took it ends (a verl cell)."""

import fcntl
import json
import os
import threading

import pytest

from tokenbalance.run.lock import LOCK_FILE, RunLock, is_locked


def test_the_lock_probe_never_makes_a_starting_run_look_taken(tmp_path):
    RunLock(tmp_path).acquire().release()  # the lock file exists, nobody holds it
    probe = os.open(tmp_path / ".lock", os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe caught mid-way, released 0.1 s later
    threading.Timer(0.1, os.close, (probe,)).start()
    lock = RunLock(tmp_path).acquire()
    assert is_locked(tmp_path)
    lock.release()
    assert not is_locked(tmp_path)


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(
            ValueError, match=f"is in use by another tokenbalance process \\(pid {os.getpid()} on host "
        ):
            RunLock(tmp_path).acquire()
    RunLock(tmp_path).acquire().release()


def test_a_lock_taken_on_a_shells_descriptor_outlives_the_taker(tmp_path):
    shell = os.open(tmp_path / LOCK_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # as bash: exec 9>> .lock
    taker = os.dup(shell)  # the child's inherited copy
    RunLock(tmp_path).acquire(fd=taker, pid=4242, command="run.sh of a cell")
    os.close(taker)  # the child exits
    assert is_locked(tmp_path)
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert (holder["pid"], holder["command"]) == (4242, "run.sh of a cell")
    with pytest.raises(ValueError, match="pid 4242 on host"):
        RunLock(tmp_path).acquire()
    os.close(shell)  # the shell and its launch end
    assert not is_locked(tmp_path)
