"""The Knights & Knaves task object for the trainer (the :class:`~tokenbalance.tasks.base.Task`
protocol): Logic-RL examples, prompt rendering and the reference reward.

``score`` puts ``example.prompt`` in front of the response and calls
:func:`~tokenbalance.tasks.kk.reward.score_with_metrics`, which is how the reference scores
(decoded prompt + response).
Its three flags (format_ok, answer_parsed, correct) are the metrics.
"""

from __future__ import annotations

from typing import Any

from tokenbalance.tasks.base import ScoreResult, TaskExample
from tokenbalance.tasks.kk.generator import DEFAULT_SEED
from tokenbalance.tasks.kk.records import DEFAULT_DATA_SOURCE, generate_rows
from tokenbalance.tasks.kk.reward import score_with_metrics
from tokenbalance.tasks.kk.templates import TEMPLATE_NAMES, get_template


def example_from_generated_row(row: dict[str, Any]) -> TaskExample:
    """A :class:`TaskExample` from a row of :func:`~tokenbalance.tasks.kk.records.generate_rows`."""
    return TaskExample(
        prompt=row["prompt"][0]["content"],
        question=row["quiz"],
        ground_truth=dict(row["reward_model"]["ground_truth"]),
        data_source=row["data_source"],
        difficulty=len(row["names"]),
        index=row["index"],
        extra={
            "names": list(row["names"]),
            "solution": list(row["solution"]),
            "split": row["extra_info"]["split"],
            "row": row["extra_info"]["index"],
        },
    )


class KKTask:
    """Knights & Knaves (Logic-RL data). ``difficulty`` is the number of people (2..8, default 3)."""

    name = "kk"
    templates = TEMPLATE_NAMES  # qwen-instruct (default), qwen-base, plain, compact

    def __init__(self, data_source: str = DEFAULT_DATA_SOURCE) -> None:
        self.data_source = data_source

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
        """The published split (train 100..999, test 1000..1099) unless ``count``/``start_index`` say
        otherwise; see :func:`~tokenbalance.tasks.kk.records.generate_rows`."""
        rows = generate_rows(
            3 if difficulty is None else difficulty,
            split,
            start_index=start_index,
            count=count,
            seed=DEFAULT_SEED if seed is None else seed,
            template=template or self.templates[0],
            data_source=self.data_source,
        )
        return [example_from_generated_row(row) for row in rows]

    def render_prompt(self, example: TaskExample, template: str) -> str:
        return get_template(template).render_puzzle(
            example.question, example.ground_truth.get("statements"), example.extra.get("names")
        )

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        result = score_with_metrics(example.prompt + response, example.ground_truth)
        return ScoreResult(reward=result.total, metrics=result.metrics())
