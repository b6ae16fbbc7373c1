"""Hand-computed aggregation modes, explicit normalisers and the micro-batch scope."""

import pytest
import torch

from tokenbalance.algorithms.aggregate import AGG_MODES, aggregate, loss_normaliser

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # third row empty


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 10 / 4),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-sum", (6 + 4) / 2),  # empty row excluded
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),
        ("seq-mean-token-sum-norm", 10 / (2 * 3)),  # 2 rows x C = T = 3
    ],
)
def test_modes_by_hand(mode, expected):
    assert aggregate(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_sum_norm_uses_max_response_len():
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_response_len=10).item() == pytest.approx(10 / 20)


def test_padding_values_never_leak():
    garbage = LOSS.clone()
    garbage[~MASK] = float("nan")
    for mode in AGG_MODES:
        assert aggregate(garbage, MASK, mode).item() == pytest.approx(aggregate(LOSS, MASK, mode).item())


def test_denominator_mask_counts_tokens_outside_the_numerator():
    # Lopti: numerator only the first token of row 0, denominators over all valid tokens
    stage = torch.zeros_like(MASK)
    stage[0, 0] = True
    assert aggregate(LOSS, stage, "token-mean", denominator_mask_BT=MASK).item() == pytest.approx(1 / 4)
    assert aggregate(LOSS, stage, "seq-mean-token-mean", denominator_mask_BT=MASK).item() == pytest.approx((1 / 3) / 2)


def test_nothing_valid_gives_zero_loss_with_zero_gradient():
    loss = LOSS.clone().requires_grad_(True)
    empty = torch.zeros_like(MASK)
    for mode in AGG_MODES:
        value = aggregate(loss, empty, mode)
        (grad,) = torch.autograd.grad(value, loss)
        assert value.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_with_global_normaliser_sum_to_full_batch(mode):
    gen = torch.Generator().manual_seed(3)
    loss = torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(6, 5, generator=gen) > 0.4
    mask[2] = False
    full = aggregate(loss, mask, mode)
    normaliser = loss_normaliser(mask, mode)
    parts = sum(
        aggregate(loss[rows], mask[rows], mode, normaliser=normaliser, max_response_len=5)
        for rows in (slice(0, 1), slice(1, 4), slice(4, 6))
    )
    assert parts.item() == pytest.approx(full.item(), abs=1e-12)
    (g_full,) = torch.autograd.grad(full, loss)
    (g_parts,) = torch.autograd.grad(parts, loss)
    torch.testing.assert_close(g_parts, g_full, atol=1e-12, rtol=0)


def test_micro_batch_scope_differs_from_mini_batch_when_token_counts_differ():
    # the reference's per-micro-batch token-mean: mean of (6 / 3) and (4 / 1) = 3, not 10 / 4
    micro = [aggregate(LOSS[i : i + 1], MASK[i : i + 1], "token-mean") for i in (0, 1)]
    assert (sum(micro) / 2).item() == pytest.approx(3.0)
    assert aggregate(LOSS[:2], MASK[:2], "token-mean").item() == pytest.approx(2.5)


def test_bad_mode_and_shapes():
    with pytest.raises(ValueError, match="loss_agg_mode: unknown value 'mean'; valid: 'token-mean'"):
        aggregate(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match=r"mask_BT: expected shape \(3, 3\), got \(3, 2\)"):
        aggregate(LOSS, MASK[:, :2])
    with pytest.raises(ValueError, match="normaliser: must be in"):
        aggregate(LOSS, MASK, normaliser=-1.0)
