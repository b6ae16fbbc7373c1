"""Rollout tokens/s: our fast engine vs Hugging Face `generate` (default SDPA and eager attention).

Same model weights, same prompts, same sampling settings (T = 1, no top-p / top-k); every engine
generates the full budget because EOS is disabled for the measurement (each engine is handed a
token id that never occurs). The default size is the issue's reference: a 1.1M-parameter
Qwen2-style model (hidden 128, 4 layers), 128 prompts of 96 tokens, 160 new tokens, 2 threads.
``--engines`` chooses the engines (the first is the baseline of the ratios).
``--group-size G`` asks for G samples of each of batch / G distinct prompts (``n = G``), as an RL
step does (our engine then prefills each prompt once and decodes the groups together).

``--device`` / ``--dtype`` / ``--shape`` place it elsewhere (``benchmarks/_shapes.py``), e.g. on
a GPU at Qwen2.5-0.5B's shape with random weights; on CUDA the peak memory of each engine's
generation is reported too.

    .venv/bin/python benchmarks/rollout_speed.py                    # the reference size, 128 distinct prompts
    .venv/bin/python benchmarks/rollout_speed.py --group-size 8     # 16 prompts x 8, the RL layout
    .venv/bin/python benchmarks/rollout_speed.py --profile          # where the fast engine's time goes
    python benchmarks/rollout_speed.py --device cuda --dtype bfloat16 --shape qwen2.5-0.5b --group-size 8
"""

from __future__ import annotations

import argparse
import functools

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import (
    bench_tokenizer,
    interleaved_medians,
    machine_line,
    markdown_table,
    profile_shares,
    random_prompts,
    synchronize,
)
from _shapes import add_placement_options, build_model, placement
from tokenbalance.models import count_parameters
from tokenbalance.rollout import FastEngine, HFGenerateEngine, SamplingParams

ENGINE_NAMES = ("generate", "generate-eager", "fast", "fast-no-graph")  # the last: CUDA only


def engines(tokenizer, shape: str = "bench", device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """(label, engine) pairs over identical weights; EOS is an id outside the vocabulary."""
    sdpa = build_model(shape, tokenizer, attn_implementation="sdpa").to(device=device, dtype=dtype)
    eager = build_model(shape, tokenizer, attn_implementation="eager").to(device=device, dtype=dtype)
    never = [sdpa.config.vocab_size]  # one past the vocabulary: never sampled, so every row runs the full budget
    runners = {
        "generate": ("HF generate, SDPA attention (default)", HFGenerateEngine(sdpa, tokenizer, eos_token_ids=never)),
        "generate-eager": ("HF generate, eager attention", HFGenerateEngine(eager, tokenizer, eos_token_ids=never)),
        "fast": ("tokenbalance FastEngine", FastEngine(sdpa, tokenizer, eos_token_ids=never)),
    }
    if torch.device(device).type == "cuda":  # the default there replays each step as a CUDA graph
        runners["fast"] = ("tokenbalance FastEngine, CUDA graph (default on CUDA)", runners["fast"][1])
        no_graph = FastEngine(sdpa, tokenizer, eos_token_ids=never, cuda_graph=False)
        runners["fast-no-graph"] = ("tokenbalance FastEngine, no CUDA graph", no_graph)
    return runners, count_parameters(sdpa)


def peak_generation_memory(device: torch.device, engine, prompts, params, group_size: int) -> int:
    """Bytes of GPU memory allocated at the peak of one generation (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    engine.generate(prompts, params, n=group_size)
    synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="also profile one FastEngine generation")
    parser.add_argument(
        "--engines",
        default=",".join(ENGINE_NAMES),
        help="comma-separated, the first is the baseline; fast-no-graph exists on CUDA only (elsewhere skipped)",
    )
    add_placement_options(parser)
    args = parser.parse_args(argv)
    device, dtype = placement(args)
    torch.set_num_threads(args.threads)
    tokenizer = bench_tokenizer()
    names = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = [name for name in names if name not in ENGINE_NAMES]
    if unknown or not names:  # before any model is built
        parser.error(f"--engines: unknown {', '.join(unknown) or '(none given)'}; valid: {', '.join(ENGINE_NAMES)}")
    runners, params_count = engines(tokenizer, args.shape, device, dtype)
    contenders = [runners[name] for name in names if name in runners]
    if args.batch % args.group_size:
        parser.error(f"--batch {args.batch} must be a multiple of --group-size {args.group_size}")
    distinct = random_prompts(args.batch // args.group_size, args.prompt_len, 10, len(tokenizer) - 8)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    seconds, generations = interleaved_medians(
        {
            label: functools.partial(engine.generate, distinct, params, n=args.group_size)
            for label, engine in contenders
        },
        args.repeats,
        sync=lambda: synchronize(device),
    )
    peaks = {
        label: peak_generation_memory(device, engine, distinct, params, args.group_size) for label, engine in contenders
    }
    results = []
    for label, _ in contenders:
        tokens = int(generations[label].response_mask_BT.sum())
        results.append((label, tokens, seconds[label], tokens / seconds[label]))
        print(f"{label}: {tokens} tokens in {seconds[label]:.2f} s = {tokens / seconds[label]:,.0f} tok/s", flush=True)
    base = results[0][3]
    rows = [
        [label, f"{tokens:,}", f"{seconds:.2f}", f"{rate:,.0f}", f"{rate / base:.2f}x"]
        + ([f"{peaks[label] / 2**30:.2f}"] if device.type == "cuda" else [])
        for label, tokens, seconds, rate in results
    ]
    print()
    print(
        f"Model: Qwen2-style ({args.shape}), {params_count / 1e6:.2f}M parameters, {args.dtype} on {device}; "
        f"batch {args.batch} ({args.batch // args.group_size} distinct prompts x {args.group_size}), prompt "
        f"{args.prompt_len} tokens, {args.new_tokens} new tokens, T=1; median of {args.repeats} interleaved runs "
        "after one warm-up."
    )
    print(machine_line(device))
    print()
    header = [
        "engine",
        "tokens",
        "seconds",
        "tokens/s",
        "vs default generate" if names[0] == "generate" else "vs first row",
    ]
    print(markdown_table(header + (["peak GPU memory (GiB)"] if device.type == "cuda" else []), rows))
    if args.profile:
        print()
        engine = runners["fast"][1]
        print(
            profile_shares(lambda: engine.generate(distinct, params, n=args.group_size), "FastEngine, one generation")
        )


if __name__ == "__main__":
    main()
