"""Input validation shared by the algorithm functions.

Every check raises ``ValueError`` with the argument's name, the value received and what is
allowed, so a user sees the cause of a bad call at the boundary instead of a shape error deep
inside torch. Checks on tensor *values* look only at valid (masked-in) positions: padding may
hold anything, including NaN or -inf.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Fail unless ``tensor.shape == shape``."""
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(tensor.shape)}")


def check_ndim(name: str, tensor: torch.Tensor, ndim: int, suffix: str) -> None:
    """Fail unless ``tensor`` has ``ndim`` dimensions; ``suffix`` names them (e.g. ``"BT"``)."""
    if tensor.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d tensor [{', '.join(suffix)}], got shape {tuple(tensor.shape)}")


def check_range(
    name: str,
    value: float,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Fail unless ``low <= value <= high`` (each bound strict when its ``*_open`` flag is set)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        raise ValueError(f"{name}: must be in {left}{low}, {high}{right}, got {value!r}")


def check_choice(name: str, value: str, choices: Iterable[str]) -> None:
    """Fail unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}: unknown value {value!r}; valid: {', '.join(map(repr, choices))}")


def check_finite(name: str, tensor: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Fail if ``tensor`` holds NaN or +-Inf where ``mask`` is true (everywhere if no mask)."""
    values = tensor if mask is None else tensor[mask.bool()]
    if values.numel() and not bool(torch.isfinite(values).all()):
        bad = values[~torch.isfinite(values)][0].item()
        where = "at valid positions" if mask is not None else ""
        raise ValueError(f"{name}: must be finite {where}, found {bad}".replace("  ", " "))


def masked_fill_invalid(tensor: torch.Tensor, mask: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """Return ``tensor`` with every position where ``mask`` is false replaced by ``value``.

    Uses ``torch.where`` rather than a product so NaN / Inf padding cannot leak (``nan * 0`` is NaN).
    """
    return torch.where(mask.bool(), tensor, torch.full_like(tensor, value))
