"""TRL's advantages as our [B, T] advantages, and pass-level scaling for vLLM importance sampling.

On TRL the advantages come from ``GRPOTrainer`` (group-normalised rewards, one per completion);
:func:`tokenbalance.algorithms.methods.passes_from_advantages` then runs our token-level stages
(NTHR weights -> AR weights -> single pass or Lopti passes) exactly as our trainer does.
Pure torch; no TRL import.
"""

from __future__ import annotations

import dataclasses

import torch

from tokenbalance.types import UpdatePass


def broadcast_advantages(advantages: torch.Tensor, response_mask_BT: torch.Tensor) -> torch.Tensor:
    """TRL's advantages, [B] (one per completion) or [B, T], as [B, T] (0 at padding, no gradient)."""
    mask_BT = response_mask_BT.bool()
    values = advantages.detach()
    if values.dim() == 1:
        values = values[:, None].expand(mask_BT.shape)
    if tuple(values.shape) != tuple(mask_BT.shape):
        raise ValueError(f"advantages: expected [B] or {list(mask_BT.shape)}, got {list(advantages.shape)}")
    return torch.where(mask_BT, values, torch.zeros((), dtype=values.dtype, device=values.device))


def scale_pass_advantages(update_pass: UpdatePass, scale: torch.Tensor) -> UpdatePass:
    """The pass with its advantages times a non-negative, detached ``scale`` ([B, T] or [B, 1]).

    TRL's vLLM importance-sampling correction multiplies the per-token policy loss by a ratio >= 0;
    every surrogate term is positively homogeneous in the advantage, so scaling the advantage is
    the same thing, and it leaves the KL term alone, as TRL does.
    """
    return dataclasses.replace(update_pass, advantages_BT=update_pass.advantages_BT * scale.detach())
