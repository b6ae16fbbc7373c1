"""A tiny differentiable 'policy' and a random RL batch for loss / gradient tests.

The policy is a free logits tensor theta [B, T, V]; log-probs of the sampled tokens are gathered
from log_softmax(theta). Old log-probs come from a perturbed copy of theta, so ratios differ from
1 and some tokens are clipped; reference log-probs from another perturbation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    theta_BTV: torch.Tensor  # leaf parameter, requires grad
    tokens_BT: torch.Tensor
    mask_BT: torch.Tensor
    old_logp_BT: torch.Tensor
    ref_logp_BT: torch.Tensor
    scores_B: torch.Tensor
    group_ids_B: torch.Tensor
    hidden_BTD: torch.Tensor
    unembed_VD: torch.Tensor

    def logp(self, theta_BTV: torch.Tensor | None = None) -> torch.Tensor:
        theta = self.theta_BTV if theta_BTV is None else theta_BTV
        return torch.log_softmax(theta, dim=-1).gather(-1, self.tokens_BT[..., None]).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        logp_BTV = torch.log_softmax(self.theta_BTV, dim=-1)
        return -(logp_BTV.exp() * logp_BTV).sum(-1)


def make_batch(
    seed: int = 0,
    groups: int = 2,
    group_size: int = 4,
    T: int = 7,
    V: int = 11,
    D: int = 5,
    dtype: torch.dtype = torch.float64,
    binary: bool = True,
) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    B = groups * group_size
    theta = torch.randn(B, T, V, generator=gen, dtype=dtype) * 1.5
    tokens = torch.randint(0, V, (B, T), generator=gen)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old_theta = theta + 0.4 * torch.randn(B, T, V, generator=gen, dtype=dtype)
    ref_theta = theta + 0.4 * torch.randn(B, T, V, generator=gen, dtype=dtype)
    gather = lambda th: torch.log_softmax(th, -1).gather(-1, tokens[..., None]).squeeze(-1)  # noqa: E731
    if binary:
        scores = torch.randint(0, 2, (B,), generator=gen).to(dtype)
        scores[0], scores[1] = 1.0, 0.0  # the first group is mixed
    else:
        scores = torch.randn(B, generator=gen, dtype=dtype)
    return Batch(
        theta_BTV=theta.clone().requires_grad_(True),
        tokens_BT=tokens,
        mask_BT=mask,
        old_logp_BT=gather(old_theta),
        ref_logp_BT=gather(ref_theta),
        scores_B=scores,
        group_ids_B=torch.arange(groups).repeat_interleave(group_size),
        hidden_BTD=torch.randn(B, T, D, generator=gen, dtype=dtype),
        unembed_VD=torch.randn(V, D, generator=gen, dtype=dtype),
    )


def loss_and_grad(batch: Batch, fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluate ``fn(logp_BT, entropy_BT) -> scalar`` and its gradient w.r.t. theta."""
    theta = batch.theta_BTV.detach().clone().requires_grad_(True)
    logp_BTV = torch.log_softmax(theta, dim=-1)
    entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    loss = fn(batch.logp(theta), entropy_BT)
    (grad,) = torch.autograd.grad(loss, theta)
    return loss.detach(), grad


def nthr_inputs(batch: Batch):
    from tokenbalance.algorithms.methods import NTHRInputs

    max_reward = float(batch.scores_B.max())  # binary rewards: 1; otherwise the best score of the batch
    return NTHRInputs(
        tokens_BT=batch.tokens_BT, hidden_BTD=batch.hidden_BTD, unembed_VD=batch.unembed_VD, max_reward=max_reward
    )


def passes_for(method, batch: Batch):
    from tokenbalance.algorithms.methods import build_update_passes

    return build_update_passes(
        method,
        batch.scores_B,
        batch.group_ids_B,
        batch.mask_BT,
        batch.old_logp_BT,
        batch.ref_logp_BT,
        nthr_inputs=nthr_inputs(batch) if method.nthr is not None else None,
    )


def total_loss_fn(method, batch: Batch, passes=None):
    """``fn(logp, entropy)``: the sum of every pass's loss evaluated at the same parameters."""
    from tokenbalance.algorithms.loss import pass_loss

    if passes is None:
        passes, _ = passes_for(method, batch)

    def fn(logp_BT, entropy_BT):
        return sum(pass_loss(method, p, logp_BT, batch.old_logp_BT, batch.ref_logp_BT, entropy_BT).loss for p in passes)

    return fn
