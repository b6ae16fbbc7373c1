"""LLD: which rows count, the statistics on known numbers, Δ = 0 without an update and Δ > 0 after one
that raises a correct response's probability."""

import pytest
import torch

from tokenbalance.diagnostics.lld import lld_rows, lld_stats, sequence_deltas
from tokenbalance.models import load_policy
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences, response_logprobs

torch.set_num_threads(1)


def test_only_correct_responses_of_mixed_groups_are_measured():
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 3])
    correct = torch.tensor([1, 0, 1, 1, 1, 0, 0, 0, 1]).bool()
    assert lld_rows(correct, groups).tolist() == [0, 2, 8]


def test_statistics_on_known_numbers():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]).bool()
    old = torch.zeros(4, 3)
    new = torch.tensor(
        [
            [0.5, 0.5, 9.0],  # Δ = 1 over 2 tokens (padding ignored)
            [-1.0, 0.0, -2.0],  # Δ = -3 over 3 tokens
            [0.25, 0.0, 0.0],  # Δ = 0.25 over 1 token
            [0.0, 0.0, 0.0],
        ]
    )  # Δ = 0
    seq, tok = sequence_deltas(new, old, mask)
    assert seq.tolist() == [1.0, -3.0, 0.25, 0.0] and tok.tolist() == pytest.approx([0.5, -1.0, 0.25, 0.0])
    groups = torch.tensor([7, 7, 8, 9])  # Δ(x): group 7 -> -1, group 8 -> 0.25, group 9 -> 0
    stats = lld_stats(new, old, mask, groups, epsilon=0.1)
    assert stats["diag/lld/groups"] == 3
    assert stats["diag/lld/delta_mean"] == pytest.approx((-1 + 0.25 + 0) / 3)
    assert stats["diag/lld/delta_p50"] == pytest.approx(0.0)
    assert stats["diag/lld/delta_p10"] == pytest.approx(-1 + 0.2 * 1.0)  # linear interpolation -1 .. 0
    assert stats["diag/lld/frac_below_eps"] == pytest.approx(2 / 3)  # -1 and 0 are below 0.1
    assert stats["diag/lld/delta_tok_mean"] == pytest.approx((-0.25 + 0.25 + 0) / 3)
    assert stats["diag/lld/frac_below_eps_tok"] == pytest.approx(2 / 3)
    empty = lld_stats(new[:0], old[:0], mask[:0], groups[:0])
    assert empty["diag/lld/groups"] == 0 and empty["diag/lld/delta_mean"] == 0


def _batch():
    prompts = torch.tensor([[0, 5, 6, 7], [4, 5, 6, 7], [0, 0, 9, 8]])
    prompt_mask = prompts != 0
    responses = torch.tensor([[11, 12, 13, 1], [14, 15, 1, 0], [16, 17, 18, 19]])
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    return pack_sequences(prompts, prompt_mask, responses, response_mask), response_mask


def test_delta_is_zero_without_an_update_and_positive_after_one(tiny_policy_dir):
    model, _ = load_policy(tiny_policy_dir)
    packed, mask = _batch()
    groups = torch.tensor([0, 0, 0])
    correct = torch.tensor([True, True, False])
    old = batched_response_logprobs(model, packed, temperature=0.7, micro_batch=3).logp_BT
    rows = lld_rows(correct, groups)
    assert rows.tolist() == [0, 1]

    def rescore():
        return batched_response_logprobs(model, packed.rows(rows), temperature=0.7, micro_batch=2).logp_BT

    unchanged = lld_stats(rescore(), old[rows], mask[rows], groups[rows])
    assert abs(unchanged["diag/lld/delta_mean"]) < 1e-5  # no update: no displacement (up to float noise)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    logp = response_logprobs(model, packed.rows(slice(0, 1)), temperature=0.7).logp_BT
    (-logp[mask[:1]].sum()).backward()  # raise the likelihood of the first correct response
    optimizer.step()
    moved = lld_stats(rescore(), old[rows], mask[rows], groups[rows])
    seq, _ = sequence_deltas(rescore(), old[rows], mask[rows])
    assert float(seq[0]) > 0.01 and moved["diag/lld/groups"] == 1
    assert moved["diag/lld/delta_mean"] == pytest.approx(float(seq.mean()), rel=1e-6)
