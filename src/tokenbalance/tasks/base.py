"""The task vocabulary the trainer uses: :class:`TaskExample`, :class:`ScoreResult` and the :class:`Task` protocol
(with :class:`BaseTask`'s defaults); the registry is :mod:`.registry`.

    examples = get_task("kk").examples("test", difficulty=3)     # 100 Logic-RL test puzzles
    result = get_task("kk").score(response_text, examples[0])    # ScoreResult(reward=3.0, metrics={...})

Prompts are plain strings with any chat template already applied (the Logic-RL convention); a new task touches
``tasks/`` only. Each member and its defaults: docs/tasks.md ("The Task protocol")."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class TaskExample:
    """One prompt with what is needed to score answers to it (treat as read-only).

    Attributes:
        prompt: the rendered prompt text (template applied, ready to tokenize).
        question: the bare question (K&K: the ``quiz``), for :meth:`Task.render_prompt` with another template.
        ground_truth: what the scorer compares with: K&K's ``reward_model.ground_truth`` dict, math's answer string
            (or list of accepted answers).
        data_source: the metric group, e.g. ``"kk_logic"``, ``"kk_logic3"``, ``"arith"``.
        difficulty: people for K&K, level for arith (0 when unknown).
        index: the index in its source (K&K: global generator index; files: that column, else the row number).
        extra: anything else worth keeping (K&K: names, solution, split, row, ...)."""

    prompt: str
    question: str
    ground_truth: Any
    data_source: str
    difficulty: int = 0
    index: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


class ScoreError(ValueError):
    """A scorer's failure whose one-line message already names the example (file and row) and the function that
    failed: passed on as it is by whoever scores (no second wrapping)."""


@dataclass(frozen=True)
class ScoreResult:
    """A scored response: the scalar ``reward`` and float per-response ``metrics`` (0.0/1.0 for flags, averaged over a
    batch), e.g. ``{"format_ok": 1.0, "answer_parsed": 1.0, "correct": 0.0}``."""

    reward: float
    metrics: Mapping[str, float] = field(default_factory=dict)


# held-out evaluation, a validation set disjoint from it (for tuning), RL prompts, SFT warm-start targets
EXAMPLE_USES = ("eval", "validation", "rl", "sft")
# sft.target: the answer alone, or a reasoning trace first (its reference form, or its choices drawn per example)
SFT_TARGETS = ("answer", "cot", "cot_random")


def drawn_choices(example: TaskExample, stream: str = "cot_random") -> random.Random:
    """The generator of ``cot_random``'s choices for ``example`` (or of another ``stream`` of draws, such as a noisy
    teacher's ``"slips"``), seeded by its difficulty and index: the same example always gets the same trace, different
    examples different ones."""
    return random.Random(f"{stream}/{example.difficulty}/{example.index}")


@dataclass(frozen=True)
class ExampleSource:
    """Where the generated examples of one use and difficulty come from: the arguments of :meth:`Task.examples`
    (``None``: the task's default); the held-out source must be disjoint from the training ones."""

    split: str
    count: int | None = None
    start_index: int | None = None
    seed: int | None = None


# What ``Task.write_data`` is given to show progress: ``progress(total, description)`` is a context manager yielding a
# callable to call once per unit of work done, or None (no display).
ProgressFactory = Callable[[int, str], AbstractContextManager[Callable[[], None] | None]]


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task (it never tests a task by name); members and defaults: docs/tasks.md.

    Attributes:
        name: registry name; templates: valid template names, the first the default.
        max_reward: the reward of a fully correct answer (K&K 3, arith 1), which counts a response correct.
        special_tokens: text the scorer reads from the response (K&K's tags), checked to round-trip the tokenizer
            before a run (``models.check_special_tokens``)."""

    name: str
    templates: tuple[str, ...]
    max_reward: float
    special_tokens: tuple[str, ...]

    def examples(
        self,
        split: str,
        *,
        difficulty: int | None = None,
        count: int | None = None,
        seed: int | None = None,
        template: str | None = None,
        start_index: int | None = None,
    ) -> list[TaskExample]:
        """Generate the examples of ``split`` ("train" or "test") deterministically; unset arguments default to the
        published set and ``templates[0]``; bad values raise ``ValueError`` naming the argument and its range."""
        ...

    def example_source(self, use: str, difficulty: int, count: int) -> ExampleSource:
        """Where the generated examples of ``use`` (one of :data:`EXAMPLE_USES`) at ``difficulty`` come from;
        ``count`` is how many the run asks for (``data.eval_count`` for ``"eval"`` and ``"validation"``,
        ``sft.train_count`` for ``"sft"``, ``data.rl_count`` for ``"rl"``); a task may give fewer (K&K 2 people)."""
        ...

    def read_examples(self, path: str, template: str | None = None) -> list[TaskExample]:
        """The examples of a data file (``data.train_file`` / ``data.eval_file``); ``template`` re-renders the prompts
        where the task supports it."""
        ...

    def render_prompt(self, example: TaskExample, template: str) -> str:
        """The prompt text of ``example.question`` under ``template``."""
        ...

    def score_without_prompt(self, response: str, ground_truth: Any, template: str) -> ScoreResult:
        """Score a response given without its prompt (verl's reward manager passes the response alone), as if a
        ``template`` prompt came before it."""
        ...

    def difficulty_label(self, difficulty: int) -> str:
        """How a table names a difficulty (a column of per-difficulty accuracy): ``3 people``."""
        ...

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        """Score the decoded ``response`` (generated text only, special tokens kept); tasks whose reward reads the
        prompt (K&K) prepend ``example.prompt`` themselves."""
        ...

    def sft_response(self, example: TaskExample, target: str) -> str:
        """A response that scores ``max_reward`` on ``example``: the SFT warm start's target (without EOS). ``target``
        is ``sft.target``: ``"answer"``, ``"cot"`` (reasoning first, where the task has any) or ``"cot_random"`` (K&K:
        the reasoning's search order drawn)."""
        ...

    def tokenizer_corpus(self, difficulties: Iterable[int], template: str) -> Iterator[str]:
        """Deterministic task text the embedded tiny model's tokenizer is trained on."""
        ...

    def write_data(self, options: Any, *, progress: ProgressFactory, log: Callable[[str], None]) -> None:
        """``tokenbalance gen-data <name>``: write the files ``options`` (the parsed command line, an
        ``argparse.Namespace``) asks for, calling ``log`` with one line per file written."""
        ...


class BaseTask:
    """Defaults for the optional parts of :class:`Task`; a task subclasses it and provides ``name``, ``templates``,
    ``max_reward``, ``examples``, ``render_prompt``, ``score`` and ``sft_response``."""

    name: str
    templates: tuple[str, ...]
    max_reward: float
    special_tokens: tuple[str, ...] = ()
    # whether sft_response takes error_rate (sft.error_rate: a noisy teacher's working)
    noisy_teacher: bool = False
    # the classes text_classes gives, the last being the rest (spaces, special tokens), and which of them are
    # decisions (a token profile by class)
    token_class_names: tuple[str, ...] = ()
    decision_classes: tuple[str, ...] = ()
    # seeds of the three uses when a task generates examples from a seed alone (disjoint streams)
    USE_SEEDS = {"eval": 0, "rl": 1, "sft": 2, "validation": 3}

    def example_source(self, use: str, difficulty: int, count: int) -> ExampleSource:
        """Held-out examples from the test split with seed 0, validation examples from it with seed 3; RL and SFT
        examples from the train split with seeds 1 and 2; ``count`` of each."""
        if use not in EXAMPLE_USES:
            raise ValueError(f"use: unknown value {use!r}; valid: {', '.join(map(repr, EXAMPLE_USES))}")
        split = "test" if use in ("eval", "validation") else "train"
        return ExampleSource(split, count=count, seed=self.USE_SEEDS[use])

    def examples(self, *args: Any, **options: Any) -> list[TaskExample]:
        raise NotImplementedError(f"task {self.name!r} must define examples()")

    def sft_response(self, example: TaskExample, target: str) -> str:
        raise NotImplementedError(f"task {self.name!r} must define sft_response()")

    def read_examples(self, path: str, template: str | None = None) -> list[TaskExample]:
        raise ValueError(f"task {self.name!r} reads no data files; leave data.train_file / data.eval_file unset")

    def tokenizer_corpus(self, difficulties: Iterable[int], template: str) -> Iterator[str]:
        """The prompts and :meth:`sft_response` answers of :meth:`corpus_examples`."""
        for example in self.corpus_examples(difficulties, template):
            yield example.prompt
            yield self.sft_response(example, "answer")

    def corpus_examples(self, difficulties: Iterable[int], template: str) -> Iterator[TaskExample]:
        """The first 200 SFT examples per difficulty: what the tokenizer corpus is drawn from."""
        for difficulty in difficulties:
            source = self.example_source("sft", difficulty, 200)
            yield from self.examples(
                source.split,
                difficulty=difficulty,
                count=source.count,
                start_index=source.start_index,
                seed=source.seed,
                template=template,
            )

    def write_data(self, options: Any, *, progress: ProgressFactory, log: Callable[[str], None]) -> None:
        raise ValueError(f"task {self.name!r} writes no data files")

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        raise NotImplementedError(f"task {self.name!r} must define score()")

    def score_without_prompt(self, response: str, ground_truth: Any, template: str) -> ScoreResult:
        """:meth:`score` with an empty prompt: right for a task whose reward reads the response alone."""
        return self.score(
            response, TaskExample(prompt="", question="", ground_truth=ground_truth, data_source=self.name)
        )

    def difficulty_label(self, difficulty: int) -> str:
        return f"difficulty {difficulty}"

    def text_classes(self, text: str) -> list[str] | None:
        """The class of each character of a response (a token-class profile's input: which tokens are decisions, which
        are wording), or None when the task does not tell."""
        return None
