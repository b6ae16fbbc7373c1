"""Lopti's split: computed once from old log-probs, ANDed with the mask, a partition of the tokens."""

import math

import pytest
import torch

from tokenbalance.algorithms.passes import LoptiConfig, lopti_passes, single_pass

PROBS = [[0.3, 0.6, 0.5], [0.1, 0.9, 0.05]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)  # the 0.05 token is padding
OLD = torch.tensor([[math.log(p) for p in row] for row in PROBS])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])


def test_low_first_split_by_hand():
    passes, metrics = lopti_passes(ADV, OLD, MASK, LoptiConfig(eta=0.5))
    low, high = passes
    assert [p.name for p in passes] == ["lopti_low", "lopti_high"]
    # strict p < 0.5: 0.3 and 0.1 are low; 0.5 is high; padding in neither
    assert low.policy_mask_BT.tolist() == [[True, False, False], [True, False, False]]
    assert high.policy_mask_BT.tolist() == [[False, True, True], [False, True, False]]
    assert low.advantages_BT.tolist() == [[1.0, 0.0, 0.0], [-2.0, 0.0, 0.0]]
    assert high.advantages_BT.tolist() == [[0.0, 1.0, 1.0], [0.0, -2.0, 0.0]]
    for stage in passes:
        assert torch.equal(stage.kl_entropy_mask_BT, stage.policy_mask_BT)
        assert torch.equal(stage.normaliser_mask_BT, MASK)  # denominators count all valid tokens
    assert not (low.policy_mask_BT & high.policy_mask_BT).any()
    assert torch.equal(low.policy_mask_BT | high.policy_mask_BT, MASK)
    assert metrics == {"lopti/threshold": 0.5, "lopti/low_token_frac": pytest.approx(2 / 5)}


def test_non_strict_tie_and_reverse_order_and_renormalisation():
    passes, _ = lopti_passes(ADV, OLD, MASK, LoptiConfig(eta=0.5, strict_less=False))
    assert passes[0].policy_mask_BT[0].tolist() == [True, False, True]
    reverse, _ = lopti_passes(ADV, OLD, MASK, LoptiConfig(eta=0.5, order="high_first"))
    assert [p.name for p in reverse] == ["lopti_high", "lopti_low"]
    renorm, _ = lopti_passes(ADV, OLD, MASK, LoptiConfig(eta=0.5, renormalize_per_stage=True))
    assert torch.equal(renorm[0].normaliser_mask_BT, renorm[0].policy_mask_BT)


def test_quantile_mode_uses_valid_tokens_only():
    # valid probs 0.3, 0.6, 0.5, 0.1, 0.9: median 0.5 -> low = {0.3, 0.1}
    passes, metrics = lopti_passes(ADV, OLD, MASK, LoptiConfig(threshold_mode="quantile", portion=0.5))
    assert metrics["lopti/threshold"] == pytest.approx(0.5)
    assert passes[0].policy_mask_BT.tolist() == [[True, False, False], [True, False, False]]


def test_single_pass_and_inputs_unchanged():
    adv, old = ADV.clone(), OLD.clone()
    (only,) = single_pass(adv, MASK)
    lopti_passes(adv, old, MASK, LoptiConfig())
    assert torch.equal(adv, ADV) and torch.equal(old, OLD)
    assert only.name == "all" and torch.equal(only.policy_mask_BT, MASK)
    assert only.advantages_BT[1, 2].item() == 0.0


@pytest.mark.parametrize("eta", [0.0, 1.0, -0.5, 1.5, float("nan")])
def test_eta_outside_open_unit_interval(eta):
    with pytest.raises(ValueError, match=r"lopti.eta: must be in \(0.0, 1.0\), got"):
        LoptiConfig(eta=eta)


def test_quantile_mode_needs_portion():
    with pytest.raises(ValueError, match="lopti.portion: required"):
        LoptiConfig(threshold_mode="quantile")
