"""Matrix products in float32 and bfloat16 at one thread, at SmolLM2-135M's shapes (hidden 576, MLP 1536,
vocabulary 49,152): the rate of each and their ratio, measured in one run. A CPU with AMX or AVX-512 BF16
multiplies bfloat16 in hardware; an AVX2-only CPU emulates it (docs/training.md, "Mixed precision").

    .venv/bin/python benchmarks/bf16_products.py
"""

from __future__ import annotations

import argparse
import functools

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import interleaved_medians, machine_line, markdown_table

SHAPES = {  # (rows, inner, columns): a micro-batch's tokens through one projection
    "attention q/o (2048 x 576 x 576)": (2048, 576, 576),
    "MLP up (2048 x 576 x 1536)": (2048, 576, 1536),
    "MLP down (2048 x 1536 x 576)": (2048, 1536, 576),
    "output layer (512 x 576 x 49152)": (512, 576, 49152),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, (m, k, n) in SHAPES.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        operands = {label: (a.to(dtype), b.to(dtype)) for label, dtype in DTYPES.items()}
        # the two types alternate round by round, so a slow spell of the machine hits both alike
        seconds, _ = interleaved_medians(
            {label: functools.partial(torch.matmul, x, y) for label, (x, y) in operands.items()}, args.repeats
        )
        flop = 2 * m * k * n
        f32, bf16 = seconds["float32"], seconds["bfloat16"]
        rows.append([name, f"{flop / f32 / 1e9:.1f}", f"{flop / bf16 / 1e9:.1f}", f"{f32 / bf16:.2f}x"])
    print(markdown_table(["product", "float32 GFLOP/s", "bfloat16 GFLOP/s", "bfloat16 / float32"], rows))
    print(f"\n{machine_line()}; cpu capability {torch.backends.cpu.get_cpu_capability()}; median of {args.repeats}")


if __name__ == "__main__":
    main()
