"""Bucket statistics on a hand-made batch with known answers; edge validation; clip flags."""

import math

import pytest
import torch

from tests.algorithms.helpers import make_batch, passes_for
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.presets import get_method
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.diagnostics.buckets import (
    bucket_index,
    bucket_masks,
    bucket_token_stats,
    check_bucket_edges,
    interval_label,
    parse_edges,
    probability_change_stats,
)

torch.set_num_threads(1)

# row 0: p = .1 .3 .6 .9 with A = 1 2 3 4; row 1: p = 1 .25 .75 (+ one padding token) with A = -2
PROBS = [[0.1, 0.3, 0.6, 0.9], [1.0, 0.25, 0.75, 0.5]]
MASK = torch.tensor([[True, True, True, True], [True, True, True, False]])
ADV = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-2.0, -2.0, -2.0, 99.0]])
CLIPPED = torch.tensor([[False, True, False, True], [False, False, True, True]])
ENTROPY = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 100.0]])


def old_logp():
    logp = torch.tensor(PROBS, dtype=torch.float64).log()
    logp[1, 3] = 5.0  # padding: never read
    return logp


def test_bucket_index_follows_the_paper_intervals():
    p = torch.tensor([0.0, 0.1, 0.25, 0.4999, 0.5, 0.75, 0.99, 1.0])
    assert bucket_index(p, (0, 0.25, 0.5, 0.75, 1)).tolist() == [0, 0, 1, 1, 2, 3, 3, 3]
    assert [interval_label((0, 0.25, 0.5, 0.75, 1), b) for b in range(4)] == [
        "[0, 0.25)",
        "[0.25, 0.5)",
        "[0.5, 0.75)",
        "[0.75, 1]",
    ]


def test_bucket_masks_are_disjoint_and_cover_the_valid_tokens():
    masks = bucket_masks(old_logp(), MASK, (0, 0.25, 0.5, 0.75, 1))
    assert torch.equal(sum(m.long() for m in masks), MASK.long())
    assert [int(m.sum()) for m in masks] == [1, 2, 1, 3]


def test_bucket_statistics_on_a_hand_made_batch():
    stats = bucket_token_stats(old_logp(), ADV, MASK, clipped_BT=CLIPPED, entropy_BT=ENTROPY)
    expected = {
        # bucket 0: p = .1 (A = 1)
        "bucket0/lo": 0.0,
        "bucket0/hi": 0.25,
        "bucket0/token_frac": 1 / 7,
        "bucket0/adv_mean": 1.0,
        "bucket0/clip_frac": 0.0,
        "bucket0/entropy": 1.0,
        "bucket0/pos/token_frac": 1 / 7,
        "bucket0/neg/token_frac": 0.0,
        # bucket 1: p = .3 (A = 2, clipped, H = 2) and p = .25 (A = -2, H = 6)
        "bucket1/token_frac": 2 / 7,
        "bucket1/adv_mean": 0.0,
        "bucket1/clip_frac": 0.5,
        "bucket1/entropy": 4.0,
        "bucket1/pos/token_frac": 1 / 7,
        "bucket1/pos/adv_mean": 2.0,
        "bucket1/pos/clip_frac": 1.0,
        "bucket1/pos/entropy": 2.0,
        "bucket1/neg/token_frac": 1 / 7,
        "bucket1/neg/adv_mean": -2.0,
        "bucket1/neg/clip_frac": 0.0,
        "bucket1/neg/entropy": 6.0,
        # bucket 2: p = .6 (A = 3)
        "bucket2/token_frac": 1 / 7,
        "bucket2/adv_mean": 3.0,
        "bucket2/entropy": 3.0,
        # bucket 3: p = .9 (A = 4, clipped, H = 4), p = 1 (A = -2, H = 5), p = .75 (A = -2, clipped, H = 7)
        "bucket3/lo": 0.75,
        "bucket3/hi": 1.0,
        "bucket3/token_frac": 3 / 7,
        "bucket3/adv_mean": 0.0,
        "bucket3/clip_frac": 2 / 3,
        "bucket3/entropy": 16 / 3,
        "bucket3/pos/adv_mean": 4.0,
        "bucket3/pos/clip_frac": 1.0,
        "bucket3/neg/token_frac": 2 / 7,
        "bucket3/neg/adv_mean": -2.0,
        "bucket3/neg/clip_frac": 0.5,
        "bucket3/neg/entropy": 6.0,
    }
    for key, value in expected.items():
        assert stats["diag/" + key] == pytest.approx(value, abs=1e-12), key
    for key in ("bucket0/neg/adv_mean", "bucket0/neg/clip_frac", "bucket2/neg/entropy"):
        assert math.isnan(stats["diag/" + key]), key  # empty set: no mean
    assert sum(stats[f"diag/bucket{b}/token_frac"] for b in range(4)) == pytest.approx(1.0)
    assert len([k for k in stats if k.startswith("diag/bucket")]) == 4 * 14


def test_statistics_without_optional_inputs_and_with_other_edges():
    stats = bucket_token_stats(old_logp(), ADV, MASK, (0, 0.5, 1))
    assert stats["diag/bucket0/token_frac"] == pytest.approx(3 / 7)
    assert stats["diag/bucket1/pos/adv_mean"] == pytest.approx(3.5)
    assert not any("clip_frac" in k or "entropy" in k for k in stats)


def test_quantile_buckets_have_equal_counts():
    stats = bucket_token_stats(old_logp(), ADV, MASK, (0, 0.5, 1), mode="quantile")
    assert stats["diag/bucket0/hi"] == pytest.approx(0.6)  # the median of the 7 valid probabilities
    assert stats["diag/bucket0/token_frac"] == pytest.approx(3 / 7)  # .1 .25 .3; .6 goes up
    assert stats["diag/bucket1/token_frac"] == pytest.approx(4 / 7)


@pytest.mark.parametrize(
    "edges, message",
    [
        ((0.1, 0.5, 1.0), "first edge must be 0"),
        ((0.0, 0.5, 0.9), "last 1"),
        ((0.0, 0.6, 0.4, 1.0), "strictly increasing"),
        ((0.0,), "at least two edges"),
        (("a", 1), "list of numbers"),
    ],
)
def test_bad_edges_are_rejected_naming_the_option(edges, message):
    with pytest.raises(ValueError, match=f"diagnostics.bucket_edges: .*{message}"):
        check_bucket_edges(edges)


def test_bad_edges_in_the_config_and_on_the_command_line():
    with pytest.raises(ValueError, match="diagnostics.bucket_edges"):
        apply_overrides(RunConfig(), ["diagnostics.bucket_edges=[0, 0.5, 0.8]"])
    assert parse_edges("0,0.1,1") == (0.0, 0.1, 1.0)
    with pytest.raises(ValueError, match="diagnostics.bucket_edges: expected comma-separated"):
        parse_edges("0,x,1")


def test_probability_change_and_correct_ratio():
    old = old_logp()
    new_p = torch.tensor([[0.2, 0.2, 0.6, 0.95], [0.9, 0.3, 0.7, 0.5]], dtype=torch.float64)
    rows = probability_change_stats(old, new_p.log(), ADV, MASK)
    assert [r["tokens"] for r in rows] == [1, 2, 1, 3]
    assert rows[0]["dp_mean"] == pytest.approx(0.1) and rows[0]["pos_up_frac"] == 1.0
    assert rows[1]["dp_mean"] == pytest.approx((-0.1 + 0.05) / 2)
    assert rows[1]["pos_up_frac"] == 0.0 and rows[1]["neg_down_frac"] == 0.0  # .3 -> .2 (A>0), .25 -> .3 (A<0)
    assert rows[2]["dp_mean"] == pytest.approx(0.0) and rows[2]["pos_up_frac"] == 0.0  # no change is not "up"
    assert rows[3]["pos_up_frac"] == 1.0 and rows[3]["neg_down_frac"] == 1.0
    assert math.isnan(rows[0]["neg_down_frac"]) and rows[3]["interval"] == "[0.75, 1]"


@pytest.mark.parametrize("name", ["grpo", "ar_lopti", "tr_grpo", "tr_grpo_literal"])
def test_loss_clip_flags_match_its_clip_fraction(name):
    """The diagnostics read ``LossOutput.clipped_BT``: policy tokens only, agreeing with ``clip/frac``."""
    method = get_method(name)
    batch = make_batch(seed=3)
    passes, _ = passes_for(method, batch)
    logp = batch.logp().detach()
    clipped_any = False
    for update_pass in passes:
        out = pass_loss(method, update_pass, logp, batch.old_logp_BT, batch.ref_logp_BT)
        flags, policy = out.clipped_BT, update_pass.policy_mask_BT
        assert flags.dtype == torch.bool and not flags.requires_grad
        assert not bool((flags & ~policy).any())
        assert float(flags[policy].double().mean()) == pytest.approx(out.metrics["clip/frac"], abs=1e-12)
        clipped_any |= bool(flags.any())
    assert clipped_any  # the batch really clips somewhere
