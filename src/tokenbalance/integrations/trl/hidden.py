"""Last-layer hidden states captured from TRL's training forward, for NTHR.

TRL computes per-token log-probs with a fused LM head (``trl.trainer.utils.add_fused_lm_head``):
``model(..., fused_lm_head=True)`` runs ``model.base_model`` (the decoder, whose output is the
final-norm hidden state that ``lm_head`` reads) and projects only the scored positions. A forward
hook on that decoder sees the [B, L, D] hidden states of exactly the forward whose log-probs enter
the loss, so NTHR needs no extra forward pass. The hook stores them detached and is removed on exit.

Position alignment: the fused head scores ``hidden[:, :-1]`` against ``labels[:, 1:]`` and TRL keeps
the last ``T`` = ``logits_to_keep`` columns, so completion token t is predicted by
``hidden[:, L - T - 1 + t]``: :func:`completion_hidden` takes ``hidden_BLD[:, -T-1:-1]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output ``last_hidden_state`` feeds ``lm_head`` (``model.base_model``).

    ``model`` is the unwrapped ``PreTrainedModel`` (a PEFT model is unwrapped to its base first).
    Raises ``ValueError`` when the model has no separate decoder (NTHR cannot read its hidden states).
    """
    if hasattr(model, "get_base_model"):  # PEFT
        model = model.get_base_model()
    decoder = getattr(model, "base_model", None)
    if decoder is None or decoder is model:
        raise ValueError(
            f"{type(model).__name__} has no separate decoder (model.base_model); NTHR needs the "
            "last-layer hidden states that feed lm_head"
        )
    return decoder


@contextmanager
def capture_last_hidden(model: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, every forward of ``model``'s decoder stores ``store["hidden_BLD"]`` (detached)."""
    store: dict[str, torch.Tensor] = {}

    def keep_hidden(_module, _args, output) -> None:
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        store["hidden_BLD"] = hidden.detach()

    handle = decoder_of(model).register_forward_hook(keep_hidden)
    try:
        yield store
    finally:
        handle.remove()


def completion_hidden(hidden_BLD: torch.Tensor, num_completion_tokens: int) -> torch.Tensor:
    """[B, T, D]: the hidden states at the positions that predict the last ``T`` tokens of each row."""
    T = num_completion_tokens
    if hidden_BLD.dim() != 3 or hidden_BLD.shape[1] < T + 1:
        raise ValueError(f"hidden_BLD: expected [B, L >= {T + 1}, D], got {list(hidden_BLD.shape)}")
    return hidden_BLD[:, -T - 1 : -1]
