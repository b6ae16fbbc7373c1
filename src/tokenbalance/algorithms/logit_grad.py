"""The norm of a token's loss gradient with respect to the logits, in closed form (docs/methods.md §2.9).

For logits z at the log-prob temperature, pi = softmax(z) and the sampled token o with p = pi_o, a loss that reaches
the logits through log p_o (the surrogate and the KL term do; an entropy bonus does not) has dL/dz = g (e_o - pi), g =
dL/d log p_o, so ||dL/dz||^2 = g^2 (1 - 2p + sum_j pi_j^2): one reduction over the vocabulary beyond log p
(:func:`sum_sq_probs`). With log-probs only, the AR-Lopti bound (Yang et al. 2025, Proposition 4.2's core step):
||dL/dz||^2 <= 2 g^2 (1 - p)^2. The gradient share built on them: :mod:`tokenbalance.diagnostics.grad_share`."""

from __future__ import annotations

import torch

from tokenbalance.algorithms import _checks as check


def sum_sq_probs(logp_BTV: torch.Tensor, *, chunk_rows: int = 1024) -> torch.Tensor:
    """sum_j pi_j^2 per position of ``logp_BTV`` ([..., V] log-softmax values), ``chunk_rows`` positions at a time:
    [...] in its dtype, in [1/V, 1], no gradient."""
    check.in_range("chunk_rows", chunk_rows, 1, float("inf"))
    with torch.no_grad():
        flat_NV = logp_BTV.detach().reshape(-1, logp_BTV.shape[-1])
        pieces = [
            torch.linalg.vector_norm(flat_NV[start : start + chunk_rows].exp(), dim=-1).square()
            for start in range(0, flat_NV.shape[0], chunk_rows)
        ]
        if not pieces:
            return flat_NV.new_zeros(logp_BTV.shape[:-1])
        return torch.cat(pieces).reshape(logp_BTV.shape[:-1])


def softmax_grad_sq(logp_BT: torch.Tensor, sum_sq_probs_BT: torch.Tensor) -> torch.Tensor:
    """[B, T] ||e_o - pi||^2 = (1 - p)^2 + (sum_j pi_j^2 - p^2) in [0, 2), the second term clamped at 0, no gradient;
    ``sum_sq_probs_BT`` from :func:`sum_sq_probs`."""
    check.shape("sum_sq_probs_BT", sum_sq_probs_BT, tuple(logp_BT.shape))
    p_BT = torch.exp(logp_BT.detach())
    return (1 - p_BT).square() + (sum_sq_probs_BT.detach().to(p_BT.dtype) - p_BT.square()).clamp(min=0)


def logit_grad_sq(dlogp_BT: torch.Tensor, logp_BT: torch.Tensor, sum_sq_probs_BT: torch.Tensor) -> torch.Tensor:
    """[B, T] exact ||dL/dz||^2 = g^2 ||e_o - pi||^2 per token, g = ``dlogp_BT`` (dL/d log p_o, 0 where no term; a
    token's aggregation weight gives the norm per unit advantage); ``logp_BT`` and ``sum_sq_probs_BT`` of the policy
    the loss was evaluated at. Type of ``dlogp_BT`` promoted with ``logp_BT``'s, no gradient; mask the padding."""
    check.shape("dlogp_BT", dlogp_BT, tuple(logp_BT.shape))
    g_BT = dlogp_BT.detach().to(torch.promote_types(dlogp_BT.dtype, logp_BT.dtype))
    return g_BT.square() * softmax_grad_sq(logp_BT, sum_sq_probs_BT).to(g_BT.dtype)


def logit_grad_sq_bound(dlogp_BT: torch.Tensor, logp_BT: torch.Tensor) -> torch.Tensor:
    """The upper bound 2 g^2 (1 - p)^2 >= ||dL/dz||^2 (Proposition 4.2's core step) from log-probs only; as
    :func:`logit_grad_sq` otherwise."""
    check.shape("dlogp_BT", dlogp_BT, tuple(logp_BT.shape))
    g_BT = dlogp_BT.detach().to(torch.promote_types(dlogp_BT.dtype, logp_BT.dtype))
    return 2 * g_BT.square() * (1 - torch.exp(logp_BT.detach().to(g_BT.dtype))).square()
