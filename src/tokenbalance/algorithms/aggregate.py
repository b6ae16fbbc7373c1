"""Loss aggregation: from a per-token loss matrix to a scalar, with an explicit denominator.

``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean`` and ``seq-mean-token-sum-norm`` (Dr. GRPO) over a
numerator mask and a denominator mask (Lopti's passes count all valid tokens). Micro-batches and ranks share one
``normaliser`` (:func:`loss_normaliser` over the mini-batch, summed over ranks), so their losses sum to the full
batch's exactly. The formulas and the differences from verl and the reference: docs/methods.md §2.7."""

from __future__ import annotations

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import masked_fill_invalid

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def loss_normaliser(denominator_mask_BT: torch.Tensor, mode: str, *, max_response_len: int | None = None) -> float:
    """The denominator :func:`aggregate` uses for ``mode`` on this (mini-)batch; sum it over micro-batches / ranks for
    a global normaliser."""
    check.choice("loss_agg_mode", mode, AGG_MODES)
    check.ndim("denominator_mask_BT", denominator_mask_BT, 2, "BT")
    mask_BT = denominator_mask_BT.bool()
    if mode == "token-mean":
        return float(mask_BT.sum().item())
    rows = float(mask_BT.any(dim=1).sum().item())
    if mode == "seq-mean-token-sum-norm":
        length = mask_BT.shape[1] if max_response_len is None else max_response_len
        check.in_range("max_response_len", length, 1, float("inf"))
        return rows * float(length)
    return rows


def _denominators(
    mask_BT: torch.Tensor,
    mode: str,
    normaliser: float | None,
    denominator_mask_BT: torch.Tensor | None,
    max_response_len: int | None,
) -> tuple[torch.Tensor, float]:
    """The denominator mask (default ``mask_BT``, same shape) and the normaliser (default :func:`loss_normaliser` of
    it; a given one must be >= 0) of :func:`aggregate` and :func:`token_coefficients`."""
    if denominator_mask_BT is None:
        denominator_mask_BT = mask_BT
    check.shape("denominator_mask_BT", denominator_mask_BT, tuple(mask_BT.shape))
    if normaliser is None:
        return denominator_mask_BT, loss_normaliser(denominator_mask_BT, mode, max_response_len=max_response_len)
    check.in_range("normaliser", float(normaliser), 0.0, float("inf"))
    return denominator_mask_BT, normaliser


def aggregate(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str = "token-mean",
    *,
    normaliser: float | None = None,
    denominator_mask_BT: torch.Tensor | None = None,
    max_response_len: int | None = None,
) -> torch.Tensor:
    """Reduce ``loss_BT`` to a 0-d tensor with ``mode`` (one of :data:`AGG_MODES`; docs/methods.md §2.7).

    Args:
        loss_BT: [B, T] per-token loss (may carry gradient; padding may hold anything).
        mask_BT: [B, T] tokens whose loss enters the numerator.
        normaliser: default :func:`loss_normaliser` of ``denominator_mask_BT``; <= 0 gives exactly 0 (still
            back-propagates).
        denominator_mask_BT: [B, T] tokens counted in denominators; default ``mask_BT``.
        max_response_len: the constant C of ``seq-mean-token-sum-norm`` (default T)."""
    check.choice("loss_agg_mode", mode, AGG_MODES)
    check.ndim("loss_BT", loss_BT, 2, "BT")
    check.shape("mask_BT", mask_BT, tuple(loss_BT.shape))
    denominator_mask_BT, normaliser = _denominators(mask_BT, mode, normaliser, denominator_mask_BT, max_response_len)

    masked_BT = masked_fill_invalid(loss_BT, mask_BT)
    if mode == "seq-mean-token-mean":
        lengths_B = denominator_mask_BT.bool().sum(dim=1).clamp(min=1).to(masked_BT.dtype)
        total = (masked_BT.sum(dim=1) / lengths_B).sum()
    else:
        total = masked_BT.sum()
    if normaliser <= 0:
        return total * 0.0
    return total / normaliser


def token_coefficients(
    mask_BT: torch.Tensor,
    mode: str = "token-mean",
    *,
    normaliser: float | None = None,
    denominator_mask_BT: torch.Tensor | None = None,
    max_response_len: int | None = None,
) -> torch.Tensor:
    """[B, T] float64 c with ``aggregate(L) = sum(c * L)`` for every L (no gradient; arguments as :func:`aggregate`):
    1 / N on ``mask_BT``, 1 / (N * row length) for ``seq-mean-token-mean``; 0 off the mask and everywhere when N <= 0.
    """
    check.choice("loss_agg_mode", mode, AGG_MODES)
    check.ndim("mask_BT", mask_BT, 2, "BT")
    denominator_mask_BT, normaliser = _denominators(mask_BT, mode, normaliser, denominator_mask_BT, max_response_len)
    coef_BT = mask_BT.bool().to(torch.float64)
    if normaliser <= 0:
        return torch.zeros_like(coef_BT)
    if mode == "seq-mean-token-mean":
        lengths_B = denominator_mask_BT.bool().sum(dim=1).clamp(min=1).to(torch.float64)
        coef_BT = coef_BT / lengths_B[:, None]
    return coef_BT / float(normaliser)
