"""Shared tiny fixtures for tests/models and tests/rollout (built once per test process)."""

from __future__ import annotations

import copy
import functools

import torch

from tokenbalance.models import TinyModelConfig, build_tiny_model, train_tokenizer
from tokenbalance.tasks.kk import tokenizer_corpus

TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=256)


@functools.lru_cache(maxsize=1)
def _cached_tokenizer():
    return train_tokenizer(tokenizer_corpus((2, 3), count=40), vocab_size=512)


def kk_tokenizer():
    """A 512-token K&K tokenizer (a private copy: tests may mutate it)."""
    return copy.deepcopy(_cached_tokenizer())


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    torch.set_num_threads(1)
    config = TinyModelConfig(**{**TINY.__dict__, "arch": arch, **overrides})
    return build_tiny_model(config, _cached_tokenizer(), seed=seed)
