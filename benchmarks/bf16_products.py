"""Matrix products in float32 and bfloat16 at one thread, at SmolLM2-135M's shapes (hidden 576, MLP 1536,
vocabulary 49,152): the rate of each and their ratio, measured in one run. A CPU with AMX or AVX-512 BF16
multiplies bfloat16 in hardware; an AVX2-only CPU emulates it (docs/training.md, "Mixed precision").

    .venv/bin/python benchmarks/bf16_products.py
"""

from __future__ import annotations

import argparse
import time

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import markdown_table

SHAPES = {  # (rows, inner, columns): a micro-batch's tokens through one projection
    "attention q/o (2048 x 576 x 576)": (2048, 576, 576),
    "MLP up (2048 x 576 x 1536)": (2048, 576, 1536),
    "MLP down (2048 x 1536 x 576)": (2048, 1536, 576),
    "output layer (512 x 576 x 49152)": (512, 576, 49152),
}


def seconds_per_product(rows: int, inner: int, cols: int, dtype: torch.dtype, repeats: int) -> float:
    a = torch.randn(rows, inner).to(dtype)
    b = torch.randn(inner, cols).to(dtype)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, (m, k, n) in SHAPES.items():
        flop = 2 * m * k * n
        f32 = seconds_per_product(m, k, n, torch.float32, args.repeats)
        bf16 = seconds_per_product(m, k, n, torch.bfloat16, args.repeats)
        rows.append([name, f"{flop / f32 / 1e9:.1f}", f"{flop / bf16 / 1e9:.1f}", f"{f32 / bf16:.2f}x"])
    print(markdown_table(["product", "float32 GFLOP/s", "bfloat16 GFLOP/s", "bfloat16 / float32"], rows))
    print(f"\ncpu capability {torch.backends.cpu.get_cpu_capability()}; 1 thread; median of {args.repeats}")


if __name__ == "__main__":
    main()
