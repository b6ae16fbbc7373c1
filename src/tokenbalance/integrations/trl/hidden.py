"""Last-layer hidden states captured from TRL's training forward, for NTHR.

A forward hook on the decoder (``model.base_model``) sees the hidden states of exactly the forward
whose log-probs enter the loss, so NTHR needs no extra forward pass. Completion token t is predicted
by ``hidden[:, L - T - 1 + t]``: :func:`completion_hidden` takes ``hidden_BLD[:, -T-1:-1]``.
docs/trl.md, "NTHR's hidden states", has the rest.
"""

from __future__ import annotations

import torch


def completion_hidden(hidden_BLD: torch.Tensor, num_completion_tokens: int) -> torch.Tensor:
    """[B, T, D]: the hidden states at the positions that predict the last ``T`` tokens of each row."""
    T = num_completion_tokens
    if hidden_BLD.dim() != 3 or hidden_BLD.shape[1] < T + 1:
        raise ValueError(f"hidden_BLD: expected [B, L >= {T + 1}, D], got {list(hidden_BLD.shape)}")
    return hidden_BLD[:, -T - 1 : -1]
