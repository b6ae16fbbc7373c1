"""Data parallelism through ``torch.distributed``: whole prompt groups per rank, one global normaliser, gradients
summed across ranks, so two ranks compute exactly the update one process computes on the union of their batches
(docs/training.md, "Data parallel").

    torchrun --nproc_per_node 2 -m tokenbalance.cli train ...   # gloo on CPU, NCCL on GPU"""

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


def gather_keys(keys, ctx: DistContext) -> list[str]:
    """The sorted union of every rank's ``keys`` (no newlines), by plain tensor collectives on ``ctx.device`` (not
    ``all_gather_object``, which on NCCL needs ``torch.cuda.set_device`` per rank)."""
    local = sorted(set(keys))
    if not ctx.enabled:
        return local
    payload = "\n".join(local).encode("utf-8")
    length = torch.tensor([len(payload)], dtype=torch.int64, device=ctx.device)
    lengths = [torch.zeros_like(length) for _ in range(ctx.world_size)]
    dist.all_gather(lengths, length)
    longest = max(int(n) for n in lengths)
    if longest == 0:
        return []
    data = torch.zeros(longest, dtype=torch.int32, device=ctx.device)
    data[: len(payload)] = torch.tensor(list(payload), dtype=torch.int32, device=ctx.device)
    chunks = [torch.zeros_like(data) for _ in range(ctx.world_size)]
    dist.all_gather(chunks, data)
    union: set[str] = set()
    for chunk, n in zip(chunks, lengths):
        text = bytes(chunk[: int(n)].tolist()).decode("utf-8")
        union.update(key for key in text.split("\n") if key)
    return sorted(union)


def mean_over_ranks(values: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Average scalar metrics over the ranks that report them (keys may differ: ``pass/<name>/*`` exist only where a
    rank had that pass's tokens). The key union is gathered first, then each key's sum and count all-reduced in one
    vector, so every rank makes the same calls; every rank must call this, also with no metrics."""
    if not ctx.enabled:
        return values
    keys = gather_keys(values, ctx)
    if not keys:
        return {}
    rows = [(float(values[k]), 1.0) if k in values else (0.0, 0.0) for k in keys]
    tensor = torch.tensor(rows, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return {k: total / count for k, (total, count) in zip(keys, tensor.tolist())}


def min_over_ranks(value: int, ctx: DistContext) -> int:
    """The smallest of the ranks' integers (every rank gets it)."""
    if not ctx.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()
