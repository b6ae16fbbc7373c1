"""The step-count control (``random_split``): Lopti's two passes over randomly halved tokens. It must differ from GRPO
only in taking two optimizer steps: the same tokens, advantages and denominators, the loss split in two."""

import dataclasses
import math

import pytest
import torch

from tests.tolerances import assert_close_in
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import build_update_passes
from tokenbalance.algorithms.passes import RandomSplitConfig, random_first_mask, random_split_passes, single_pass
from tokenbalance.algorithms.presets import get_method

PROBS = [[0.3, 0.6, 0.5], [0.1, 0.9, 0.05]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)  # the 0.05 token is padding
OLD = torch.tensor([[math.log(p) for p in row] for row in PROBS])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])


def _batch(rows=16, length=40, seed=0):
    generator = torch.Generator().manual_seed(seed)
    old_BT = -torch.rand(rows, length, generator=generator) * 3
    mask_BT = torch.arange(length)[None, :] < torch.randint(5, length + 1, (rows, 1), generator=generator)
    scores_B = torch.randint(0, 2, (rows,), generator=generator).double()
    groups_B = torch.arange(rows) // 4
    return old_BT, mask_BT, scores_B, groups_B


def test_two_passes_partition_the_valid_tokens_with_all_tokens_as_denominator():
    first, second = random_split_passes(ADV, OLD, MASK, RandomSplitConfig())[0]
    assert (first.name, second.name) == ("random_first", "random_second")
    assert not (first.policy_mask_BT & second.policy_mask_BT).any()
    assert torch.equal(first.policy_mask_BT | second.policy_mask_BT, MASK)
    for stage in (first, second):
        assert torch.equal(stage.normaliser_mask_BT, MASK)  # as Lopti: every valid token counts in both passes
        assert torch.equal(stage.kl_entropy_mask_BT, stage.policy_mask_BT)
    assert torch.equal(first.advantages_BT + second.advantages_BT, torch.where(MASK, ADV, 0.0))


def test_halves_are_reproducible_about_half_and_change_with_the_seed():
    old_BT, mask_BT, _, _ = _batch(rows=64, length=64)
    one = random_first_mask(old_BT, mask_BT, RandomSplitConfig())
    assert torch.equal(one, random_first_mask(old_BT.clone(), mask_BT.clone(), RandomSplitConfig()))
    assert not (one & ~mask_BT).any()
    share = one.sum().item() / mask_BT.sum().item()
    assert abs(share - 0.5) < 5 * math.sqrt(0.25 / mask_BT.sum().item())  # 5 sd of a fair coin's share
    assert not torch.equal(one, random_first_mask(old_BT, mask_BT, RandomSplitConfig(seed=1)))
    quarter = random_first_mask(old_BT, mask_BT, RandomSplitConfig(fraction=0.25))
    assert abs(quarter.sum().item() / mask_BT.sum().item() - 0.25) < 5 * math.sqrt(0.1875 / mask_BT.sum().item())


def test_the_halves_ignore_the_token_probability():
    """Lopti's first pass holds the tokens below eta; the control's first pass holds as many low as high tokens."""
    old_BT, mask_BT, _, _ = _batch(rows=64, length=64)
    first = random_first_mask(old_BT, mask_BT, RandomSplitConfig())
    low = (old_BT.exp() < 0.5) & mask_BT
    low_share = (first & low).sum().item() / low.sum().item()
    high_share = (first & ~low & mask_BT).sum().item() / (~low & mask_BT).sum().item()
    assert abs(low_share - high_share) < 0.1


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5])
def test_fraction_outside_the_open_unit_interval_is_refused(fraction):
    with pytest.raises(ValueError, match=r"random_split.fraction: must be in \(0.0, 1.0\)"):
        RandomSplitConfig(fraction=fraction)


def test_with_lopti_is_refused():
    with pytest.raises(ValueError, match="random_split: the step-count control replaces Lopti"):
        get_method("lopti").replace(random_split=RandomSplitConfig())


def test_two_step_preset_is_the_grpo_preset_with_the_split_only():
    two_step, grpo = get_method("arlopti_kk_fig4_grpo_two_step"), get_method("arlopti_kk_fig4_grpo")
    assert two_step.random_split == RandomSplitConfig()
    assert two_step.pass_names == ("random_first", "random_second")
    same = dataclasses.replace(
        two_step, random_split=None, name=grpo.name, description=grpo.description, citations=grpo.citations
    )
    assert same == grpo


def test_the_two_passes_losses_add_up_to_grpo_s_one_pass():
    """At the same parameters the two passes' losses (each over all valid tokens) sum to GRPO's loss, and their
    gradients to its gradient: the control changes only how many optimizer steps the batch takes."""
    old_BT, mask_BT, scores_B, groups_B = _batch()
    ref_BT = old_BT - 0.1
    two_step, grpo = get_method("arlopti_kk_fig4_grpo_two_step"), get_method("arlopti_kk_fig4_grpo")
    halves, _ = build_update_passes(two_step, scores_B, groups_B, mask_BT, old_BT, ref_BT)
    (whole,), _ = build_update_passes(grpo, scores_B, groups_B, mask_BT, old_BT, ref_BT)
    logp_BT = (old_BT + 0.05 * torch.randn(old_BT.shape, generator=torch.Generator().manual_seed(3))).requires_grad_()
    total = pass_loss(grpo, whole, logp_BT, old_BT, ref_BT).loss
    (grad_whole,) = torch.autograd.grad(total, logp_BT)
    parts = [pass_loss(two_step, p, logp_BT, old_BT, ref_BT).loss for p in halves]
    (grad_parts,) = torch.autograd.grad(parts[0] + parts[1], logp_BT)
    assert_close_in(parts[0] + parts[1], total, torch.float32, msg="loss")
    assert_close_in(grad_parts, grad_whole, torch.float32, msg="gradient")
    assert torch.equal(
        single_pass(whole.advantages_BT, mask_BT)[0].policy_mask_BT, halves[0].policy_mask_BT | halves[1].policy_mask_BT
    )
