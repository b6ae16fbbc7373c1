"""Per-token weights that rebalance low- and high-probability tokens: AR and TR-GRPO (NTHR: :mod:`.nthr`).

* Advantage Reweighting (arXiv 2505.12929, Eq. 4): ``A <- (alpha * pi + tau) * A``, then the reference's
  ``neg_adv_weight`` on negative advantages (docs/methods.md §3).
* TR-GRPO (arXiv 2511.00066): ``w = clip(f(p), L, U)``, two sigmoid readings (``shape``) of an unpublished formula;
  the literal transcription, a constant 1, is refused (:data:`DROPPED_TR_SHAPES`; docs/methods.md §5)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import masked_fill_invalid, param

PROB_SOURCES_AR = ("old", "current_detached")
TR_SHAPES = ("sigmoid_shift", "sigmoid_mul")
# Readings removed, with the reason the config error gives. "sigmoid_div" is the third-party transcription read
# literally: with its own constants (2, 9, 0.25, 1, 1.4) the raw value 2 (sigmoid(p / 9) - 0.25) lies in [0.5, 0.5555]
# for p in [0, 1], below L = 1, so w = 1 for every token (docs/methods.md §5), whereas the paper's v1 abstract has
# weights positively correlated with the predicted probability.
DROPPED_TR_SHAPES = {
    "sigmoid_div": "the literal third-party transcription clip(alpha (sigmoid(p / tau) - mu), L, U) was dropped: "
    "at its constants (2, 9, 0.25, 1, 1.4) it is the constant 1 (plain GRPO), not a weight that grows with p; "
    "use the 'grpo' preset for GRPO or shape 'sigmoid_shift' / 'sigmoid_mul'",
}
TR_PROB_SOURCES = ("current", "old")
TR_PLACEMENTS = ("loss_multiplier", "ratio_in_clip")
DEGENERATE_WEIGHT_SPREAD = 1e-3


@dataclass(frozen=True)
class ARConfig:
    """Advantage Reweighting hyper-parameters (docs/methods.md §3)."""

    alpha: float = param(
        0.3,
        "slope on the token probability, in [0, 1]; 0 is plain GRPO. Paper: 0.3 on K&K (Figure 4), 0.1 "
        "on math and REINFORCE++.",
    )
    tau: float | None = param(
        None,
        "intercept; ``None`` means ``1 - alpha`` (the paper's form). The reference lets it be set "
        "independently (``reweight_tau``); it must be >= 0 so the weight stays positive.",
    )
    neg_adv_weight: float = param(
        1.0, "extra factor on advantages <= 0 after reweighting (reference 1.0), on both ``prob_source`` paths."
    )
    prob_source: str = param(
        "old",
        '``"old"`` (paper: the rollout policy) or ``"current_detached"`` (the current policy\'s '
        "probability, detached, applied in the loss; ``neg_adv_weight`` is then applied by "
        ":func:`scale_negative_advantages` before the passes).",
    )

    def __post_init__(self) -> None:
        check.in_range("ar.alpha", self.alpha, 0.0, 1.0)
        if self.tau is not None:
            check.in_range("ar.tau", self.tau, 0.0, float("inf"))
        check.in_range("ar.neg_adv_weight", self.neg_adv_weight, 0.0, float("inf"))
        check.choice("ar.prob_source", self.prob_source, PROB_SOURCES_AR)
        if self.alpha + self.intercept <= 0:
            raise ValueError(f"ar: alpha + tau must be > 0, got alpha={self.alpha}, tau={self.tau}")

    @property
    def intercept(self) -> float:
        return 1.0 - self.alpha if self.tau is None else self.tau


def ar_token_weights(logp_BT: torch.Tensor, response_mask_BT: torch.Tensor, config: ARConfig) -> torch.Tensor:
    """AR weights ``alpha * exp(logp) + tau`` ([B, T], 1 at padding, no gradient)."""
    check.ndim("logp_BT", logp_BT, 2, "BT")
    check.shape("response_mask_BT", response_mask_BT, tuple(logp_BT.shape))
    check.finite("logp_BT", logp_BT.detach(), response_mask_BT)
    prob_BT = torch.exp(masked_fill_invalid(logp_BT.detach(), response_mask_BT))
    weights_BT = config.alpha * prob_BT + config.intercept
    return masked_fill_invalid(weights_BT, response_mask_BT, 1.0)


def advantage_reweight(
    advantages_BT: torch.Tensor,
    logp_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    config: ARConfig,
) -> torch.Tensor:
    """AR (Eq. 4): ``(alpha * pi + tau) * A``, then negatives times ``neg_adv_weight``; [B, T], 0 at padding, no
    gradient. ``logp_BT`` gives pi (the old policy's for ``prob_source="old"``)."""
    check.shape("advantages_BT", advantages_BT, tuple(logp_BT.shape))
    weights_BT = ar_token_weights(logp_BT, response_mask_BT, config)
    adv_BT = masked_fill_invalid(advantages_BT.detach(), response_mask_BT)
    out_BT = weights_BT * adv_BT
    if config.neg_adv_weight != 1.0:
        out_BT = torch.where(adv_BT > 0, out_BT, out_BT * config.neg_adv_weight)
    return out_BT


def scale_negative_advantages(
    advantages_BT: torch.Tensor, response_mask_BT: torch.Tensor, neg_adv_weight: float
) -> torch.Tensor:
    """AR's ``neg_adv_weight`` alone (advantages <= 0 times the factor; [B, T], 0 at padding, no gradient): the end of
    :func:`advantage_reweight` for ``prob_source="current_detached"``, whose weight (>= 0) is applied in the loss."""
    check.shape("response_mask_BT", response_mask_BT, tuple(advantages_BT.shape))
    check.in_range("ar.neg_adv_weight", neg_adv_weight, 0.0, float("inf"))
    adv_BT = masked_fill_invalid(advantages_BT.detach(), response_mask_BT)
    if neg_adv_weight == 1.0:
        return adv_BT
    return torch.where(adv_BT > 0, adv_BT, adv_BT * neg_adv_weight)


@dataclass(frozen=True)
class TRGRPOConfig:
    """TR-GRPO probability-shaping hyper-parameters (docs/methods.md §5). All constants are unverified."""

    shape: str = param(
        "sigmoid_shift",
        '``"sigmoid_shift"`` (default; w = clip(alpha * sigmoid(tau (p - mu)), L, U)) or '
        '``"sigmoid_mul"`` (w = clip(alpha (sigmoid(tau p) - mu), L, U)). The literal transcription '
        '``"sigmoid_div"`` is refused (:data:`DROPPED_TR_SHAPES`).',
    )
    alpha: float = param(2.0, "shape constants (third-party: 2.0, 9.0, 0.25).")
    tau: float = param(9.0, "shape constants (third-party: 2.0, 9.0, 0.25).")
    mu: float = param(0.25, "shape constants (third-party: 2.0, 9.0, 0.25).")
    lower: float = param(1.0, "clip bounds L <= U, L > 0 (third-party: 1.0, 1.4).")
    upper: float = param(1.4, "clip bounds L <= U, L > 0 (third-party: 1.0, 1.4).")
    prob_source: str = param("current", '``"current"`` (detached current-policy probability; default) or ``"old"``.')
    placement: str = param(
        "loss_multiplier",
        '``"loss_multiplier"`` (default; w times the clipped surrogate, PPO\'s trust region intact) or '
        '``"ratio_in_clip"`` (paper-literal per the reviews: w r inside both branches of the clip; '
        "positive-advantage tokens with w > 1 + eps_high get no gradient).",
    )
    weight_kl: bool = param(False, "multiply pi_ref / pi_theta by w inside k3 (paper-literal per the reviews).")
    warn_degenerate: bool = param(True, "warn when the weight spread over p in [0, 1] is below 1e-3.")

    def __post_init__(self) -> None:
        if self.shape in DROPPED_TR_SHAPES:
            raise ValueError(f"tr_grpo.shape: {self.shape!r}: {DROPPED_TR_SHAPES[self.shape]}")
        check.choice("tr_grpo.shape", self.shape, TR_SHAPES)
        check.in_range("tr_grpo.alpha", self.alpha, 0.0, float("inf"), low_open=True)
        check.in_range("tr_grpo.tau", self.tau, 0.0, float("inf"), low_open=True)
        check.in_range("tr_grpo.mu", self.mu, -float("inf"), float("inf"), low_open=True, high_open=True)
        check.in_range("tr_grpo.lower", self.lower, 0.0, float("inf"), low_open=True)
        check.in_range("tr_grpo.upper", self.upper, self.lower, float("inf"))
        check.choice("tr_grpo.prob_source", self.prob_source, TR_PROB_SOURCES)
        check.choice("tr_grpo.placement", self.placement, TR_PLACEMENTS)
        if self.warn_degenerate:
            low, high = tr_grpo_weight_range(self)
            if high - low < DEGENERATE_WEIGHT_SPREAD:
                warnings.warn(
                    f"tr_grpo: weight is constant ({low:.4f}..{high:.4f} over p in [0, 1]) with "
                    f"shape={self.shape!r}, alpha={self.alpha}, tau={self.tau}, mu={self.mu}, "
                    f"L={self.lower}, U={self.upper}: the method reduces to GRPO",
                    stacklevel=3,
                )


def tr_grpo_weights_from_prob(prob_BT: torch.Tensor, config: TRGRPOConfig) -> torch.Tensor:
    """Apply the TR-GRPO weight shape to probabilities (any shape, no gradient)."""
    prob = prob_BT.detach()
    if config.shape == "sigmoid_mul":
        raw = config.alpha * (torch.sigmoid(config.tau * prob) - config.mu)
    else:
        raw = config.alpha * torch.sigmoid(config.tau * (prob - config.mu))
    return raw.clamp(config.lower, config.upper)


def tr_grpo_weight_range(config: TRGRPOConfig, points: int = 1001) -> tuple[float, float]:
    """(min, max) of the weight over an even grid of p in [0, 1]."""
    weights = tr_grpo_weights_from_prob(torch.linspace(0.0, 1.0, points, dtype=torch.float64), config)
    return float(weights.min()), float(weights.max())


def tr_grpo_token_weights(logp_BT: torch.Tensor, response_mask_BT: torch.Tensor, config: TRGRPOConfig) -> torch.Tensor:
    """TR-GRPO weights from log-probs ([B, T], 1 at padding, no gradient).

    Pass the current log-probs (detached here) for ``prob_source="current"``, the old ones for ``"old"``."""
    check.ndim("logp_BT", logp_BT, 2, "BT")
    check.shape("response_mask_BT", response_mask_BT, tuple(logp_BT.shape))
    check.finite("logp_BT", logp_BT.detach(), response_mask_BT)
    prob_BT = torch.exp(masked_fill_invalid(logp_BT.detach(), response_mask_BT))
    return masked_fill_invalid(tr_grpo_weights_from_prob(prob_BT, config), response_mask_BT, 1.0)
