"""Progress of long loops (step, reward, accuracy, tokens/s, time left) and the timer of one RL step's phases: a rich
bar on a terminal, else plain lines (every :data:`PLAIN_EVERY_S` s or 1/:data:`PLAIN_LINES` of the steps, and at each
evaluation), also appended to a file inside :func:`progress_log`. docs/training.md ("Progress in a log")."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

PLAIN_EVERY_S = 30.0  # a plain line at least this often (seconds) ...
PLAIN_LINES = 20  # ... and at every 1/20 of the steps
_LOG_FILE: ContextVar[Path | None] = ContextVar("tokenbalance_progress_log", default=None)


@contextmanager
def progress_log(path: Path | None) -> Iterator[None]:
    """Within the block, every :class:`StepProgress` also appends its plain lines to ``path`` (``None``: to no file)."""
    token = _LOG_FILE.set(path)
    try:
        yield
    finally:
        _LOG_FILE.reset(token)


def is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class Cadence:
    """When the next plain line is due: at each multiple of ``every_steps`` and when ``every_s`` seconds have passed
    since the last line, whichever comes first (the first call is always due)."""

    def __init__(self, every_steps: int, every_s: float = PLAIN_EVERY_S) -> None:
        self.every_steps, self.every_s = max(1, every_steps), every_s
        self.last_step: int | None = None
        self.last_time = time.monotonic()

    def due(self, step: int, *, force: bool = False) -> bool:
        now = time.monotonic()
        due = force or self.last_step is None or step // self.every_steps > self.last_step // self.every_steps
        if due or now - self.last_time >= self.every_s:
            self.last_step, self.last_time = step, now
            return True
        return False


STAT_KEYS = (
    ("reward/mean", "reward", "{:+.2f}"),
    ("reward/acc", "acc", "{:.2f}"),
    ("loss/total", "loss", "{:.3f}"),
    ("sft/loss", "loss", "{:.3f}"),
    ("throughput/tokens_per_s", "tok/s", "{:.0f}"),
)


class StepProgress:
    """Progress of ``total`` steps (or other ``unit``) from ``start`` (module docstring). ``stream``: where the plain
    lines go (default stderr); the rich bar is drawn only when it is a terminal."""

    def __init__(
        self,
        total: int,
        *,
        start: int = 0,
        enabled: bool = True,
        description: str = "RL",
        unit: str = "step",
        stream: TextIO | None = None,
    ) -> None:
        self.total, self.start, self.description, self.unit = total, start, description, unit
        self.stream = stream if stream is not None else sys.stderr
        self.log_file = _LOG_FILE.get() if total > 0 else None
        self.enabled = enabled and total > 0
        self.plain = self.enabled and not is_terminal(self.stream)
        self.cadence = Cadence(max(1, total // PLAIN_LINES))
        self.started = time.monotonic()
        self._last_eval = ""
        self._progress = None
        if self.enabled and not self.plain:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=Console(file=stream, stderr=stream is None),
                transient=False,
            )
            self._task = self._progress.add_task(description, total=total, completed=start, stats="")

    def __enter__(self) -> StepProgress:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def line(self, text: str) -> None:
        """One plain line (time-stamped) to the stream when not a terminal, and to the log file."""
        if not (self.plain or self.log_file is not None):
            return
        stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {text}"
        if self.plain:
            print(stamped, file=self.stream, flush=True)
        if self.log_file is not None:
            with open(self.log_file, "a", encoding="utf-8") as handle:
                handle.write(stamped + "\n")

    def advance(self, completed: int, metrics: dict[str, float]) -> None:
        parts = [f"{label} {fmt.format(metrics[key])}" for key, label, fmt in STAT_KEYS if key in metrics]
        stats = "  ".join(parts)
        if self._progress is not None:
            self._progress.update(
                self._task, completed=completed, stats=stats + (f"  | {self._last_eval}" if self._last_eval else "")
            )
        if (self.plain or self.log_file is not None) and self.cadence.due(completed, force=completed == self.total):
            elapsed = time.monotonic() - self.started
            done = completed - self.start
            per_step = elapsed / done if done > 0 else None
            left = per_step * (self.total - completed) if per_step is not None else None
            rate = f"{per_step:.2f} s/{self.unit}" if per_step is not None else f"? s/{self.unit}"
            self.line(
                f"{self.description} {self.unit} {completed}/{self.total}"
                + (f"  {stats}" if stats else "")
                + f"  | {rate}  elapsed {format_seconds(elapsed)}  left {format_seconds(left)}"
            )

    def note_eval(self, metrics: dict[str, float], step: int | None = None) -> None:
        parts = [
            f"{mode} {name} {metrics[f'eval/{mode}/{name}']:{fmt}}"
            for mode in ("greedy", "sample")
            for name, fmt in (("acc", ".3f"), ("reward", "+.3f"))
            if f"eval/{mode}/{name}" in metrics
        ]
        if "eval/greedy/acc" in metrics:
            self._last_eval = f"eval acc {metrics['eval/greedy/acc']:.3f}"
        if parts:
            self.line(
                f"{self.description} eval" + (f" at step {step}" if step is not None else "") + ": " + "  ".join(parts)
            )


class StepTimer:
    """Wall time of the phases of one RL step, as ``timing/*`` and ``throughput/*`` metrics."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Add the block's wall time to ``timing/<phase>_s`` (a phase may be timed in several blocks)."""
        start = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self, *, tokens: float) -> dict[str, float]:
        step_s = time.perf_counter() - self.start
        out = {f"timing/{phase}_s": seconds for phase, seconds in self.seconds.items()}
        out["timing/step_s"] = step_s
        out["throughput/rollout_tokens_per_s"] = tokens / max(self.seconds.get("rollout", 0.0), 1e-9)
        out["throughput/tokens_per_s"] = tokens / max(step_s, 1e-9)
        return out
