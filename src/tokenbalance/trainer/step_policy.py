"""The trainer's side of :class:`tokenbalance.diagnostics.step.PolicyAccess`: the policy's log-probs on rows of one
step's batch, and the data-parallel reductions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenbalance.trainer.distributed import DistContext, sum_gradients, sum_normaliser
from tokenbalance.trainer.logprobs import (
    PackedSequences,
    batched_response_logprobs,
    response_logprobs,
)
from tokenbalance.trainer.precision import PLAIN_FORWARD, ForwardSettings
from tokenbalance.types import LossNormaliser


@dataclass(frozen=True)
class StepPolicy:
    """The policy seen by one step's diagnostics: log-probs of rows of the batch and the data-parallel reductions."""

    policy: torch.nn.Module
    packed: PackedSequences
    temperature: float
    micro_batch_rows: int
    ctx: DistContext
    forward_settings: ForwardSettings = PLAIN_FORWARD  # the forwards' precision and chunks, as the update's

    def logp(self, rows_R: torch.Tensor | slice) -> torch.Tensor:
        packed = self.packed.rows(rows_R)
        if torch.is_grad_enabled():
            return response_logprobs(
                self.policy, packed, temperature=self.temperature, forward_settings=self.forward_settings
            ).logp_BT
        return batched_response_logprobs(
            self.policy,
            packed,
            temperature=self.temperature,
            micro_batch=self.micro_batch_rows,
            forward_settings=self.forward_settings,
        ).logp_BT

    def sum_gradients(self, params: list) -> None:
        sum_gradients(params, self.ctx)

    def sum_normaliser(self, normaliser: LossNormaliser) -> LossNormaliser:
        return sum_normaliser(normaliser, self.ctx)
