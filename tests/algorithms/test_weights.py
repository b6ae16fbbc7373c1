"""Hand-computed Advantage Reweighting and TR-GRPO weights."""

import math

import pytest
import torch

from tests.algorithms.conftest import assert_values
from tokenbalance.algorithms.weights import (
    ARConfig,
    TRGRPOConfig,
    advantage_reweight,
    ar_token_weights,
    scale_negative_advantages,
    tr_grpo_token_weights,
    tr_grpo_weights_from_prob,
)

MASK = torch.tensor([[1, 1, 0]], dtype=torch.bool)


def logp(*probs):
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float64)


def test_ar_by_hand():
    # alpha 0.3: w = 0.3 p + 0.7 -> p = 0.5: 0.85, p = 1: 1.0; padding stays 0
    adv = torch.tensor([[2.0, -1.0, 5.0]], dtype=torch.float64)
    out = advantage_reweight(adv, logp(0.5, 1.0, 0.1), MASK, ARConfig(alpha=0.3))
    assert_values(out, [[1.7, -1.0, 0.0]], atol=1e-12)


def test_ar_explicit_tau_and_negative_weight():
    adv = torch.tensor([[2.0, -1.0, 0.0]], dtype=torch.float64)
    out = advantage_reweight(adv, logp(0.5, 0.5, 0.5), MASK, ARConfig(alpha=0.2, tau=0.5, neg_adv_weight=0.8))
    # w = 0.2 * 0.5 + 0.5 = 0.6; negatives x 0.8
    assert_values(out, [[1.2, -0.48, 0.0]], atol=1e-12)


def test_negative_advantage_factor_alone_by_hand():
    # the current_detached path's sign factor: A <= 0 times 0.8, A > 0 unchanged, padding 0
    adv = torch.tensor([[2.0, -1.0, 7.0], [0.0, -2.5, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert_values(scale_negative_advantages(adv, mask, 0.8), [[2.0, -0.8, 0.0], [0.0, -2.0, 0.0]], atol=1e-12)
    assert_values(scale_negative_advantages(adv, mask, 1.0), [[2.0, -1.0, 0.0], [0.0, -2.5, 0.0]], atol=1e-12)
    with pytest.raises(ValueError, match=r"ar.neg_adv_weight: must be in \[0.0, inf\], got -1.0"):
        scale_negative_advantages(adv, mask, -1.0)


def test_ar_alpha_zero_is_identity_and_weights_carry_no_gradient():
    old = logp(0.2, 0.9, 0.5).requires_grad_(True)
    adv = torch.tensor([[1.5, -0.5, 0.0]], dtype=torch.float64)
    out = advantage_reweight(adv, old, MASK, ARConfig(alpha=0.0))
    assert torch.equal(out, adv)
    assert not out.requires_grad
    assert not ar_token_weights(old, MASK, ARConfig(alpha=0.5)).requires_grad


def test_tr_grpo_readings_match_the_table():
    probs = torch.tensor([0.1, 0.2, 0.25, 0.3, 0.4, 0.9], dtype=torch.float64)
    shift = tr_grpo_weights_from_prob(probs, TRGRPOConfig(shape="sigmoid_shift"))
    mul = tr_grpo_weights_from_prob(probs, TRGRPOConfig(shape="sigmoid_mul"))
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # reading C: clip(2 sigmoid(9 (p - 0.25)), 1, 1.4); p = 0.3 -> 2 sigmoid(0.45) = 1.2213
    assert_values(shift, [1.0, 1.0, 1.0, 2 * sig(0.45), 1.4, 1.4], atol=1e-12)
    assert shift[3].item() == pytest.approx(1.221, abs=1e-3)
    # reading B: clip(2 (sigmoid(9 p) - 0.25), 1, 1.4); p = 0.2 -> 1.216, p = 0.25 -> 1.309
    assert_values(
        mul, [1.0, 2 * (sig(1.8) - 0.25), 2 * (sig(2.25) - 0.25), 2 * (sig(2.7) - 0.25), 1.4, 1.4], atol=1e-12
    )
    assert mul[3].item() == pytest.approx(1.374, abs=1e-3)
    assert mul[1].item() == pytest.approx(1.216, abs=1e-3) and mul[2].item() == pytest.approx(1.309, abs=1e-3)


def test_where_the_readings_leave_the_clip_bounds():
    # docs/methods.md §5: shift is 1 up to p = 0.25 and 1.4 from 0.25 + ln(7/3)/9 = 0.3441;
    # mul is 1 up to ln(3)/9 = 0.1221 and 1.4 from ln(19)/9 = 0.3272.
    shift_edges = torch.tensor([0.25, 0.25 + math.log(7 / 3) / 9], dtype=torch.float64)
    mul_edges = torch.tensor([math.log(3) / 9, math.log(19) / 9], dtype=torch.float64)
    assert_values(tr_grpo_weights_from_prob(shift_edges, TRGRPOConfig(shape="sigmoid_shift")), [1.0, 1.4], atol=1e-12)
    assert_values(tr_grpo_weights_from_prob(mul_edges, TRGRPOConfig(shape="sigmoid_mul")), [1.0, 1.4], atol=1e-12)
    assert shift_edges[1].item() == pytest.approx(0.3441, abs=1e-4)
    assert mul_edges.tolist() == pytest.approx([0.1221, 0.3272], abs=1e-4)


def test_the_literal_transcription_is_the_constant_one_so_it_is_refused():
    # clip(2 (sigmoid(p / 9) - 0.25), 1, 1.4): the raw value runs from 2 (0.5 - 0.25) = 0.5 at p = 0
    # to 2 (sigmoid(1/9) - 0.25) = 0.55550 at p = 1, below L = 1, so every token gets w = 1 (GRPO).
    p = torch.linspace(0.0, 1.0, 10001, dtype=torch.float64)
    raw = 2.0 * (torch.sigmoid(p / 9.0) - 0.25)
    assert raw.min().item() == pytest.approx(0.5, abs=1e-15)
    assert raw.max().item() == pytest.approx(2 * (1 / (1 + math.exp(-1 / 9)) - 0.25), abs=1e-15)
    assert raw.max().item() == pytest.approx(0.55550, abs=1e-5)
    assert torch.equal(raw.clamp(1.0, 1.4), torch.ones_like(p))
    with pytest.raises(ValueError, match=r"tr_grpo.shape: 'sigmoid_div': .* constant 1 \(plain GRPO\)"):
        TRGRPOConfig(shape="sigmoid_div")


def test_a_constant_weight_warns():
    with pytest.warns(UserWarning, match=r"weight is constant \(1.4000..1.4000"):
        config = TRGRPOConfig(lower=1.4, upper=1.4)
    weights = tr_grpo_token_weights(logp(0.01, 0.99, 0.5), MASK, config)
    assert_values(weights, [[1.4, 1.4, 1.0]])  # 1 at padding


def test_tr_grpo_weights_increase_with_probability_and_are_detached():
    current = torch.log(torch.linspace(0.01, 1.0, 50, dtype=torch.float64))[None].requires_grad_(True)
    weights = tr_grpo_token_weights(current, torch.ones_like(current, dtype=torch.bool), TRGRPOConfig())
    assert not weights.requires_grad
    assert bool((weights[0, 1:] >= weights[0, :-1]).all())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ARConfig(alpha=1.5), r"ar.alpha: must be in \[0.0, 1.0\], got 1.5"),
        (lambda: ARConfig(alpha=-0.1), r"ar.alpha: must be in \[0.0, 1.0\], got -0.1"),
        (lambda: ARConfig(prob_source="new"), "ar.prob_source: unknown value 'new'; valid: 'old', 'current_detached'"),
        (lambda: TRGRPOConfig(shape="tanh"), "tr_grpo.shape: unknown value 'tanh'"),
        (lambda: TRGRPOConfig(lower=1.5, upper=1.4), r"tr_grpo.upper: must be in \[1.5, inf\], got 1.4"),
        (lambda: TRGRPOConfig(placement="inside"), "tr_grpo.placement"),
        (
            lambda: ar_token_weights(
                torch.tensor([[float("inf"), 0.0]]), torch.ones(1, 2, dtype=torch.bool), ARConfig()
            ),
            "logp_BT: must be finite at valid positions, found inf",
        ),
    ],
)
def test_bad_hyper_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()
