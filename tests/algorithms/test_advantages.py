"""Hand-computed advantages: GRPO, Dr. GRPO, RLOO, REINFORCE++ and their edge cases."""

import math
import statistics

import pytest
import torch

from tests.algorithms.conftest import assert_values
from tokenbalance.algorithms.advantages import (
    discounted_returns,
    dr_grpo_advantages,
    grpo_advantages,
    kl_in_reward,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)


def full_mask(B, T):
    return torch.ones(B, T, dtype=torch.bool)


def test_grpo_two_member_group_by_hand():
    # scores [1, 0]: mean 0.5, unbiased std sqrt(0.5) = 0.7071068; A = +-0.5 / (0.7071068 + 1e-6)
    adv = grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([7, 7]), full_mask(2, 3))
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv[0].tolist() == pytest.approx([expected] * 3, abs=1e-7)
    assert adv[1].tolist() == pytest.approx([-expected] * 3, abs=1e-7)
    assert expected == pytest.approx(0.7071058, abs=1e-7)


def test_grpo_kk_score_group_matches_formula():
    scores = [3, -0.5, -1, -3, 3, 3, -3, -0.5]  # spec test checklist item 1
    mean = sum(scores) / 8  # 0.125
    std = statistics.stdev(scores)  # unbiased
    adv = grpo_advantages(torch.tensor(scores, dtype=torch.float64), torch.zeros(8, dtype=torch.long), full_mask(8, 1))
    assert mean == 0.125
    assert adv[:, 0].tolist() == pytest.approx([(s - mean) / (std + 1e-6) for s in scores], abs=1e-12)


def test_grpo_groups_are_ids_not_positions_and_padding_is_zero():
    scores = torch.tensor([1.0, 5.0, 0.0, 5.0])
    ids = torch.tensor([0, 1, 0, 1])  # interleaved groups
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    adv = grpo_advantages(scores, ids, mask)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert_values(adv, [[a, a, 0], [0, 0, 0], [-a, -a, -a], [0, 0, 0]], atol=1e-6)


def test_grpo_equal_rewards_give_exact_zero():
    adv = grpo_advantages(torch.tensor([3.0, 3.0, 3.0]), torch.zeros(3, dtype=torch.long), full_mask(3, 2))
    assert torch.equal(adv, torch.zeros(3, 2))


def test_grpo_singleton_reference_quirk_and_zero_rule():
    with pytest.warns(UserWarning, match="group of size 1"):
        adv = grpo_advantages(torch.tensor([3.0]), torch.tensor([0]), full_mask(1, 2))
    assert adv[0, 0].item() == pytest.approx(3.0 / (1 + 1e-6), rel=1e-7)
    adv_zero = grpo_advantages(torch.tensor([3.0]), torch.tensor([0]), full_mask(1, 2), singleton="zero")
    assert torch.equal(adv_zero, torch.zeros(1, 2))


def test_dr_grpo_is_mean_only():
    adv = dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long), full_mask(4, 1))
    assert adv[:, 0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_rloo_leave_one_out_baseline():
    # s_i - mean of the others: 1 - 0 = 1; 0 - 1/3 = -1/3
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long), full_mask(4, 1))
    assert adv[:, 0].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_outcome_reward_sits_on_last_valid_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    rewards = outcome_token_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert rewards.tolist() == [[0, 2, 0], [0, 0, -1], [0, 0, 0]]


def test_discounted_returns_gamma_and_reset():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    # the 7.0 at a padded position is ignored; gamma 0.5 discounts backwards
    assert discounted_returns(rewards, mask, 0.5).tolist() == [[0.25, 0.5, 1.0, 0.0]]


def test_discounted_returns_at_a_gap_restart_or_carry():
    # response, 2 masked tool-output tokens, response again, padding; reward 1 on the last valid token
    rewards = torch.tensor([[0.0, 0.0, 5.0, 5.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
    # restart (AR-Lopti fork): the return is reset after each masked position, so the first turn gets 0
    restart = discounted_returns(rewards, mask, 0.5, gaps="restart")
    assert restart.tolist() == [[0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 0.0]]
    # carry (verl): the return passes the gap undiscounted; masked positions hold 0
    carry = discounted_returns(rewards, mask, 0.5, gaps="carry")
    assert carry.tolist() == [[0.125, 0.25, 0.0, 0.0, 0.5, 1.0, 0.0]]


def test_discounted_returns_rules_agree_without_gaps():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = torch.arange(6)[None, :] < torch.tensor([6, 3, 1, 0])[:, None]
    restart = discounted_returns(rewards, mask, 0.9, gaps="restart") * mask
    assert torch.equal(restart, discounted_returns(rewards, mask, 0.9, gaps="carry"))
    assert torch.equal(
        reinforce_pp_advantages(rewards, mask, gaps="restart"), reinforce_pp_advantages(rewards, mask, gaps="carry")
    )


def test_reinforce_pp_whitening_by_hand():
    # returns: row 0 = [1, 1], row 1 = [0, 0, 0]; M = 5, mean 0.4, unbiased var 0.3
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    rewards = outcome_token_rewards(torch.tensor([1.0, 0.0], dtype=torch.float64), mask)
    adv = reinforce_pp_advantages(rewards, mask)
    hi, lo = 0.6 / math.sqrt(0.3 + 1e-8), -0.4 / math.sqrt(0.3 + 1e-8)
    assert_values(adv, [[hi, hi, 0.0], [lo, lo, lo]], atol=1e-12)
    assert hi == pytest.approx(1.0954451, abs=1e-6)
    valid = adv[mask]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-12)
    assert valid.var(unbiased=True).item() == pytest.approx(1.0, abs=1e-6)


def test_reinforce_pp_outcome_reward_gives_each_token_the_same_return():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    rewards = outcome_token_rewards(torch.tensor([3.0, -1.0]), mask)
    returns = discounted_returns(rewards, mask, 1.0)
    assert returns.tolist() == [[3, 3, 3, 3], [-1, -1, 0, 0]]


def test_reinforce_pp_fewer_than_two_tokens_gives_zeros():
    mask = torch.tensor([[1, 0], [0, 0]], dtype=torch.bool)
    adv = reinforce_pp_advantages(torch.tensor([[2.0, 0.0], [0.0, 0.0]]), mask)
    assert torch.equal(adv, torch.zeros(2, 2))


def test_kl_in_reward_subtracts_at_valid_tokens():
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    out = kl_in_reward(torch.tensor([[0.0, 3.0, 0.0]]), torch.tensor([[0.5, 1.0, 9.0]]), mask, 0.1)
    assert_values(out, [[-0.05, 2.9, 0.0]])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: grpo_advantages(torch.ones(3), torch.zeros(2, dtype=torch.long), full_mask(3, 2)), "group_ids_B"),
        (lambda: grpo_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), full_mask(3, 2)), "scores_B"),
        (
            lambda: grpo_advantages(
                torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.long), full_mask(2, 1)
            ),
            "scores_B: must be finite",
        ),
        (
            lambda: grpo_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), full_mask(2, 1), singleton="x"),
            "singleton",
        ),
        (
            lambda: discounted_returns(torch.zeros(1, 2), full_mask(1, 2), 1.5),
            r"gamma: must be in \[0.0, 1.0\], got 1.5",
        ),
        (lambda: discounted_returns(torch.zeros(1, 2), full_mask(1, 2), gaps="skip"), "gaps"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
