"""The loss of one update pass on one (micro-)batch: surrogate + KL + entropy, aggregated.

Every runner calls it in its micro-batch loop: ``policy - entropy_coeff * entropy + kl_coef * kl`` over the pass's
tokens over its normaliser (docs/methods.md §2.8, §4). Current-policy weights are applied here, detached, in order: AR
with ``prob_source="current_detached"``, TR-GRPO, a ``stage="loss"`` token rule; old-policy ones (AR by default, NTHR)
are already in ``update_pass.advantages_BT``."""

from __future__ import annotations

from typing import Any

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms.aggregate import aggregate, loss_normaliser
from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.surrogate import clipped_surrogate, kl_penalty
from tokenbalance.algorithms.token_rules import weight_metrics
from tokenbalance.algorithms.weights import ar_token_weights, tr_grpo_token_weights
from tokenbalance.types import LossNormaliser, LossOutput, UpdatePass


def pass_normaliser(method: Method, update_pass: UpdatePass) -> LossNormaliser:
    """Denominators of ``update_pass``'s loss terms over its rows: on the mini-batch (summed over ranks) for a global
    token-mean, or per micro-batch for the reference's scope (then divide by the accumulation steps)."""
    mask_BT = update_pass.normaliser_mask_BT
    length = method.max_response_len
    return LossNormaliser(
        policy=loss_normaliser(mask_BT, method.policy_agg_mode, max_response_len=length),
        regulariser=loss_normaliser(mask_BT, method.loss_agg_mode, max_response_len=length),
    )


def _masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    count = int(mask_BT.sum().item())
    return float(values_BT[mask_BT].double().sum().item()) / count if count else 0.0


def pass_loss(
    method: Method,
    update_pass: UpdatePass,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None = None,
    entropy_BT: torch.Tensor | None = None,
    normaliser: LossNormaliser | None = None,
) -> LossOutput:
    """Loss of ``update_pass`` on the rows given (:class:`LossOutput`: the scalar loss, ``loss/*``, ``clip/*``,
    ``tr_grpo/*``, ``token_rule/*`` metrics and the clip flags of the pass's policy tokens).

    Args:
        update_pass: restricted to the tensors' rows (:meth:`UpdatePass.select_rows`).
        logp_BT: [B, T] current log-probs at the log-prob temperature, with gradient.
        old_logp_BT / ref_logp_BT: [B, T] rollout / reference log-probs (the latter required with a KL loss).
        entropy_BT: [B, T] entropy (with gradient if ``entropy_coeff != 0``); required then or by a rule that needs
            it.
        normaliser: global denominators (:func:`pass_normaliser`); default: from these rows."""
    shape = tuple(update_pass.policy_mask_BT.shape)
    check.shape("logp_BT", logp_BT, shape)
    check.shape("old_logp_BT", old_logp_BT, shape)
    policy_BT = update_pass.policy_mask_BT.bool()
    regular_BT = update_pass.kl_entropy_mask_BT.bool()
    valid_BT = policy_BT | regular_BT | update_pass.normaliser_mask_BT.bool()
    if normaliser is None:
        normaliser = pass_normaliser(method, update_pass)
    metrics: dict[str, float] = {}

    advantages_BT = update_pass.advantages_BT
    if method.ar is not None and method.ar.prob_source == "current_detached":
        advantages_BT = advantages_BT * ar_token_weights(logp_BT, valid_BT, method.ar)
    ratio_weight_BT = None
    kl_weight_BT = None
    tr = method.tr_grpo
    if tr is not None:
        source_BT = logp_BT if tr.prob_source == "current" else old_logp_BT
        weights_BT = tr_grpo_token_weights(source_BT, valid_BT, tr)
        if tr.placement == "loss_multiplier":
            advantages_BT = advantages_BT * weights_BT
        else:
            ratio_weight_BT = weights_BT
        if tr.weight_kl:
            kl_weight_BT = weights_BT
        w_valid = weights_BT[policy_BT]
        if w_valid.numel():
            metrics["tr_grpo/w_mean"] = float(w_valid.double().mean().item())
            metrics["tr_grpo/w_min"] = float(w_valid.min().item())
            metrics["tr_grpo/w_max"] = float(w_valid.max().item())
            metrics["tr_grpo/w_at_upper_frac"] = float((w_valid >= tr.upper).double().mean().item())
    rule = method.token_rule
    if rule is not None and rule.stage == "loss":
        inputs = rule.inputs(old_logp_BT, advantages_BT, valid_BT, logp_BT=logp_BT, entropy_BT=entropy_BT)
        rule_weights_BT = rule(inputs)
        advantages_BT = advantages_BT * rule_weights_BT
        metrics.update(weight_metrics(rule_weights_BT, policy_BT))

    surrogate = clipped_surrogate(
        logp_BT, old_logp_BT, advantages_BT, valid_BT, method.clip, ratio_weight_BT=ratio_weight_BT
    )
    agg: dict[str, Any] = dict(
        denominator_mask_BT=update_pass.normaliser_mask_BT, max_response_len=method.max_response_len
    )
    policy_loss = aggregate(surrogate.loss_BT, policy_BT, method.policy_agg_mode, normaliser=normaliser.policy, **agg)
    total = policy_loss
    metrics["loss/policy"] = float(policy_loss.detach().item())

    if method.kl.placement == "loss" and method.kl.coef > 0:
        if ref_logp_BT is None:
            raise ValueError(f"ref_logp_BT: required by method {method.name!r} (KL loss coef {method.kl.coef})")
        kl_BT = kl_penalty(
            logp_BT,
            ref_logp_BT,
            valid_BT,
            method.kl.estimator,
            log_ratio_clamp=method.kl.log_ratio_clamp,
            ref_weight_BT=kl_weight_BT,
        )
        kl_loss = aggregate(kl_BT, regular_BT, method.loss_agg_mode, normaliser=normaliser.regulariser, **agg)
        total = total + method.kl.coef * kl_loss
        metrics["loss/kl"] = float(kl_loss.detach().item())

    if entropy_BT is not None:
        check.shape("entropy_BT", entropy_BT, shape)
        entropy = aggregate(entropy_BT, regular_BT, method.loss_agg_mode, normaliser=normaliser.regulariser, **agg)
        if method.entropy_coeff != 0:
            total = total - method.entropy_coeff * entropy
        metrics["loss/entropy"] = float(entropy.detach().item())
    elif method.entropy_coeff != 0:
        raise ValueError(f"entropy_BT: required by method {method.name!r} (entropy_coeff {method.entropy_coeff})")

    metrics["loss/total"] = float(total.detach().item())
    adv_BT = advantages_BT.detach()
    metrics["clip/frac"] = _masked_mean(surrogate.clipped_BT.double(), policy_BT)
    metrics["clip/frac_pos_adv"] = _masked_mean(surrogate.clipped_BT.double(), policy_BT & (adv_BT > 0))
    metrics["clip/frac_neg_adv"] = _masked_mean(surrogate.clipped_BT.double(), policy_BT & (adv_BT < 0))
    metrics["clip/dual_frac"] = _masked_mean(surrogate.dual_clipped_BT.double(), policy_BT)
    metrics["policy/approx_kl_old"] = _masked_mean(-surrogate.log_ratio_BT, policy_BT)
    metrics["policy/ratio_mean"] = _masked_mean(surrogate.ratio_BT, policy_BT)
    clipped_BT = (surrogate.clipped_BT & policy_BT).detach()
    return LossOutput(loss=total, metrics=metrics, clipped_BT=clipped_BT)
