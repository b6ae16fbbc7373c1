"""Held-out evaluation as the AR-Lopti reference logs it: accuracy (reward == the task's
``max_reward``: 3 on K&K, 1 on arith) per difficulty, for greedy decoding and for one sample at temperature 1.0, plus the mean
reward, response length and format-error rate."""

from __future__ import annotations

from collections import defaultdict

from tokenbalance.tasks.base import Task, TaskExample
from tokenbalance.trainer.scoring import decode_responses, encode_prompts, score_responses

MODES = {"greedy": 0.0, "sample": 1.0}


def full_reward(task: Task) -> float:
    """The reward of a fully correct answer: the task's ``max_reward`` (K&K 3, math 1)."""
    return float(task.max_reward)


def evaluate(
    engine,
    tokenizer,
    task: Task,
    examples: list[TaskExample],
    *,
    eos_token_ids: set[int],
    max_new_tokens: int,
    max_prompt_tokens: int,
    batch_size: int = 256,
    seed: int = 0,
) -> dict[str, float]:
    """``eval/{greedy,sample}/{acc,acc_<difficulty>,reward,response_len,format_error}`` metrics."""
    prompts = encode_prompts(tokenizer, examples, max_prompt_tokens)
    target = full_reward(task)
    metrics: dict[str, float] = {}
    for mode, temperature in MODES.items():
        per_level: dict[int, list[float]] = defaultdict(list)
        rewards, lengths, format_errors = [], [], []
        for start in range(0, len(prompts), batch_size):
            batch = examples[start : start + batch_size]
            out = engine.generate(
                prompts[start : start + batch_size],
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed + start,
            )
            texts = decode_responses(tokenizer, out.response_ids_BT, out.response_mask_BT, eos_token_ids)
            for example, result, length in zip(
                batch, score_responses(task, texts, batch), out.response_mask_BT.sum(dim=1).tolist()
            ):
                correct = float(result.reward == target)
                per_level[example.difficulty].append(correct)
                rewards.append(result.reward)
                lengths.append(length)
                format_errors.append(1.0 - float(result.metrics.get("format_ok", 1.0)))
        prefix = f"eval/{mode}"
        for level, values in sorted(per_level.items()):
            metrics[f"{prefix}/acc_{level}"] = sum(values) / len(values)
        level_accs = [metrics[f"{prefix}/acc_{level}"] for level in sorted(per_level)]
        metrics[f"{prefix}/acc"] = sum(level_accs) / len(level_accs)
        metrics[f"{prefix}/reward"] = sum(rewards) / len(rewards)
        metrics[f"{prefix}/response_len"] = sum(lengths) / len(lengths)
        metrics[f"{prefix}/format_error"] = sum(format_errors) / len(format_errors)
    return metrics
