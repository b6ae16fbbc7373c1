"""The Knights & Knaves reward as a TRL reward function, and a K&K prompt dataset for TRL.

TRL calls a reward function with the batch's ``prompts``, decoded ``completions``, their
``completion_ids`` and every other dataset column as a keyword (a list per column). The K&K
reference reward reads decoded prompt + response with special tokens kept; TRL decodes completions
with ``skip_special_tokens=True``, so given a tokenizer :class:`KKReward` decodes ``completion_ids``
itself (EOS dropped, other special tokens kept), exactly as our trainer does.

    dataset = kk_prompt_dataset(64, difficulty=3, template="qwen-instruct")
    trainer = TokenBalanceGRPOTrainer(model, reward_funcs=KKReward(tokenizer), train_dataset=dataset, ...)
"""

from __future__ import annotations

from tokenbalance.tasks.kk.reward import MAX_REWARD, compute_score

GROUND_TRUTH_COLUMN = "solution_text_format"


class KKReward:
    """TRL reward function: the K&K reference reward (3, -0.5, -1 or -3) of prompt + completion.

    Args:
        tokenizer: decode ``completion_ids`` with special tokens kept (recommended); ``None`` uses
            TRL's decoded ``completions``.
    """

    __name__ = "kk"  # TRL names the reward's metrics after this (rewards/kk/mean)
    max_reward = MAX_REWARD  # 3.0, a fully correct answer (NTHR's anchors)

    def __init__(self, tokenizer=None) -> None:
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = set() if eos is None else {int(eos)}

    def response_text(self, completion, completion_ids) -> str:
        if self.tokenizer is not None and completion_ids is not None:
            kept = [t for t in completion_ids if int(t) not in self.eos_token_ids]
            return self.tokenizer.decode(kept, skip_special_tokens=False)
        if not isinstance(completion, str):
            raise TypeError(
                "KKReward: conversational completions are not supported; use plain-text prompts "
                "with the template already applied (tokenbalance.tasks.kk templates)"
            )
        return completion

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[float]:
        if GROUND_TRUTH_COLUMN not in columns:
            raise ValueError(f"KKReward: the dataset needs a {GROUND_TRUTH_COLUMN!r} column (kk_prompt_dataset)")
        truths = columns[GROUND_TRUTH_COLUMN]
        ids = completion_ids if completion_ids is not None else [None] * len(completions)
        return [
            float(compute_score(prompt + self.response_text(completion, row_ids), truth))
            for prompt, completion, row_ids, truth in zip(prompts, completions, ids, truths, strict=True)
        ]


def kk_prompt_rows(
    count: int, *, difficulty: int = 3, template: str = "compact", split: str = "train", seed: int | None = None
) -> list[dict[str, str]]:
    """``count`` K&K puzzles as ``{"prompt", "solution_text_format"}`` rows (prompt template applied)."""
    from tokenbalance.tasks import get_task

    examples = get_task("kk").examples(split, difficulty=difficulty, count=count, seed=seed, template=template)
    return [{"prompt": e.prompt, GROUND_TRUTH_COLUMN: e.ground_truth["solution_text_format"]} for e in examples]


def kk_prompt_dataset(count: int, **options):
    """A ``datasets.Dataset`` of :func:`kk_prompt_rows` (the columns :class:`KKReward` reads)."""
    from datasets import Dataset

    return Dataset.from_list(kk_prompt_rows(count, **options))
