"""How a tokenbalance process uses the CPU: a fixed thread count, and a wait policy under which a run beside a busy
process slows in proportion instead of collapsing. :func:`prepare_process` runs before torch loads (``cli.main``
first); :func:`use_threads` applies ``train.threads``; :class:`ThreadAdapter` (``train.threads=0``) re-decides between
phases. Standard library only. docs/training.md "Threads and bit-identical runs"."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, MutableMapping

AUTO_ENV = "TOKENBALANCE_AUTO_ENV"
BUSY_CPUS_FOR_PASSIVE = 0.5
SAMPLE_S = 0.2


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


def others_busy_cpus(
    before: tuple[float, float], after: tuple[float, float], own_cpu_s: float, wall_s: float, cpus: int
) -> float:
    """How many CPUs processes other than this one kept busy between two (busy, total) jiffy counts of the whole
    machine (:func:`_cpu_times`), this process having used ``own_cpu_s`` CPU seconds over those ``wall_s`` seconds;
    0.0 when the counts did not advance."""
    if after[1] <= before[1] or wall_s <= 0:
        return 0.0
    jiffies_per_cpu = (after[1] - before[1]) / cpus
    busy = (after[0] - before[0]) / jiffies_per_cpu
    return max(0.0, busy - own_cpu_s / wall_s)


def busy_cpus_of_others(sample_s: float = SAMPLE_S) -> float:
    """How many CPUs other processes kept busy over ``sample_s`` seconds (0.0 where the OS does not say: then the
    process keeps the default policy)."""
    before, own_before = _cpu_times(), time.process_time()
    if before is None:
        return 0.0
    time.sleep(sample_s)
    after, own_after = _cpu_times(), time.process_time()
    if after is None:
        return 0.0
    return others_busy_cpus(before, after, own_after - own_before, sample_s, os.cpu_count() or 1)


def user_set(environ: MutableMapping[str, str], name: str) -> bool:
    """Whether the user set ``name``: a variable this module chose in a parent process does not count."""
    return name in environ and name not in environ.get(AUTO_ENV, "").split(",")


def choose_environment(environ: MutableMapping[str, str], busy_cpus: float) -> dict[str, str]:
    """The variables :func:`prepare_process` sets: those the user did not set (:func:`user_set`), given how many CPUs
    others keep busy."""
    chosen: dict[str, str] = {}
    if not user_set(environ, "MKL_DYNAMIC"):
        chosen["MKL_DYNAMIC"] = "FALSE"
    if not user_set(environ, "OMP_WAIT_POLICY"):
        chosen["OMP_WAIT_POLICY"] = "PASSIVE" if busy_cpus >= BUSY_CPUS_FOR_PASSIVE else ""
    return chosen


def prepare_process(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set this process's threading environment before torch loads (module docstring); returns what it chose. Does
    nothing once torch is imported: its OpenMP runtime has read the policy."""
    if "torch" in sys.modules:
        return {}
    environ = os.environ if environ is None else environ
    needs_sample = not user_set(environ, "OMP_WAIT_POLICY")
    chosen = choose_environment(environ, busy_cpus_of_others() if needs_sample else 0.0)
    for name, value in chosen.items():
        if value:
            environ[name] = value
        else:  # the default policy: no variable at all
            environ.pop(name, None)
    environ[AUTO_ENV] = ",".join(sorted(chosen))
    return chosen


def use_threads(count: int) -> int:
    """Give torch's intra-op pool ``count`` threads and its inter-op pool one; returns the count used. 0 means the
    CPUs this process may run on, shared among the ranks of this node under torchrun (``LOCAL_WORLD_SIZE``)."""
    import torch

    ranks_here = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    threads = count or max(1, available_cpus() // ranks_here)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process, or inter-op work has started: keep it
        pass
    return threads


ADAPT_WINDOW_S = 0.5  # a shorter window since the last decision says too little about the load


def threads_for_load(most: int, cpus: int, busy_others: float) -> int:
    """Intra-op threads for a process allowed ``most`` on ``cpus`` CPUs of which others keep ``busy_others`` busy: the
    free CPUs rounded half down (half a busy CPU costs a thread), within [1, ``most``]."""
    return max(1, min(most, math.ceil(cpus - busy_others - 0.5)))


class ThreadAdapter:
    """Re-decides torch's intra-op thread count from the load since the last decision (``train.threads=0``; call
    :meth:`adapt` between phases): only after ``window_s`` seconds, ``most`` where the OS gives no load (no
    ``/proc/stat``). ``set_threads``, ``cpu_times`` and ``clock`` are replaceable in tests."""

    def __init__(
        self,
        most: int,
        set_threads: Callable[[int], None],
        *,
        cpus: int | None = None,
        window_s: float = ADAPT_WINDOW_S,
        cpu_times: Callable[[], tuple[float, float] | None] = _cpu_times,
        own_cpu_s: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most, self.threads, self.fewest = most, most, most
        self.cpus = cpus or os.cpu_count() or 1
        self.window_s = window_s
        self._set, self._cpu_times, self._own, self._clock = set_threads, cpu_times, own_cpu_s, clock
        self._mark = self._sample()

    def _sample(self) -> tuple[tuple[float, float] | None, float, float]:
        return self._cpu_times(), self._own(), self._clock()

    def adapt(self) -> int:
        """The count to use from now on, applied: :func:`threads_for_load` of the load since the last decision
        (unchanged within ``window_s`` of it)."""
        (before, own_before, start), now = self._mark, self._sample()
        after, own_after, end = now
        if end - start < self.window_s:
            return self.threads
        self._mark = now
        if before is None or after is None:
            return self.threads
        busy = others_busy_cpus(before, after, own_after - own_before, end - start, self.cpus)
        threads = threads_for_load(self.most, self.cpus, busy)
        if threads != self.threads:
            self._set(threads)
            self.threads = threads
        self.fewest = min(self.fewest, threads)
        return threads

    def take_fewest(self) -> int:
        """The fewest threads any phase used since the last call (a count a step used for one phase only
        changes its numbers too); starts over from the current count."""
        fewest, self.fewest = self.fewest, self.threads
        return fewest
