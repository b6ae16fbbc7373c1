"""Shared pieces of the benchmark scripts: the benchmark model, timing, the machine line, tables.

Every benchmark builds its models locally (no hub), fixes the torch thread count, warms each
contender up once, and reports medians of repeated runs plus ratios computed from numbers taken
in the same process, so the machine's drift between runs cancels as far as it can.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import TypeVar

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from tokenbalance.models import TinyModelConfig, train_tokenizer
from tokenbalance.tasks.kk import tokenizer_corpus

Result = TypeVar("Result")

# The reference size: a Qwen2-style model of about 1.1M parameters (hidden 128, 4 layers).
BENCH_MODEL = TinyModelConfig(
    arch="qwen2", hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, max_position_embeddings=512
)


def bench_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer trained on K&K text (a few seconds, no network)."""
    return train_tokenizer(tokenizer_corpus((3,), count=200), vocab_size=vocab_size)


def random_prompts(count: int, length: int, vocab_low: int, vocab_high: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn uniformly from [vocab_low, vocab_high)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(vocab_low, vocab_high, (count, length), generator=generator).tolist()


def interleaved_medians(
    contenders: dict[str, Callable[[], Result]],
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
) -> tuple[dict[str, float], dict[str, Result]]:
    """Median wall time of each contender over ``repeats`` rounds, and each one's last result.

    Every round runs all contenders once, in turn, after ``warmup`` untimed rounds: a slow spell of
    the machine then hits every contender alike instead of whichever happened to run during it.
    ``sync`` runs before the clock starts and before it stops (on a GPU: wait for queued work).
    """
    results: dict[str, Result] = {}
    for _ in range(warmup):
        for label, fn in contenders.items():
            results[label] = fn()
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for _ in range(repeats):
        for label, fn in contenders.items():
            sync()
            start = time.perf_counter()
            results[label] = fn()
            sync()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}, results


def matmul_flops_per_s(
    size: int = 512, repeats: int = 20, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> float:
    """The matrix-multiply rate (FLOP/s) of ``size`` x ``size`` products in ``dtype`` on ``device``
    (on the CPU at the current thread count); random operands."""
    device = torch.device(device)
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    seconds, _ = interleaved_medians({"mm": lambda: a @ b}, repeats, warmup=3, sync=lambda: synchronize(device))
    return 2 * size**3 / seconds["mm"]


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): timings then cover the work itself."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_line(device: str | torch.device = "cpu") -> str:
    line = (
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch {version('torch')} "
        f"with {torch.get_num_threads()} threads, transformers {version('transformers')}, "
        f"Python {platform.python_version()}"
    )
    device = torch.device(device)
    if device.type == "cuda":
        line += f"; GPU {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    return line


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def profile_shares(fn: Callable[[], object], title: str, top: int = 6) -> str:
    """The operators taking the most CPU time in one call of ``fn``, as shares of the profiled total."""
    from torch.profiler import profile

    with profile() as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    rows = [
        [e.key, f"{e.count}", f"{e.self_cpu_time_total / 1e3:.0f}", f"{e.self_cpu_time_total / total:.0%}"]
        for e in events[:top]
    ]
    return markdown_table([f"operator ({title})", "calls", "self CPU ms", "share"], rows)


def testbed_policy_and_prompts(argv_description: str):
    """The command line of a benchmark on the reasoning testbed's policy (``--model``,
    ``--max-new-tokens``, ``--repeats``), at one thread: ``(args, policy, tokenizer, prompts)``, the
    prompts 32 validation K&K puzzles of 3 and 4 people (16 each)."""
    import argparse

    from tokenbalance.config import RunConfig, apply_overrides
    from tokenbalance.models import load_policy
    from tokenbalance.run.examples import encode_prompts, eval_examples

    parser = argparse.ArgumentParser(description=argv_description)
    parser.add_argument("--model", required=True, help="a policy directory (the testbed's SFT policy)")
    parser.add_argument("--max-new-tokens", type=int, default=440)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy, tokenizer = load_policy(args.model, device="cpu")
    config = apply_overrides(
        RunConfig(), ["data.eval_set=validation", "data.eval_difficulties=[3,4]", "data.eval_count=32"]
    )
    prompts = encode_prompts(tokenizer, eval_examples(config.data), config.data.max_prompt_tokens)
    return args, policy, tokenizer, prompts
