"""Knights & Knaves reward for verl's custom reward function hook.

Point verl at it with::

    reward.custom_reward_function.path=pkg://tokenbalance.integrations.verl.reward
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.template=qwen-instruct   # optional

verl's reward manager passes the decoded **response only** (special tokens skipped), while the
Logic-RL / AR-Lopti reward reads prompt + response. We therefore score with
:func:`tokenbalance.tasks.kk.reward.score_response`, which puts the prompt template's assistant
header in front of the response, exactly what the reference saw after its ``Assistant`` split
(docs/tasks.md). The template must be the one the data was generated with (``gen-data``'s
``--template``, default ``qwen-instruct``).

Returns verl's dict form: ``score`` (3, -0.5, -1 or -3) plus ``format_ok``, ``answer_parsed``
and ``correct`` (0/1, logged by verl as reward extras; ``correct`` is the paper's accuracy).
"""

from __future__ import annotations

from typing import Any

from tokenbalance.tasks.kk.reward import score_response
from tokenbalance.tasks.kk.templates import DEFAULT_TEMPLATE

KK_DATA_SOURCE_PREFIX = "kk_logic"


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    template: str = DEFAULT_TEMPLATE,
    **_: Any,
) -> dict[str, float]:
    """Score one decoded response against a K&K row's ``reward_model.ground_truth``."""
    if not str(data_source).startswith(KK_DATA_SOURCE_PREFIX):
        raise ValueError(
            f"data_source: {data_source!r} is not a Knights & Knaves row (expected {KK_DATA_SOURCE_PREFIX}*, "
            "as written by `tokenbalance gen-data kk`)"
        )
    score = score_response(solution_str, ground_truth, template)
    return {"score": score.total, **score.metrics()}
