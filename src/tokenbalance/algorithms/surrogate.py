"""The per-token PPO surrogate, KL estimators and entropy, each a per-token ``[B, T]`` tensor.

Differences from the reference (verl's ``core_algos.py``, AR-Lopti fork): the log-ratio is clamped to
``[-log_ratio_clamp, log_ratio_clamp]`` before ``exp`` (default 20, as upstream verl; ``None`` as the fork), and
``ratio_weight_BT`` puts TR-GRPO's paper-literal weight on the ratio inside both branches of the clip (``None`` for
every other method). docs/methods.md §2.4-2.6 and §5 have the rest."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import masked_fill_invalid, param

IMPORTANCE_SAMPLING_MODES = ("on", "off", "off_for_pos")

# Names accepted for the KL estimator: ours (k1, k2, k3) and verl's aliases. A trailing "+" (k1+, k3+, ...) returns
# the value of the estimator with the gradient of k2 (upstream verl).
KL_ESTIMATOR_ALIASES = {
    "k1": "k1",
    "kl": "k1",
    "abs": "abs",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
}
KL_ESTIMATORS = tuple(KL_ESTIMATOR_ALIASES) + tuple(
    f"{name}+" for name, kind in KL_ESTIMATOR_ALIASES.items() if kind in ("k1", "k3")
)
K3_VALUE_CLAMP = 10.0  # outer clamp of k3, identical in the reference and upstream verl


@dataclass(frozen=True)
class ClipConfig:
    """Hyper-parameters of the clipped surrogate."""

    eps_low: float = param(0.2, "lower clip range, ratio >= 1 - eps_low. K&K reference 0.20.")
    eps_high: float = param(0.2, "upper clip range (clip-higher, DAPO), ratio <= 1 + eps_high. K&K reference 0.24.")
    dual_clip_c: float | None = param(
        3.0, "dual-clip bound c > 1 for negative advantages (loss <= -A * c); ``None`` disables it. K&K reference 10.0."
    )
    importance_sampling: str = param(
        "on",
        '``"on"`` (standard ratio), ``"off"`` (old := current, detached: the vanilla policy gradient) or '
        '``"off_for_pos"`` (``"off"`` where A > 0).',
    )
    log_ratio_clamp: float | None = param(20.0, "clamp on ``logp - old_logp`` before ``exp``; ``None`` for none.")

    def __post_init__(self) -> None:
        check.in_range("clip.eps_low", self.eps_low, 0.0, 1.0, high_open=True)
        check.in_range("clip.eps_high", self.eps_high, 0.0, float("inf"))
        if self.dual_clip_c is not None:
            check.in_range("clip.dual_clip_c", self.dual_clip_c, 1.0, float("inf"), low_open=True)
        check.choice("clip.importance_sampling", self.importance_sampling, IMPORTANCE_SAMPLING_MODES)
        if self.log_ratio_clamp is not None:
            check.in_range("clip.log_ratio_clamp", self.log_ratio_clamp, 0.0, float("inf"), low_open=True)


@dataclass(frozen=True)
class SurrogateOutput:
    """Per-token results of :func:`clipped_surrogate` (all ``[B, T]``, 0 / False at padding).

    ``loss_BT`` carries gradient; the rest is detached. ``clipped_BT`` marks L2 > L1 (the clip acted, verl's
    ``pg_clipfrac``); ``dual_clipped_BT`` marks tokens where the dual-clip bound acted (``pg_clipfrac_lower``)."""

    loss_BT: torch.Tensor
    ratio_BT: torch.Tensor
    clipped_BT: torch.Tensor
    dual_clipped_BT: torch.Tensor
    log_ratio_BT: torch.Tensor


def clipped_surrogate(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    config: ClipConfig,
    *,
    ratio_weight_BT: torch.Tensor | None = None,
) -> SurrogateOutput:
    """PPO clipped surrogate loss per token, with clip-higher and dual-clip (docs/methods.md §2.4).

    ``r = exp(logp - old_logp)``, ``L1 = -A w r``, ``L2 = -A clip(w r, 1 - eps_low, 1 + eps_high)``, ``Lc = max(L1,
    L2)``, and for ``A < 0`` the loss is ``min(Lc, -A c)``. ``w`` is ``ratio_weight_BT`` (TR-GRPO paper-literal
    placement) or 1.

    Args:
        logp_BT: [B, T] log-prob of the sampled tokens under the current policy (with gradient).
        old_logp_BT: [B, T] log-prob under the rollout policy (no gradient).
        advantages_BT: [B, T] per-token advantages (no gradient).
        response_mask_BT: [B, T] valid-token mask; other positions may hold anything.
        config: :class:`ClipConfig`.
        ratio_weight_BT: optional [B, T] positive weights multiplying the ratio (no gradient)."""
    check.ndim("logp_BT", logp_BT, 2, "BT")
    shape = tuple(logp_BT.shape)
    check.shape("old_logp_BT", old_logp_BT, shape)
    check.shape("advantages_BT", advantages_BT, shape)
    check.shape("response_mask_BT", response_mask_BT, shape)
    mask_BT = response_mask_BT.bool()
    check.finite("logp_BT", logp_BT.detach(), mask_BT)
    check.finite("old_logp_BT", old_logp_BT, mask_BT)
    check.finite("advantages_BT", advantages_BT, mask_BT)

    logp_BT = masked_fill_invalid(logp_BT, mask_BT)
    old_logp_BT = masked_fill_invalid(old_logp_BT.detach(), mask_BT)
    adv_BT = masked_fill_invalid(advantages_BT.detach(), mask_BT)
    if config.importance_sampling == "off":
        old_logp_BT = logp_BT.detach()
    elif config.importance_sampling == "off_for_pos":
        old_logp_BT = torch.where(adv_BT > 0, logp_BT.detach(), old_logp_BT)

    log_ratio_BT = logp_BT - old_logp_BT
    if config.log_ratio_clamp is not None:
        log_ratio_BT = log_ratio_BT.clamp(-config.log_ratio_clamp, config.log_ratio_clamp)
    ratio_BT = torch.exp(log_ratio_BT)
    weighted_ratio_BT = ratio_BT
    if ratio_weight_BT is not None:
        check.shape("ratio_weight_BT", ratio_weight_BT, shape)
        weighted_ratio_BT = ratio_BT * masked_fill_invalid(ratio_weight_BT.detach(), mask_BT, 1.0)

    unclipped_BT = -adv_BT * weighted_ratio_BT
    clipped_BT = -adv_BT * weighted_ratio_BT.clamp(1.0 - config.eps_low, 1.0 + config.eps_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    dual_acted_BT = torch.zeros_like(mask_BT)
    if config.dual_clip_c is not None:
        bound_BT = -adv_BT * config.dual_clip_c
        dual_acted_BT = (adv_BT < 0) & (loss_BT > bound_BT)
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, bound_BT), loss_BT)

    return SurrogateOutput(
        loss_BT=masked_fill_invalid(loss_BT, mask_BT),
        ratio_BT=masked_fill_invalid(ratio_BT.detach(), mask_BT, 1.0),
        clipped_BT=(clipped_BT > unclipped_BT).detach() & mask_BT,
        dual_clipped_BT=dual_acted_BT.detach() & mask_BT,
        log_ratio_BT=masked_fill_invalid(log_ratio_BT.detach(), mask_BT),
    )


def kl_penalty(
    logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    estimator: str = "k3",
    *,
    log_ratio_clamp: float = 5.0,
    ref_weight_BT: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate, ``[B, T]``, 0 at padding (docs/methods.md §2.5).

    With ``d = logp - ref_logp``: k1 = d, abs = |d|, k2 = d^2 / 2, and k3 = clamp(e^x - x - 1, -10, 10) with x =
    clamp(-d, -C, C), C = ``log_ratio_clamp`` (5 in the AR-Lopti reference, 20 upstream). A trailing ``+`` on k1 / k3
    returns that value with the gradient of k2 (straight-through).

    ``ref_weight_BT`` is TR-GRPO's weighted KL (docs/methods.md §5, paper-literal per reviews): rho = w pi_ref /
    pi_theta, k = rho - log rho - 1, i.e. k3 with x shifted by log w. It is only defined for k3."""
    if estimator == "full":
        raise ValueError(
            "estimator: 'full' needs whole-vocabulary logits and is not implemented (as in the "
            f"reference); valid: {', '.join(KL_ESTIMATORS)}"
        )
    check.choice("estimator", estimator, KL_ESTIMATORS)
    check.ndim("logp_BT", logp_BT, 2, "BT")
    shape = tuple(logp_BT.shape)
    check.shape("ref_logp_BT", ref_logp_BT, shape)
    check.shape("response_mask_BT", response_mask_BT, shape)
    check.in_range("log_ratio_clamp", log_ratio_clamp, 0.0, float("inf"), low_open=True)
    mask_BT = response_mask_BT.bool()
    check.finite("logp_BT", logp_BT.detach(), mask_BT)
    check.finite("ref_logp_BT", ref_logp_BT, mask_BT)

    straight_through = estimator.endswith("+")
    kind = KL_ESTIMATOR_ALIASES[estimator.rstrip("+")]
    delta_BT = masked_fill_invalid(logp_BT, mask_BT) - masked_fill_invalid(ref_logp_BT.detach(), mask_BT)
    if ref_weight_BT is not None and kind != "k3":
        raise ValueError(f"ref_weight_BT: the weighted KL is defined for k3 only, got estimator {estimator!r}")

    if kind == "k1":
        value_BT = delta_BT
    elif kind == "abs":
        value_BT = delta_BT.abs()
    elif kind == "k2":
        value_BT = 0.5 * delta_BT.square()
    else:
        x_BT = -delta_BT
        if ref_weight_BT is not None:
            check.shape("ref_weight_BT", ref_weight_BT, shape)
            weight_BT = masked_fill_invalid(ref_weight_BT.detach(), mask_BT, 1.0)
            x_BT = x_BT + torch.log(weight_BT)
        x_BT = x_BT.clamp(-log_ratio_clamp, log_ratio_clamp)
        value_BT = (torch.exp(x_BT) - x_BT - 1.0).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    if straight_through:
        k2_BT = 0.5 * delta_BT.square()
        value_BT = k2_BT - k2_BT.detach() + value_BT.detach()
    return masked_fill_invalid(value_BT, mask_BT)


def entropy_from_logits(logits_BTV: torch.Tensor, *, chunk_rows: int = 1024) -> torch.Tensor:
    """Per-position entropy ``H = -sum_v p_v log p_v`` of ``softmax(z)`` over the last dimension.

    Args:
        logits_BTV: [..., V] logits, already divided by the log-prob temperature (docs/methods.md §1).
        chunk_rows: positions processed at once, bounding the [rows, V] float32 temporaries.

    Returns:
        [...] float32 entropies; gradient flows if the logits carry it."""
    return _softmax_stats(logits_BTV, chunk_rows, with_sum_sq=False)[0]


def entropy_and_sum_sq_probs(logits_BTV: torch.Tensor, *, chunk_rows: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`entropy_from_logits` and, from the same float32 softmax, ``sum_v p_v^2`` per position (detached; the
    logit-gradient norm's extra quantity, :mod:`tokenbalance.algorithms.logit_grad`). The entropy is the same tensor
    :func:`entropy_from_logits` returns."""
    entropy, sum_sq = _softmax_stats(logits_BTV, chunk_rows, with_sum_sq=True)
    assert sum_sq is not None
    return entropy, sum_sq


def _softmax_stats(
    logits_BTV: torch.Tensor, chunk_rows: int, *, with_sum_sq: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if logits_BTV.dim() < 1 or logits_BTV.shape[-1] < 1:
        raise ValueError(f"logits_BTV: expected a [..., V] tensor with V >= 1, got {tuple(logits_BTV.shape)}")
    check.in_range("chunk_rows", chunk_rows, 1, math.inf)
    flat_NV = logits_BTV.reshape(-1, logits_BTV.shape[-1])
    pieces, sum_sq = [], []
    for start in range(0, flat_NV.shape[0], chunk_rows):
        logp_NV = torch.log_softmax(flat_NV[start : start + chunk_rows].float(), dim=-1)
        p_NV = logp_NV.exp()
        # p log p -> 0 where p == 0 (a -inf logit), instead of 0 * -inf = NaN
        plogp_NV = torch.where(p_NV > 0, p_NV * logp_NV, torch.zeros_like(p_NV))
        pieces.append(-plogp_NV.sum(dim=-1))
        if with_sum_sq:
            sum_sq.append(torch.linalg.vector_norm(p_NV.detach(), dim=-1).square())
    shape = logits_BTV.shape[:-1]
    if not pieces:
        empty = flat_NV.new_zeros(shape, dtype=torch.float32)
        return empty, empty.clone() if with_sum_sq else None
    return torch.cat(pieces).reshape(shape), torch.cat(sum_sq).reshape(shape) if with_sum_sq else None
