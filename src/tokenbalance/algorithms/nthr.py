"""NTHR: Negative Token Hidden Reward (Deng et al. 2025, arXiv 2505.18830, §5.3 / §7 and Eq. 7-8).

Per-token weights for incorrect responses: a token whose score s-_t = g-_t^T M+ h-_t exceeds the anchor tau is
selected and its negative advantage multiplied by eta; the caller applies the weights before the unchanged clipped
loss, once per rollout batch. Differences from the paper: the log-Z trick [derived] (q_t from the hidden states, the
|V*| unembedding rows and ``old_logp``, no full-vocabulary softmax), ``positives`` ("correct" or the [derived]
"advantage_sign"), ``anchor_exclude_self`` and ``beta=-inf`` as explicit options. docs/methods.md §6 has the rest."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import masked_fill_invalid, param

__all__ = [
    "NTHRConfig",
    "NTHRGroup",
    "nthr_correct",
    "nthr_eta",
    "nthr_groups",
    "nthr_restricted_probs",
    "nthr_token_scores",
    "nthr_token_weights",
]

ETA_RULES = ("2|0.5-p|", "p", "1-p")
VOCAB_MODES = ("group", "full")
POSITIVE_RULES = ("correct", "advantage_sign")


@dataclass(frozen=True)
class NTHRConfig:
    """Hyper-parameters of NTHR (docs/methods.md §6)."""

    beta: float = param(
        1.0,
        "threshold multiplier, tau = beta * min_{i'} sbar+_{i'}. Any finite float, or ``float(\"-inf\")`` "
        "to select every negative token (uniform shrink). NaN / +inf rejected.",
    )
    eta: float | str = param(
        "2|0.5-p|",
        'weight of the selected negative tokens: ``"2|0.5-p|"`` (paper default), ``"p"``, ``"1-p"`` (p = '
        "N+/G), or a constant float in [0, 1]. ``eta=1.0`` reproduces GRPO.",
    )
    anchor_exclude_self: bool = param(
        False,
        "compute the anchor score of positive response i' against M+ without its own contribution (falls "
        "back to the inclusive form when the group has one positive).",
    )
    vocab: str = param("group", '``"group"`` (V* = token ids of the group\'s responses, paper §7.4) or ``"full"``.')
    chunk_tokens: int = param(
        4096,
        "maximum number of tokens whose [n, |V*|] probability block is held at once. Peak extra memory "
        'per group is about (2 * chunk_tokens + D) * |V*| floats; with ``vocab="full"`` (|V*| = V) lower '
        "it accordingly.",
    )
    positives: str = param(
        "correct",
        'which responses anchor the scores. ``"correct"`` (default, the paper\'s rule): the correct '
        "responses are the positives and the incorrect ones with a negative advantage the negatives; "
        'needs ``correct_B`` (:func:`nthr_correct`). ``"advantage_sign"`` [derived]: rows with a '
        "positive / negative masked advantage sum, whatever their reward.",
    )
    correct_threshold: float | None = param(
        None,
        'with ``positives="correct"``, a response is correct when its reward is >= this value; ``None`` '
        "(default) means the reward equals the task's maximum (K&K 3, math 1), which the runner supplies "
        "(``NTHRInputs.max_reward``).",
    )

    def __post_init__(self) -> None:
        beta = self.beta
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or math.isnan(beta) or beta == math.inf:
            raise ValueError(
                f"beta: must be a finite float or float('-inf') (select all negative tokens), got {beta!r}"
            )
        eta = self.eta
        if isinstance(eta, str):
            if eta not in ETA_RULES:
                raise ValueError(
                    f"eta: unknown value {eta!r}; valid: {', '.join(map(repr, ETA_RULES))} or a float in [0, 1]"
                )
        elif isinstance(eta, bool) or not isinstance(eta, (int, float)):
            raise ValueError(f"eta: must be one of {ETA_RULES} or a float in [0, 1], got {eta!r}")
        else:
            check.in_range("eta", eta, 0.0, 1.0)
        if not isinstance(self.anchor_exclude_self, bool):
            raise ValueError(f"anchor_exclude_self: must be a bool, got {self.anchor_exclude_self!r}")
        if not isinstance(self.vocab, str):
            raise ValueError(f"vocab: must be one of {VOCAB_MODES}, got {self.vocab!r}")
        check.choice("vocab", self.vocab, VOCAB_MODES)
        ct = self.chunk_tokens
        if isinstance(ct, bool) or not isinstance(ct, int) or ct < 1:
            raise ValueError(f"chunk_tokens: must be an int >= 1, got {ct!r}")
        if not isinstance(self.positives, str):
            raise ValueError(f"positives: must be one of {POSITIVE_RULES}, got {self.positives!r}")
        check.choice("positives", self.positives, POSITIVE_RULES)
        if self.correct_threshold is not None:
            check.in_range(
                "correct_threshold", self.correct_threshold, -math.inf, math.inf, low_open=True, high_open=True
            )


def nthr_eta(rule: float | str, p: float) -> float:
    """Down-weighting factor eta for a group with success rate ``p = N+/G`` under ``rule``.

    ``"2|0.5-p|"`` -> 2|0.5 - p|, ``"p"`` -> p, ``"1-p"`` -> 1 - p, a float -> itself."""
    if isinstance(rule, str):
        if rule == "2|0.5-p|":
            return 2.0 * abs(0.5 - p)
        if rule == "p":
            return float(p)
        if rule == "1-p":
            return 1.0 - p
        raise ValueError(f"eta: unknown value {rule!r}; valid: {ETA_RULES} or a float in [0, 1]")
    return float(rule)


def nthr_correct(scores_B: Tensor, config: NTHRConfig, max_reward: float | None = None) -> Tensor:
    """[B] bool: the responses NTHR counts as correct (its anchors under ``positives="correct"``): ``scores_B >=
    config.correct_threshold`` if set, else ``scores_B == max_reward`` (then required). A score above ``max_reward``
    raises; NaN is not correct."""
    if not isinstance(config, NTHRConfig):
        raise ValueError(f"config: expected an NTHRConfig, got {type(config).__name__}")
    check.ndim("scores_B", scores_B, 1, "B")
    if not scores_B.dtype.is_floating_point:
        scores_B = scores_B.double()
    scores = scores_B.detach()
    if config.correct_threshold is not None:
        return scores >= config.correct_threshold
    if max_reward is None:
        raise ValueError(
            "max_reward: NTHR's positives='correct' needs the task's maximum reward (NTHRInputs.max_reward) "
            "or a stated nthr.correct_threshold; or set nthr.positives='advantage_sign'"
        )
    check.in_range("max_reward", max_reward, -math.inf, math.inf, low_open=True, high_open=True)
    above = scores > max_reward
    if bool(above.any()):
        raise ValueError(
            f"max_reward: {max_reward} is not the task's maximum, found a reward of {float(scores[above][0])}"
        )
    return scores >= max_reward


@dataclass(frozen=True)
class NTHRGroup:
    """One mixed group as NTHR sees it: [G] ``rows``, [N+] ``positive_rows`` (the anchors) and [N-] ``negative_rows``
    (the rows whose tokens are scored), int64 batch indices; ``p`` = N+ / G."""

    group: int
    rows: Tensor
    positive_rows: Tensor
    negative_rows: Tensor

    @property
    def p(self) -> float:
        return self.positive_rows.numel() / self.rows.numel()


def _validate_correct(correct_B: Tensor | None, config: NTHRConfig, B: int) -> Tensor | None:
    if config.positives != "correct":
        return None
    if correct_B is None:
        raise ValueError(
            "correct_B: required by nthr.positives='correct' (the anchors are the correct responses); "
            "pass nthr_correct(scores_B, config, max_reward), or set nthr.positives='advantage_sign'"
        )
    if not isinstance(correct_B, Tensor) or correct_B.dtype != torch.bool:
        raise ValueError(f"correct_B: expected a [B] bool tensor, got {getattr(correct_B, 'dtype', type(correct_B))}")
    check.shape("correct_B", correct_B, (B,))
    return correct_B.detach()


@torch.no_grad()
def nthr_groups(
    advantages_BT: Tensor,
    response_mask_BT: Tensor,
    group_ids_B: Tensor,
    config: NTHRConfig,
    correct_B: Tensor | None = None,
) -> list[NTHRGroup]:
    """The groups NTHR acts on, in group-id order. ``positives="correct"``: positives = ``correct_B`` rows, negatives
    = the others with masked advantage sum < 0; ``"advantage_sign"``: sum > 0 / < 0 (``correct_B`` ignored)."""
    check.ndim("advantages_BT", advantages_BT, 2, "BT")
    B, T = advantages_BT.shape
    check.shape("response_mask_BT", response_mask_BT, (B, T))
    check.shape("group_ids_B", group_ids_B, (B,))
    correct = _validate_correct(correct_B, config, B)
    mask_BT = response_mask_BT.detach() != 0
    adv = masked_fill_invalid(advantages_BT.detach(), mask_BT, 0.0)
    acc = torch.float64 if adv.dtype == torch.float64 else torch.float32
    row_sign_B = torch.sign(adv.to(acc).sum(dim=1))  # positive / negative / neither, per row
    if correct is None:
        positive_B, negative_B = row_sign_B > 0, row_sign_B < 0
    else:
        correct = correct.to(row_sign_B.device)
        positive_B, negative_B = correct, ~correct & (row_sign_B < 0)
    gids = group_ids_B.detach()
    out = []
    for g in torch.unique(gids).tolist():
        rows = (gids == g).nonzero(as_tuple=True)[0]
        pos, neg = rows[positive_B[rows]], rows[negative_B[rows]]
        if pos.numel() and neg.numel():
            out.append(NTHRGroup(group=int(g), rows=rows, positive_rows=pos, negative_rows=neg))
    return out


# -------------------------------------------------------------------------------------------------- validation
# --------------------------------------------------------------------------------------------------


def _validate_token_inputs(
    tokens_BT: Tensor,
    response_mask_BT: Tensor,
    hidden_BTD: Tensor,
    unembed_VD: Tensor,
    old_logp_BT: Tensor,
    temperature: float,
    unembed_bias_V: Tensor | None,
) -> Tensor:
    """Check shapes / dtypes / values shared by both entry points; return the bool mask [B, T]."""
    check.ndim("tokens_BT", tokens_BT, 2, "BT")
    B, T = tokens_BT.shape
    check.shape("response_mask_BT", response_mask_BT, (B, T))
    check.ndim("hidden_BTD", hidden_BTD, 3, "BTD")
    check.ndim("unembed_VD", unembed_VD, 2, "VD")
    V, D = unembed_VD.shape
    check.shape("hidden_BTD", hidden_BTD, (B, T, hidden_BTD.shape[-1]))
    if hidden_BTD.shape[-1] != D:
        raise ValueError(
            f"hidden_BTD: expected shape {(B, T, D)} (D from unembed_VD of shape "
            f"{tuple(unembed_VD.shape)}), got {tuple(hidden_BTD.shape)}"
        )
    check.shape("old_logp_BT", old_logp_BT, (B, T))
    if tokens_BT.dtype.is_floating_point or tokens_BT.dtype.is_complex or tokens_BT.dtype == torch.bool:
        raise ValueError(f"tokens_BT: expected an integer dtype (int64), got {tokens_BT.dtype}")
    for name, t in (("hidden_BTD", hidden_BTD), ("unembed_VD", unembed_VD), ("old_logp_BT", old_logp_BT)):
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
    if unembed_bias_V is not None:
        check.ndim("unembed_bias_V", unembed_bias_V, 1, "V")
        check.shape("unembed_bias_V", unembed_bias_V, (V,))
        if not unembed_bias_V.dtype.is_floating_point:
            raise ValueError(f"unembed_bias_V: expected a floating dtype, got {unembed_bias_V.dtype}")
    check.in_range("temperature", temperature, 0.0, math.inf, low_open=True, high_open=True)

    if response_mask_BT.dtype == torch.bool:
        mask_BT = response_mask_BT.detach()
    else:
        m = response_mask_BT.detach()
        if m.numel() and not bool(((m == 0) | (m == 1)).all()):
            bad = m[(m != 0) & (m != 1)][0].item()
            raise ValueError(f"response_mask_BT: must be bool or hold only 0/1, found {bad}")
        mask_BT = m != 0

    tok_valid = tokens_BT.detach()[mask_BT]
    if tok_valid.numel():
        lo, hi = int(tok_valid.min()), int(tok_valid.max())
        if lo < 0 or hi >= V:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"tokens_BT: token ids at valid positions must be in [0, {V}) (V = unembed_VD.shape[0]), found {bad}"
            )
    check.finite("old_logp_BT", old_logp_BT.detach(), mask_BT)
    check.finite("hidden_BTD", hidden_BTD.detach(), mask_BT)
    if unembed_bias_V is not None:
        check.finite("unembed_bias_V", unembed_bias_V.detach())
    return mask_BT


def _validate_rows(name: str, rows: Tensor, B: int) -> Tensor:
    if not isinstance(rows, Tensor):
        raise ValueError(f"{name}: expected a 1-d int64 tensor of row indices, got {type(rows).__name__}")
    check.ndim(name, rows, 1, "R")
    if rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool:
        raise ValueError(f"{name}: expected an integer dtype of row indices, got {rows.dtype}")
    if rows.numel():
        lo, hi = int(rows.min()), int(rows.max())
        if lo < 0 or hi >= B:
            raise ValueError(f"{name}: row indices must be in [0, {B}), found {lo if lo < 0 else hi}")
        if torch.unique(rows).numel() != rows.numel():
            raise ValueError(f"{name}: row indices must be unique, got {rows.tolist()}")
    return rows.detach().long()


# -------------------------------------------------------------------------------------------------- core computation
# (no validation; inputs already sanitised)
# --------------------------------------------------------------------------------------------------


class _Scorer:
    """Holds the sanitised inputs of one call and the V*-restricted unembedding of one group."""

    def __init__(
        self,
        tokens_BT: Tensor,
        mask_BT: Tensor,
        hidden_BTD: Tensor,
        old_logp_BT: Tensor,
        unembed_VD: Tensor,
        bias_V: Tensor | None,
        temperature: float,
        vocab_S: Tensor | None,
        chunk_tokens: int,
    ) -> None:
        self.dtype = torch.float64 if torch.float64 in (hidden_BTD.dtype, unembed_VD.dtype) else torch.float32
        self.tokens_BT = tokens_BT
        self.mask_BT = mask_BT
        self.hidden_BTD = hidden_BTD
        self.old_logp_BT = old_logp_BT
        self.temperature = float(temperature)
        self.chunk = int(chunk_tokens)
        self.vocab_S = vocab_S  # None == full vocabulary (column index == token id)
        if vocab_S is None:
            self.W_SD = unembed_VD.to(self.dtype)
            self.b_S = None if bias_V is None else bias_V.to(self.dtype)
        else:
            self.W_SD = unembed_VD[vocab_S].to(self.dtype)
            self.b_S = None if bias_V is None else bias_V[vocab_S].to(self.dtype)
        check.finite("unembed_VD", self.W_SD)  # only the rows actually used
        self.S = self.W_SD.shape[0]

    def positions(self, rows_R: Tensor) -> tuple[Tensor, Tensor]:
        """Flattened (row, t) of the valid tokens of ``rows_R`` (row-major order)."""
        r_local, t = self.mask_BT[rows_R].nonzero(as_tuple=True)
        return rows_R[r_local], t

    def columns(self, y_N: Tensor) -> Tensor:
        if self.vocab_S is None:
            return y_N
        col = torch.searchsorted(self.vocab_S, y_N).clamp_max(self.S - 1)
        if not bool((self.vocab_S[col] == y_N).all()):
            raise ValueError("vocab: every valid token of the scored and positive rows must be in V*")
        return col

    def chunks(self, rows_N: Tensor, t_N: Tensor):
        """Yield (h [n, D], q [n, S], col [n]) for chunks of at most ``chunk_tokens`` tokens."""
        for start in range(0, rows_N.numel(), self.chunk):
            r = rows_N[start : start + self.chunk]
            t = t_N[start : start + self.chunk]
            h = self.hidden_BTD[r, t].to(self.dtype)
            col = self.columns(self.tokens_BT[r, t])
            q = _restricted_probs(h, col, self.old_logp_BT[r, t].to(self.dtype), self.W_SD, self.b_S, self.temperature)
            yield h, q, col

    def matrix(self, rows_R: Tensor) -> Tensor:
        """M = sum over valid tokens of ``rows_R`` of g h^T, shape [S, D]."""
        M = torch.zeros(self.S, self.hidden_BTD.shape[-1], dtype=self.dtype, device=self.W_SD.device)
        r, t = self.positions(rows_R)
        for h, q, col in self.chunks(r, t):
            M.index_add_(0, col, h)  # one-hot part: scatter h rows into the token's row
            M.addmm_(q.T, h, alpha=-1.0)  # minus Q^T H
        return M

    def scores(self, M_SD: Tensor, rows_N: Tensor, t_N: Tensor) -> Tensor:
        """s_t = g_t^T M h_t = (M h_t)[y_t] - q_t . (M h_t) for the listed tokens, shape [N]."""
        out = []
        for h, q, col in self.chunks(rows_N, t_N):
            u = h @ M_SD.T  # [n, S]
            out.append(u.gather(1, col[:, None]).squeeze(1) - (q * u).sum(1))
        if not out:
            return torch.zeros(0, dtype=self.dtype, device=self.W_SD.device)
        return torch.cat(out)


def _restricted_probs(
    h_ND: Tensor, col_N: Tensor, old_logp_N: Tensor, W_SD: Tensor, b_S: Tensor | None, temperature: float
) -> Tensor:
    """q [N, S] = full-vocabulary softmax(z / T) restricted to the S rows of ``W_SD``, via log Z."""
    z = h_ND @ W_SD.T
    if b_S is not None:
        z = z + b_S
    z = z / temperature  # [N, S] logits restricted to V*
    # old_logp = z[y] - log Z  =>  log Z = z[y] - old_logp and q[v] = exp(z[v] - log Z)
    log_z = z.gather(1, col_N[:, None]).squeeze(1) - old_logp_N
    return torch.exp(z - log_z[:, None])


def _group_vocab(tokens_BT: Tensor, mask_BT: Tensor, rows_R: Tensor) -> Tensor:
    return torch.unique(tokens_BT[rows_R][mask_BT[rows_R]])  # sorted


def _sanitise(
    tokens_BT: Tensor, mask_BT: Tensor, hidden_BTD: Tensor, old_logp_BT: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    tokens = masked_fill_invalid(tokens_BT.detach().long(), mask_BT, 0)
    hidden = masked_fill_invalid(hidden_BTD.detach(), mask_BT[..., None], 0.0)
    old_logp = masked_fill_invalid(old_logp_BT.detach(), mask_BT, 0.0)
    return tokens, hidden, old_logp


def _score_rows(
    scorer: _Scorer,
    positive_rows: Tensor,
    rows: Tensor,
    exclude: Tensor | None,
) -> Tensor:
    """Scores [R, T] (0 at padding) of ``rows`` against M+ of ``positive_rows`` (minus exclusions)."""
    B, T = scorer.mask_BT.shape
    out_RT = torch.zeros(rows.numel(), T, dtype=scorer.dtype, device=scorer.W_SD.device)
    if rows.numel() == 0:
        return out_RT
    M = scorer.matrix(positive_rows)
    if exclude is None:
        exclude = torch.full_like(rows, -1)
    for e in torch.unique(exclude).tolist():
        sel = (exclude == e).nonzero(as_tuple=True)[0]
        M_e = M if e < 0 else M - scorer.matrix(torch.tensor([e], device=rows.device))
        r_local, t = scorer.mask_BT[rows[sel]].nonzero(as_tuple=True)
        s = scorer.scores(M_e, rows[sel][r_local], t)
        out_RT[sel[r_local], t] = s
    return out_RT


# -------------------------------------------------------------------------------------------------- public API
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def nthr_token_scores(
    tokens_BT: Tensor,
    response_mask_BT: Tensor,
    hidden_BTD: Tensor,
    unembed_VD: Tensor,
    old_logp_BT: Tensor,
    positive_rows: Tensor,
    rows: Tensor,
    *,
    temperature: float = 1.0,
    unembed_bias_V: Tensor | None = None,
    vocab: str | Tensor = "group",
    chunk_tokens: int = 4096,
    exclude_rows_from_matrix: Tensor | None = None,
) -> Tensor:
    """Hidden-reward scores s_t = g_t^T M+ h_t of the valid tokens of ``rows`` (the building block).

    M+ = sum over the valid tokens k of ``positive_rows`` of g_k h_k^T, with g = onehot_{V*}(y) - q and q = softmax(z
    / temperature) over the full vocabulary sliced to V* (not renormalised), obtained through the log-Z trick from
    ``old_logp_BT`` (see the module docstring). Usually called for one prompt group; ``nthr_token_weights`` is the
    batch entry point.

    Args:
        tokens_BT: [B, T] integer sampled token ids; any value at padding (e.g. -100).
        response_mask_BT: [B, T] bool or 0/1; True at valid response tokens.
        hidden_BTD: [B, T, D] float old-policy final-layer hidden states; row t predicts tokens_BT[:, t].
        unembed_VD: [V, D] float lm_head weight.
        old_logp_BT: [B, T] float, log softmax(z / temperature)[y] of the old policy.
        positive_rows: [P] int64 unique row indices whose tokens form M+ (may be empty: scores 0).
        rows: [R] int64 unique row indices to score.
        temperature: > 0, the temperature of ``old_logp_BT``.
        unembed_bias_V: optional [V] lm_head bias (logits = (W h + b) / temperature).
        vocab: ``"group"`` (V* = sorted unique valid tokens of ``positive_rows`` and ``rows``), ``"full"``, or a 1-d
            sorted tensor of unique token ids that contains every valid token of those rows (``nthr_token_weights``
            passes the whole group's token set).
        chunk_tokens: at most this many tokens' [n, |V*|] blocks are held at once.
        exclude_rows_from_matrix: optional [R] int64; entry r is -1 (score against M+) or a member of
            ``positive_rows`` whose own contribution is removed from M+ for row ``rows[r]`` (anchor self-exclusion:
            pass ``rows`` itself).

    Returns:
        scores_RT: [R, T], float32 (float64 if ``hidden_BTD`` or ``unembed_VD`` is float64), 0 at padded positions, no
        gradient. Inputs are not modified."""
    mask_BT = _validate_token_inputs(
        tokens_BT, response_mask_BT, hidden_BTD, unembed_VD, old_logp_BT, temperature, unembed_bias_V
    )
    B = tokens_BT.shape[0]
    positive_rows = _validate_rows("positive_rows", positive_rows, B)
    rows = _validate_rows("rows", rows, B)
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens: must be an int >= 1, got {chunk_tokens!r}")
    exclude = None
    if exclude_rows_from_matrix is not None:
        check.ndim("exclude_rows_from_matrix", exclude_rows_from_matrix, 1, "R")
        check.shape("exclude_rows_from_matrix", exclude_rows_from_matrix, (rows.numel(),))
        exclude = exclude_rows_from_matrix.detach().long()
        members = set(positive_rows.tolist())
        bad = [e for e in exclude.tolist() if e != -1 and e not in members]
        if bad:
            raise ValueError(
                f"exclude_rows_from_matrix: entries must be -1 or members of positive_rows, found {bad[0]}"
            )
    tokens, hidden, old_logp = _sanitise(tokens_BT, mask_BT, hidden_BTD, old_logp_BT)
    V = unembed_VD.shape[0]
    if isinstance(vocab, Tensor):
        check.ndim("vocab", vocab, 1, "S")
        vocab_S = vocab.detach().long()
        if vocab_S.numel() == 0 or int(vocab_S.min()) < 0 or int(vocab_S.max()) >= V:
            raise ValueError(f"vocab: token ids must be non-empty and in [0, {V}), got {vocab_S.tolist()[:8]}")
        if vocab_S.numel() > 1 and not bool((vocab_S[1:] > vocab_S[:-1]).all()):
            raise ValueError("vocab: token ids must be sorted and unique")
    else:
        if not isinstance(vocab, str):
            raise ValueError(f"vocab: must be 'group', 'full' or a tensor of token ids, got {vocab!r}")
        check.choice("vocab", vocab, VOCAB_MODES)
        if vocab == "full":
            vocab_S = None
        else:
            vocab_S = _group_vocab(tokens, mask_BT, torch.cat([positive_rows, rows]))
            if vocab_S.numel() == 0:  # no valid token anywhere: every score is 0
                vocab_S = torch.zeros(1, dtype=torch.long, device=tokens.device)
    scorer = _Scorer(
        tokens,
        mask_BT,
        hidden,
        old_logp,
        unembed_VD.detach(),
        None if unembed_bias_V is None else unembed_bias_V.detach(),
        temperature,
        vocab_S,
        chunk_tokens,
    )
    return _score_rows(scorer, positive_rows, rows, exclude)


@torch.no_grad()
def nthr_restricted_probs(
    hidden_ND: Tensor,
    tokens_N: Tensor,
    old_logp_N: Tensor,
    unembed_VD: Tensor,
    vocab_S: Tensor | None = None,
    *,
    temperature: float = 1.0,
    unembed_bias_V: Tensor | None = None,
) -> Tensor:
    """Old-policy probabilities q_NS of ``vocab_S`` (None: all V) without a full-vocabulary softmax: exp(z[s] - log
    Z_n), log Z_n = z_n[tokens_N[n]] - old_logp_N[n] (the log-Z trick; exact when ``old_logp_N`` came from the same
    weights and temperature; not renormalised). Inputs: valid tokens only; dtypes as :func:`nthr_token_scores`; no
    gradient."""
    check.ndim("hidden_ND", hidden_ND, 2, "ND")
    N, D = hidden_ND.shape
    check.ndim("unembed_VD", unembed_VD, 2, "VD")
    V = unembed_VD.shape[0]
    check.shape("unembed_VD", unembed_VD, (V, D))
    check.shape("tokens_N", tokens_N, (N,))
    check.shape("old_logp_N", old_logp_N, (N,))
    if unembed_bias_V is not None:
        check.shape("unembed_bias_V", unembed_bias_V, (V,))
    check.in_range("temperature", temperature, 0.0, math.inf, low_open=True, high_open=True)
    if N and (int(tokens_N.min()) < 0 or int(tokens_N.max()) >= V):
        raise ValueError(f"tokens_N: token ids must be in [0, {V}), got {tokens_N.tolist()[:8]}")
    check.finite("hidden_ND", hidden_ND.detach())
    check.finite("old_logp_N", old_logp_N.detach())
    dtype = torch.float64 if torch.float64 in (hidden_ND.dtype, unembed_VD.dtype) else torch.float32
    W = unembed_VD.detach()
    b = None if unembed_bias_V is None else unembed_bias_V.detach()
    y = tokens_N.detach().long()
    if vocab_S is None:
        col = y
    else:
        check.ndim("vocab_S", vocab_S, 1, "S")
        vocab_S = vocab_S.detach().long()
        col = torch.searchsorted(vocab_S, y).clamp_max(max(vocab_S.numel() - 1, 0))
        if vocab_S.numel() == 0 or not bool((vocab_S[col] == y).all()):
            raise ValueError("vocab_S: must contain every id of tokens_N")
        W = W[vocab_S]
        b = None if b is None else b[vocab_S]
    return _restricted_probs(
        hidden_ND.detach().to(dtype),
        col,
        old_logp_N.detach().to(dtype),
        W.to(dtype),
        None if b is None else b.to(dtype),
        float(temperature),
    )


@torch.no_grad()
def nthr_token_weights(
    advantages_BT: Tensor,
    response_mask_BT: Tensor,
    group_ids_B: Tensor,
    tokens_BT: Tensor,
    old_logp_BT: Tensor,
    hidden_BTD: Tensor,
    unembed_VD: Tensor,
    config: NTHRConfig,
    *,
    temperature: float = 1.0,
    unembed_bias_V: Tensor | None = None,
    correct_B: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """NTHR per-token weights for the policy-gradient advantages (multiply: adv_BT * weights_BT).

    Per group (rows sharing ``group_ids_B``), :func:`nthr_groups`: positives P = the correct rows and negatives N =
    the incorrect rows with masked advantage sum < 0 (``positives="correct"``), or P / N = rows with sum > 0 / < 0
    (``"advantage_sign"``); G = number of rows in the group, p = |P| / G. Groups lacking positives or negatives keep
    weight 1. Otherwise every valid token t of a negative row with s-_t = g_t^T M+ h_t > tau = beta * min_{i' in P}
    mean_k s+_{i',k} gets weight eta(p); all other positions (positive rows, unselected tokens, zero-advantage rows,
    padding) get 1.

    Args:
        advantages_BT: [B, T] float per-token advantages (anything at padding).
        response_mask_BT: [B, T] bool or 0/1.
        group_ids_B: [B] integer group ids (one per prompt instance).
        tokens_BT: [B, T] integer sampled ids (anything at padding, e.g. -100).
        old_logp_BT: [B, T] float old-policy log-prob of the sampled token at ``temperature``.
        hidden_BTD: [B, T, D] float old-policy final-layer hidden states aligned with ``tokens_BT``.
        unembed_VD: [V, D] float lm_head weight.
        config: ``NTHRConfig``.
        temperature: > 0, the temperature the old log-probs were computed at.
        unembed_bias_V: optional [V] lm_head bias.
        correct_B: [B] bool, which responses are correct (:func:`nthr_correct`); required with
            ``config.positives="correct"``, ignored with ``"advantage_sign"``.

    Returns:
        weights_BT: [B, T] with ``advantages_BT``'s (floating) dtype, no gradient. metrics: ``nthr/mixed_groups``,
        ``nthr/selected_frac`` (selected / valid negative tokens of mixed groups), ``nthr/tau_mean`` (mean tau over
        mixed groups; 0 when beta = -inf), ``nthr/score_neg_mean`` (token mean of s- over mixed groups),
        ``nthr/eta_mean`` (over mixed groups), ``nthr/anchor_self_fallback_groups``; all finite, 0.0 when nothing
        applies."""
    if not isinstance(config, NTHRConfig):
        raise ValueError(f"config: expected an NTHRConfig, got {type(config).__name__}")
    check.ndim("advantages_BT", advantages_BT, 2, "BT")
    B, T = advantages_BT.shape
    check.shape("tokens_BT", tokens_BT, (B, T))
    check.ndim("group_ids_B", group_ids_B, 1, "B")
    check.shape("group_ids_B", group_ids_B, (B,))
    if group_ids_B.dtype.is_floating_point or group_ids_B.dtype.is_complex or group_ids_B.dtype == torch.bool:
        raise ValueError(f"group_ids_B: expected an integer dtype (int64), got {group_ids_B.dtype}")
    if not advantages_BT.dtype.is_floating_point:
        raise ValueError(f"advantages_BT: expected a floating dtype, got {advantages_BT.dtype}")
    mask_BT = _validate_token_inputs(
        tokens_BT, response_mask_BT, hidden_BTD, unembed_VD, old_logp_BT, temperature, unembed_bias_V
    )
    check.finite("advantages_BT", advantages_BT.detach(), mask_BT)
    groups = nthr_groups(advantages_BT, mask_BT, group_ids_B, config, correct_B)

    tokens, hidden, old_logp = _sanitise(tokens_BT, mask_BT, hidden_BTD, old_logp_BT)
    weights_BT = torch.ones(B, T, dtype=advantages_BT.dtype, device=advantages_BT.device)
    unembed = unembed_VD.detach()
    bias = None if unembed_bias_V is None else unembed_bias_V.detach()
    select_all = config.beta == -math.inf

    mixed = fallbacks = 0
    n_sel = n_neg = 0
    tau_sum = score_sum = eta_sum = 0.0
    for group in groups:
        rows, pos, neg = group.rows, group.positive_rows, group.negative_rows
        mixed += 1
        eta = nthr_eta(config.eta, group.p)
        eta_sum += eta
        vocab_S = None if config.vocab == "full" else _group_vocab(tokens, mask_BT, rows)
        scorer = _Scorer(tokens, mask_BT, hidden, old_logp, unembed, bias, temperature, vocab_S, config.chunk_tokens)
        s_neg_NT = _score_rows(scorer, pos, neg, None)
        valid_neg_NT = mask_BT[neg]
        if select_all:
            sel_NT = valid_neg_NT
        else:
            exclude = None
            if config.anchor_exclude_self:
                if pos.numel() == 1:
                    fallbacks += 1
                else:
                    exclude = pos
            s_pos_PT = _score_rows(scorer, pos, pos, exclude)
            valid_pos_PT = mask_BT[pos]
            sbar_P = s_pos_PT.sum(1) / valid_pos_PT.sum(1)  # positive rows have >= 1 valid token
            tau = config.beta * float(sbar_P.min())
            tau_sum += tau
            sel_NT = valid_neg_NT & (s_neg_NT > tau)
        n_sel += int(sel_NT.sum())
        n_neg += int(valid_neg_NT.sum())
        score_sum += float(s_neg_NT[valid_neg_NT].sum())
        w_NT = weights_BT[neg]
        w_NT[sel_NT] = eta
        weights_BT[neg] = w_NT

    metrics = {
        "nthr/mixed_groups": float(mixed),
        "nthr/selected_frac": n_sel / n_neg if n_neg else 0.0,
        "nthr/tau_mean": tau_sum / mixed if mixed and not select_all else 0.0,
        "nthr/score_neg_mean": score_sum / n_neg if n_neg else 0.0,
        "nthr/eta_mean": eta_sum / mixed if mixed else 0.0,
        "nthr/anchor_self_fallback_groups": float(fallbacks),
    }
    metrics = {k: (v if math.isfinite(v) else 0.0) for k, v in metrics.items()}
    return weights_BT, metrics
