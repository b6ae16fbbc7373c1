"""Where and at what size a benchmark runs: ``--device``, ``--dtype`` and ``--shape`` for the
benchmark scripts, and models of those shapes built locally with random weights (no hub).

Shapes: ``bench`` (the 1.1M-parameter reference model of the CPU tables), ``tiny`` (what
``scripts/gpu_check.sh --dry-run`` runs on a CPU), ``smollm2-135m`` (SmolLM2-135M's decoder layers with
the tokenizer's vocabulary) and ``qwen2.5-0.5b`` (Qwen2.5-0.5B's
architecture: 24 layers, hidden 896, 14 query / 2 key-value heads, MLP 4864, RoPE base 1e6, tied
embeddings, 151,936-entry vocabulary, about 494M parameters). The tokenizer stays the local K&K
one: the model's vocabulary is larger than the tokenizer's, as Qwen's is (151,936 vs 151,665),
and sampled ids past the tokenizer decode to nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch
from transformers import GenerationConfig, Qwen2ForCausalLM

from _common import BENCH_MODEL
from tokenbalance.config import RunConfig
from tokenbalance.models import TinyModelConfig, build_tiny_model, save_policy, train_tokenizer
from tokenbalance.models.tiny import hf_config, special_token_ids
from tokenbalance.tasks import get_task

SHAPES = {
    "tiny": TinyModelConfig(
        arch="qwen2", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
    ),
    "bench": BENCH_MODEL,
    # SmolLM2-135M's decoder (30 layers, hidden 576, 9 query / 3 key-value heads, MLP 1536, tied
    # embeddings) with the tokenizer's vocabulary: its attention and MLP products, a small output layer
    "smollm2-135m": TinyModelConfig(
        arch="llama",
        hidden_size=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        intermediate_size=1536,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": TinyModelConfig(
        arch="qwen2",
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
    ),
}
# the model's vocabulary where it is not the tokenizer's
VOCAB_SIZES = {"qwen2.5-0.5b": 151_936}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_placement_options(parser: argparse.ArgumentParser, *, shapes=tuple(SHAPES), default_shape="bench") -> None:
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=tuple(DTYPES), help="parameter dtype")
    parser.add_argument("--shape", default=default_shape, choices=shapes, help="model shape (random weights)")


def add_data_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-count",
        type=int,
        help="generated RL and evaluation prompts per difficulty (default: the config's; fewer start faster)",
    )


def run_config(data_count: int | None = None) -> RunConfig:
    """The default run config, with ``--data-count`` prompts per difficulty when given."""
    config = RunConfig()
    if data_count:
        config.data.rl_count = config.data.eval_count = data_count
    return config


def placement(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    return device, DTYPES[args.dtype]


def build_model(shape: str, tokenizer, *, seed: int = 0, attn_implementation: str = "sdpa"):
    """A float32 model of ``shape`` on the CPU, eval mode; the vocabulary is the tokenizer's unless
    the shape has its own (:data:`VOCAB_SIZES`)."""
    config = SHAPES[shape]
    if shape not in VOCAB_SIZES:
        return build_tiny_model(config, tokenizer, seed=seed, attn_implementation=attn_implementation).eval()
    token_ids = special_token_ids(tokenizer)
    architecture = hf_config(config, VOCAB_SIZES[shape], token_ids)
    architecture._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(architecture)
    model.generation_config = GenerationConfig(**token_ids)
    return model.eval()


def task_tokenizer(config: RunConfig | None = None):
    """The tokenizer the embedded default trains (its task's corpus, its vocabulary size)."""
    config = config or RunConfig()
    corpus = list(get_task(config.data.task).tokenizer_corpus(config.data.train_difficulties, config.data.template))
    return train_tokenizer(corpus, vocab_size=config.model.vocab_size)


def random_policy_dir(shape: str, path: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A policy directory (Hugging Face format) of ``shape`` with random weights saved in ``dtype``
    and the task tokenizer: what a local checkpoint looks like to our trainer and to TRL."""
    tokenizer = task_tokenizer()
    return save_policy(build_model(shape, tokenizer).to(dtype), tokenizer, path)
