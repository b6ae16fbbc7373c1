"""The token rules in examples/rules/ load by their file names and weigh tokens as their docstrings say."""

from pathlib import Path

import pytest
import torch

from tokenbalance.algorithms.presets import get_method
from tokenbalance.algorithms.token_rules import TokenInputs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rules"


pytestmark = pytest.mark.usefixtures("isolated_rules")  # the examples register into a copy of the registry


def rule(name):
    return get_method(f"{EXAMPLES / name}.py:{name}").token_rule


def test_overlong_filter_drops_only_the_responses_that_used_the_whole_budget():
    overlong = rule("overlong_filter")
    budget = 440
    mask_BT = torch.zeros(3, budget, dtype=torch.bool)
    mask_BT[0, :budget] = True  # cut off at the budget
    mask_BT[1, : budget - 1] = True  # ended one token before it
    mask_BT[2, :5] = True
    inputs = TokenInputs(
        old_logp_BT=torch.zeros(3, budget),
        advantages_BT=torch.tensor([[-2.0], [1.0], [0.5]]).expand(3, budget),
        response_mask_BT=mask_BT,
    )
    weights_BT = overlong.function(inputs)
    assert (overlong.name, overlong.stage) == ("overlong_filter", "passes")
    assert weights_BT[:, 0].tolist() == [0.0, 1.0, 1.0] and bool((weights_BT == weights_BT[:, :1]).all())


def test_positive_only_keeps_the_positive_advantages():
    positive = rule("positive_only")
    inputs = TokenInputs(
        old_logp_BT=torch.zeros(2, 3),
        advantages_BT=torch.tensor([[0.7, 0.7, 0.7], [-0.3, 0.0, -0.3]]),
        response_mask_BT=torch.ones(2, 3, dtype=torch.bool),
    )
    assert positive.function(inputs).tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
