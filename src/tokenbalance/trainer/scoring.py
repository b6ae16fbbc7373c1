"""Decoding responses and scoring them with the task (prompts are encoded by :mod:`tokenbalance.run.examples`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenbalance.tasks.base import ScoreError, ScoreResult, Task, TaskExample


def decode_responses(
    tokenizer, response_ids_BT: torch.Tensor, response_mask_BT: torch.Tensor, eos_token_ids: set[int]
) -> list[str]:
    """Response text up to (not including) the EOS token, special tokens kept (the reward reads tags)."""
    return [
        response_text(tokenizer, [t for t, m in zip(ids, mask) if m], eos_token_ids)
        for ids, mask in zip(response_ids_BT.tolist(), response_mask_BT.tolist())
    ]


def response_text(tokenizer, response_ids: list[int], eos_token_ids: set[int]) -> str:
    """One response's text from its generated ids (the mask's ones): EOS dropped, special tokens kept."""
    return tokenizer.decode([t for t in response_ids if t not in eos_token_ids], skip_special_tokens=False)


def score_responses(task: Task, responses: list[str], examples: Sequence[TaskExample]) -> list[ScoreResult]:
    """Score every response; a scorer that raises is reported with the example it failed on, as a ``ValueError`` (the
    reward is the user's input: one line on the command line, no traceback)."""
    results = []
    for response, example in zip(responses, examples):
        try:
            results.append(task.score(response, example))
        except ScoreError:  # already one line naming the example and the function (your reward)
            raise
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise ValueError(
                f"the {task.name!r} reward raised {type(err).__name__}: {err} on example "
                f"{example.data_source}:{example.index} with response {response[:200]!r}; fix the reward "
                "function so it returns a score for any text"
            ) from err
    return results
