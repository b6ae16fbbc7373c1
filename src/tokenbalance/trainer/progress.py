"""A progress bar for long loops (step, reward, accuracy, tokens per second, time left) and the
timer of one RL step's phases.

Drawn with rich on stderr; disabled (a no-op) when not wanted, e.g. on non-main ranks or with
``output.progress=false``. When stderr is not a terminal rich prints nothing live, so logs stay clean.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class StepProgress:
    def __init__(self, total: int, *, start: int = 0, enabled: bool = True, description: str = "RL") -> None:
        self.enabled = enabled and total > 0
        self._last_eval = ""
        self._progress = None
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
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

    def advance(self, completed: int, metrics: dict[str, float]) -> None:
        if self._progress is None:
            return
        parts = []
        for key, label, fmt in (
            ("reward/mean", "reward", "{:+.2f}"),
            ("reward/acc", "acc", "{:.2f}"),
            ("loss/total", "loss", "{:.3f}"),
            ("sft/loss", "loss", "{:.3f}"),
            ("throughput/tokens_per_s", "tok/s", "{:.0f}"),
        ):
            if key in metrics:
                parts.append(f"{label} {fmt.format(metrics[key])}")
        stats = "  ".join(parts) + (f"  | {self._last_eval}" if self._last_eval else "")
        self._progress.update(self._task, completed=completed, stats=stats)

    def note_eval(self, metrics: dict[str, float]) -> None:
        if "eval/greedy/acc" in metrics:
            self._last_eval = f"eval acc {metrics['eval/greedy/acc']:.3f}"


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
