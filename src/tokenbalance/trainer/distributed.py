"""Data parallelism through ``torch.distributed``: whole prompt groups per rank, one global
normaliser, gradients summed across ranks.

Each rank generates, scores and scores log-probs for its own prompts (whole groups, so group
statistics never cross ranks). The loss denominators (:class:`~tokenbalance.types.LossNormaliser`)
are summed over ranks before the backward pass and the gradients are summed after it, so two
ranks compute exactly the update one process computes on the union of their batches.

    torchrun --nproc_per_node 2 -m tokenbalance.cli train ...   # gloo on CPU, NCCL on GPU
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tokenbalance.types import LossNormaliser


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")  # where collectives run (NCCL needs CUDA tensors)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> DistContext:
    """Join the process group torchrun describes (env ``WORLD_SIZE`` > 1), else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(device=device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


def sum_normaliser(normaliser: LossNormaliser, ctx: DistContext) -> LossNormaliser:
    if not ctx.enabled:
        return normaliser
    values = torch.tensor([normaliser.policy, normaliser.regulariser], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return LossNormaliser(float(values[0]), float(values[1]))


def sum_gradients(parameters, ctx: DistContext, *, scale: float = 1.0) -> None:
    """All-reduce (sum) every gradient in place, then multiply by ``scale``."""
    if not ctx.enabled:
        return
    for param in parameters:
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            if scale != 1.0:
                param.grad.mul_(scale)


def mean_over_ranks(values: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Average scalar metrics over ranks (same keys on every rank)."""
    if not ctx.enabled or not values:
        return values
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return {k: float(v) / ctx.world_size for k, v in zip(keys, tensor.tolist())}


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()
