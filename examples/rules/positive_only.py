"""A probe, not a method: the policy gradient of the responses with a positive advantage only; the
others train no token (their rewards still set the group's baseline, and the KL term stays).

    tokenbalance train --method examples/rules/positive_only.py:positive_only

docs/results.md uses it on the reasoning testbed: does the search collapse under RL come from the
negative responses' gradient falling on correct steps?
"""

import torch

from tokenbalance.algorithms import TokenInputs, register_token_rule


@register_token_rule("positive_only", stage="passes")
def positive_only(inputs: TokenInputs) -> torch.Tensor:
    """Weight 1 where the advantage is positive, 0 elsewhere."""
    return (inputs.advantages_BT > 0).to(inputs.advantages_BT.dtype)
