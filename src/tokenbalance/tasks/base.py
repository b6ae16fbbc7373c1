"""The task vocabulary the trainer uses: :class:`TaskExample`, :class:`ScoreResult`, the
:class:`Task` protocol and the :func:`get_task` registry.

A task makes examples (generated or read from files), renders their prompt text under a named
template, and scores a response against an example. Prompts are plain strings with any chat
template already applied (the Logic-RL convention): a trainer tokenizes ``example.prompt`` as is.

    task = get_task("kk")
    examples = task.examples("test", difficulty=3)            # 100 Logic-RL test puzzles
    result = task.score(response_text, examples[0])           # ScoreResult(reward=3.0, metrics={...})

Nothing here imports pyarrow or math-verify; tasks import them lazily where they need them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TaskExample:
    """One prompt with what is needed to score answers to it.

    Attributes:
        prompt: the rendered prompt text (template applied; ready to tokenize as is).
        question: the bare question (K&K: the ``quiz``), so the prompt can be re-rendered with
            another template by :meth:`Task.render_prompt`.
        ground_truth: what the scorer compares with: for K&K the ``reward_model.ground_truth`` dict
            (``{"solution_text_format": str, "statements": str}``), for math tasks the answer string
            (or a list of accepted answer strings).
        data_source: the metric group, e.g. ``"kk_logic"``, ``"kk_logic3"``, ``"arith"``.
        difficulty: number of people for K&K, level for arith (0 when unknown).
        index: the example's index in its source (K&K: global generator index; file readers:
            that column when present, else the row number).
        extra: anything else worth keeping (K&K: names, solution, split, row, ...). Treat as read-only.
    """

    prompt: str
    question: str
    ground_truth: Any
    data_source: str
    difficulty: int = 0
    index: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoreResult:
    """A scored response: the scalar ``reward`` and named per-response ``metrics``.

    Metrics are floats (0.0/1.0 for flags) so a trainer can average them over a batch,
    e.g. ``{"format_ok": 1.0, "answer_parsed": 1.0, "correct": 0.0}``.
    """

    reward: float
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task.

    ``name``: registry name. ``templates``: valid template names, the first being the default.
    """

    name: str
    templates: tuple[str, ...]

    def examples(
        self,
        split: str,
        *,
        difficulty: int | None = None,
        count: int | None = None,
        seed: int | None = None,
        template: str | None = None,
    ) -> list[TaskExample]:
        """Generate the examples of ``split`` ("train" or "test") deterministically.

        ``difficulty`` / ``count`` / ``seed`` default to the task's published set; ``template`` to
        ``templates[0]``. Bad values raise ``ValueError`` naming the argument and the valid range.
        """
        ...

    def render_prompt(self, example: TaskExample, template: str) -> str:
        """The prompt text of ``example.question`` under ``template``."""
        ...

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        """Score the decoded ``response`` (generated text only, special tokens kept) for ``example``.

        Tasks whose reference reward reads prompt + response (K&K) put ``example.prompt`` in front
        themselves, so every task is called the same way.
        """
        ...


def _make_kk() -> Task:
    from tokenbalance.tasks.kk.task import KKTask

    return KKTask()


def _make_arith() -> Task:
    from tokenbalance.tasks.arith import ArithTask

    return ArithTask()


TASK_FACTORIES: dict[str, Callable[[], Task]] = {"kk": _make_kk, "arith": _make_arith}
TASK_NAMES = tuple(TASK_FACTORIES)


def get_task(name: str) -> Task:
    """A fresh task object by registry name; ``ValueError`` listing the valid names otherwise."""
    factory = TASK_FACTORIES.get(name) if isinstance(name, str) else None
    if factory is None:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")
    return factory()
