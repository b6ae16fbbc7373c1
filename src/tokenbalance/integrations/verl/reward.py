"""A registered task's reward for verl's custom reward function hook (Knights & Knaves by default)::

    reward.custom_reward_function.path=pkg://tokenbalance.integrations.verl.reward
    +reward.custom_reward_function.reward_kwargs.task=arith        # optional; also template=, reward=

verl passes the decoded response only; the task scores it behind the template's assistant header
(``Task.score_without_prompt``) and returns ``score`` plus its metrics (K&K ``correct`` is the
paper's accuracy). Your own ``fn(response, **row)`` and the row it gets: docs/tasks.md; docs/verl.md.
"""

from __future__ import annotations

from typing import Any

from tokenbalance.tasks import DEFAULT_TASK, get_task
from tokenbalance.tasks.function import cached_function_task

REWARD_PATH = "pkg://tokenbalance.integrations.verl.reward"  # reward.custom_reward_function.path
FUNCTION_MAX_REWARD = 1.0  # reward_kwargs.max_reward of your own reward function, when not given


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    template: str | None = None,
    task: str = DEFAULT_TASK,
    reward: str | None = None,
    max_reward: float = FUNCTION_MAX_REWARD,
    **_: Any,
) -> dict[str, float]:
    """Score one decoded response against its row's ``reward_model.ground_truth`` with ``task``, or
    with your function ``reward`` (module docstring)."""
    if reward is not None:
        if task != DEFAULT_TASK:
            raise ValueError(f"reward_kwargs: give task ({task!r}) or reward, not both")
        row = dict(extra_info or {})
        row.update(ground_truth if isinstance(ground_truth, dict) else {"ground_truth": ground_truth})
        row["data_source"] = data_source
        where = f"verl row {row['index']}" if "index" in row else f"a verl row of {data_source!r}"
        result = cached_function_task(reward, float(max_reward), "reward_kwargs.").score_row(solution_str, row, where)
        return {"score": result.reward, **result.metrics}
    scorer = get_task(task)
    own_source = getattr(scorer, "data_source", None)  # a task that writes its rows names their source
    if own_source is not None and not str(data_source).startswith(own_source):
        raise ValueError(
            f"data_source: {data_source!r} is not a row of task {task!r} (expected {own_source}*, as written by "
            f"`tokenbalance gen-data {task}`); set reward_kwargs.task"
        )
    score = scorer.score_without_prompt(solution_str, ground_truth, template or scorer.templates[0])
    return {"score": score.reward, **score.metrics}
