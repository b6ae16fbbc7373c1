"""Last-layer hidden states from a host trainer's own forward, for NTHR (TRL and verl).

NTHR needs the hidden state that ``lm_head`` reads (after the final norm) at every response
position. A host trainer computes it in a forward it already runs; a forward hook on the
decoder (``model.base_model``, e.g. ``LlamaModel``) stores it there, so no second forward is
needed. Torch only (no host import): the TRL subclass (:mod:`.trl.hidden`) and the verl worker
(:mod:`.verl.nthr_worker`) both use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output ``last_hidden_state`` feeds ``lm_head`` (``model.base_model``).

    ``model`` is the unwrapped ``PreTrainedModel`` (a PEFT model is unwrapped to its base first;
    an FSDP2-sharded model is the model itself). Raises ``ValueError`` when the model has no
    separate decoder (NTHR cannot read its hidden states).
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
