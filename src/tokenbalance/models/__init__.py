"""Tiny causal LMs and tokenizers built locally; any Hugging Face causal LM loaded from a local directory (never the
hub).

    from tokenbalance.models import TinyModelConfig, build_tiny_model, load_policy, save_policy, train_tokenizer
    model = build_tiny_model(TinyModelConfig(arch="qwen2"), tokenizer, seed=0)
    model, tokenizer = load_policy("runs/tiny/init")       # or any local HF causal-LM directory

docs/training.md ("Models")."""

from tokenbalance.models.loading import check_policy_dir, check_special_tokens, load_policy, save_policy
from tokenbalance.models.tiny import TinyModelConfig, build_tiny_model, count_parameters
from tokenbalance.models.tokenizer import (
    CHAT_TURN_TOKENS,
    EOS_TOKEN,
    PAD_TOKEN,
    REASONING_TAGS,
    train_tokenizer,
)

__all__ = [
    "CHAT_TURN_TOKENS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "REASONING_TAGS",
    "TinyModelConfig",
    "build_tiny_model",
    "check_policy_dir",
    "check_special_tokens",
    "count_parameters",
    "load_policy",
    "save_policy",
    "train_tokenizer",
]
