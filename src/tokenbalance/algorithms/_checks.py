"""Input validation shared by the algorithm functions (docs/methods.md §8).

Every check raises ``ValueError`` naming the argument, the value received and what is allowed, so a bad call fails at
the boundary, not as a shape error deep inside torch. Tensor-value checks look only at valid (masked-in) positions:
padding may hold anything, NaN or -inf included. Read as ``from tokenbalance.algorithms import _checks as check``:
``check.shape``, ``check.ndim``, ``check.finite``; ``check.in_range`` and ``check.choice`` are :mod:`tokenbalance.checks`'
(shared with the config, the tasks and the models). :func:`param` declares a hyper-parameter field with its help."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any

import torch

from tokenbalance.checks import check_choice as choice
from tokenbalance.checks import check_range as in_range

__all__ = ["choice", "finite", "in_range", "masked_fill_invalid", "ndim", "param", "shape"]


def shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    """Fail unless ``tensor.shape == expected``."""
    if tuple(tensor.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(tensor.shape)}")


def ndim(name: str, tensor: torch.Tensor, expected: int, suffix: str) -> None:
    """Fail unless ``tensor`` has ``expected`` dimensions; ``suffix`` names them (e.g. ``"BT"``)."""
    if tensor.dim() != expected:
        raise ValueError(
            f"{name}: expected a {expected}-d tensor [{', '.join(suffix)}], got shape {tuple(tensor.shape)}"
        )


def finite(name: str, tensor: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Fail if ``tensor`` holds NaN or +-Inf where ``mask`` is true (everywhere if no mask)."""
    values = tensor if mask is None else tensor[mask.bool()]
    if values.numel() and not bool(torch.isfinite(values).all()):
        bad = values[~torch.isfinite(values)][0].item()
        where = "at valid positions" if mask is not None else ""
        raise ValueError(f"{name}: must be finite {where}, found {bad}".replace("  ", " "))


def masked_fill_invalid(tensor: torch.Tensor, mask: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """Return ``tensor`` with every position where ``mask`` is false replaced by ``value``.

    Uses ``torch.where`` rather than a product so NaN / Inf padding cannot leak (``nan * 0`` is NaN)."""
    return torch.where(mask.bool(), tensor, torch.full_like(tensor, value))


def param(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING) -> Any:
    """A hyper-parameter field: its default and its help text (``metadata["help"]``, which ``--help-config`` and
    ``tokenbalance list-methods`` print) declared in one place."""
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})
