"""Tiny causal LMs and tokenizers built locally; any Hugging Face causal LM loaded from a directory.

    from tokenbalance.models import TinyModelConfig, build_tiny_model, load_policy, save_policy, train_tokenizer
    from tokenbalance.tasks import get_task
    tokenizer = train_tokenizer(get_task("kk").tokenizer_corpus([2, 3], "compact"), vocab_size=1024)
    model = build_tiny_model(TinyModelConfig(arch="qwen2"), tokenizer, seed=0)
    save_policy(model, tokenizer, "runs/tiny/init")
    model, tokenizer = load_policy("runs/tiny/init")       # or any local HF causal-LM directory

Nothing here reaches for the Hugging Face hub: tokenizers are trained on task text, models are
built from an architecture config, and loading takes local directories only.
Modules: ``tokenizer`` (byte-level BPE trained on any text; the tasks give theirs), ``tiny`` (model config and builder),
``loading`` (atomic safetensors save, checked local load, tag checks).

CPU: everything above as written (tiny models train and generate on a laptop core).
One GPU: ``load_policy(path, device="cuda", dtype=torch.bfloat16)``, or ``model.to("cuda")``.
Tests: ``.venv/bin/pytest tests/models -q``.
"""

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
