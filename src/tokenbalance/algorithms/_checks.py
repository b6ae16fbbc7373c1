"""Input validation shared by the algorithm functions (docs/methods.md §8).

Every check raises ``ValueError`` naming the argument, the value received and what is allowed, so a bad call fails at
the boundary, not as a shape error deep inside torch. Tensor-value checks look only at valid (masked-in) positions:
padding may hold anything, NaN or -inf included. The scalar checks (``check_range``, ``check_choice``) are
:mod:`tokenbalance.checks`' (shared with the config, the tasks and the models); :func:`param` declares a
hyper-parameter field with its help text."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any

import torch

from tokenbalance.checks import check_choice, check_range

__all__ = [
    "check_choice",
    "check_finite",
    "check_ndim",
    "check_range",
    "check_shape",
    "masked_fill_invalid",
    "param",
]


def check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Fail unless ``tensor.shape == shape``."""
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(tensor.shape)}")


def check_ndim(name: str, tensor: torch.Tensor, ndim: int, suffix: str) -> None:
    """Fail unless ``tensor`` has ``ndim`` dimensions; ``suffix`` names them (e.g. ``"BT"``)."""
    if tensor.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d tensor [{', '.join(suffix)}], got shape {tuple(tensor.shape)}")


def check_finite(name: str, tensor: torch.Tensor, mask: torch.Tensor | None = None) -> None:
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
