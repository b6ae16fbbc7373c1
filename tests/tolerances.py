"""Comparison tolerances derived from the dtype a computation really ran in.

Two evaluations of the same quantity differ by rounding that depends on the summation order (the
BLAS kernel, the thread count, chunking, the split over ranks); that order differs between CPUs,
so a fixed tolerance tuned on one machine fails on the next. The bound used here is ``ulps`` units
of the dtype's machine epsilon, scaled by the largest magnitude compared (at least 1): rounding of
a sum of n terms grows like sqrt(n) to n ulps of its largest partial sum, and the default of 64
ulps covers the few-hundred-term sums of these tests with margin, while staying orders of magnitude
below any real discrepancy (a wrong mask or a missing factor moves values by 1e-3 or more).
"""

from __future__ import annotations

import torch

DEFAULT_ULPS = 64


def dtype_atol(dtype: torch.dtype, scale: float = 1.0, ulps: int = DEFAULT_ULPS) -> float:
    """``ulps`` machine epsilons of ``dtype``, times ``max(|scale|, 1)``."""
    return ulps * torch.finfo(dtype).eps * max(abs(float(scale)), 1.0)


def assert_close_in(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, ulps: int = DEFAULT_ULPS, msg: str = ""
) -> None:
    """``actual`` equals ``expected`` up to rounding of a computation carried out in ``dtype``."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 1.0
    atol = dtype_atol(dtype, scale, ulps)
    diff = float((actual.detach().double() - expected.detach().double()).abs().max()) if expected.numel() else 0.0
    assert diff <= atol, (
        f"{msg}: max |difference| {diff:.3g} > {atol:.3g} ({ulps} ulps of {dtype} at scale {scale:.3g})"
    )
