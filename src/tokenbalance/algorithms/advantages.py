"""Advantage estimators: GRPO, Dr. GRPO (mean-only), RLOO and REINFORCE++.

Outcome scores (one per response) or token-level rewards in, a ``[B, T]`` float advantage out: 0 at every padded
position, no gradient; groups by ``group_ids_B``, never by prompt text. The reference is verl's ``core_algos.py`` as
forked by AR-Lopti; the differences (singleton groups, REINFORCE++ on fewer than two tokens, ``gaps="restart"`` vs
``"carry"``): docs/methods.md §2.2, §2.3."""

from __future__ import annotations

import warnings

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import masked_fill_invalid
from tokenbalance.algorithms.registry import Registry

SINGLETON_RULES = ("reference", "zero")
GAP_RULES = ("restart", "carry")


def _check_outcome_inputs(scores_B: torch.Tensor, group_ids_B: torch.Tensor, response_mask_BT: torch.Tensor) -> None:
    check.ndim("response_mask_BT", response_mask_BT, 2, "BT")
    batch = response_mask_BT.shape[0]
    check.shape("scores_B", scores_B, (batch,))
    check.shape("group_ids_B", group_ids_B, (batch,))
    check.finite("scores_B", scores_B)


def group_statistics(
    scores_B: torch.Tensor, group_ids_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response statistics of its group: (size_B, mean_B, unbiased std_B), float64.

    The std of a singleton group is returned as 0 (callers decide what a singleton means)."""
    _, inverse_B = torch.unique(group_ids_B, return_inverse=True)
    num_groups = int(inverse_B.max().item()) + 1 if inverse_B.numel() else 0
    scores = scores_B.detach().to(torch.float64)
    zeros_P = scores.new_zeros(num_groups)  # on the scores' device, whatever the default device is
    size_P = zeros_P.index_add(0, inverse_B, torch.ones_like(scores))
    mean_P = zeros_P.index_add(0, inverse_B, scores) / size_P
    centred_B = scores - mean_P[inverse_B]
    sq_P = zeros_P.index_add(0, inverse_B, centred_B**2)
    var_P = sq_P / (size_P - 1).clamp(min=1)
    return size_P[inverse_B], mean_P[inverse_B], var_P.sqrt()[inverse_B]


def _group_advantages(
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    singleton: str,
    from_group_stats,
) -> torch.Tensor:
    """Shared body of the grouped estimators.

    ``from_group_stats(scores_B, size_B, mean_B, std_B) -> adv_B`` (float64) sees the reference's singleton convention
    (mean 0, std 1); with ``singleton="zero"`` singletons are then set to 0."""
    _check_outcome_inputs(scores_B, group_ids_B, response_mask_BT)
    check.choice("singleton", singleton, SINGLETON_RULES)
    size_B, mean_B, std_B = group_statistics(scores_B, group_ids_B)
    lonely_B = size_B == 1
    if bool(lonely_B.any()) and singleton == "reference":
        warnings.warn(
            "group of size 1: using the reference's mean 0 / std 1, so its advantage is its score "
            "(pass singleton='zero' for an advantage of 0)",
            stacklevel=3,
        )
    mean_B = torch.where(lonely_B, torch.zeros_like(mean_B), mean_B)
    std_B = torch.where(lonely_B, torch.ones_like(std_B), std_B)
    adv_B = from_group_stats(scores_B.detach().double(), size_B, mean_B, std_B)
    if singleton == "zero":
        adv_B = torch.where(lonely_B, torch.zeros_like(adv_B), adv_B)
    dtype = scores_B.dtype if scores_B.is_floating_point() else torch.float32
    adv_BT = adv_B.to(dtype)[:, None].expand(response_mask_BT.shape)
    return masked_fill_invalid(adv_BT, response_mask_BT)


def grpo_advantages(
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    *,
    eps: float = 1e-6,
    singleton: str = "reference",
) -> torch.Tensor:
    """GRPO: ``A_i = (s_i - mean_g) / (std_g + eps)`` with the unbiased group std; [B, T] in ``scores_B``'s dtype
    (float32 for integer scores), 0 at padding.

    ``eps``: reference 1e-6 (an all-equal group gets exactly 0); ``singleton``: ``"reference"`` (A = s / (1 + eps)) or
    ``"zero"``."""
    check.in_range("eps", eps, 0.0, float("inf"))
    return _group_advantages(
        scores_B,
        group_ids_B,
        response_mask_BT,
        singleton,
        lambda s, size, mean, std: (s - mean) / (std + eps),
    )


def dr_grpo_advantages(
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    *,
    singleton: str = "reference",
) -> torch.Tensor:
    """Dr. GRPO (arXiv 2503.20783): the mean-only baseline ``A_i = s_i - mean_g`` (no std)."""
    return _group_advantages(scores_B, group_ids_B, response_mask_BT, singleton, lambda s, size, mean, std: s - mean)


def rloo_advantages(
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    *,
    singleton: str = "reference",
) -> torch.Tensor:
    """RLOO: ``A_i = s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean_g)``.

    A singleton has no leave-one-out baseline: the reference rule uses a baseline of 0 (A = s), ``"zero"`` gives 0."""
    return _group_advantages(
        scores_B,
        group_ids_B,
        response_mask_BT,
        singleton,
        lambda s, size, mean, std: (s - mean) * torch.where(size > 1, size / (size - 1).clamp(min=1), 1.0),
    )


def outcome_token_rewards(scores_B: torch.Tensor, response_mask_BT: torch.Tensor) -> torch.Tensor:
    """Place each outcome score at its response's last valid token ([B, T], 0 elsewhere).

    Rows without a valid token receive nothing (docs/methods.md §1, "outcome reward placement")."""
    check.ndim("response_mask_BT", response_mask_BT, 2, "BT")
    check.shape("scores_B", scores_B, (response_mask_BT.shape[0],))
    mask_BT = response_mask_BT.bool()
    length_B = mask_BT.sum(dim=1)
    positions_T = torch.arange(mask_BT.shape[1], device=mask_BT.device)
    # index of the last valid token: the largest position where the mask is set
    last_B = torch.where(mask_BT, positions_T, torch.full_like(positions_T, -1)).max(dim=1).values
    dtype = scores_B.dtype if scores_B.is_floating_point() else torch.float32
    rewards_BT = torch.zeros(mask_BT.shape, dtype=dtype, device=scores_B.device)
    rows_B = torch.nonzero(length_B > 0).squeeze(1)
    rewards_BT[rows_B, last_B[rows_B]] = scores_B.detach().to(dtype)[rows_B]
    return rewards_BT


def discounted_returns(
    token_rewards_BT: torch.Tensor, response_mask_BT: torch.Tensor, gamma: float = 1.0, *, gaps: str = "restart"
) -> torch.Tensor:
    """Reverse discounted cumulative sum of the valid token rewards ([B, T], no gradient; docs/methods.md §2.3).

    ``gaps``, what a masked position inside a response does to the running return G:

    * ``"restart"`` (AR-Lopti fork): G restarts at 0 after each masked position; returns there are left as computed.
    * ``"carry"`` (verl 0.9): G passes it unchanged (no reward, no discount); returns there are 0.

    Both agree on a mask without gaps."""
    check.ndim("token_rewards_BT", token_rewards_BT, 2, "BT")
    check.shape("response_mask_BT", response_mask_BT, tuple(token_rewards_BT.shape))
    check.in_range("gamma", gamma, 0.0, 1.0)
    check.choice("gaps", gaps, GAP_RULES)
    mask_BT = response_mask_BT.bool()
    rewards_BT = masked_fill_invalid(token_rewards_BT.detach(), mask_BT)
    returns_BT = torch.zeros_like(rewards_BT)
    running_B = torch.zeros_like(rewards_BT[:, 0])
    for t in range(rewards_BT.shape[1] - 1, -1, -1):
        if gaps == "restart":
            running_B = rewards_BT[:, t] + gamma * running_B
            returns_BT[:, t] = running_B
            running_B = running_B * mask_BT[:, t]
        else:
            running_B = torch.where(mask_BT[:, t], rewards_BT[:, t] + gamma * running_B, running_B)
            returns_BT[:, t] = running_B * mask_BT[:, t]
    return returns_BT


def reinforce_pp_advantages(
    token_rewards_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    *,
    gamma: float = 1.0,
    eps: float = 1e-8,
    gaps: str = "restart",
) -> torch.Tensor:
    """REINFORCE++ (arXiv 2501.03262): ``A = (G - mu) / sqrt(var + eps) * mask``, discounted returns whitened over the
    M valid tokens of the whole batch (unbiased var, no grouping); M < 2 gives 0 (the reference raises).
    ``token_rewards_BT`` from :func:`outcome_token_rewards` (minus :func:`kl_in_reward`); ``gaps`` as
    :func:`discounted_returns`. [B, T], 0 at masked positions, no gradient."""
    check.finite("token_rewards_BT", token_rewards_BT, response_mask_BT)
    mask_BT = response_mask_BT.bool()
    returns_BT = discounted_returns(token_rewards_BT, mask_BT, gamma, gaps=gaps)
    count = int(mask_BT.sum().item())
    if count < 2:
        return torch.zeros_like(returns_BT)
    values = returns_BT[mask_BT].double()
    mean = values.mean()
    var = ((values - mean) ** 2).sum() / (count - 1)
    adv_BT = ((returns_BT.double() - mean) / torch.sqrt(var + eps)).to(returns_BT.dtype)
    return masked_fill_invalid(adv_BT, mask_BT)


def kl_in_reward(
    token_scores_BT: torch.Tensor,
    kl_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    coef: float,
) -> torch.Tensor:
    """``token_rewards = token_scores - coef * kl`` at valid tokens (docs/methods.md §2.3, ``apply_kl_penalty``).

    ``kl_BT`` is an estimator of old vs reference policy (e.g. k1 = old_logp - ref_logp); the reference uses this only
    when the KL loss is off."""
    check.shape("kl_BT", kl_BT, tuple(token_scores_BT.shape))
    check.in_range("coef", coef, 0.0, float("inf"))
    check.finite("kl_BT", kl_BT, response_mask_BT)
    rewards_BT = token_scores_BT - coef * masked_fill_invalid(kl_BT.detach(), response_mask_BT)
    return masked_fill_invalid(rewards_BT, response_mask_BT)


# Outcome estimators share one signature: (scores_B, group_ids_B, response_mask_BT, **options).
OUTCOME_ESTIMATORS: Registry = Registry("advantage estimator")
OUTCOME_ESTIMATORS.add("grpo", grpo_advantages)
OUTCOME_ESTIMATORS.add("dr_grpo", dr_grpo_advantages)
OUTCOME_ESTIMATORS.add("rloo", rloo_advantages)
# REINFORCE++ works on token rewards, not grouped scores; methods.py dispatches to it by name.
ADVANTAGE_ESTIMATOR_NAMES = (*OUTCOME_ESTIMATORS.names(), "reinforce_pp")
