"""Typed containers that cross module boundaries.

Tensor names carry their shape as a suffix (``logp_BT`` is [B, T], ``rewards_PG`` [P, G]): the one list of suffix
letters is docs/methods.md §1 ("Shape suffixes")."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class UpdatePass:
    """One complete optimizer pass over an RL batch (all mini-batches, one step each).

    A plain method returns one pass; Lopti returns two over disjoint token sets, low-probability tokens first. Every
    runner executes the list in order; nothing mutates a batch in place.

    Attributes:
        name: label for metrics (``"all"``, ``"lopti_low"``, ``"lopti_high"``).
        advantages_BT: [B, T] float advantages of this pass, already multiplied by the weights that depend on the old
            policy only (AR, NTHR); 0 outside ``policy_mask_BT``. No gradient.
        policy_mask_BT: [B, T] bool, tokens whose policy-gradient term enters this pass.
        kl_entropy_mask_BT: [B, T] bool, tokens whose KL and entropy terms enter this pass.
        normaliser_mask_BT: [B, T] bool, tokens counted in this pass's loss denominators. For Lopti it is the full
            response mask (the reference's normalisation), so the two passes' losses add up to the single-pass loss.
    """

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
    """Denominators of one pass's loss terms over a whole mini-batch (summed across ranks).

    ``policy`` is for the policy-gradient term (its aggregation mode may differ in reference-compatibility mode);
    ``regulariser`` for the KL and entropy terms."""

    policy: float
    regulariser: float

    def __add__(self, other: LossNormaliser) -> LossNormaliser:
        return LossNormaliser(self.policy + other.policy, self.regulariser + other.regulariser)


@dataclass(frozen=True)
class LossOutput:
    """The loss of one (micro-)batch of one pass.

    Attributes:
        loss: 0-d tensor with gradient: policy - entropy_coeff * entropy + kl_coef * kl.
        metrics: floats under namespaced keys (``loss/...``, ``clip/...``, ``tr_grpo/...``), detached. Fractions are
            over the pass's policy tokens in this micro-batch.
        clipped_BT: [B, T] bool, detached: the pass's policy tokens where the PPO clip acted (the diagnostics collect
            it; nothing recomputes the surrogate). ``None`` only from code that builds a ``LossOutput`` by hand."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    clipped_BT: torch.Tensor | None = None
