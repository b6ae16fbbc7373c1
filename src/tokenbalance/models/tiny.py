"""Tiny causal LMs (Llama or Qwen2 architecture) from a config and a local tokenizer: a stock ``transformers`` class
(saves, loads, generates like a hub checkpoint), small enough for a CPU; the same seed gives the same weights, the
global RNG untouched. docs/training.md ("Models").

    model = build_tiny_model(TinyModelConfig(arch="qwen2"), tokenizer, seed=0)"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tokenbalance.checks import check_range

ARCHITECTURES = ("llama", "qwen2")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass(frozen=True)
class TinyModelConfig:
    """Sizes of a tiny decoder-only model (vocabulary from the tokenizer).

    Attributes:
        arch: ``"llama"`` (no attention biases) or ``"qwen2"`` (q/k/v biases, like Qwen2.5).
        hidden_size: width D, a multiple of ``num_heads`` with an even head size (RoPE).
        num_kv_heads: key/value heads (GQA), dividing ``num_heads``; ``None`` = ``num_heads``.
        intermediate_size: SwiGLU MLP width; max_position_embeddings: longest prompt + response.
        tie_word_embeddings: share input embedding and LM head (as Qwen2.5-0.5B/3B)."""

    arch: str = "llama"
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {self.arch!r}")
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            check_range(name, getattr(self, name), 1, integer=True)
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"hidden_size must be a multiple of num_heads ({self.num_heads}), got {self.hidden_size}")
        if (self.hidden_size // self.num_heads) % 2 != 0:
            raise ValueError(
                f"hidden_size / num_heads (the head size) must be even for RoPE, got "
                f"hidden_size={self.hidden_size}, num_heads={self.num_heads}"
            )
        kv = self.num_kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.num_heads % kv):
            raise ValueError(
                f"num_kv_heads must be None or a divisor of num_heads ({self.num_heads}) in "
                f"1..{self.num_heads}, got {kv!r}"
            )
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"tie_word_embeddings must be a bool, got {self.tie_word_embeddings!r}")
        check_range("rope_theta", self.rope_theta, 0.0, low_open=True)

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (``num_kv_heads`` resolved)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """``pad_token_id``, ``eos_token_id`` and ``bos_token_id`` of ``tokenizer``; BOS falls back to EOS (Qwen's
    convention) when the tokenizer has none. ``ValueError`` if pad or eos is unset."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token; set tokenizer.eos_token")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; set one, e.g. tokenizer.pad_token = tokenizer.eos_token")
    bos = tokenizer.bos_token_id
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id if bos is None else bos,
    }


def hf_config(config: TinyModelConfig, vocab_size: int, token_ids: dict[str, int]) -> PretrainedConfig:
    """The ``transformers`` architecture config for ``config`` with a ``vocab_size`` vocabulary."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        **token_ids,
    )
    if config.arch == "llama":
        return LlamaConfig(**common, attention_bias=False, mlp_bias=False)
    return Qwen2Config(**common, use_sliding_window=False)


def build_tiny_model(
    config: TinyModelConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A freshly initialised float32 ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` on the CPU with ``len(tokenizer)``
    tokens, its pad / eos / bos ids in ``model.config`` and ``generation_config``; weights depend only on ``(config,
    len(tokenizer), seed)``."""
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, got {attn_implementation!r}"
        )
    token_ids = special_token_ids(tokenizer)
    architecture = hf_config(config, len(tokenizer), token_ids)
    architecture._attn_implementation = attn_implementation
    model_class = LlamaForCausalLM if config.arch == "llama" else Qwen2ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(architecture)
    model.generation_config = GenerationConfig(**token_ids)
    return model


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Number of distinct parameters (a tied embedding / LM head matrix counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
