"""The closed-form logit-gradient norm equals autograd's, token by token; the bound bounds it; the
aggregation weights are the aggregate's derivative."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algorithms.helpers import make_batch, total_loss_fn
from tests.tolerances import dtype_atol
from tokenbalance.algorithms.aggregate import AGG_MODES, aggregate, token_coefficients
from tokenbalance.algorithms.logit_grad import (
    logit_grad_sq,
    logit_grad_sq_bound,
    softmax_grad_sq,
    sum_sq_probs,
)
from tokenbalance.algorithms.presets import apply_method_overrides, get_method


def test_hand_computed_three_token_vocabulary():
    # pi = (0.5, 0.3, 0.2), sampled o = 0, g = 2: ||e_o - pi||^2 = 0.5^2 + 0.3^2 + 0.2^2 = 0.38
    logp_BTV = torch.tensor([[[0.5, 0.3, 0.2]]], dtype=torch.float64).log()
    logp_BT = logp_BTV[..., 0]
    g_BT = torch.tensor([[2.0]], dtype=torch.float64)
    s_BT = sum_sq_probs(logp_BTV)
    assert s_BT.item() == pytest.approx(0.25 + 0.09 + 0.04)
    assert softmax_grad_sq(logp_BT, s_BT).item() == pytest.approx(0.38)
    assert logit_grad_sq(g_BT, logp_BT, s_BT).item() == pytest.approx(4 * 0.38)
    assert logit_grad_sq_bound(g_BT, logp_BT).item() == pytest.approx(2 * 4 * 0.5**2)  # 2 g^2 (1 - p)^2


def test_sum_sq_probs_chunks_and_has_no_gradient():
    theta = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    logp_BTV = torch.log_softmax(theta, dim=-1)
    whole = sum_sq_probs(logp_BTV)
    assert not whole.requires_grad
    torch.testing.assert_close(sum_sq_probs(logp_BTV, chunk_rows=2), whole, rtol=0, atol=0)
    torch.testing.assert_close(whole, (logp_BTV.exp() ** 2).sum(-1).detach(), rtol=1e-14, atol=1e-15)


def logit_norms_vs_autograd(method, dtype):
    """(closed form, autograd) per-token ||dL/dz|| of the method's total loss on a random batch."""
    batch = make_batch(seed=3, dtype=dtype)
    theta = batch.theta_BTV.detach().clone().requires_grad_(True)
    logp_BTV = torch.log_softmax(theta, dim=-1)
    logp_BT = logp_BTV.gather(-1, batch.tokens_BT[..., None]).squeeze(-1)
    logp_BT.retain_grad()
    loss = total_loss_fn(method, batch)(logp_BT, None)
    loss.backward()
    closed_BT = logit_grad_sq(logp_BT.grad, logp_BT, sum_sq_probs(logp_BTV)).sqrt()
    return closed_BT, theta.grad.norm(dim=-1), logp_BT, batch.mask_BT


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["grpo", "ar", "tr_grpo", "lopti", "seq_mean"])
def test_closed_form_equals_autograd_gradient_wrt_logits(name, dtype):
    method = get_method("ar").replace(loss_agg_mode="seq-mean-token-mean") if name == "seq_mean" else get_method(name)
    if name == "lopti":
        method = apply_method_overrides(method, {"lopti.eta": 0.2})
    closed_BT, autograd_BT, _, mask_BT = logit_norms_vs_autograd(method, dtype)
    scale = float(autograd_BT.max())
    assert scale > 1e-3 and int((autograd_BT[mask_BT] > 1e-6).sum()) > 10  # real gradients on many tokens
    # relative to the largest norm, every position (padding included: both 0)
    assert float((closed_BT - autograd_BT).abs().max()) / scale <= dtype_atol(dtype)


def test_bounds_hold_token_by_token():
    closed_BT, _, logp_BT, mask_BT = logit_norms_vs_autograd(get_method("grpo"), torch.float64)
    batch = make_batch(seed=3)
    V = batch.theta_BTV.shape[-1]
    g_abs_BT = closed_BT / softmax_grad_sq(logp_BT, sum_sq_probs(torch.log_softmax(batch.theta_BTV, -1))).sqrt()
    one_minus_p = 1 - logp_BT.detach().exp()
    upper_BT = logit_grad_sq_bound(g_abs_BT, logp_BT).sqrt()
    lower_BT = math.sqrt(V / (V - 1)) * g_abs_BT * one_minus_p
    eps = 1e-12
    assert bool((closed_BT[mask_BT] <= upper_BT[mask_BT] + eps).all())
    assert bool((closed_BT[mask_BT] >= lower_BT[mask_BT] - eps).all())


@pytest.mark.parametrize("mode", AGG_MODES)
def test_token_coefficients_are_the_derivative_of_aggregate(mode):
    gen = torch.Generator().manual_seed(0)
    mask_BT = torch.rand(4, 6, generator=gen) < 0.7
    mask_BT[2] = False  # an empty row
    denominator_BT = mask_BT | (torch.rand(4, 6, generator=gen) < 0.3)
    loss_BT = torch.randn(4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    kwargs = dict(denominator_mask_BT=denominator_BT, max_response_len=9)
    for normaliser in (None, 5.0, 0.0):
        total = aggregate(loss_BT, mask_BT, mode, normaliser=normaliser, **kwargs)
        (grad_BT,) = torch.autograd.grad(total, loss_BT)
        coef_BT = token_coefficients(mask_BT, mode, normaliser=normaliser, **kwargs)
        torch.testing.assert_close(coef_BT, grad_BT, rtol=1e-15, atol=1e-15)
    # token-mean over 10 tokens: 1/10 on the mask, 0 elsewhere
    hand = token_coefficients(torch.tensor([[True, True, False]]), "token-mean", normaliser=10.0)
    assert hand.tolist() == [[0.1, 0.1, 0.0]]


def test_entropy_pass_gives_the_same_entropy_and_the_sum_of_squares():
    from tokenbalance.algorithms.surrogate import entropy_and_sum_sq_probs, entropy_from_logits

    logits_BTV = 3 * torch.randn(4, 9, 50)
    entropy_BT, sum_sq_BT = entropy_and_sum_sq_probs(logits_BTV, chunk_rows=7)
    assert torch.equal(entropy_BT, entropy_from_logits(logits_BTV, chunk_rows=7))  # the entropy is untouched
    expected = sum_sq_probs(torch.log_softmax(logits_BTV.double(), dim=-1))
    assert float((sum_sq_BT.double() - expected).abs().max()) <= dtype_atol(torch.float32)
