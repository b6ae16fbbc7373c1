"""The grid's progress display (cells done / running with their step / left, time left from the seconds per step of
the finished cells, or of the running ones until a cell has finished): rich on a terminal, one line per cell event
either way. docs/ablate.md ("How a grid runs")."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tokenbalance.run.state import RunStatus
from tokenbalance.trainer.progress import Cadence, format_seconds, is_terminal


class StepRates:
    """Seconds per RL step of each row: from finished cells (wall time / steps run, evaluations included) and, until a
    row has one, from its running cells (wall time so far / steps they advanced in this sitting)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.running: dict[str, tuple[str, float]] = {}  # running cell -> (row, seconds per step so far)

    def add(self, row: str, wall_s: float, steps: int) -> None:
        if steps > 0 and wall_s > 0:
            self.samples.setdefault(row, []).append(wall_s / steps)

    def note_running(self, cell: str, row: str, wall_s: float, steps: int) -> None:
        """A running cell's wall time since it started and the steps it advanced since (none yet: nothing noted)."""
        if steps > 0 and wall_s > 0:
            self.running[cell] = (row, wall_s / steps)

    def forget_running(self, cell: str) -> None:
        self.running.pop(cell, None)

    def rate(self, row: str) -> float | None:
        """The row's finished cells' mean, else its running cells', else the mean over rows of the finished, else of
        the running; None before any cell advanced a step."""
        running: dict[str, list[float]] = {}
        for r, rate in self.running.values():
            running.setdefault(r, []).append(rate)
        for samples in (self.samples, running):
            if samples.get(row):
                return sum(samples[row]) / len(samples[row])
        for samples in (self.samples, running):
            means = [sum(v) / len(v) for v in samples.values() if v]
            if means:
                return sum(means) / len(means)
        return None

    def seconds_left(self, work: list[tuple[str, int]]) -> float | None:
        """Estimated seconds for ``(row, steps to run)`` pairs; None when nothing is measured yet."""
        total = 0.0
        for row, steps in work:
            rate = self.rate(row)
            if rate is None:
                return None
            total += rate * steps
        return total


class GridProgress:
    def __init__(self, total: int, *, done: int, enabled: bool, log=print) -> None:
        self.total, self.done, self.failed = total, done, 0
        self.log = log
        self.running: dict[str, str] = {}  # cell -> "step k/n" of each cell running now
        self.left_s: float | None = None
        self.started = time.perf_counter()
        self._progress = None
        self.plain = enabled and total > 0 and not is_terminal(sys.stderr)
        self.cadence = Cadence(every_steps=10**9)  # by time only
        self.cadence.due(0)  # the first line after PLAIN_EVERY_S: the cell's start was just logged
        if enabled and total > 0 and not self.plain:
            self._progress = Progress(
                TextColumn("[bold]grid"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._task = self._progress.add_task("grid", total=total, completed=done, stats="")

    def __enter__(self) -> GridProgress:
        if self._progress is not None:
            self._progress.__enter__()
        self._refresh()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    @property
    def left(self) -> int:
        return self.total - self.done - self.failed

    def _refresh(self) -> None:
        if self._progress is None:
            return
        stats = (
            f"done {self.done}  failed {self.failed}  left {self.left}"
            + (f"  | running {', '.join(f'{n} {s}' for n, s in self.running.items())}" if self.running else "")
            + f"  | time left ~{format_seconds(self.left_s)}"
        )
        self._progress.update(self._task, completed=self.done + self.failed, stats=stats)

    def cell_started(self, name: str, action: str, from_step: int, steps: int, left_s: float | None) -> None:
        self.running[name] = f"({action}) step {from_step}/{steps}"
        self.left_s = left_s
        started = self.done + self.failed + len(self.running)
        self.log(f"[{started}/{self.total}] {name}: {action} from step {from_step} of {steps}")
        self._refresh()

    def cell_step(self, name: str, step: int, steps: int, left_s: float | None) -> None:
        self.running[name] = f"step {step}/{steps}"
        self.left_s = left_s
        self._refresh()
        if self.plain and self.cadence.due(0):
            self.log(
                f"    running {', '.join(f'{n} {s}' for n, s in self.running.items())}; done {self.done}, "
                f"failed {self.failed}, left {self.left}, time left ~{format_seconds(self.left_s)}"
            )

    def cell_finished(self, name: str, status: str, wall_s: float, left_s: float | None) -> None:
        if status == RunStatus.COMPLETED:
            self.done += 1
        else:
            self.failed += 1
        self.running.pop(name, None)
        self.left_s = left_s
        self.log(
            f"    {name}: {status} in {format_seconds(wall_s)}; done {self.done}, failed {self.failed}, "
            f"left {self.left}, time left ~{format_seconds(left_s)}"
        )
        self._refresh()
