"""Our advantage estimators with verl's estimator signature (``algorithm.adv_estimator``).

verl passes ``token_level_rewards`` and ``response_mask`` ([B, T]), ``index`` (each response's
group uid) and ``config`` (its ``algorithm`` section, of which only ``gamma`` is read) and stores
the returned ``(advantages, returns)``. Grouped estimators score a response by the sum of its token
rewards and return ``advantages`` twice, as verl's GRPO; ``tokenbalance_reinforce_pp`` follows
verl at gaps in the mask (``gaps="carry"``). Details and differences: docs/verl.md, "Advantage estimators".
"""

from __future__ import annotations

import numpy as np
import torch

from tokenbalance.algorithms.advantages import (
    discounted_returns,
    reinforce_pp_advantages,
)
from tokenbalance.algorithms.methods import (
    AdvantageConfig,
    KLConfig,
    Method,
    compute_advantages,
)
from tokenbalance.integrations.verl.names import ADVANTAGE_ESTIMATORS

REINFORCE_PP_GAPS = "carry"
"""verl's rule for the REINFORCE++ return at masked positions inside a response."""


def group_ids_from_index(index, batch_size: int) -> torch.Tensor:
    """[B] int64 group ids from verl's per-response uids (any hashable values)."""
    if index is None:
        raise ValueError(
            "index: the grouped tokenbalance estimators need verl's per-response uid (non_tensor_batch['uid'])"
        )
    values = np.asarray(index)
    if values.shape != (batch_size,):
        raise ValueError(f"index: expected {batch_size} uids, got shape {values.shape}")
    _, inverse = np.unique(values.astype(str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def _gamma(config) -> float:
    return 1.0 if config is None else float(config.get("gamma", 1.0))


def make_estimator(estimator: str):
    """A verl advantage-estimator function for our estimator ``estimator``."""

    def estimate(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, index=None, **_):
        mask_BT = response_mask.bool()
        with torch.no_grad():
            if estimator == "reinforce_pp":
                gamma = _gamma(config)
                advantages_BT = reinforce_pp_advantages(
                    token_level_rewards, mask_BT, gamma=gamma, gaps=REINFORCE_PP_GAPS
                )
                returns_BT = discounted_returns(token_level_rewards, mask_BT, gamma, gaps=REINFORCE_PP_GAPS)
                return advantages_BT, returns_BT.to(advantages_BT.dtype)
            method = Method(advantage=AdvantageConfig(estimator=estimator), kl=KLConfig(placement="none"))
            group_ids_B = group_ids_from_index(index, mask_BT.shape[0])
            scores_B = token_level_rewards.sum(dim=-1)
            advantages_BT = compute_advantages(method, scores_B, group_ids_B, mask_BT)
        return advantages_BT, advantages_BT

    estimate.__name__ = f"tokenbalance_{estimator}_advantage"
    estimate.__doc__ = f"verl advantage estimator: tokenbalance {estimator!r} (see the module docstring)."
    return estimate


ESTIMATOR_FUNCTIONS = {name: make_estimator(ours) for name, ours in ADVANTAGE_ESTIMATORS.items()}
