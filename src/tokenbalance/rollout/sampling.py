"""Drawing the next token from logits: temperature, top-k / top-p truncation and an inverse-CDF draw in float64 that
consumes the same random stream whatever the values. The fast engine draws through :func:`sample_next`, and so does
the tests' full-forward reference sampler, so that their tokens can be compared bit for bit."""

from __future__ import annotations

import torch


def truncate_logits(scores_BV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[B, V] scores with everything outside the top-k, then outside the top-p nucleus, at -inf.

    top-k keeps ties with the k-th best score (like ``transformers``' ``TopKLogitsWarper``); top-p keeps the smallest
    prefix of tokens, most probable first, whose mass reaches ``top_p`` (always at least one token). ``top_k == 0`` /
    ``top_p == 1`` switch a step off."""
    if 0 < top_k < scores_BV.shape[-1]:
        kth_best_B1 = scores_BV.topk(top_k, dim=-1).values[:, -1:]
        scores_BV = scores_BV.masked_fill(scores_BV < kth_best_B1, float("-inf"))
    if top_p < 1.0:
        probs_sorted_BV, order_BV = torch.softmax(scores_BV, dim=-1).sort(dim=-1, descending=True)
        mass_before_BV = probs_sorted_BV.cumsum(dim=-1) - probs_sorted_BV
        keep_BV = torch.empty_like(order_BV, dtype=torch.bool).scatter_(-1, order_BV, mass_before_BV < top_p)
        scores_BV = scores_BV.masked_fill(~keep_BV, float("-inf"))
    return scores_BV


def uniforms(rows: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """[rows, 1] float64 in (0, 1]: the draws :func:`draw` makes for ``rows`` rows."""
    return 1.0 - torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=device)


def draw(probs_BV: torch.Tensor, generator: torch.Generator | None, u_B1: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64: one index per row with probability ``probs / probs.sum()``, by inverse CDF in float64.

    Uses exactly B float64 uniforms from ``generator`` per call whatever the values (every sampler consumes the stream
    identically); ``u`` lies in (0, 1], so the chosen token always has positive probability. ``u_B1``: uniforms drawn
    already (:func:`uniforms`; the compacted loop passes the live rows' ones)."""
    cdf_BV = probs_BV.double().cumsum(dim=-1)
    if u_B1 is None:
        u_B1 = uniforms(probs_BV.shape[0], generator, probs_BV.device)
    return torch.searchsorted(cdf_BV, u_B1 * cdf_BV[:, -1:]).squeeze(1)


def sample_next(
    logits_BV: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    u_B1: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_B int64, logp_B float32)``: one token per row and its log-prob under the processed distribution.

    ``temperature == 0``: argmax, no randomness, ``logp`` = the untempered log-softmax. Otherwise ``logits /
    temperature`` truncated (:func:`truncate_logits`) and drawn by :func:`draw` (always all B rows)."""
    logits_BV = logits_BV.float()
    if temperature == 0:
        token_B = logits_BV.argmax(dim=-1)
        logp_BV = torch.log_softmax(logits_BV, dim=-1)
    else:
        scores_BV = truncate_logits(logits_BV / temperature, top_k, top_p)
        logp_BV = torch.log_softmax(scores_BV, dim=-1)
        token_B = draw(logp_BV.exp(), generator, u_B1)
    return token_B, logp_BV.gather(1, token_B[:, None]).squeeze(1)
