"""The actor worker of the NTHR trainer: verl's own, whose old-log-prob forward also keeps hidden states.

:class:`NTHRActorRolloutRefWorker` subclasses verl 0.9.1's ``ActorRolloutRefWorker``: when the batch
asks (``NTHR_HIDDEN_KEY``), ``compute_log_prob`` runs verl's own with a decoder hook and
:class:`HiddenCollector` as the loss function of that call, which adds the response hidden states to
verl's model output; ``nthr_output_layer`` returns the old policy's ``lm_head`` from global rank 0.
No second forward, no change inside verl. What it relies on in verl 0.9.1 and the launches :mod:`.nthr`
refuses: docs/verl.md, "NTHR on verl".
"""

from __future__ import annotations

from typing import Any

import torch
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_from_nested

from tokenbalance.integrations.hidden import capture_last_hidden
from tokenbalance.integrations.verl.names import NTHR_HIDDEN_FIELD, NTHR_HIDDEN_KEY


def response_hidden(hidden: torch.Tensor, micro_batch) -> torch.Tensor:
    """Jagged ``[b, response, D]``: the hidden states at the positions that predict each response token.

    ``hidden`` is the decoder output of verl's forward of ``micro_batch``: packed ``[1, tokens(+pad),
    D]`` with ``use_remove_padding`` (the static pad at the end is dropped), else right-padded
    ``[b, longest, D]``. Position ``prompt + t - 1`` predicts response token ``t``, the alignment
    verl's ``response_from_nested`` gives the log-probs.
    """
    input_ids = micro_batch["input_ids"]
    offsets = input_ids.offsets()
    total = int(offsets[-1])
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        if hidden.shape[0] != 1 or hidden.shape[1] < total:
            raise ValueError(f"hidden: expected packed [1, >= {total}, D], got {list(hidden.shape)}")
        values = hidden[0, :total]
    else:
        values = torch.cat([hidden[row, :length] for row, length in enumerate(offsets.diff().tolist())])
    full = torch.nested.nested_tensor_from_jagged(values, offsets)
    return response_from_nested(full, micro_batch["response_mask"])


def full_output_layer(model: torch.nn.Module) -> torch.nn.Linear:
    """The model's output layer with its full weight (and bias) on the CPU, no gradient.

    Under FSDP2 the parameters are ``DTensor`` shards: ``full_tensor()`` gathers them, a
    collective every rank must join (the collector calls it once, at the first micro-batch, which
    every rank runs).
    """
    from torch.distributed.tensor import DTensor

    def whole(tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None:
            return None
        tensor = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        return tensor.detach().to("cpu", copy=True)

    head = model.get_output_embeddings()
    weight, bias = whole(head.weight), whole(getattr(head, "bias", None))
    assert weight is not None
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = torch.nn.Parameter(bias, requires_grad=False)
    return layer


class HiddenCollector:
    """A verl loss function for one inference call that adds the response hidden states to the output.

    Called by verl's engine after each micro-batch's forward, with the decoder output the hook
    stored in ``store``; moves it to the CPU at once (the model's dtype), so the accelerator holds
    one micro-batch of it at a time. Returns a zero loss and no metrics.
    """

    def __init__(self, model: torch.nn.Module, store: dict[str, torch.Tensor]) -> None:
        self.model = model
        self.store = store
        self.output_layer: torch.nn.Linear | None = None

    def __call__(self, model_output: dict[str, Any], data, dp_group=None) -> tuple[torch.Tensor, dict]:
        hidden = self.store.pop("hidden_BLD", None)
        if hidden is None:
            raise RuntimeError("NTHR: the decoder hook saw no forward for this micro-batch")
        model_output[NTHR_HIDDEN_FIELD] = response_hidden(hidden, data).cpu()
        if self.output_layer is None:
            self.output_layer = full_output_layer(self.model)
        return torch.zeros((), device=hidden.device), {}


class NTHRActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor / rollout / reference worker; the old-log-prob forward also returns hidden states."""

    nthr_output: torch.nn.Linear | None = None

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data):
        if not tu.pop(data, key=NTHR_HIDDEN_KEY, default=False):
            return super().compute_log_prob(data)
        engine = self.actor.engine
        if getattr(engine, "use_ulysses_sp", False):
            raise ValueError("NTHR: the hidden states of a sequence are split over Ulysses ranks; set its size to 1")
        loss_fn = self.actor.loss_fn
        with capture_last_hidden(engine.module) as store:
            collector = HiddenCollector(engine.module, store)
            tu.assign_non_tensor(data, compute_loss=True)  # verl's infer_batch then calls the actor's loss_fn
            self.actor.loss_fn = collector
            try:
                output = super().compute_log_prob(data)
            finally:
                self.actor.loss_fn = loss_fn
        self.nthr_output = collector.output_layer if torch.distributed.get_rank() == 0 else None
        return output

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nthr_output_layer(self) -> torch.nn.Linear | None:
        """The old policy's output layer from the last NTHR old-log-prob call (global rank 0; else None)."""
        return self.nthr_output


def use_nthr_worker(role_worker_mapping: dict) -> None:
    """Put :class:`NTHRActorRolloutRefWorker` in place of verl's actor worker (whichever role holds it)."""
    import ray
    from verl.trainer.ppo.utils import Role

    for role in (Role.Actor, Role.ActorRolloutRef, Role.ActorRollout):
        if role in role_worker_mapping:
            role_worker_mapping[role] = ray.remote(NTHRActorRolloutRefWorker)
            return
    raise ValueError(f"NTHR: no actor worker in verl's role map {sorted(map(str, role_worker_mapping))}")
