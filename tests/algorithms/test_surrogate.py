"""Hand-computed clipped surrogate, dual clip, importance-sampling modes, KL estimators, entropy."""

import math

import pytest
import torch

from tests.algorithms.conftest import assert_values
from tokenbalance.algorithms.surrogate import ClipConfig, clipped_surrogate, entropy_from_logits, kl_penalty

KK_CLIP = ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=10.0)


def surrogate_and_grad(ratios, advantages, config=KK_CLIP, old=None):
    """One row of tokens with old_logp = 0, so ratio = exp(logp)."""
    logp = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old_logp = torch.zeros_like(logp) if old is None else torch.tensor([old], dtype=torch.float64)
    adv = torch.tensor([advantages], dtype=torch.float64)
    out = clipped_surrogate(logp, old_logp, adv, torch.ones_like(adv, dtype=torch.bool), config)
    (grad,) = torch.autograd.grad(out.loss_BT.sum(), logp)
    return out, grad


def test_unclipped_token_loss_and_gradient():
    # r = 1.1 inside [0.8, 1.24]: loss = -A r = -2.2, d loss / d logp = -A r = -2.2
    out, grad = surrogate_and_grad([1.1], [2.0])
    assert_values(out.loss_BT, [[-2.2]], atol=1e-12)
    assert_values(grad, [[-2.2]], atol=1e-12)
    assert not out.clipped_BT.any()


def test_positive_advantage_above_clip_high_has_no_gradient():
    # r = 1.5 > 1.24: loss = -A * 1.24 = -2.48, constant
    out, grad = surrogate_and_grad([1.5], [2.0])
    assert_values(out.loss_BT, [[-2.48]], atol=1e-12)
    assert_values(grad, [[0.0]])
    assert out.clipped_BT.tolist() == [[True]]


def test_negative_advantage_below_clip_low_is_clipped():
    # A = -1, r = 0.5: L1 = 0.5, L2 = 0.8 -> max = 0.8 (clipped, no gradient)
    out, grad = surrogate_and_grad([0.5], [-1.0])
    assert_values(out.loss_BT, [[0.8]], atol=1e-12)
    assert_values(grad, [[0.0]])
    assert out.clipped_BT.tolist() == [[True]]


def test_dual_clip_bounds_negative_advantage_loss():
    # A = -1, r = 12 > c = 10: max(L1, L2) = 12 > L3 = 10 -> loss 10, no gradient
    out, grad = surrogate_and_grad([12.0, 5.0], [-1.0, -1.0])
    assert_values(out.loss_BT, [[10.0, 5.0]], atol=1e-12)
    assert_values(grad, [[0.0, 5.0]], atol=1e-12)  # below the bound: d(-A r)/dlogp = r
    assert out.dual_clipped_BT.tolist() == [[True, False]]


def test_dual_clip_off_lets_the_loss_grow():
    out, _ = surrogate_and_grad([12.0], [-1.0], ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=None))
    assert_values(out.loss_BT, [[12.0]], atol=1e-9)


def test_importance_sampling_off_is_vanilla_policy_gradient():
    config = ClipConfig(importance_sampling="off")
    out, grad = surrogate_and_grad([3.0, 0.1], [2.0, -1.0], config)
    assert_values(out.ratio_BT, [[1.0, 1.0]])
    assert_values(grad, [[-2.0, 1.0]], atol=1e-12)  # -A * grad(logp)


def test_importance_sampling_off_for_positive_advantages_only():
    config = ClipConfig(eps_low=0.2, eps_high=0.2, dual_clip_c=None, importance_sampling="off_for_pos")
    out, grad = surrogate_and_grad([3.0, 1.1], [2.0, -1.0], config)
    assert_values(out.ratio_BT, [[1.0, 1.1]], atol=1e-12)
    assert_values(grad, [[-2.0, 1.1]], atol=1e-12)


def test_ratio_weight_inside_clip_zeroes_positive_gradient():
    # TR-GRPO paper-literal: w = 1.4, eps_high = 0.2, r = 1, A > 0 -> clip(w r) = 1.2, no gradient
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    out = clipped_surrogate(
        logp,
        torch.zeros_like(logp),
        adv,
        torch.ones(1, 2, dtype=torch.bool),
        ClipConfig(eps_low=0.2, eps_high=0.2, dual_clip_c=None),
        ratio_weight_BT=torch.full((1, 2), 1.4, dtype=torch.float64),
    )
    (grad,) = torch.autograd.grad(out.loss_BT.sum(), logp)
    assert_values(out.loss_BT, [[-1.2, 1.4]], atol=1e-12)
    assert_values(grad, [[0.0, 1.4]], atol=1e-12)


def test_log_ratio_clamp():
    logp = torch.tensor([[30.0]])
    out = clipped_surrogate(
        logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), ClipConfig(log_ratio_clamp=20.0)
    )
    assert out.ratio_BT.item() == pytest.approx(math.exp(20.0), rel=1e-6)


def kl_value_and_grad(delta, estimator="k3", **kw):
    logp = torch.tensor([delta], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(logp, torch.zeros_like(logp), torch.ones_like(logp, dtype=torch.bool), estimator, **kw)
    (grad,) = torch.autograd.grad(value.sum(), logp)
    return value[0], grad[0]


def test_k3_zero_at_equal_policies_and_gradient_inside():
    value, grad = kl_value_and_grad([0.0, 0.5, -0.7])
    # k3 = e^x - x - 1 with x = -d; gradient wrt logp = 1 - pi_ref / pi = 1 - e^{-d}
    assert_values(value, [0.0, math.exp(-0.5) + 0.5 - 1, math.exp(0.7) - 0.7 - 1], atol=1e-12)
    assert_values(grad, [0.0, 1 - math.exp(-0.5), 1 - math.exp(0.7)], atol=1e-12)


def test_k3_clamps():
    # x = -d >= 2.611 -> saturates at 10 (zero gradient); x <= -5 -> e^-5 + 4 = 4.0067 (zero gradient)
    value, grad = kl_value_and_grad([-2.62, -4.0, 5.5, 9.0])
    assert_values(value, [10.0, 10.0, math.exp(-5) + 4, math.exp(-5) + 4], atol=1e-12)
    assert math.exp(-5) + 4 == pytest.approx(4.0067, abs=1e-4)
    assert_values(grad, [0.0, 0.0, 0.0, 0.0])
    # with the upstream clamp 20 the lower side is free until e^x - x - 1 = 10 (x ~ -11)
    value20, _ = kl_value_and_grad([9.0], log_ratio_clamp=20.0)
    assert value20.item() == pytest.approx(math.exp(-9) + 8, abs=1e-12)


def test_other_estimators_by_hand():
    d = [0.5, -2.0]
    assert_values(kl_value_and_grad(d, "k1")[0], d)
    assert_values(kl_value_and_grad(d, "kl")[0], d)
    assert_values(kl_value_and_grad(d, "abs")[0], [0.5, 2.0])
    assert_values(kl_value_and_grad(d, "k2")[0], [0.125, 2.0])
    assert_values(kl_value_and_grad(d, "mse")[1], d)  # gradient of d^2/2


def test_straight_through_has_k3_value_and_k2_gradient():
    value, grad = kl_value_and_grad([0.5], "k3+")
    assert value.item() == pytest.approx(math.exp(-0.5) + 0.5 - 1, abs=1e-12)
    assert grad.item() == pytest.approx(0.5, abs=1e-12)


def test_weighted_kl_is_nonzero_at_equal_policies():
    # rho = w pi_ref / pi = 1.4 -> 1.4 - log 1.4 - 1
    logp = torch.zeros(1, 1, dtype=torch.float64)
    value = kl_penalty(
        logp, logp, torch.ones(1, 1, dtype=torch.bool), "k3", ref_weight_BT=torch.full((1, 1), 1.4, dtype=torch.float64)
    )
    assert value.item() == pytest.approx(0.4 - math.log(1.4), abs=1e-12)


def test_entropy_from_logits():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, float("-inf"), float("-inf"), float("-inf")]]])
    assert_values(entropy_from_logits(logits), [[math.log(4), 0.0]], atol=1e-6)
    probs = torch.tensor([0.5, 0.25, 0.25])
    h = entropy_from_logits(probs.log()[None], chunk_rows=1)
    assert h.item() == pytest.approx(1.5 * math.log(2), abs=1e-6)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ClipConfig(eps_low=1.2), r"clip.eps_low: must be in \[0.0, 1.0\), got 1.2"),
        (lambda: ClipConfig(dual_clip_c=0.5), r"clip.dual_clip_c: must be in \(1.0, inf\], got 0.5"),
        (lambda: ClipConfig(importance_sampling="maybe"), "clip.importance_sampling: unknown value 'maybe'"),
        (
            lambda: kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), "k7"),
            "estimator: unknown value 'k7'; valid: 'k1', 'kl'",
        ),
        (
            lambda: kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), "full"),
            "not implemented",
        ),
        (
            lambda: clipped_surrogate(
                torch.zeros(2, 3),
                torch.zeros(2, 2),
                torch.zeros(2, 3),
                torch.ones(2, 3, dtype=torch.bool),
                ClipConfig(),
            ),
            r"old_logp_BT: expected shape \(2, 3\), got \(2, 2\)",
        ),
        (
            lambda: clipped_surrogate(
                torch.tensor([[float("nan")]]),
                torch.zeros(1, 1),
                torch.zeros(1, 1),
                torch.ones(1, 1, dtype=torch.bool),
                ClipConfig(),
            ),
            "logp_BT: must be finite",
        ),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()
