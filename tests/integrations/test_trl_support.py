"""Shared pieces of the TRL integration tests: the tiny policy directory and a fixed batch.

No tests here; the ``test_trl_`` prefix only keeps the file with the TRL tests it serves. The TRL
tests' offline flags are a fixture (``trl_offline``, tests/integrations/conftest.py), not set here.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

GROUP = 4


@functools.lru_cache(maxsize=1)
def tiny_policy_dir() -> Path:
    """The smoke run's 2-layer hidden-32 Llama + K&K tokenizer, saved once per test process."""
    from tokenbalance.integrations.trl.smoke import build_tiny_policy

    root = Path(tempfile.mkdtemp(prefix="tb-trl-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return build_tiny_policy(root / "tiny")


def fixed_batch(tokenizer, *, prompts: int = 2, group: int = GROUP, max_len: int = 7, seed: int = 0) -> dict:
    """Left-padded K&K prompts (different lengths), random right-padded completions, rewards.

    Returns tensors named as TRL names them (``prompt_ids``, ``completion_mask``, ...) plus
    ``scores_B`` and ``group_ids_B`` for our side.
    """
    from tokenbalance.integrations.trl.rewards import task_prompt_rows

    gen = torch.Generator().manual_seed(seed)
    rows = task_prompt_rows(prompts, difficulty=2, template="compact")
    prompt_lists = [tokenizer(r["prompt"])["input_ids"] for r in rows for _ in range(group)]
    P = max(len(ids) for ids in prompt_lists)
    B = len(prompt_lists)
    prompt_ids = torch.full((B, P), tokenizer.pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    for i, ids in enumerate(prompt_lists):
        prompt_ids[i, P - len(ids) :] = torch.tensor(ids)
        prompt_mask[i, P - len(ids) :] = 1
    lengths = torch.randint(2, max_len + 1, (B,), generator=gen)
    lengths[0] = max_len
    completion_ids = torch.randint(10, 400, (B, max_len), generator=gen)
    completion_mask = (torch.arange(max_len)[None] < lengths[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id)
    scores_B = torch.randn(B, generator=gen, dtype=torch.float64).round(decimals=1)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "scores_B": scores_B,
        "group_ids_B": torch.arange(B) // group,
    }
