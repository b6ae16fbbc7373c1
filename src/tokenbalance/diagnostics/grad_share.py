"""The low-probability gradient share: each probability bucket's share of the squared logit-gradient norm, the one
estimator every runner logs. Per token ||dL/dz||^2 = g^2 ||e_o - pi||^2 (:mod:`tokenbalance.algorithms.logit_grad`),
exact with sum_j pi_j^2, else the bound (``_bound`` keys); "after": g = dL/d log p, "before": g = A c. docs/metrics.md
("Gradient share per bucket")."""

from __future__ import annotations

import torch

from tokenbalance.algorithms.aggregate import token_coefficients
from tokenbalance.algorithms.logit_grad import logit_grad_sq, logit_grad_sq_bound
from tokenbalance.algorithms.methods import Method
from tokenbalance.diagnostics.buckets import bucket_shares


def grad_shares(
    old_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    logit_grad_sq_BT: torch.Tensor,
    unit_logit_grad_sq_BT: torch.Tensor,
    estimator_adv_BT: torch.Tensor,
    edges,
    *,
    exact: bool = True,
    mode: str = "fixed",
    with_token_frac: bool = False,
) -> dict[str, float]:
    """``diag/bucket<b>/grad_share`` and ``grad_share_before`` (``..._bound`` when not ``exact``) from [B, T]
    ``logit_grad_sq_BT`` (the update's), ``unit_logit_grad_sq_BT`` (per unit advantage) and ``estimator_adv_BT``
    (before any token stage); buckets by ``old_logp_BT``, ``edges``, ``mode``. ``with_token_frac``: also
    ``token_frac``."""
    suffix = "" if exact else "_bound"
    before_BT = estimator_adv_BT.double().square() * unit_logit_grad_sq_BT
    values = {"token_frac": mask_BT} if with_token_frac else {}
    values |= {f"grad_share{suffix}": logit_grad_sq_BT, f"grad_share_before{suffix}": before_BT}
    return bucket_shares(old_logp_BT, mask_BT, values, edges, mode=mode)


def loss_grad_shares(
    loss: torch.Tensor,
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    estimator_adv_BT: torch.Tensor,
    *,
    method: Method,
    normaliser_mask_BT: torch.Tensor,
    policy_normaliser: float,
    edges,
    sum_sq_probs_BT: torch.Tensor | None = None,
) -> dict[str, float]:
    """:func:`grad_shares` (with ``token_frac``) of a host's micro-batch: g = dL/d log p of ``loss`` by
    ``autograd.grad`` (no parameter gradient), c the token's weight in ``method``'s aggregation; exact with
    ``sum_sq_probs_BT``, else the bound."""
    (dlogp_BT,) = torch.autograd.grad(loss, logp_BT, retain_graph=True, allow_unused=True)
    if dlogp_BT is None:  # no gradient reaches the log-probs (every advantage 0)
        dlogp_BT = torch.zeros_like(logp_BT)
    coef_BT = token_coefficients(
        mask_BT.bool(),
        method.policy_agg_mode,
        normaliser=policy_normaliser,
        denominator_mask_BT=normaliser_mask_BT,
        max_response_len=method.max_response_len,
    ).to(logp_BT.device)
    if sum_sq_probs_BT is None:
        after_BT, unit_BT = logit_grad_sq_bound(dlogp_BT, logp_BT), logit_grad_sq_bound(coef_BT, logp_BT)
    else:
        after_BT = logit_grad_sq(dlogp_BT, logp_BT, sum_sq_probs_BT)
        unit_BT = logit_grad_sq(coef_BT, logp_BT, sum_sq_probs_BT)
    exact = sum_sq_probs_BT is not None
    return grad_shares(
        old_logp_BT, mask_BT, after_BT, unit_BT, estimator_adv_BT, edges, exact=exact, with_token_frac=True
    )
