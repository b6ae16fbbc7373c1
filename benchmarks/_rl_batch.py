"""One realistic RL batch of the embedded default: the SFT-warmed tiny policy, 16 K&K prompts x 8.

Uses the embedded policy from the cache (building it first, ~1-2 min, if absent) and the trainer's
own rollout and packing, so the benchmarks time exactly the tensors a training step sees. With a
``shape`` other than ``"embedded"``, a policy of that shape with random weights instead
(``benchmarks/_shapes.py``), on ``device`` in ``dtype``.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _shapes import random_policy_dir
from tokenbalance.config import RunConfig
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.embedded import ensure_embedded_policy
from tokenbalance.trainer.logprobs import PackedSequences
from tokenbalance.trainer.loop import TrainerParts, prepare_training, rollout


@dataclass
class RLBatch:
    parts: TrainerParts
    packed: PackedSequences
    mask_BT: torch.Tensor
    scores_B: torch.Tensor
    group_ids_B: torch.Tensor
    initial_state: dict


def embedded_batch(
    step: int = 0,
    config: RunConfig | None = None,
    *,
    shape: str = "embedded",
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> RLBatch:
    config = config or RunConfig()
    config.output.progress = False
    config.model.dtype = str(dtype).removeprefix("torch.")
    device = device or torch.device("cpu")
    if shape == "embedded":
        path = ensure_embedded_policy(config, device=torch.device("cpu"), progress=False, log=lambda *_: None)
    else:
        path = random_policy_dir(shape, Path(tempfile.mkdtemp(prefix="tokenbalance-bench-policy-")), dtype)
    policy, tokenizer = load_policy(path, device=device, dtype=dtype)
    run_dir = Path(tempfile.mkdtemp(prefix="tokenbalance-bench-"))
    parts = prepare_training(config, run_dir, policy, tokenizer, device, DistContext(device=device))
    batch, _, _ = rollout(parts, step)
    return RLBatch(
        parts, batch.packed, batch.mask_BT, batch.rewards_B, batch.group_ids_B, copy.deepcopy(policy.state_dict())
    )
