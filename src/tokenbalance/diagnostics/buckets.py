"""Token statistics by probability bucket (AR-Lopti paper, Figure 1 a-b and Figure 3).

Tokens go by old-policy probability p at the log-prob temperature into ``edges[b] <= p < edges[b + 1]`` (p == 1 in the
last), or equal-count buckets (``bucket_mode="quantile"``). Pure functions of tensors; keys, edges and differences
from the paper: docs/metrics.md ("Diagnostics")."""

from __future__ import annotations

import torch

from tokenbalance.checks import check_range
from tokenbalance.diagnostics.edges import (  # noqa: F401 - re-exported
    BUCKET_MODES,
    DEFAULT_EDGES,
    EDGES_NAME,
    check_bucket_edges,
    interval_label,
    parse_edges,
)


def quantile_edges(prob_N: torch.Tensor, num_buckets: int) -> tuple[float, ...]:
    """Edges 0, q(1/n), ..., q((n-1)/n), 1 of the probabilities ``prob_N`` (equal-count buckets).

    Ties can make two interior edges equal (an empty bucket); with no tokens the edges are uniform."""
    check_range("num_buckets", num_buckets, 1, integer=True)
    if prob_N.numel() == 0:
        return tuple(i / num_buckets for i in range(num_buckets + 1))
    levels = torch.arange(1, num_buckets, dtype=torch.float64) / num_buckets
    inner = torch.quantile(prob_N.detach().double().flatten(), levels).clamp(0.0, 1.0).tolist()
    return (0.0, *inner, 1.0)


def bucket_index(prob_BT: torch.Tensor, edges) -> torch.Tensor:
    """Bucket of each probability: b with edges[b] <= p < edges[b+1]; p >= 1 in the last bucket (int64)."""
    inner = torch.tensor(list(edges)[1:-1], dtype=torch.float64, device=prob_BT.device)
    return torch.bucketize(prob_BT.detach().double(), inner, right=True)


def bucket_masks(old_logp_BT: torch.Tensor, mask_BT: torch.Tensor, edges) -> list[torch.Tensor]:
    """One [B, T] bool mask per bucket (valid tokens only); disjoint, and their union is ``mask_BT``."""
    valid_BT = mask_BT.bool()
    prob_BT = torch.exp(torch.where(valid_BT, old_logp_BT.detach(), torch.zeros_like(old_logp_BT)))
    index_BT = bucket_index(prob_BT, edges)
    return [valid_BT & (index_BT == b) for b in range(len(edges) - 1)]


def step_edges(old_logp_BT: torch.Tensor, mask_BT: torch.Tensor, edges, mode: str = "fixed") -> tuple[float, ...]:
    """The edges a step uses: ``edges`` (``mode="fixed"``) or the step's equal-count quantile edges."""
    edges = check_bucket_edges(edges)
    if mode not in BUCKET_MODES:
        raise ValueError(f"diagnostics.bucket_mode: unknown value {mode!r}; valid: {', '.join(BUCKET_MODES)}")
    if mode == "quantile":
        return quantile_edges(torch.exp(old_logp_BT.detach()[mask_BT.bool()]), len(edges) - 1)
    return edges


def bucket_shares(
    old_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    values: dict[str, torch.Tensor],
    edges=DEFAULT_EDGES,
    *,
    mode: str = "fixed",
    prefix: str = "diag/",
) -> dict[str, float]:
    """Each bucket's share of the sum over valid tokens of each per-token quantity in ``values`` (name -> [B, T]
    non-negative, e.g. ``{"grad_share": logit_grad_sq_BT}``; ``mask_BT`` itself gives the token share), buckets by
    ``old_logp_BT``; ``edges``, ``mode`` as :func:`bucket_token_stats`. ``{prefix}bucket{b}/{name}`` (float64 sums)
    add up to 1, or are all NaN when the total is 0."""
    valid_BT = mask_BT.bool()
    edges = step_edges(old_logp_BT, valid_BT, edges, mode)
    index_BT = bucket_index(
        torch.exp(torch.where(valid_BT, old_logp_BT.detach(), torch.zeros_like(old_logp_BT))), edges
    )
    index_N = index_BT[valid_BT]
    buckets = len(edges) - 1
    metrics: dict[str, float] = {}
    for name, values_BT in values.items():
        values_N = values_BT.detach()[valid_BT].double()
        sums = torch.zeros(buckets, dtype=torch.float64, device=values_N.device).index_add_(0, index_N, values_N)
        total = float(sums.sum())
        shares = (sums / total).tolist() if total > 0 else [float("nan")] * buckets
        for b, share in enumerate(shares):
            metrics[f"{prefix}bucket{b}/{name}"] = share
    return metrics


def _mean(values_BT: torch.Tensor | None, select_BT: torch.Tensor) -> float:
    """Mean of ``values`` over ``select``; NaN when nothing is selected (an empty bucket has no mean)."""
    count = int(select_BT.sum())
    if values_BT is None or count == 0:
        return float("nan")
    return float(values_BT.detach()[select_BT].double().sum()) / count


def bucket_token_stats(
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    edges=DEFAULT_EDGES,
    *,
    clipped_BT: torch.Tensor | None = None,
    entropy_BT: torch.Tensor | None = None,
    mode: str = "fixed",
    prefix: str = "diag/",
) -> dict[str, float]:
    """Per-bucket token share, mean advantage, clip fraction and entropy, also split by sign(A).

    Args:
        old_logp_BT: [B, T] old-policy log-probs at the log-prob temperature (defines p).
        advantages_BT: [B, T] the advantages the update used (after AR / NTHR weights).
        edges: bucket edges covering [0, 1] (:func:`check_bucket_edges`); mode: ``"fixed"`` or ``"quantile"``.
        clipped_BT: [B, T] bool, where the PPO clip acted (optional); entropy_BT: old-policy entropy (optional).

    Returns:
        Under ``{prefix}bucket{b}/``: ``lo``, ``hi``, ``token_frac`` (of all valid tokens), ``adv_mean``,
        ``clip_frac``, ``entropy``, and the same four under ``pos/`` and ``neg/`` (A > 0 / A < 0; ``token_frac`` still
        of *all* valid tokens). Means over an empty set are NaN; missing inputs give no key."""
    valid_BT = mask_BT.bool()
    edges = step_edges(old_logp_BT, valid_BT, edges, mode)
    total = int(valid_BT.sum())
    adv_BT = advantages_BT.detach()
    signs = {"": valid_BT, "pos/": valid_BT & (adv_BT > 0), "neg/": valid_BT & (adv_BT < 0)}
    clipped = None if clipped_BT is None else clipped_BT.detach().double()
    metrics: dict[str, float] = {}
    for b, in_bucket_BT in enumerate(bucket_masks(old_logp_BT, valid_BT, edges)):
        key = f"{prefix}bucket{b}/"
        metrics[key + "lo"] = float(edges[b])
        metrics[key + "hi"] = float(edges[b + 1])
        for sign, sign_BT in signs.items():
            select_BT = in_bucket_BT & sign_BT
            metrics[key + sign + "token_frac"] = int(select_BT.sum()) / total if total else 0.0
            metrics[key + sign + "adv_mean"] = _mean(adv_BT, select_BT)
            if clipped is not None:
                metrics[key + sign + "clip_frac"] = _mean(clipped, select_BT)
            if entropy_BT is not None:
                metrics[key + sign + "entropy"] = _mean(entropy_BT, select_BT)
    return metrics


def probability_change_stats(
    old_logp_BT: torch.Tensor,
    new_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    edges=DEFAULT_EDGES,
) -> list[dict[str, float | str]]:
    """Δp = exp(new) - exp(old) per bucket of the *old* probability (Figure 1 c/e/f, Figure 3): per bucket
    ``interval``, ``tokens``, ``dp_mean``, ``dp_p10/p50/p90``, ``pos_tokens``, ``pos_up_frac`` (A > 0 tokens whose
    probability rose: the paper's "correct ratio"), ``neg_tokens``, ``neg_down_frac``; NaN where a set is empty."""
    edges = check_bucket_edges(edges)
    valid_BT = mask_BT.bool()
    dp_BT = torch.exp(new_logp_BT.detach().double()) - torch.exp(old_logp_BT.detach().double())
    adv_BT = advantages_BT.detach()
    rows = []
    for b, in_bucket_BT in enumerate(bucket_masks(old_logp_BT, valid_BT, edges)):
        dp_N = dp_BT[in_bucket_BT]
        pos_N = dp_BT[in_bucket_BT & (adv_BT > 0)]
        neg_N = dp_BT[in_bucket_BT & (adv_BT < 0)]
        quantiles = (
            torch.quantile(dp_N, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
            if dp_N.numel()
            else [float("nan")] * 3
        )
        rows.append(
            {
                "interval": interval_label(edges, b),
                "tokens": int(dp_N.numel()),
                "dp_mean": float(dp_N.mean()) if dp_N.numel() else float("nan"),
                "dp_p10": quantiles[0],
                "dp_p50": quantiles[1],
                "dp_p90": quantiles[2],
                "pos_tokens": int(pos_N.numel()),
                "pos_up_frac": float((pos_N > 0).double().mean()) if pos_N.numel() else float("nan"),
                "neg_tokens": int(neg_N.numel()),
                "neg_down_frac": float((neg_N < 0).double().mean()) if neg_N.numel() else float("nan"),
            }
        )
    return rows
