"""A registered task's reward as a TRL reward function (Knights & Knaves by default), and a prompt
dataset of the task for TRL.

TRL calls a reward function with the batch's ``prompts``, decoded ``completions``, their
``completion_ids`` and every other dataset column as a keyword (a list per column). The task scores
decoded prompt + response with special tokens kept (K&K's reference reward reads its tags); TRL
decodes completions with ``skip_special_tokens=True``, so given a tokenizer :class:`TaskReward`
decodes ``completion_ids`` itself (EOS dropped, other special tokens kept), exactly as our trainer
does. Any other TRL reward function (a plain callable) can stand beside it in ``reward_funcs``.

    dataset = task_prompt_dataset(64, difficulty=3, template="qwen-instruct")
    trainer = TokenBalanceGRPOTrainer(model, reward_funcs=TaskReward(tokenizer), train_dataset=dataset, ...)
"""

from __future__ import annotations

from typing import Any

from tokenbalance.tasks import DEFAULT_TASK, TaskExample, get_task

GROUND_TRUTH_COLUMN = "ground_truth"


class TaskReward:
    """TRL reward function: the task's reward of prompt + completion (K&K: 3, -0.5, -1 or -3).

    Args:
        tokenizer: decode ``completion_ids`` with special tokens kept (recommended); ``None`` uses
            TRL's decoded ``completions``.
        task: a registered task name (``tokenbalance.tasks.register_task`` adds yours).
    """

    def __init__(self, tokenizer=None, task: str = DEFAULT_TASK) -> None:
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
        if GROUND_TRUTH_COLUMN not in columns:
            raise ValueError(f"TaskReward: the dataset needs a {GROUND_TRUTH_COLUMN!r} column (task_prompt_dataset)")
        truths = columns[GROUND_TRUTH_COLUMN]
        ids = completion_ids if completion_ids is not None else [None] * len(completions)
        return [
            float(self.task.score(self.response_text(completion, row_ids), self._example(prompt, truth)).reward)
            for prompt, completion, row_ids, truth in zip(prompts, completions, ids, truths, strict=True)
        ]

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
