"""Typed containers that cross module boundaries.

Tensor names carry their shape as a suffix (``logp_BT`` is [B, T], ``rewards_PG`` [P, G]): the one list of suffix
letters is docs/methods.md §1 ("Shape suffixes")."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class UpdatePass:
    """One complete optimizer pass over an RL batch (all mini-batches, one step each): one for a plain method, two
    over disjoint token sets for Lopti (low first); runners execute the list in order, nothing mutated in place.

    Attributes:
        name: metrics label (``"all"``, ``"lopti_low"``, ``"lopti_high"``).
        advantages_BT: [B, T] float, already times the old-policy weights (AR, NTHR); 0 outside ``policy_mask_BT``; no
            gradient.
        policy_mask_BT / kl_entropy_mask_BT: [B, T] bool, tokens whose policy-gradient / KL and entropy terms enter.
        normaliser_mask_BT: [B, T] bool, tokens counted in the denominators (Lopti: the full response mask, so the two
            passes add up to the single-pass loss)."""

    name: str
    advantages_BT: torch.Tensor
    policy_mask_BT: torch.Tensor
    kl_entropy_mask_BT: torch.Tensor
    normaliser_mask_BT: torch.Tensor

    def select_rows(self, rows: torch.Tensor | slice) -> UpdatePass:
        """The same pass restricted to some rows (a mini- or micro-batch); shares storage."""
        return UpdatePass(
            name=self.name,
            advantages_BT=self.advantages_BT[rows],
            policy_mask_BT=self.policy_mask_BT[rows],
            kl_entropy_mask_BT=self.kl_entropy_mask_BT[rows],
            normaliser_mask_BT=self.normaliser_mask_BT[rows],
        )


@dataclass(frozen=True)
class LossNormaliser:
    """Denominators of one pass's loss terms over a mini-batch (summed across ranks): ``policy`` for the
    policy-gradient term, ``regulariser`` for KL and entropy."""

    policy: float
    regulariser: float

    def __add__(self, other: LossNormaliser) -> LossNormaliser:
        return LossNormaliser(self.policy + other.policy, self.regulariser + other.regulariser)


@dataclass(frozen=True)
class LossOutput:
    """The loss of one (micro-)batch of one pass: ``loss`` (0-d, with gradient: policy - entropy_coeff * entropy +
    kl_coef * kl), detached ``metrics`` (``loss/...``, ``clip/...``, ``tr_grpo/...``; fractions over the pass's policy
    tokens here) and ``clipped_BT`` ([B, T] bool, where the PPO clip acted; ``None`` only when built by hand)."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    clipped_BT: torch.Tensor | None = None
