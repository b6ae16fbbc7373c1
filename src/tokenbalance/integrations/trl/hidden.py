"""Last-layer hidden states captured from TRL's training forward, for NTHR.

TRL computes per-token log-probs with a fused LM head (``trl.trainer.utils.add_fused_lm_head``):
``model(..., fused_lm_head=True)`` runs ``model.base_model`` (the decoder, whose output is the
final-norm hidden state that ``lm_head`` reads) and projects only the scored positions. A forward
hook on that decoder sees the [B, L, D] hidden states of exactly the forward whose log-probs enter
the loss, so NTHR needs no extra forward pass. The hook (:mod:`tokenbalance.integrations.hidden`,
shared with the verl worker) stores them detached and is removed on exit.

Position alignment: the fused head scores ``hidden[:, :-1]`` against ``labels[:, 1:]`` and TRL keeps
the last ``T`` = ``logits_to_keep`` columns, so completion token t is predicted by
``hidden[:, L - T - 1 + t]``: :func:`completion_hidden` takes ``hidden_BLD[:, -T-1:-1]``.
"""

from __future__ import annotations

import torch


def completion_hidden(hidden_BLD: torch.Tensor, num_completion_tokens: int) -> torch.Tensor:
    """[B, T, D]: the hidden states at the positions that predict the last ``T`` tokens of each row."""
    T = num_completion_tokens
    if hidden_BLD.dim() != 3 or hidden_BLD.shape[1] < T + 1:
        raise ValueError(f"hidden_BLD: expected [B, L >= {T + 1}, D], got {list(hidden_BLD.shape)}")
    return hidden_BLD[:, -T - 1 : -1]
