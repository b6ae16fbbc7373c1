"""Decoding under bfloat16 autocast with a bfloat16 K/V cache (the fast engine's choice, ``layers.cache_dtype``)
against a float32 cache, and against float32 decoding without autocast: same weights, prompts and sampling, the
three alternating round by round (``_common.interleaved_medians``).

With a float32 cache under autocast every attention step reads the cache in float32 and autocast converts it to
bfloat16 for the product, as the engine did before its cache took the compute type (commit 0cb21dd); the contender
is that same engine with ``cache_dtype`` answering float32. Reports tokens/s and the ratios.

    .venv/bin/python benchmarks/kv_cache_precision.py                          # SmolLM2-135M's decoder, 1 thread
    .venv/bin/python benchmarks/kv_cache_precision.py --prompt-len 512 --new-tokens 256
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Callable, Iterator

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import bench_tokenizer, interleaved_medians, machine_line, markdown_table, random_prompts
from _shapes import SHAPES, build_model
from tokenbalance.models import count_parameters
from tokenbalance.rollout import FastEngine, Generation, SamplingParams, layers


@contextlib.contextmanager
def float32_cache() -> Iterator[None]:
    """The fast engine's K/V cache in float32 whatever autocast computes in (the engine before 0cb21dd)."""
    chosen = layers.cache_dtype
    layers.cache_dtype = lambda weight: torch.float32
    try:
        yield
    finally:
        layers.cache_dtype = chosen


def decode(engine: FastEngine, prompts, params, group_size: int, *, autocast: bool, cache32: bool = False):
    with (
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        float32_cache() if cache32 else contextlib.nullcontext(),
    ):
        return engine.generate(prompts, params, n=group_size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="smollm2-135m", choices=tuple(SHAPES), help="model shape (random weights)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.batch % args.group_size:
        parser.error(f"--batch {args.batch} must be a multiple of --group-size {args.group_size}")
    torch.set_num_threads(args.threads)
    tokenizer = bench_tokenizer()
    model = build_model(args.shape, tokenizer)
    never = [model.config.vocab_size]  # one past the vocabulary: every row decodes the full budget
    engine = FastEngine(model, tokenizer, eos_token_ids=never)
    prompts = random_prompts(args.batch // args.group_size, args.prompt_len, 10, len(tokenizer) - 8)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    contenders: dict[str, Callable[[], Generation]] = {
        "float32, no autocast": functools.partial(decode, engine, prompts, params, args.group_size, autocast=False),
        "bfloat16 autocast, bfloat16 K/V cache (the engine's)": functools.partial(
            decode, engine, prompts, params, args.group_size, autocast=True
        ),
        "bfloat16 autocast, float32 K/V cache (before 0cb21dd)": functools.partial(
            decode, engine, prompts, params, args.group_size, autocast=True, cache32=True
        ),
    }
    seconds, generations = interleaved_medians(contenders, args.repeats)
    labels = list(contenders)
    tokens = {label: int(generations[label].response_mask_BT.sum()) for label in labels}
    cache16, cache32 = labels[1], labels[2]
    rows = [
        [
            label,
            f"{tokens[label]:,}",
            f"{seconds[label]:.2f}",
            f"{tokens[label] / seconds[label]:,.0f}",
            f"{seconds[labels[0]] / seconds[label]:.2f}x",
        ]
        for label in labels
    ]
    print(
        f"Model: {args.shape} ({count_parameters(model) / 1e6:.1f}M parameters, the local tokenizer's vocabulary), "
        f"float32 weights; {args.batch // args.group_size} prompts x {args.group_size} of {args.prompt_len} tokens, "
        f"{args.new_tokens} new tokens, T=1; median of {args.repeats} interleaved rounds after one warm-up."
    )
    print(machine_line())
    print()
    print(markdown_table(["decoding", "tokens", "seconds", "tokens/s", "speed vs float32"], rows))
    print()
    print(f"bfloat16 K/V cache / float32 K/V cache under autocast: {seconds[cache32] / seconds[cache16]:.2f}x")


if __name__ == "__main__":
    main()
