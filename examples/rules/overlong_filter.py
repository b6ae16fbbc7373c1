"""DAPO's overlong filtering (Yu et al. 2025, arXiv 2503.14476) as a token rule: a response that used
the whole response budget, so was cut off, trains no token; the group's advantages are still computed
with its reward. Set BUDGET to your ``rollout.max_new_tokens``.

    tokenbalance train --method examples/rules/overlong_filter.py:overlong_filter --set rollout.max_new_tokens=440

docs/results.md uses it as a probe of the reasoning testbed (whether the -3 of the truncated traces
is what shortens them under RL).
"""

import torch

from tokenbalance.algorithms import TokenInputs, register_token_rule

BUDGET = 440


@register_token_rule("overlong_filter", stage="passes")
def overlong_filter(inputs: TokenInputs) -> torch.Tensor:
    """Weight 0 on every token of a response with BUDGET tokens (no EOS within the budget), else 1."""
    truncated_B = inputs.response_mask_BT.sum(dim=1) >= BUDGET
    return (~truncated_B)[:, None].expand_as(inputs.advantages_BT).to(inputs.advantages_BT.dtype)
