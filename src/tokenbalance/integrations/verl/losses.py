"""Our losses in verl's shapes: the registered policy loss and the Lopti trainer's full loss.

:func:`policy_loss` is verl's ``loss_mode=tokenbalance`` (verl's ``ppo_loss`` adds its KL and entropy
terms); :func:`lopti_ppo_loss` replaces ``ppo_loss`` under the ``tokenbalance_lopti`` trainer (the
named pass's surrogate, KL and entropy). Both run :func:`tokenbalance.algorithms.loss.pass_loss` with
verl's normaliser (:func:`global_normaliser`), or the AR-Lopti fork's per micro-batch
(:func:`scoped_batch_info`), and report the gradient share per probability bucket. Normalisers and
differences: docs/verl.md, "Differences from our trainer and the AR-Lopti fork".
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tokenbalance.algorithms.aggregate import loss_normaliser
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import Method, passes_from_advantages
from tokenbalance.diagnostics.edges import DEFAULT_EDGES
from tokenbalance.diagnostics.grad_share import loss_grad_shares
from tokenbalance.integrations.verl.config import method_from_actor_config, token_mean_scope
from tokenbalance.integrations.verl.names import LOPTI_TRAINER, UPDATE_PASS_KEY
from tokenbalance.types import LossNormaliser, UpdatePass


def select_pass(passes: list[UpdatePass], name: str) -> UpdatePass:
    for update_pass in passes:
        if update_pass.name == name:
            return update_pass
    raise ValueError(f"{UPDATE_PASS_KEY}: unknown pass {name!r}; this schedule has {[p.name for p in passes]}")


def global_normaliser(method: Method, update_pass: UpdatePass, global_batch_info: dict[str, Any]) -> LossNormaliser:
    """Our normaliser equal to verl's ``agg_loss`` scaling with ``global_batch_info``.

    verl divides by ``batch_num_tokens`` (token-mean) or ``global_batch_size`` (seq-mean modes;
    times ``loss_scale_factor`` or the padded width for ``seq-mean-token-sum-norm``) and
    multiplies by ``dp_size``; without them (one rank, no global info) it uses the micro-batch's
    own counts, which is our :func:`pass_normaliser` of these rows.
    """
    mode = method.loss_agg_mode
    dp_size = int(global_batch_info.get("dp_size") or 1)
    tokens = global_batch_info.get("batch_num_tokens")
    sequences = global_batch_info.get("global_batch_size")
    mask_BT = update_pass.normaliser_mask_BT
    if mode == "token-mean":
        value = float(tokens) / dp_size if tokens is not None else loss_normaliser(mask_BT, mode)
    elif sequences is None:
        value = loss_normaliser(mask_BT, mode, max_response_len=method.max_response_len)
    else:
        value = float(sequences) / dp_size
        if mode == "seq-mean-token-sum-norm":
            value *= float(method.max_response_len or mask_BT.shape[1])
    return LossNormaliser(policy=value, regulariser=value)


def scoped_batch_info(global_batch_info: dict[str, Any], response_mask_BT: torch.Tensor, scope: str) -> dict[str, Any]:
    """verl's ``global_batch_info`` for one micro-batch under the normaliser ``scope``.

    ``mini_batch``: unchanged (verl 0.9.1: the mini-batch's valid tokens or sequences over all
    ranks). ``micro_batch``: the counts that make verl's ``agg_loss`` (and :func:`global_normaliser`)
    divide by this micro-batch's own valid tokens (sequences) times its gradient-accumulation steps,
    rows per rank (``global_batch_size / dp_size``) over rows here: the AR-Lopti fork's masked mean
    per micro-batch divided by the accumulation steps (with ``use_dynamic_bsz``, the fork's weighting
    of a micro-batch by its share of the rows). Ranks then average, as the fork's data parallelism.
    """
    if scope == "mini_batch":
        return dict(global_batch_info)
    mask_BT = response_mask_BT.bool()
    dp_size = int(global_batch_info.get("dp_size") or 1)
    sequences = global_batch_info.get("global_batch_size")
    rows = max(int(mask_BT.shape[0]), 1)
    accumulation = 1.0 if sequences is None else float(sequences) / dp_size / rows
    scale = accumulation * dp_size  # agg_loss multiplies by dp_size again
    tokens = max(float(mask_BT.sum().item()), 1.0)  # an empty micro-batch: a zero loss, as the fork's
    nonempty = max(float(mask_BT.any(dim=1).sum().item()), 1.0)
    return {**global_batch_info, "batch_num_tokens": tokens * scale, "global_batch_size": nonempty * scale}


def apply_token_mean_scope(config, response_mask_BT: torch.Tensor) -> dict[str, Any]:
    """Set ``config.global_batch_info`` (verl's ``ActorConfig``) to this micro-batch's scoped counts
    (:func:`scoped_batch_info`) and return them: verl's own KL and entropy terms of the micro-batch,
    computed after the policy loss from the same dict, then use the same normaliser."""
    info = scoped_batch_info(config.global_batch_info, response_mask_BT, token_mean_scope(config.policy_loss))
    config.global_batch_info.update(info)
    return info


def grad_share_bound_metrics(
    method: Method,
    loss: torch.Tensor,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    update_pass: UpdatePass,
    normaliser: LossNormaliser,
    edges=DEFAULT_EDGES,
) -> dict[str, float]:
    """``diag/bucket<b>/token_frac``, ``grad_share_bound`` and ``grad_share_before_bound`` of one
    micro-batch (:func:`~tokenbalance.diagnostics.grad_share.loss_grad_shares`, the bound: p the
    current probability; "before" with verl's advantage, all valid tokens; buckets by the old
    probability). verl averages these over micro-batches, so a micro-batch whose loss has no
    gradient through the log-probs (every advantage 0) counts 0 in every bucket instead of NaN.
    Nothing when ``log_prob`` carries no gradient.
    """
    if not log_prob.requires_grad:
        return {}
    shares = loss_grad_shares(
        loss,
        log_prob,
        old_log_prob,
        response_mask.bool(),
        advantages,
        method=method,
        normaliser_mask_BT=update_pass.normaliser_mask_BT,
        policy_normaliser=normaliser.policy,
        edges=edges,
    )
    return {key: 0.0 if math.isnan(value) else value for key, value in shares.items()}


def _verl_metrics(metrics: dict[str, float], prefix: str = "") -> dict[str, float]:
    """verl's metric names for the shared quantities, plus ours under ``tokenbalance/``."""
    out = {
        f"actor/pg_clipfrac{prefix}": metrics["clip/frac"],
        f"actor/pg_clipfrac_lower{prefix}": metrics["clip/dual_frac"],
        f"actor/ppo_kl{prefix}": metrics["policy/approx_kl_old"],
    }
    skip = ("loss/",)
    out.update({f"tokenbalance/{key}{prefix}": value for key, value in metrics.items() if not key.startswith(skip)})
    return out


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl ``PolicyLossFn`` of our loss, ``loss_mode=tokenbalance`` (all tensors ``[B, T]``).

    The method is ``config.policy_loss``'s (:func:`~tokenbalance.integrations.verl.config.method_from_actor_config`;
    one pass: Lopti's passes are the Lopti trainer's); ``log_prob`` carries gradient. Returns the
    aggregated policy loss and float metrics.
    """
    if config is None:
        raise ValueError("config: the tokenbalance policy losses need verl's ActorConfig")
    if rollout_is_weights is not None:
        raise ValueError(
            "rollout_is_weights: verl's rollout correction is not supported by the tokenbalance losses; "
            "set algorithm.rollout_correction=null"
        )
    method = method_from_actor_config(config, with_regularisers=False).replace(loss_agg_mode=loss_agg_mode)
    passes, _ = passes_from_advantages(method, advantages, response_mask, old_log_prob)
    (update_pass,) = passes
    normaliser = global_normaliser(method, update_pass, apply_token_mean_scope(config, response_mask))
    output = pass_loss(method, update_pass, log_prob, old_log_prob, normaliser=normaliser)
    shares = grad_share_bound_metrics(
        method, output.loss, log_prob, old_log_prob, advantages, response_mask, update_pass, normaliser
    )
    return output.loss, _verl_metrics({**output.metrics, **shares})


def lopti_pass_loss(
    actor_config,
    pass_name: str,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The full loss of Lopti pass ``pass_name`` on one micro-batch (all tensors ``[B, T]``).

    Surrogate (with the method's AR / TR-GRPO weights) on the pass's tokens, plus verl's KL loss
    and entropy terms on the pass's tokens, all divided by the mini-batch's valid-token (or
    sequence) count from ``actor_config.global_batch_info``.
    """
    method = method_from_actor_config(actor_config, with_regularisers=True, with_lopti=True)
    passes, lopti_metrics = passes_from_advantages(method, advantages, response_mask, old_log_prob)
    update_pass = select_pass(passes, pass_name)
    normaliser = global_normaliser(method, update_pass, apply_token_mean_scope(actor_config, response_mask))
    output = pass_loss(
        method,
        update_pass,
        log_prob,
        old_log_prob,
        ref_logp_BT=ref_log_prob,
        entropy_BT=entropy,
        normaliser=normaliser,
    )
    shares = grad_share_bound_metrics(
        method, output.loss, log_prob, old_log_prob, advantages, response_mask, update_pass, normaliser
    )
    metrics = _verl_metrics({**output.metrics, **lopti_metrics, **shares})
    metrics["tokenbalance/loss/policy"] = output.metrics["loss/policy"]
    if "loss/kl" in output.metrics:
        metrics["tokenbalance/loss/kl"] = output.metrics["loss/kl"]
    return output.loss, metrics


def lopti_ppo_loss(config, model_output, data, dp_group=None):
    """Drop-in for verl's ``workers.utils.losses.ppo_loss`` under the ``tokenbalance_lopti`` trainer.

    Unpacks verl's micro-batch as ``ppo_loss`` does (nested model outputs to padded ``[B, T]``),
    records the global batch info, and returns :func:`lopti_pass_loss` of the pass named in the
    batch. The reported loss is a partial sum with the full denominator (per pass), as in the
    reference; the trainer logs both passes and their sum.
    """
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    pass_name = tu.get_non_tensor_data(data=data, key=UPDATE_PASS_KEY, default=None)
    if pass_name is None:
        raise ValueError(
            f"{UPDATE_PASS_KEY}: missing from the batch; lopti_ppo_loss runs only under "
            f"trainer.v1.trainer_mode={LOPTI_TRAINER}"
        )
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    for key in ("dp_size", "batch_num_tokens", "global_batch_size"):
        config.global_batch_info[key] = data[key]
    fields = [key for key in ("response_mask", "old_log_probs", "advantages", "ref_log_prob") if key in data]
    padded = data.select(*fields).to_padded_tensor()
    loss, metrics = lopti_pass_loss(
        config,
        pass_name,
        log_prob,
        padded["old_log_probs"],
        padded["advantages"],
        padded["response_mask"].bool(),
        ref_log_prob=padded.get("ref_log_prob", None),
        entropy=entropy,
    )
    out: dict[str, Any] = {
        key: Metric(value=value, aggregation=AggregationType.SUM if is_partial_loss(key) else AggregationType.MEAN)
        for key, value in metrics.items()
    }
    out["actor/pg_loss"] = Metric(value=loss.detach(), aggregation=AggregationType.SUM)
    return loss, out


def is_partial_loss(metric_key: str) -> bool:
    """Loss terms are partial sums over a micro-batch with the mini-batch's denominator, so verl
    must add them over micro-batches (``AggregationType.SUM``, as its ``ppo_loss`` does for
    ``pg_loss`` / ``kl_loss``); rates and means are averaged."""
    return "/loss/" in metric_key or metric_key.endswith("_loss")
