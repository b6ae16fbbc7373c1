"""Skipping rows without a token of the pass is exact: the update equals a plain full-batch loop."""

import pytest
import torch

from tests.models.helpers import tiny_model
from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.algorithms.methods import build_update_passes
from tokenbalance.algorithms.presets import apply_method_overrides, get_method
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences, response_logprobs, row_chunks
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, rows_with_terms, run_update

ROWS, GROUP, T = 8, 4, 6


def fixed_batch():
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(10, 300, (ROWS // GROUP, 4), generator=gen).repeat_interleave(GROUP, 0)
    responses = torch.randint(10, 300, (ROWS, T), generator=gen)
    mask = torch.arange(T)[None] < torch.tensor([6, 3, 4, 2, 6, 5, 1, 3])[:, None]
    scores = torch.tensor([3.0, -1.0, -0.5, 3.0, -3.0, 3.0, -1.0, -1.0])
    packed = pack_sequences(prompts, torch.ones_like(prompts, dtype=torch.bool), responses, mask)
    return packed, mask, scores, torch.arange(ROWS // GROUP).repeat_interleave(GROUP)


def low_eta(quantile: float) -> float:
    """A Lopti threshold putting about ``quantile`` of the batch's tokens in the low pass (the tiny
    random model's probabilities all sit near 1 / vocabulary)."""
    packed, mask, _, _ = fixed_batch()
    old = batched_response_logprobs(tiny_model("llama").double(), packed, temperature=1.0, micro_batch=8).logp_BT
    return float(torch.quantile(old[mask].exp(), quantile))


def reference_update(method, passes, policy, optimizer, packed, old, mini, micro, scope):
    """The schedule without any skipping: every micro-batch's rows run forward and backward."""
    for update_pass in passes:
        for mini_rows in row_chunks(ROWS, mini):
            optimizer.zero_grad(set_to_none=True)
            slices = row_chunks(mini_rows.stop - mini_rows.start, micro)
            shared = pass_normaliser(method, update_pass.select_rows(mini_rows))
            for m in slices:
                rows = slice(mini_rows.start + m.start, mini_rows.start + m.stop)
                micro_pass = update_pass.select_rows(rows)
                normaliser = shared if scope == "mini_batch" else pass_normaliser(method, micro_pass)
                current = response_logprobs(policy, packed.rows(rows), temperature=1.0, with_entropy=True)
                loss = pass_loss(
                    method, micro_pass, current.logp_BT, old[rows], old[rows], current.entropy_BT, normaliser=normaliser
                ).loss
                (loss if scope == "mini_batch" else loss / len(slices)).backward()
            torch.nn.utils.clip_grad_norm_(list(policy.parameters()), 1.0)
            optimizer.step()


@pytest.mark.parametrize("scope", ["mini_batch", "micro_batch"])
@pytest.mark.parametrize("quantile", [0.1, 0.0])  # a few low tokens on some rows; none at all
def test_lopti_update_with_skipped_rows_equals_the_plain_loop(scope, quantile):
    packed, mask, scores, groups = fixed_batch()
    eta = low_eta(quantile) if quantile else 1e-9
    method = apply_method_overrides(get_method("lopti"), {"lopti.eta": eta})
    results = []
    for skip in (True, False):
        policy = tiny_model("llama").double().train()
        old = batched_response_logprobs(policy, packed, temperature=1.0, micro_batch=4).logp_BT
        passes, _ = build_update_passes(method, scores, groups, mask, old, old)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
        if skip:
            run_update(
                UpdateSpec(
                    method,
                    passes,
                    UpdateRows(packed, old, old),
                    UpdateSettings(
                        temperature=1.0, mini_batch_rows=4, micro_batch_rows=2, grad_clip=1.0, token_mean_scope=scope
                    ),
                ),
                policy,
                optimizer,
                DistContext(),
            )
        else:
            reference_update(method, passes, policy, optimizer, packed, old, 4, 2, scope)
        results.append(([p.detach().clone() for p in policy.parameters()], passes))
    (skipped, passes), (plain, _) = results
    low_rows = passes[0].policy_mask_BT.any(dim=1)
    assert int(low_rows.sum()) < ROWS  # the low pass really leaves rows out
    if quantile:
        assert int(low_rows.sum()) > 0
    for got, want in zip(skipped, plain, strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_rows_with_terms_returns_slice_index_or_none():
    packed, mask, scores, groups = fixed_batch()
    method = apply_method_overrides(get_method("lopti"), {"lopti.eta": low_eta(0.1)})
    policy = tiny_model("llama").double()
    old = batched_response_logprobs(policy, packed, temperature=1.0, micro_batch=8).logp_BT
    low, _ = build_update_passes(method, scores, groups, mask, old, old)[0]
    (whole,), _ = build_update_passes(get_method("grpo"), scores, groups, mask, old, old)
    rows, same = rows_with_terms(slice(0, ROWS), whole.select_rows(slice(0, ROWS)), whole)
    assert rows == slice(0, ROWS) and same.policy_mask_BT.shape[0] == ROWS
    rows, subset = rows_with_terms(slice(0, ROWS), low.select_rows(slice(0, ROWS)), low)
    assert torch.equal(rows, torch.nonzero(low.policy_mask_BT.any(dim=1)).squeeze(1))
    assert subset.policy_mask_BT.any(dim=1).all()
    row = int(torch.nonzero(~low.policy_mask_BT.any(dim=1))[0])  # a row without a low token
    assert rows_with_terms(slice(row, row + 1), low.select_rows(slice(row, row + 1)), low)[0] is None
