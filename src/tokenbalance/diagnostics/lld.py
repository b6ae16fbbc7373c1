"""Lazy Likelihood Displacement of correct responses (NTHR paper, arXiv 2505.18830, §4): Δ(x) = mean over the correct
responses of a mixed group of [ln π_new(y+|x) - ln π_old(y+|x)]; "LLD" when Δ(x) < epsilon. Used online
(``diagnostics.lld``, the whole step's displacement) and by ``diagnose lld`` (the paper's protocol): docs/metrics.md."""

from __future__ import annotations

import torch


def lld_rows(correct_B: torch.Tensor, group_ids_B: torch.Tensor) -> torch.Tensor:
    """Indices (sorted, int64) of the correct responses that belong to mixed groups."""
    correct_B = correct_B.bool()
    keep = torch.zeros_like(correct_B)
    for g in torch.unique(group_ids_B).tolist():
        members = group_ids_B == g
        n_pos = int((correct_B & members).sum())
        if 0 < n_pos < int(members.sum()):
            keep |= members & correct_B
    return keep.nonzero(as_tuple=True)[0]


def sequence_deltas(
    new_logp_RT: torch.Tensor, old_logp_RT: torch.Tensor, mask_RT: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per response: Σ_t (new - old) over valid tokens, and the same divided by the length (float64)."""
    valid = mask_RT.bool()
    diff = torch.where(
        valid,
        new_logp_RT.detach().double() - old_logp_RT.detach().double(),
        torch.zeros((), dtype=torch.float64, device=new_logp_RT.device),
    )
    total = diff.sum(dim=1)
    return total, total / valid.sum(dim=1).clamp(min=1).double()


def group_deltas(delta_R: torch.Tensor, group_ids_R: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Δ(x) per group: the mean of ``delta_R`` over each group's rows (groups in sorted order)."""
    groups = torch.unique(group_ids_R).tolist()
    return groups, torch.stack([delta_R[group_ids_R == g].mean() for g in groups]) if groups else torch.zeros(
        0, dtype=torch.float64
    )


def lld_stats(
    new_logp_RT: torch.Tensor,
    old_logp_RT: torch.Tensor,
    mask_RT: torch.Tensor,
    group_ids_R: torch.Tensor,
    *,
    epsilon: float = 0.0,
    prefix: str = "diag/lld/",
) -> dict[str, float]:
    """LLD statistics of the correct responses of mixed groups: ``groups``, ``delta_mean``, ``delta_p10``,
    ``delta_p50`` (sequence sums), ``frac_below_eps``, and the token-mean variants ``delta_tok_mean``,
    ``frac_below_eps_tok``; all 0 without a mixed group."""
    keys = ("delta_mean", "delta_p10", "delta_p50", "frac_below_eps", "delta_tok_mean", "frac_below_eps_tok")
    if new_logp_RT.shape[0] == 0:
        return {prefix + "groups": 0.0, **{prefix + k: 0.0 for k in keys}}
    seq_R, tok_R = sequence_deltas(new_logp_RT, old_logp_RT, mask_RT)
    _, seq_X = group_deltas(seq_R, group_ids_R)
    _, tok_X = group_deltas(tok_R, group_ids_R)
    quantiles = torch.quantile(seq_X, torch.tensor([0.1, 0.5], dtype=torch.float64)).tolist()
    return {
        prefix + "groups": float(seq_X.numel()),
        prefix + "delta_mean": float(seq_X.mean()),
        prefix + "delta_p10": quantiles[0],
        prefix + "delta_p50": quantiles[1],
        prefix + "frac_below_eps": float((seq_X < epsilon).double().mean()),
        prefix + "delta_tok_mean": float(tok_X.mean()),
        prefix + "frac_below_eps_tok": float((tok_X < epsilon).double().mean()),
    }
