"""Tests for NTHR (tokenbalance.algorithms.nthr); spec methods.md §6 and §12 items 16-18."""

from __future__ import annotations

import math

import pytest
import torch

from tokenbalance.algorithms.nthr import (
    NTHRConfig,
    nthr_correct,
    nthr_eta,
    nthr_restricted_probs,
    nthr_token_scores,
    nthr_token_weights,
)

F64 = torch.float64


# --------------------------------------------------------------------------------------------------
# helpers: random consistent data and a naive reference with explicit Python loops
# --------------------------------------------------------------------------------------------------


def make_batch(
    seed=0,
    B=6,
    T=5,
    D=4,
    V=11,
    used_vocab=7,
    temperature=0.7,
    bias=True,
    row_adv=(1.0, -1.0, 1.0, -1.0, -1.0, 0.0),
    group_ids=(0, 0, 0, 0, 0, 0),
    dtype=F64,
):
    """Random batch whose old_logp is the exact full-softmax log-prob of the sampled tokens.

    Tokens are drawn from the first ``used_vocab`` ids only, so V* is a strict subset of the vocabulary.
    Each row has 2..T valid tokens (right padding).
    """
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=g, dtype=dtype)
    W = torch.randn(V, D, generator=g, dtype=dtype)
    b = torch.randn(V, generator=g, dtype=dtype) if bias else None
    tokens = torch.randint(0, used_vocab, (B, T), generator=g)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logits = hidden @ W.T + (b if b is not None else 0.0)
    logp_full = torch.log_softmax(logits / temperature, dim=-1)
    old_logp = logp_full.gather(-1, tokens[..., None]).squeeze(-1)
    adv = torch.tensor(row_adv, dtype=dtype)[:B, None].expand(B, T).clone()
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    tokens = torch.where(mask, tokens, torch.full_like(tokens, -100))
    return dict(
        advantages_BT=adv,
        response_mask_BT=mask,
        group_ids_B=torch.tensor(group_ids[:B], dtype=torch.long),
        tokens_BT=tokens,
        old_logp_BT=torch.where(mask, old_logp, torch.zeros_like(old_logp)),
        hidden_BTD=hidden,
        unembed_VD=W,
        unembed_bias_V=b,
        temperature=temperature,
    )


def binary_correct(batch):
    """Correctness of a binary-reward batch: the rows with a positive advantage sum.

    With binary rewards the correct responses are exactly those, and the incorrect ones those with
    a negative sum, so ``positives="correct"`` and ``"advantage_sign"`` coincide on these batches;
    the cases where they differ (graded rewards) are computed by hand in section 11.
    """
    adv, mask = batch["advantages_BT"], batch["response_mask_BT"]
    if mask.shape == adv.shape:  # (not in the bad-shape tests)
        adv = torch.where(mask.bool(), adv, torch.zeros_like(adv))
    return torch.nan_to_num(adv).sum(dim=1) > 0


def call_weights(batch, config):
    return nthr_token_weights(
        batch["advantages_BT"],
        batch["response_mask_BT"],
        batch["group_ids_B"],
        batch["tokens_BT"],
        batch["old_logp_BT"],
        batch["hidden_BTD"],
        batch["unembed_VD"],
        config,
        temperature=batch["temperature"],
        unembed_bias_V=batch["unembed_bias_V"],
        correct_B=batch.get("correct_B", binary_correct(batch)),
    )


def call_scores(batch, positive_rows, rows, **kw):
    return nthr_token_scores(
        batch["tokens_BT"],
        batch["response_mask_BT"],
        batch["hidden_BTD"],
        batch["unembed_VD"],
        batch["old_logp_BT"],
        torch.tensor(positive_rows, dtype=torch.long),
        torch.tensor(rows, dtype=torch.long),
        temperature=batch["temperature"],
        unembed_bias_V=batch["unembed_bias_V"],
        **kw,
    )


def naive_vocab(batch, group_rows, mode):
    V = batch["unembed_VD"].shape[0]
    if mode == "full":
        return list(range(V))
    tok, mask = batch["tokens_BT"], batch["response_mask_BT"]
    return sorted({int(tok[i, t]) for i in group_rows for t in range(tok.shape[1]) if mask[i, t]})


def naive_g_h(batch, vs):
    """(g, h) per valid (i, t): g from a DIRECT full-vocabulary softmax, sliced to vs, one-hot minus q."""
    tok, mask, hid = batch["tokens_BT"], batch["response_mask_BT"], batch["hidden_BTD"]
    W, b, temp = batch["unembed_VD"], batch["unembed_bias_V"], batch["temperature"]
    out = {}
    for i in range(tok.shape[0]):
        for t in range(tok.shape[1]):
            if not mask[i, t]:
                continue
            z = W @ hid[i, t]
            if b is not None:
                z = z + b
            q = torch.softmax(z / temp, dim=0)
            y = int(tok[i, t])
            g = torch.tensor([(1.0 if v == y else 0.0) - float(q[v]) for v in vs], dtype=F64)
            out[(i, t)] = (g, hid[i, t].to(F64))
    return out


def naive_score(gh, pos_rows, token, skip_row=None):
    """Explicit double sum s_t = sum_{i in P} sum_k (g_ik . g_t)(h_ik . h_t)."""
    g_t, h_t = gh[token]
    s = 0.0
    for (i, _k), (g_ik, h_ik) in gh.items():
        if i in pos_rows and i != skip_row:
            s += float(g_ik @ g_t) * float(h_ik @ h_t)
    return s


def naive_weights(batch, config):
    """Reference implementation of nthr_token_weights with loops; returns weights and per-group taus."""
    adv, mask, gid = batch["advantages_BT"], batch["response_mask_BT"], batch["group_ids_B"]
    B, T = adv.shape
    w = torch.ones(B, T, dtype=adv.dtype)
    taus = []
    for g in sorted(set(gid.tolist())):
        rows = [i for i in range(B) if int(gid[i]) == g]
        sums = {i: float((adv[i] * mask[i]).sum()) for i in rows}
        P = [i for i in rows if sums[i] > 0]
        N = [i for i in rows if sums[i] < 0]
        if not P or not N:
            continue
        p = len(P) / len(rows)
        eta = nthr_eta(config.eta, p)
        gh = naive_g_h(batch, naive_vocab(batch, rows, config.vocab))
        if config.beta == -math.inf:
            tau = -math.inf
        else:
            sbar = []
            for i2 in P:
                skip = i2 if (config.anchor_exclude_self and len(P) > 1) else None
                toks = [(i2, t) for t in range(T) if mask[i2, t]]
                sbar.append(sum(naive_score(gh, P, tk, skip) for tk in toks) / len(toks))
            tau = config.beta * min(sbar)
            taus.append(tau)
        for j in N:
            for t in range(T):
                if mask[j, t] and naive_score(gh, P, (j, t)) > tau:
                    w[j, t] = eta
    return w, taus


# --------------------------------------------------------------------------------------------------
# 1. factorised score == explicit double sum; 2. log-Z trick == sliced full softmax
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["group", "full"])
@pytest.mark.parametrize("seed", [0, 1])
def test_factorised_score_equals_explicit_double_sum(mode, seed):
    batch = make_batch(seed=seed)
    P, N = [0, 2], [1, 3, 4]
    group = list(range(6))
    vs = naive_vocab(batch, group, mode)
    assert mode == "full" or len(vs) < batch["unembed_VD"].shape[0]  # V* is a strict subset
    gh = naive_g_h(batch, vs)
    vocab_arg = "full" if mode == "full" else torch.tensor(vs)
    got = call_scores(batch, P, N, vocab=vocab_arg)
    assert got.dtype == F64
    mask = batch["response_mask_BT"]
    for r, j in enumerate(N):
        for t in range(mask.shape[1]):
            want = naive_score(gh, P, (j, t)) if mask[j, t] else 0.0
            assert abs(float(got[r, t]) - want) < 1e-10, (j, t, float(got[r, t]), want)
    # the scores are not trivially zero / constant
    assert got[mask[N]].abs().max() > 1e-3


def test_group_vocab_string_uses_scored_and_positive_rows():
    batch = make_batch(seed=3)
    P, N = [0, 2], [1, 3]
    vs = naive_vocab(batch, P + N, "group")
    gh = naive_g_h(batch, vs)
    got = call_scores(batch, P, N, vocab="group")
    for r, j in enumerate(N):
        for t in range(batch["tokens_BT"].shape[1]):
            if batch["response_mask_BT"][j, t]:
                assert abs(float(got[r, t]) - naive_score(gh, P, (j, t))) < 1e-10


def test_exclude_rows_from_matrix_matches_double_sum_without_that_row():
    batch = make_batch(seed=4)
    P = [0, 2, 5]
    vs = naive_vocab(batch, list(range(6)), "group")
    gh = naive_g_h(batch, vs)
    got = call_scores(batch, P, P, vocab=torch.tensor(vs), exclude_rows_from_matrix=torch.tensor([0, -1, 5]))
    mask = batch["response_mask_BT"]
    for r, (i, skip) in enumerate([(0, 0), (2, None), (5, 5)]):
        for t in range(mask.shape[1]):
            if mask[i, t]:
                assert abs(float(got[r, t]) - naive_score(gh, P, (i, t), skip)) < 1e-10


@pytest.mark.parametrize("with_vocab", [True, False])
def test_log_z_trick_equals_sliced_full_softmax(with_vocab):
    g = torch.Generator().manual_seed(7)
    N, D, V, temp = 9, 5, 17, 0.6
    h = torch.randn(N, D, generator=g, dtype=F64) * 3
    W = torch.randn(V, D, generator=g, dtype=F64)
    b = torch.randn(V, generator=g, dtype=F64)
    y = torch.randint(0, V, (N,), generator=g)
    full = torch.softmax((h @ W.T + b) / temp, dim=-1)
    old_logp = torch.log(full.gather(1, y[:, None]).squeeze(1))
    if with_vocab:
        vs = torch.unique(torch.cat([y, torch.tensor([0, 3])]))
        want = full[:, vs]
    else:
        vs, want = None, full
    got = nthr_restricted_probs(h, y, old_logp, W, vs, temperature=temp, unembed_bias_V=b)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    if with_vocab:  # not renormalised: the slice sums to less than 1
        assert bool((got.sum(-1) < 1 - 1e-6).all())


# --------------------------------------------------------------------------------------------------
# 3. hand-computed tiny cases
# --------------------------------------------------------------------------------------------------


def tiny_batch(V):
    """One positive and one negative response of 2 tokens; W = 0 so every q is uniform 1/V.

    positive row 0: tokens (0, 1), hidden (1, 0), (0, 1)
    negative row 1: tokens (0, 2), hidden (2, 0), (1, 1)
    """
    tokens = torch.tensor([[0, 1], [0, 2]])
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [1.0, 1.0]]], dtype=F64)
    return dict(
        advantages_BT=torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F64),
        response_mask_BT=torch.ones(2, 2, dtype=torch.bool),
        group_ids_B=torch.tensor([7, 7]),
        tokens_BT=tokens,
        old_logp_BT=torch.full((2, 2), math.log(1.0 / V), dtype=F64),
        hidden_BTD=hidden,
        unembed_VD=torch.zeros(V, 2, dtype=F64),
        unembed_bias_V=None,
        temperature=1.0,
    )


# With q = u (uniform 1/V over the full vocabulary) sliced to V* of size S (not renormalised):
#   g_a . g_b = delta_ab - 2/V + S/V^2.
# V = 3 (V* = {0,1,2} = full): same token 2/3, different token -1/3.
#   negative t1 (y=0, h=(2,0)): k1 (y=0,h=(1,0)): 2/3 * 2 = 4/3; k2 (y=1,h=(0,1)): -1/3 * 0  -> 4/3
#   negative t2 (y=2, h=(1,1)): k1: -1/3 * 1;                 k2: -1/3 * 1              -> -2/3
#   anchor k1 (y=0, h=(1,0)): k1: 2/3 * 1 + k2: -1/3 * 0 = 2/3; anchor k2 likewise 2/3; sbar = 2/3
# V = 4, vocab "group" (S = 3): same 1 - 1/2 + 3/16 = 11/16, different -5/16
#   negatives (22/16, -10/16), sbar 11/16
# V = 4, vocab "full" (S = 4): same 3/4, different -1/4: negatives (3/2, -1/2), sbar 3/4
@pytest.mark.parametrize(
    "V, vocab, s_neg, sbar",
    [
        (3, "group", (4 / 3, -2 / 3), 2 / 3),
        (3, "full", (4 / 3, -2 / 3), 2 / 3),
        (4, "group", (22 / 16, -10 / 16), 11 / 16),
        (4, "full", (3 / 2, -1 / 2), 3 / 4),
    ],
)
def test_hand_computed_tiny_case(V, vocab, s_neg, sbar):
    batch = tiny_batch(V)
    scores = call_scores(batch, [0], [1, 0], vocab=vocab)
    torch.testing.assert_close(scores[0], torch.tensor(s_neg, dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(scores[1], torch.tensor([sbar, sbar], dtype=F64), rtol=0, atol=1e-12)

    # beta = 1: tau = sbar; t1 (score > sbar) selected, t2 not. G = 2, p = 1/2.
    w, m = call_weights(batch, NTHRConfig(beta=1.0, eta=0.5, vocab=vocab))
    assert w.tolist() == [[1.0, 1.0], [0.5, 1.0]]
    assert m["nthr/tau_mean"] == pytest.approx(sbar, abs=1e-12)
    assert m["nthr/selected_frac"] == pytest.approx(0.5)
    assert m["nthr/score_neg_mean"] == pytest.approx(sum(s_neg) / 2, abs=1e-12)
    assert m["nthr/mixed_groups"] == 1.0
    # default eta 2|0.5 - p| = 0 at p = 1/2
    w, m = call_weights(batch, NTHRConfig(vocab=vocab))
    assert w.tolist() == [[1.0, 1.0], [0.0, 1.0]]
    assert m["nthr/eta_mean"] == 0.0
    # beta = 2.5: tau = 2.5 * sbar exceeds both negative scores -> nothing selected
    w, m = call_weights(batch, NTHRConfig(beta=2.5, eta=0.5, vocab=vocab))
    assert w.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert m["nthr/selected_frac"] == 0.0
    # beta = 0: tau = 0, still only t1 (t2 is negative)
    w, _ = call_weights(batch, NTHRConfig(beta=0.0, eta=0.5, vocab=vocab))
    assert w.tolist() == [[1.0, 1.0], [0.5, 1.0]]
    # selection is strict: beta chosen so that tau == s(t1) exactly -> not selected (V = 3 case)
    if V == 3:
        w, _ = call_weights(batch, NTHRConfig(beta=2.0, eta=0.5, vocab=vocab))  # tau = 4/3
        assert w.tolist() == [[1.0, 1.0], [1.0, 1.0]]


# --------------------------------------------------------------------------------------------------
# end-to-end against the loop reference
# --------------------------------------------------------------------------------------------------


MULTI_ADV = (1.0, -1.0, 1.0, -1.0, 0.0, -0.5, 2.0, 1.0, -1.0, -1.0, 0.3, 0.3)
MULTI_GID = (0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3)


@pytest.mark.parametrize(
    "config",
    [
        NTHRConfig(),
        NTHRConfig(beta=1.0, eta=0.3, vocab="full"),
        NTHRConfig(beta=0.0, eta="p"),
        NTHRConfig(beta=-0.5, eta="1-p", anchor_exclude_self=True),
        NTHRConfig(beta=1.0, eta=0.2, anchor_exclude_self=True, vocab="full", chunk_tokens=3),
    ],
)
def test_weights_match_loop_reference(config):
    # group 0 mixed (2 pos, 3 neg, 1 zero row), group 1 all positive, group 2 all negative,
    # group 3 all positive (non-binary values)
    batch = make_batch(seed=11, B=12, T=5, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    w, m = call_weights(batch, config)
    want, taus = naive_weights(batch, config)
    assert torch.equal(w, want)
    assert m["nthr/mixed_groups"] == 1.0
    if taus:
        assert m["nthr/tau_mean"] == pytest.approx(taus[0], abs=1e-10)
    assert all(math.isfinite(v) for v in m.values())


def test_selection_is_nontrivial_on_random_data():
    # guards the reference test above against passing vacuously (everything or nothing selected)
    batch = make_batch(seed=11, B=12, T=5, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    _, m = call_weights(batch, NTHRConfig(beta=0.0, eta=0.5))
    assert 0.0 < m["nthr/selected_frac"] < 1.0


# --------------------------------------------------------------------------------------------------
# 4. GRPO reduction, beta = -inf, non-mixed groups, positives and padding untouched
# --------------------------------------------------------------------------------------------------


def test_eta_one_is_grpo():
    batch = make_batch(seed=2, B=12, T=5, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    for beta in (1.0, 0.0, -math.inf):
        w, _ = call_weights(batch, NTHRConfig(beta=beta, eta=1.0))
        assert torch.equal(w, torch.ones_like(w))


def test_beta_minus_inf_selects_every_negative_token_and_leaves_the_rest():
    batch = make_batch(seed=5, B=12, T=5, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    mask = batch["response_mask_BT"]
    w, m = call_weights(batch, NTHRConfig(beta=-math.inf, eta=0.25))
    neg_rows_mixed = [1, 3, 5]
    expected = torch.ones_like(w)
    for j in neg_rows_mixed:
        expected[j][mask[j]] = 0.25
    assert torch.equal(w, expected)  # pos rows, zero row 4, non-mixed groups 1-3, padding: all 1
    assert m["nthr/selected_frac"] == 1.0
    assert m["nthr/tau_mean"] == 0.0


def test_beta_minus_inf_selects_all_even_when_min_anchor_is_negative():
    # -inf * min(sbar) would be +inf here (min sbar < 0) and select nothing.
    # V = 3, vocab full, W = 0 so q = 1/3 and g_a . g_b = delta_ab - 1/3 (same token 2/3, different -1/3).
    # positive row 0: one token y=0, h=(1, 0);  positive row 1: one token y=0, h=(-2, 0)
    #   M+ = g_0 (1, 0)^T + g_0 (-2, 0)^T = g_0 (-1, 0)^T
    #   sbar_0 = g_0^T M+ (1, 0)  = (2/3)(-1)  = -2/3;  sbar_1 = (2/3)(-1)(-2) = 4/3;  min = -2/3
    # negative row 2: t1 y=0, h=(0.5, 0): s = (2/3)(-0.5) = -1/3 > -2/3  -> selected at beta = 1
    #                 t2 y=1, h=(-3, 0):  s = (-1/3)(3)    = -1   < -2/3  -> not selected
    batch = dict(
        advantages_BT=torch.tensor([[1.0, 0.0], [1.0, 0.0], [-1.0, -1.0]], dtype=F64),
        response_mask_BT=torch.tensor([[True, False], [True, False], [True, True]]),
        group_ids_B=torch.tensor([0, 0, 0]),
        tokens_BT=torch.tensor([[0, -100], [0, -100], [0, 1]]),
        old_logp_BT=torch.full((3, 2), math.log(1 / 3), dtype=F64),
        hidden_BTD=torch.tensor(
            [[[1.0, 0.0], [9.0, 9.0]], [[-2.0, 0.0], [9.0, 9.0]], [[0.5, 0.0], [-3.0, 0.0]]], dtype=F64
        ),
        unembed_VD=torch.zeros(3, 2, dtype=F64),
        unembed_bias_V=None,
        temperature=1.0,
    )
    scores = call_scores(batch, [0, 1], [2, 0, 1], vocab="full")
    torch.testing.assert_close(
        scores, torch.tensor([[-1 / 3, -1.0], [-2 / 3, 0.0], [4 / 3, 0.0]], dtype=F64), rtol=0, atol=1e-12
    )
    w, m = call_weights(batch, NTHRConfig(beta=1.0, eta=0.5, vocab="full"))
    assert w[2].tolist() == [0.5, 1.0]
    assert m["nthr/tau_mean"] == pytest.approx(-2 / 3)
    w, m = call_weights(batch, NTHRConfig(beta=-math.inf, eta=0.5, vocab="full"))
    assert w.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.5, 0.5]]
    assert m["nthr/selected_frac"] == 1.0


@pytest.mark.parametrize("kind", ["all_pos", "all_neg", "all_zero"])
def test_non_mixed_groups_untouched(kind):
    adv = {"all_pos": (1.0, 0.5, 2.0, 1.0), "all_neg": (-1.0, -0.5, -2.0, -1.0), "all_zero": (0.0,) * 4}
    batch = make_batch(seed=6, B=4, row_adv=adv[kind], group_ids=(3, 3, 3, 3))
    w, m = call_weights(batch, NTHRConfig(beta=-math.inf, eta=0.0))
    assert torch.equal(w, torch.ones_like(w))
    assert m == {
        "nthr/mixed_groups": 0.0,
        "nthr/selected_frac": 0.0,
        "nthr/tau_mean": 0.0,
        "nthr/score_neg_mean": 0.0,
        "nthr/eta_mean": 0.0,
        "nthr/anchor_self_fallback_groups": 0.0,
    }


def test_positive_tokens_and_padding_always_one():
    batch = make_batch(seed=8, B=12, T=5, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    mask = batch["response_mask_BT"]
    pos = torch.tensor(MULTI_ADV) >= 0
    for cfg in (NTHRConfig(beta=-math.inf, eta=0.0), NTHRConfig(beta=0.0, eta=0.0), NTHRConfig(eta=0.0)):
        w, _ = call_weights(batch, cfg)
        assert bool((w[pos] == 1).all())
        assert bool((w[~mask] == 1).all())


def test_sign_of_row_sum_defines_positive_for_token_level_advantages():
    # a row with mixed-sign token advantages but a positive sum counts as positive
    batch = tiny_batch(3)
    batch["advantages_BT"] = torch.tensor([[-0.5, 1.0], [0.5, -1.0]], dtype=F64)
    w, m = call_weights(batch, NTHRConfig(beta=1.0, eta=0.5, positives="advantage_sign"))
    assert m["nthr/mixed_groups"] == 1.0
    assert w.tolist() == [[1.0, 1.0], [0.5, 1.0]]


# --------------------------------------------------------------------------------------------------
# 5. anchor self-exclusion
# --------------------------------------------------------------------------------------------------


def test_anchor_exclude_self_single_positive_falls_back():
    batch = tiny_batch(4)
    w_inc, m_inc = call_weights(batch, NTHRConfig(beta=1.0, eta=0.5))
    w_exc, m_exc = call_weights(batch, NTHRConfig(beta=1.0, eta=0.5, anchor_exclude_self=True))
    assert torch.equal(w_inc, w_exc)
    assert m_exc["nthr/tau_mean"] == m_inc["nthr/tau_mean"] == pytest.approx(11 / 16)
    assert m_exc["nthr/anchor_self_fallback_groups"] == 1.0
    assert m_inc["nthr/anchor_self_fallback_groups"] == 0.0


def test_anchor_exclude_self_with_two_positives_uses_exclusive_formula():
    batch = make_batch(seed=9)  # rows 0, 2 positive; 1, 3, 4 negative; 5 zero; one group
    mask = batch["response_mask_BT"]
    gh = naive_g_h(batch, naive_vocab(batch, list(range(6)), "group"))
    P = [0, 2]

    def sbar(i, skip):
        toks = [(i, t) for t in range(mask.shape[1]) if mask[i, t]]
        return sum(naive_score(gh, P, tk, skip) for tk in toks) / len(toks)

    tau_inc = min(sbar(i, None) for i in P)
    tau_exc = min(sbar(i, i) for i in P)
    assert abs(tau_inc - tau_exc) > 1e-3  # the option matters on this data
    _, m_inc = call_weights(batch, NTHRConfig(beta=1.0))
    _, m_exc = call_weights(batch, NTHRConfig(beta=1.0, anchor_exclude_self=True))
    assert m_inc["nthr/tau_mean"] == pytest.approx(tau_inc, abs=1e-10)
    assert m_exc["nthr/tau_mean"] == pytest.approx(tau_exc, abs=1e-10)
    assert m_exc["nthr/anchor_self_fallback_groups"] == 0.0
    # with 2 positives the exclusive anchor of i is the cross term with the other positive
    _, m_b = call_weights(batch, NTHRConfig(beta=-2.0, anchor_exclude_self=True))
    assert m_b["nthr/tau_mean"] == pytest.approx(-2.0 * tau_exc, abs=1e-10)


# --------------------------------------------------------------------------------------------------
# 6. eta rules
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule, eta", [("2|0.5-p|", 0.25), ("p", 0.375), ("1-p", 0.625), (0.1, 0.1)])
def test_eta_rules_at_p_three_eighths(rule, eta):
    adv = (1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0, -1.0)  # 3 positives of G = 8
    batch = make_batch(seed=10, B=8, row_adv=adv, group_ids=(4,) * 8)
    w, m = call_weights(batch, NTHRConfig(beta=-math.inf, eta=rule))
    mask = batch["response_mask_BT"]
    neg = torch.tensor(adv) < 0
    sel = mask & neg[:, None]
    assert torch.allclose(w[sel], torch.full_like(w[sel], eta), rtol=0, atol=1e-15)
    assert bool((w[~sel] == 1).all())
    assert m["nthr/eta_mean"] == pytest.approx(eta)
    assert nthr_eta(rule, 3 / 8) == pytest.approx(eta)


def test_eta_mean_over_groups():
    adv = (1.0, -1.0, -1.0, -1.0, 1.0, -1.0)  # group 0: p = 1/4 -> 0.5; group 1: p = 1/2 -> 0
    batch = make_batch(seed=12, B=6, row_adv=adv, group_ids=(0, 0, 0, 0, 1, 1))
    _, m = call_weights(batch, NTHRConfig())
    assert m["nthr/mixed_groups"] == 2.0
    assert m["nthr/eta_mean"] == pytest.approx(0.25)


# --------------------------------------------------------------------------------------------------
# 7. padding invariance; 8. chunking invariance; dtype / mask variants
# --------------------------------------------------------------------------------------------------


def test_padding_garbage_does_not_matter():
    batch = make_batch(seed=13, B=12, T=6, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    mask = batch["response_mask_BT"]
    assert bool((~mask).any())
    dirty = dict(batch)
    pad = ~mask
    dirty["tokens_BT"] = torch.where(pad, torch.full_like(batch["tokens_BT"], 10**9), batch["tokens_BT"])
    dirty["tokens_BT"][pad.nonzero()[0].tolist()[0], -1] = -100
    dirty["hidden_BTD"] = torch.where(
        pad[..., None], torch.full_like(batch["hidden_BTD"], math.nan), batch["hidden_BTD"]
    )
    dirty["hidden_BTD"][pad] = torch.tensor([1e300, -math.inf, 1e300, -math.inf], dtype=F64)
    dirty["old_logp_BT"] = torch.where(pad, torch.full_like(batch["old_logp_BT"], math.nan), batch["old_logp_BT"])
    dirty["advantages_BT"] = torch.where(pad, torch.full_like(batch["advantages_BT"], 1e30), batch["advantages_BT"])
    for cfg in (NTHRConfig(beta=0.0, eta=0.5), NTHRConfig(eta=0.5, vocab="full", anchor_exclude_self=True)):
        w0, m0 = call_weights(batch, cfg)
        w1, m1 = call_weights(dirty, cfg)
        assert torch.equal(w0, w1)
        assert m0 == m1
    s0 = call_scores(batch, [0, 2], [1, 3, 5])
    s1 = call_scores(dirty, [0, 2], [1, 3, 5])
    assert torch.equal(s0, s1)


def test_chunking_invariance():
    batch = make_batch(seed=14, B=12, T=6, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    for base in (NTHRConfig(beta=0.0, eta=0.5), NTHRConfig(eta=0.5, anchor_exclude_self=True, vocab="full")):
        cfg1 = NTHRConfig(**{**base.__dict__, "chunk_tokens": 1})
        cfg2 = NTHRConfig(**{**base.__dict__, "chunk_tokens": 4096})
        w1, m1 = call_weights(batch, cfg1)
        w2, m2 = call_weights(batch, cfg2)
        assert torch.equal(w1, w2)
        assert m1.keys() == m2.keys()
        for k in m1:
            assert m1[k] == pytest.approx(m2[k], rel=1e-12, abs=1e-12)
    s1 = call_scores(batch, [0, 2], [1, 3, 5, 0], chunk_tokens=1)
    s2 = call_scores(batch, [0, 2], [1, 3, 5, 0], chunk_tokens=4096)
    torch.testing.assert_close(s1, s2, rtol=1e-12, atol=1e-12)


def test_int_mask_equals_bool_mask_and_float32_close_to_float64():
    batch = make_batch(seed=15, B=12, T=6, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    cfg = NTHRConfig(beta=0.0, eta=0.5)
    w_ref, m_ref = call_weights(batch, cfg)
    as_int = dict(batch, response_mask_BT=batch["response_mask_BT"].long())
    w_int, m_int = call_weights(as_int, cfg)
    assert torch.equal(w_int, w_ref) and m_int == m_ref
    f32 = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in batch.items()}
    s64 = call_scores(batch, [0, 2], [1, 3, 5])
    s32 = call_scores(f32, [0, 2], [1, 3, 5])
    assert s32.dtype == torch.float32
    torch.testing.assert_close(s32.double(), s64, rtol=1e-4, atol=1e-4)
    bf = dict(f32, hidden_BTD=batch["hidden_BTD"].bfloat16())  # bf16 hidden: fp32 accumulation
    w_bf, _ = call_weights(bf, cfg)
    assert w_bf.dtype == torch.float32


# --------------------------------------------------------------------------------------------------
# 9. bad inputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beta=math.nan), "beta"),
        (dict(beta=math.inf), "beta"),
        (dict(beta="1"), "beta"),
        (dict(eta=1.5), "eta"),
        (dict(eta=-0.1), "eta"),
        (dict(eta="q"), "eta"),
        (dict(eta=True), "eta"),
        (dict(vocab="all"), "vocab"),
        (dict(chunk_tokens=0), "chunk_tokens"),
        (dict(chunk_tokens=2.0), "chunk_tokens"),
        (dict(anchor_exclude_self=1), "anchor_exclude_self"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NTHRConfig(**kwargs)


def _bad(batch, **changes):
    return dict(batch, **changes)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: _bad(b, hidden_BTD=b["hidden_BTD"][:, :, :3]), r"hidden_BTD: expected shape \(4, 5, 4\)"),
        (lambda b: _bad(b, hidden_BTD=b["hidden_BTD"][:, :4]), "hidden_BTD"),
        (
            lambda b: _bad(b, unembed_VD=b["unembed_VD"][:, :3]),
            r"hidden_BTD: expected shape \(4, 5, 3\) \(D from unembed_VD.*got \(4, 5, 4\)",
        ),
        (lambda b: _bad(b, old_logp_BT=b["old_logp_BT"][:, :4]), r"old_logp_BT: expected shape \(4, 5\)"),
        (lambda b: _bad(b, tokens_BT=b["tokens_BT"][:3]), "tokens_BT"),
        (lambda b: _bad(b, response_mask_BT=b["response_mask_BT"][:, :2]), "response_mask_BT"),
        (lambda b: _bad(b, response_mask_BT=b["response_mask_BT"].double() * 0.5), "response_mask_BT"),
        (lambda b: _bad(b, group_ids_B=b["group_ids_B"][:2]), "group_ids_B"),
        (lambda b: _bad(b, group_ids_B=b["group_ids_B"].double()), "group_ids_B"),
        (lambda b: _bad(b, unembed_bias_V=b["unembed_bias_V"][:3]), "unembed_bias_V"),
        (lambda b: _bad(b, tokens_BT=b["tokens_BT"].double()), "tokens_BT"),
        (
            lambda b: _bad(b, tokens_BT=torch.where(b["response_mask_BT"], 11, b["tokens_BT"])),
            r"tokens_BT: .*\[0, 11\).*11",
        ),
        (lambda b: _bad(b, tokens_BT=torch.where(b["response_mask_BT"], -1, b["tokens_BT"])), "tokens_BT"),
        (
            lambda b: _bad(b, old_logp_BT=torch.where(b["response_mask_BT"], math.nan, b["old_logp_BT"])),
            "old_logp_BT: must be finite",
        ),
        (lambda b: _bad(b, hidden_BTD=b["hidden_BTD"] * math.inf), "hidden_BTD: must be finite"),
        (lambda b: _bad(b, advantages_BT=b["advantages_BT"] + math.nan), "advantages_BT"),
        (lambda b: _bad(b, temperature=0.0), r"temperature: must be in \(0"),
        (lambda b: _bad(b, temperature=-1.0), "temperature"),
        (lambda b: _bad(b, temperature=math.nan), "temperature"),
    ],
)
def test_bad_inputs_raise(change, match):
    batch = make_batch(seed=16, B=4, row_adv=(1.0, -1.0, 1.0, -1.0), group_ids=(0, 0, 0, 0))
    with pytest.raises(ValueError, match=match):
        call_weights(change(batch), NTHRConfig())


def test_bad_config_object_and_score_arguments():
    batch = make_batch(seed=16, B=4, row_adv=(1.0, -1.0, 1.0, -1.0), group_ids=(0, 0, 0, 0))
    with pytest.raises(ValueError, match="config"):
        call_weights(batch, {"beta": 1.0})
    with pytest.raises(ValueError, match="positive_rows"):
        call_scores(batch, [0, 9], [1])
    with pytest.raises(ValueError, match="rows"):
        call_scores(batch, [0], [1, 1])
    with pytest.raises(ValueError, match="exclude_rows_from_matrix"):
        call_scores(batch, [0], [1], exclude_rows_from_matrix=torch.tensor([2]))
    with pytest.raises(ValueError, match="vocab"):
        call_scores(batch, [0], [1], vocab=torch.tensor([0]))  # misses tokens of the rows
    with pytest.raises(ValueError, match="vocab"):
        call_scores(batch, [0], [1], vocab="word")
    with pytest.raises(ValueError, match="chunk_tokens"):
        call_scores(batch, [0], [1], chunk_tokens=0)


# --------------------------------------------------------------------------------------------------
# 10. no mutation, no gradient
# --------------------------------------------------------------------------------------------------


def test_inputs_not_mutated_and_no_grad():
    batch = make_batch(seed=17, B=12, T=6, row_adv=MULTI_ADV, group_ids=MULTI_GID)
    batch["hidden_BTD"] = batch["hidden_BTD"].clone().requires_grad_(True)
    batch["unembed_VD"] = batch["unembed_VD"].clone().requires_grad_(True)
    batch["unembed_bias_V"] = batch["unembed_bias_V"].clone().requires_grad_(True)
    batch["old_logp_BT"] = batch["old_logp_BT"].clone().requires_grad_(True)
    batch["advantages_BT"] = batch["advantages_BT"].clone().requires_grad_(True)
    batch["tokens_BT"][~batch["response_mask_BT"]] = -100
    before = {k: v.detach().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
    for cfg in (NTHRConfig(beta=0.0, eta=0.5), NTHRConfig(anchor_exclude_self=True, vocab="full")):
        w, m = call_weights(batch, cfg)
        assert not w.requires_grad and w.grad_fn is None
        assert all(isinstance(v, float) for v in m.values())
    s = call_scores(batch, [0, 2], [1, 0], exclude_rows_from_matrix=torch.tensor([-1, 0]))
    assert not s.requires_grad and s.grad_fn is None
    for k, v in before.items():
        assert torch.equal(batch[k].detach(), v), k
    for k in ("hidden_BTD", "unembed_VD", "old_logp_BT", "advantages_BT"):
        assert batch[k].grad is None


# --------------------------------------------------------------------------------------------------
# 11. which responses are positive: correctness (default) or the advantage sign, on graded rewards
# --------------------------------------------------------------------------------------------------
#
# One token per response, V = 2, D = 1 and W = 0, so q = (1/2, 1/2) everywhere and
# g(y=0) = (1/2, -1/2), g(y=1) = (-1/2, 1/2): g_a . g_b = +1/2 for the same token, -1/2 otherwise,
# and s_t = h_t * sum_{k in P} h_k (g_t . g_k).


def graded_batch(scores, tokens, hidden, group_ids):
    from tokenbalance.algorithms.methods import compute_advantages
    from tokenbalance.algorithms.presets import get_method

    B = len(scores)
    mask = torch.ones(B, 1, dtype=torch.bool)
    scores_B = torch.tensor(scores, dtype=F64)
    gids = torch.tensor(group_ids)
    return dict(
        advantages_BT=compute_advantages(get_method("grpo"), scores_B, gids, mask),
        response_mask_BT=mask,
        group_ids_B=gids,
        tokens_BT=torch.tensor(tokens)[:, None],
        old_logp_BT=torch.full((B, 1), math.log(0.5), dtype=F64),
        hidden_BTD=torch.tensor(hidden, dtype=F64)[:, None, None],
        unembed_VD=torch.zeros(2, 1, dtype=F64),
        unembed_bias_V=None,
        temperature=1.0,
        scores_B=scores_B,
    )


# K&K group [3, -0.5, -0.5, -3 x 5]: mean -13/8, so the two -0.5 rows have a POSITIVE advantage.
KK_SCORES = (3.0, -0.5, -0.5, -3.0, -3.0, -3.0, -3.0, -3.0)
KK_TOKENS = (0, 1, 1, 0, 1, 0, 1, 0)
KK_HIDDEN = (1.0, 1.0, 1.0, 2.0, 2.0, 0.5, 0.5, -1.0)


def test_kk_group_correct_anchors_are_the_correct_responses_only():
    # P = {0} (reward 3), N = the -3 rows 3..7; the -0.5 rows (wrong, positive advantage) are neither.
    # p = 1/8, eta = 2|0.5 - 1/8| = 0.75. M+ = g0 * 1 -> s(y=0, h) = h/2, s(y=1, h) = -h/2.
    # anchor: s(row 0) = 1/2 -> tau = 1/2. negatives: 1.0, -1.0, 0.25, -0.25, -0.5 -> only row 3 > tau.
    batch = graded_batch(KK_SCORES, KK_TOKENS, KK_HIDDEN, [0] * 8)
    assert binary_correct(batch).tolist() == [True, True, True] + [False] * 5  # the -0.5 rows: A > 0
    correct = nthr_correct(batch["scores_B"], NTHRConfig(), max_reward=3.0)
    assert correct.tolist() == [True] + [False] * 7
    w, m = call_weights(dict(batch, correct_B=correct), NTHRConfig(beta=1.0))
    assert w[:, 0].tolist() == [1.0, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0, 1.0]
    assert m["nthr/mixed_groups"] == 1.0 and m["nthr/eta_mean"] == pytest.approx(0.75)
    assert m["nthr/tau_mean"] == pytest.approx(0.5, abs=1e-12)
    assert m["nthr/selected_frac"] == pytest.approx(1 / 5)
    assert m["nthr/score_neg_mean"] == pytest.approx((1.0 - 1.0 + 0.25 - 0.25 - 0.5) / 5, abs=1e-12)


def test_kk_group_advantage_sign_makes_wrong_well_formatted_rows_anchors():
    # P = {0, 1, 2} (A > 0), N = rows 3..7; p = 3/8, eta = 2|0.5 - 3/8| = 0.25.
    # M+ = g0 + 2 g1 = (-1/2, 1/2) -> s(y=0, h) = -h/2, s(y=1, h) = h/2.
    # anchors: -1/2, 1/2, 1/2 -> tau = -1/2. negatives: -1.0, 1.0, -0.25, 0.25, 0.5 -> rows 4..7 > tau.
    batch = graded_batch(KK_SCORES, KK_TOKENS, KK_HIDDEN, [0] * 8)
    w, m = call_weights(batch, NTHRConfig(beta=1.0, positives="advantage_sign"))
    assert w[:, 0].tolist() == [1.0, 1.0, 1.0, 1.0, 0.25, 0.25, 0.25, 0.25]
    assert m["nthr/eta_mean"] == pytest.approx(0.25) and m["nthr/tau_mean"] == pytest.approx(-0.5, abs=1e-12)
    assert m["nthr/selected_frac"] == pytest.approx(4 / 5)
    # a stated threshold of -0.5 counts the -0.5 rows as correct: the same split as the sign rule here
    config = NTHRConfig(beta=1.0, correct_threshold=-0.5)
    correct = nthr_correct(batch["scores_B"], config)
    assert correct.tolist() == [True, True, True] + [False] * 5
    w_thr, _ = call_weights(dict(batch, correct_B=correct), config)
    assert torch.equal(w_thr, w)


# No correct response, mixed format scores [-0.5, -0.5, -1, -3]: mean -5/4, rows 0..2 have A > 0.
FORMAT_SCORES = (-0.5, -0.5, -1.0, -3.0)
FORMAT_TOKENS = (0, 1, 0, 0)
FORMAT_HIDDEN = (1.0, 1.0, 1.0, 2.0)


def test_group_without_correct_response_is_left_alone_by_the_correctness_rule():
    batch = graded_batch(FORMAT_SCORES, FORMAT_TOKENS, FORMAT_HIDDEN, [0] * 4)
    correct = nthr_correct(batch["scores_B"], NTHRConfig(), max_reward=3.0)
    assert not correct.any()
    for beta in (1.0, -math.inf):
        w, m = call_weights(dict(batch, correct_B=correct), NTHRConfig(beta=beta, eta=0.0))
        assert bool((w == 1.0).all()) and m["nthr/mixed_groups"] == 0.0 and m["nthr/selected_frac"] == 0.0


def test_group_without_correct_response_activates_under_the_advantage_sign_rule():
    # P = {0, 1, 2}, N = {3}, p = 3/4, eta = 2|0.5 - 3/4| = 0.5. M+ = 2 g0 + g1 = (1/2, -1/2):
    # anchors 1/2, -1/2, 1/2 -> tau = -1/2; negative row 3 (y=0, h=2): s = 1.0 > tau: selected.
    batch = graded_batch(FORMAT_SCORES, FORMAT_TOKENS, FORMAT_HIDDEN, [0] * 4)
    w, m = call_weights(batch, NTHRConfig(beta=1.0, positives="advantage_sign"))
    assert w[:, 0].tolist() == [1.0, 1.0, 1.0, 0.5]
    assert m["nthr/mixed_groups"] == 1.0 and m["nthr/tau_mean"] == pytest.approx(-0.5, abs=1e-12)


@pytest.mark.parametrize("positives", ["correct", "advantage_sign"])
def test_build_update_passes_derives_correctness_from_the_rewards(positives):
    """Both groups in one batch through the method: NTHRInputs.max_reward = 3 (the K&K maximum)."""
    from tokenbalance.algorithms.methods import NTHRInputs, build_update_passes, compute_advantages
    from tokenbalance.algorithms.presets import get_method

    batch = graded_batch(
        KK_SCORES + FORMAT_SCORES, KK_TOKENS + FORMAT_TOKENS, KK_HIDDEN + FORMAT_HIDDEN, [0] * 8 + [1] * 4
    )
    method = get_method("grpo").replace(nthr=NTHRConfig(beta=1.0, positives=positives))
    inputs = NTHRInputs(batch["tokens_BT"], batch["hidden_BTD"], batch["unembed_VD"], max_reward=3.0)
    mask = batch["response_mask_BT"]
    (update_pass,), m = build_update_passes(
        method, batch["scores_B"], batch["group_ids_B"], mask, batch["old_logp_BT"], batch["old_logp_BT"], inputs
    )
    if positives == "correct":
        weights = [1.0, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0, 1.0] + [1.0] * 4
    else:
        weights = [1.0, 1.0, 1.0, 1.0, 0.25, 0.25, 0.25, 0.25] + [1.0, 1.0, 1.0, 0.5]
    advantages = compute_advantages(method, batch["scores_B"], batch["group_ids_B"], mask)
    torch.testing.assert_close(update_pass.advantages_BT, advantages * torch.tensor(weights, dtype=F64)[:, None])
    assert m["nthr/mixed_groups"] == (1.0 if positives == "correct" else 2.0)


def test_correctness_inputs_are_checked():
    batch = graded_batch(FORMAT_SCORES, FORMAT_TOKENS, FORMAT_HIDDEN, [0] * 4)
    scores = batch["scores_B"]
    with pytest.raises(ValueError, match="correct_B: required by nthr.positives='correct'"):
        nthr_token_weights(
            *(batch[k] for k in ("advantages_BT", "response_mask_BT", "group_ids_B", "tokens_BT", "old_logp_BT")),
            batch["hidden_BTD"],
            batch["unembed_VD"],
            NTHRConfig(),
        )
    with pytest.raises(ValueError, match=r"correct_B: expected a \[B\] bool tensor"):
        call_weights(dict(batch, correct_B=torch.ones(4)), NTHRConfig())
    with pytest.raises(ValueError, match=r"correct_B: expected shape \(4,\)"):
        call_weights(dict(batch, correct_B=torch.ones(3, dtype=torch.bool)), NTHRConfig())
    with pytest.raises(ValueError, match="max_reward: NTHR's positives='correct' needs the task's maximum reward"):
        nthr_correct(scores, NTHRConfig())
    with pytest.raises(ValueError, match="max_reward: -1.0 is not the task's maximum, found a reward of -0.5"):
        nthr_correct(scores, NTHRConfig(), max_reward=-1.0)
    assert nthr_correct(torch.tensor([1.0, math.nan, 0.0]), NTHRConfig(), max_reward=1.0).tolist() == [
        True,
        False,
        False,
    ]
    # the advantage-sign rule needs no correctness and ignores a given one
    w, _ = call_weights(dict(batch, correct_B=torch.zeros(4, dtype=torch.bool)), NTHRConfig(positives="advantage_sign"))
    assert w[3, 0] == 0.5
    for bad, match in (
        (dict(positives="sign"), "positives: unknown value 'sign'"),
        (dict(correct_threshold=math.inf), "correct_threshold"),
        (dict(correct_threshold="3"), "correct_threshold"),
    ):
        with pytest.raises(ValueError, match=match):
            NTHRConfig(**bad)
