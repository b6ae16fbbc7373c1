"""Which negative tokens NTHR selects per mixed group, for ``tokenbalance diagnose nthr``: the scores, tau and
selection by the rules of :func:`~tokenbalance.algorithms.nthr.nthr_token_weights` (a test checks they agree), and a
response rendered with them in ``[brackets]``. docs/methods.md §6, docs/metrics.md ("Offline diagnostics")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from tokenbalance.algorithms.nthr import NTHRConfig, nthr_eta, nthr_groups, nthr_token_scores


@dataclass(frozen=True)
class GroupSelection:
    """NTHR's view of one mixed group: ``negative_rows`` [N], their scores ``scores_NT``, ``selected_NT`` the
    down-weighted valid tokens, ``tau`` (``-inf`` with beta = -inf), ``eta`` and ``p`` = N+ / G."""

    group: int
    positive_rows: list[int]
    negative_rows: list[int]
    p: float
    eta: float
    tau: float
    scores_NT: torch.Tensor
    selected_NT: torch.Tensor


@torch.no_grad()
def nthr_selections(
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    group_ids_B: torch.Tensor,
    tokens_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    hidden_BTD: torch.Tensor,
    unembed_VD: torch.Tensor,
    config: NTHRConfig,
    *,
    temperature: float = 1.0,
    unembed_bias_V: torch.Tensor | None = None,
    correct_B: torch.Tensor | None = None,
) -> list[GroupSelection]:
    """One :class:`GroupSelection` per mixed group in id order, positives as ``config.positives`` says
    (:func:`~tokenbalance.algorithms.nthr.nthr_groups`; ``correct_B`` required for ``"correct"``)."""
    valid = mask_BT.bool()
    select_all = config.beta == -math.inf
    out = []
    for group in nthr_groups(advantages_BT, valid, group_ids_B, config, correct_B):
        g, rows, pos, neg = group.group, group.rows, group.positive_rows, group.negative_rows
        vocab = None
        if config.vocab != "full":
            vocab = torch.unique(tokens_BT[rows][valid[rows]]).sort().values
        common: dict[str, Any] = {
            "temperature": temperature,
            "unembed_bias_V": unembed_bias_V,
            "vocab": "full" if vocab is None else vocab,
            "chunk_tokens": config.chunk_tokens,
        }
        s_neg = nthr_token_scores(tokens_BT, valid, hidden_BTD, unembed_VD, old_logp_BT, pos, neg, **common)
        if select_all:
            tau = -math.inf
            selected = valid[neg].clone()
        else:
            exclude = pos if config.anchor_exclude_self and pos.numel() > 1 else None
            s_pos = nthr_token_scores(
                tokens_BT,
                valid,
                hidden_BTD,
                unembed_VD,
                old_logp_BT,
                pos,
                pos,
                exclude_rows_from_matrix=exclude,
                **common,
            )
            sbar = s_pos.sum(1) / valid[pos].sum(1)
            tau = config.beta * float(sbar.min())
            selected = valid[neg] & (s_neg > tau)
        p = group.p
        out.append(
            GroupSelection(
                group=int(g),
                positive_rows=pos.tolist(),
                negative_rows=neg.tolist(),
                p=p,
                eta=nthr_eta(config.eta, p),
                tau=tau,
                scores_NT=s_neg,
                selected_NT=selected,
            )
        )
    return out


def bracket_selected(pieces: list[str], selected: list[bool]) -> str:
    """Concatenate token texts, wrapping each run of selected tokens in ``[...]``."""
    out, inside = [], False
    for piece, chosen in zip(pieces, selected):
        if chosen and not inside:
            out.append("[")
        elif not chosen and inside:
            out.append("]")
        inside = chosen
        out.append(piece)
    if inside:
        out.append("]")
    return "".join(out)
