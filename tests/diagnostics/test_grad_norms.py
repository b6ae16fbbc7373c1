"""Per-bucket gradient norms: the bucket gradients add up to the all-token gradient; norms are exact."""

import math

import pytest
import torch

from tests.algorithms.helpers import make_batch, passes_for
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.presets import get_method
from tokenbalance.diagnostics.buckets import bucket_masks
from tokenbalance.diagnostics.grad_norms import (
    bucket_gradient_norms,
    gradient_free_method,
    grouped_norms,
    parameter_group,
    probe_rows,
)
from tokenbalance.diagnostics.step import update_advantages
from tokenbalance.types import UpdatePass

torch.set_num_threads(1)
EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)


def spread_batch(seed):
    """``make_batch`` with sharper logits and sampled tokens, so every probability bucket is populated."""
    batch = make_batch(seed=seed, groups=3, group_size=4, T=9, V=5)
    gen = torch.Generator().manual_seed(seed)
    theta = batch.theta_BTV.detach() * 2.5
    batch.theta_BTV = theta.clone().requires_grad_(True)
    probs = torch.softmax(theta, -1).reshape(-1, 5)
    batch.tokens_BT = torch.multinomial(probs, 1, generator=gen).reshape(theta.shape[:2])
    old_theta = theta + 0.3 * torch.randn(theta.shape, generator=gen, dtype=theta.dtype)
    batch.old_logp_BT = torch.log_softmax(old_theta, -1).gather(-1, batch.tokens_BT[..., None]).squeeze(-1)
    batch.ref_logp_BT = batch.old_logp_BT.clone()
    return batch


def setup(name="grpo", seed=0):
    method = get_method(name)
    batch = spread_batch(seed)
    passes, _ = passes_for(method, batch)
    adv, policy = update_advantages(passes, batch.mask_BT)
    theta = torch.nn.Parameter(batch.theta_BTV.detach().clone())
    masks = {"all": policy}
    for b, m in enumerate(bucket_masks(batch.old_logp_BT, batch.mask_BT, EDGES)):
        masks[f"bucket{b}"] = m & policy
    return method, batch, adv, theta, masks


def run(method, batch, adv, theta, masks, micro=5, shared=None, **kwargs):
    """Log-probs from free per-token logits ``theta`` (+ a bias shared by every position, if given)."""
    params = [("theta", theta)] + ([] if shared is None else [("lm_head.bias", shared)])
    logits = (lambda: theta) if shared is None else (lambda: theta + shared)
    return bucket_gradient_norms(
        method=method,
        named_params=params,
        logp_fn=lambda rows: batch.logp(logits())[rows],
        old_logp_BT=batch.old_logp_BT,
        advantages_BT=adv,
        mask_BT=batch.mask_BT,
        masks=masks,
        micro_batch_rows=micro,
        **kwargs,
    )


@pytest.mark.parametrize("name", ["grpo", "ar_lopti", "tr_grpo"])
def test_bucket_gradients_sum_to_the_all_token_gradient(name):
    method, batch, adv, theta, masks = setup(name)
    assert all(int(m.sum()) > 0 for m in masks.values())  # every bucket holds tokens
    shared = torch.nn.Parameter(torch.zeros(5, dtype=theta.dtype))
    norms, grads = run(method, batch, adv, theta, masks, shared=shared, keep_grads=True)
    for i in range(2):  # per-token logits and the shared bias
        bucket_sum = sum(grads[f"bucket{b}"][i] for b in range(4))
        torch.testing.assert_close(bucket_sum, grads["all"][i], rtol=1e-10, atol=1e-12)
    for label, grad in grads.items():
        total = math.sqrt(sum(float(g.square().sum()) for g in grad))
        assert norms[f"diag/grad_norm/{label}"] == pytest.approx(total, rel=1e-12)
        assert norms[f"diag/grad_norm/{label}/head"] == pytest.approx(float(grad[1].norm()), rel=1e-12)
        assert norms[f"diag/grad_norm/{label}/other"] == pytest.approx(float(grad[0].norm()), rel=1e-12)
    # squared norms add up only for orthogonal gradients: the per-token logits' are, the shared bias's are not
    squares = [sum(norms[f"diag/grad_norm/bucket{b}/{g}"] ** 2 for b in range(4)) for g in ("other", "head")]
    assert squares[0] == pytest.approx(norms["diag/grad_norm/all/other"] ** 2, rel=1e-9)
    assert squares[1] != pytest.approx(norms["diag/grad_norm/all/head"] ** 2, rel=1e-2)


def test_all_token_norm_equals_the_methods_policy_gradient_and_grads_are_restored():
    method, batch, adv, theta, masks = setup("ar_lopti", seed=1)
    sentinel = torch.full_like(theta, 7.0)
    theta.grad = sentinel
    norms, _ = run(method, batch, adv, theta, masks, micro=2)
    assert theta.grad is sentinel  # untouched
    # expected: the sum of the method's passes' policy losses (KL off) at the same parameters
    passes, _ = passes_for(method, batch)
    no_kl = gradient_free_method(method)
    theta2 = batch.theta_BTV.detach().clone().requires_grad_(True)
    loss = sum(pass_loss(no_kl, p, batch.logp(theta2), batch.old_logp_BT).loss for p in passes)
    (grad,) = torch.autograd.grad(loss, theta2)
    assert norms["diag/grad_norm/all"] == pytest.approx(float(grad.norm()), rel=1e-10)


def test_a_bucket_gradient_uses_the_full_denominator():
    method, batch, adv, theta, masks = setup("grpo", seed=2)
    _, grads = run(method, batch, adv, theta, {"bucket3": masks["bucket3"]}, keep_grads=True)
    select = masks["bucket3"]
    only = UpdatePass("b3", torch.where(select, adv, torch.zeros_like(adv)), select, select, batch.mask_BT.bool())
    theta2 = batch.theta_BTV.detach().clone().requires_grad_(True)
    loss = pass_loss(gradient_free_method(method), only, batch.logp(theta2), batch.old_logp_BT).loss
    (grad,) = torch.autograd.grad(loss, theta2)
    torch.testing.assert_close(grads["bucket3"][0], grad)


def test_parameter_groups_and_grouped_norms():
    assert parameter_group("model.layers.3.self_attn.q_proj.weight") == "layer3"
    assert parameter_group("model.embed_tokens.weight") == "embed"
    assert parameter_group("lm_head.weight") == "head"
    assert parameter_group("model.norm.weight") == "other"
    total, groups = grouped_norms(
        [
            ("model.layers.0.a", torch.tensor([3.0])),
            ("model.layers.0.b", torch.tensor([4.0])),
            ("model.layers.1.a", torch.tensor([12.0])),
            ("lm_head.weight", None),
        ]
    )
    assert groups == {"layer0": 5.0, "layer1": 12.0, "head": 0.0} and total == pytest.approx(13.0)


def test_per_layer_norms_of_a_tiny_model(tiny_policy_dir):
    from tokenbalance.models import load_policy

    model, _ = load_policy(tiny_policy_dir)
    names = [n for n, p in model.named_parameters()]
    groups = {parameter_group(n) for n in names}
    assert {"layer0", "layer1", "embed", "other"} <= groups
    grads = [(n, torch.ones_like(p)) for n, p in model.named_parameters()]
    total, per_group = grouped_norms(grads)
    assert total == pytest.approx(math.sqrt(sum(v * v for v in per_group.values())))
    assert total == pytest.approx(math.sqrt(sum(p.numel() for p in model.parameters())))


def test_probe_rows_are_a_seeded_sorted_sample():
    a = probe_rows(20, 5, seed=3)
    assert a.tolist() == probe_rows(20, 5, seed=3).tolist() and a.tolist() == sorted(a.tolist())
    assert len(set(a.tolist())) == 5 and probe_rows(4, 0, 1).tolist() == [0, 1, 2, 3]
    assert probe_rows(4, 10, 1).tolist() == [0, 1, 2, 3]
