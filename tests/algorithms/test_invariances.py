"""Invariances: padding never matters; micro-batches / ranks with a global normaliser equal the
full batch; vectorised NTHR-free presets are deterministic and leave their inputs untouched."""

import dataclasses

import pytest
import torch

from tests.algorithms.helpers import loss_and_grad, make_batch, nthr_inputs, passes_for
from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.algorithms.methods import build_update_passes
from tokenbalance.algorithms.presets import METHOD_PRESETS, get_method

PRESETS = METHOD_PRESETS.names()


def poison_padding(tensor, mask, value):
    return torch.where(mask if tensor.dim() == 2 else mask[..., None], tensor, torch.full_like(tensor, value))


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -1e30])
def test_padding_values_do_not_matter(name, garbage):
    method = get_method(name).replace(entropy_coeff=0.01)
    batch = make_batch(1)
    mask = batch.mask_BT
    assert (~mask).any()

    def run(poison):
        old, ref, hidden = batch.old_logp_BT, batch.ref_logp_BT, batch.hidden_BTD
        tokens = batch.tokens_BT
        if poison:
            old, ref = poison_padding(old, mask, garbage), poison_padding(ref, mask, garbage)
            hidden = poison_padding(hidden, mask, garbage)
            tokens = torch.where(mask, tokens, torch.full_like(tokens, -100))
        extras = dataclasses.replace(nthr_inputs(batch), tokens_BT=tokens, hidden_BTD=hidden) if method.nthr else None
        passes, metrics = build_update_passes(method, batch.scores_B, batch.group_ids_B, mask, old, ref, extras)

        def fn(logp_BT, entropy_BT):
            if poison:
                logp_BT = poison_padding(logp_BT, mask, garbage)
                entropy_BT = poison_padding(entropy_BT, mask, garbage)
            return sum(pass_loss(method, p, logp_BT, old, ref, entropy_BT).loss for p in passes)

        return loss_and_grad(batch, fn), metrics

    (clean_loss, clean_grad), clean_metrics = run(False)
    (loss, grad), metrics = run(True)
    assert torch.isfinite(loss) and loss.item() == pytest.approx(clean_loss.item(), abs=1e-12)
    torch.testing.assert_close(grad, clean_grad, atol=1e-12, rtol=0)
    assert metrics == pytest.approx(clean_metrics)


def accumulate(method, batch, passes, row_slices, normaliser_rows=None):
    """Sum of micro-batch losses, each divided by the normaliser of ``normaliser_rows``."""

    def fn(logp_BT, entropy_BT):
        total = 0.0
        for update_pass in passes:
            if normaliser_rows is None:
                normaliser = pass_normaliser(method, update_pass)
            else:  # data-parallel: every rank contributes its count, the sum is shared
                normaliser = sum(
                    (pass_normaliser(method, update_pass.select_rows(r)) for r in normaliser_rows[1:]),
                    pass_normaliser(method, update_pass.select_rows(normaliser_rows[0])),
                )
            for rows in row_slices:
                total = (
                    total
                    + pass_loss(
                        method,
                        update_pass.select_rows(rows),
                        logp_BT[rows],
                        batch.old_logp_BT[rows],
                        batch.ref_logp_BT[rows],
                        entropy_BT[rows],
                        normaliser=normaliser,
                    ).loss
                )
        return total

    return fn


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_accumulation_equals_full_batch(name, mode):
    method = get_method(name).replace(loss_agg_mode=mode, entropy_coeff=0.01)
    batch = make_batch(7, groups=3)
    passes, _ = passes_for(method, batch)
    full = accumulate(method, batch, passes, [slice(None)])
    micro = accumulate(method, batch, passes, [slice(0, 3), slice(3, 4), slice(4, 12)])
    ranks = accumulate(method, batch, passes, [slice(0, 6), slice(6, 12)], normaliser_rows=[slice(0, 6), slice(6, 12)])
    full_loss, full_grad = loss_and_grad(batch, full)
    for variant in (micro, ranks):
        loss, grad = loss_and_grad(batch, variant)
        assert loss.item() == pytest.approx(full_loss.item(), abs=1e-12)
        torch.testing.assert_close(grad, full_grad, atol=1e-12, rtol=0)


def test_inputs_are_not_mutated_and_results_are_deterministic():
    method = get_method("ar_lopti").replace(nthr=get_method("nthr").nthr)
    batch = make_batch(8)
    before = [t.clone() for t in (batch.old_logp_BT, batch.ref_logp_BT, batch.scores_B, batch.hidden_BTD)]
    first, m1 = passes_for(method, batch)
    second, m2 = passes_for(method, batch)
    after = (batch.old_logp_BT, batch.ref_logp_BT, batch.scores_B, batch.hidden_BTD)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert m1 == m2
    assert all(torch.equal(a.advantages_BT, b.advantages_BT) for a, b in zip(first, second))
