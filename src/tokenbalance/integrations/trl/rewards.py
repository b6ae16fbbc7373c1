"""A registered task's reward as a TRL reward function (Knights & Knaves by default), and the task's
prompts as a TRL dataset. :class:`TaskReward` decodes ``completion_ids`` itself (EOS dropped, other
special tokens kept, as our trainer does); ``reward="mypkg.rewards:fn"`` scores with your own
``fn(response, **row)``. docs/trl.md, "Use":

    trainer = TokenBalanceGRPOTrainer(model, reward_funcs=TaskReward(tokenizer),
                                      train_dataset=task_prompt_dataset(64, difficulty=3), ...)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenbalance.tasks import DEFAULT_TASK, Task, TaskExample, get_task
from tokenbalance.tasks.function import FunctionTask

GROUND_TRUTH_COLUMN = "ground_truth"
# what TRL passes a reward function besides the dataset's columns (not columns of a row)
TRL_ARGUMENTS = frozenset({"trainer_state", "log_extra", "log_metric", "environments"})


class TaskReward:
    """TRL reward function: the task's reward of prompt + completion (K&K: 3, -0.5, -1 or -3), or
    your function's.

    Args:
        tokenizer: decode ``completion_ids`` with special tokens kept (recommended); ``None`` uses
            TRL's decoded ``completions``.
        task: a registered task name (``tokenbalance.tasks.register_task`` adds yours).
        reward: instead of a task, your reward function ``fn(response, **row)`` or its name
            (``"mypkg.rewards:gsm8k"``, ``"rewards.py:gsm8k"``), as ``tokenbalance train --reward``
            takes it; every row is the batch's ``prompt`` and other dataset columns.
        max_reward: with ``reward``: the reward of a correct response (a returned ``correct`` flag
            must agree; NTHR's anchors).
    """

    def __init__(
        self,
        tokenizer=None,
        task: str = DEFAULT_TASK,
        *,
        reward: str | Callable[..., Any] | None = None,
        max_reward: float = 1.0,
    ) -> None:
        self.function_task: FunctionTask | None = None
        self.task: Task
        if reward is not None:
            if task != DEFAULT_TASK:
                raise ValueError(f"TaskReward: give task ({task!r}) or reward, not both")
            self.function_task = FunctionTask(reward, max_reward=max_reward, prefix="")
            self.task = self.function_task
            self.__name__ = getattr(self.function_task.reward.function, "__name__", "reward")  # rewards/<fn>/mean
        else:
            self.task = get_task(task)
            self.__name__ = task  # TRL names the reward's metrics after this (rewards/kk/mean)
        self.max_reward = self.task.max_reward  # a fully correct answer (NTHR's anchors)
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = set() if eos is None else {int(eos)}

    def response_text(self, completion, completion_ids) -> str:
        if self.tokenizer is not None and completion_ids is not None:
            kept = [t for t in completion_ids if int(t) not in self.eos_token_ids]
            return self.tokenizer.decode(kept, skip_special_tokens=False)
        if not isinstance(completion, str):
            raise TypeError(
                "TaskReward: conversational completions are not supported; use plain-text prompts "
                "with the task's template already applied (task_prompt_dataset)"
            )
        return completion

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[float]:
        if self.function_task is not None:
            return self._function_rewards(self.function_task, prompts, completions, completion_ids, columns)
        if GROUND_TRUTH_COLUMN not in columns:
            raise ValueError(f"TaskReward: the dataset needs a {GROUND_TRUTH_COLUMN!r} column (task_prompt_dataset)")
        truths = columns[GROUND_TRUTH_COLUMN]
        ids = completion_ids if completion_ids is not None else [None] * len(completions)
        return [
            float(self.task.score(self.response_text(completion, row_ids), self._example(prompt, truth)).reward)
            for prompt, completion, row_ids, truth in zip(prompts, completions, ids, truths, strict=True)
        ]

    def _function_rewards(self, task: FunctionTask, prompts, completions, completion_ids, columns) -> list[float]:
        """Your function on each completion with its row: ``prompt`` and the dataset's other columns."""
        count = len(completions)
        table = {
            key: values
            for key, values in columns.items()
            if key not in TRL_ARGUMENTS and isinstance(values, (list, tuple)) and len(values) == count
        }
        ids = completion_ids if completion_ids is not None else [None] * count
        rewards = []
        for i, (prompt, completion, row_ids) in enumerate(zip(prompts, completions, ids, strict=True)):
            row = {key: values[i] for key, values in table.items()}
            row["prompt"] = prompt
            result = task.score_row(self.response_text(completion, row_ids), row, f"TRL batch row {i}")
            rewards.append(float(result.reward))
        return rewards

    def _example(self, prompt: str, ground_truth: Any) -> TaskExample:
        return TaskExample(prompt=prompt, question="", ground_truth=ground_truth, data_source=self.task.name)


def task_prompt_rows(
    count: int,
    *,
    task: str = DEFAULT_TASK,
    difficulty: int | None = None,
    template: str | None = None,
    split: str = "train",
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """``count`` generated examples of ``task`` as ``{"prompt", "ground_truth"}`` rows (the prompt
    template applied; ``template`` defaults to the task's first)."""
    examples = get_task(task).examples(split, difficulty=difficulty, count=count, seed=seed, template=template)
    return [{"prompt": e.prompt, GROUND_TRUTH_COLUMN: e.ground_truth} for e in examples]


def task_prompt_dataset(count: int, **options):
    """A ``datasets.Dataset`` of :func:`task_prompt_rows` (the columns :class:`TaskReward` reads)."""
    from datasets import Dataset

    return Dataset.from_list(task_prompt_rows(count, **options))
