"""One RL step of every method preset on the device, float32 and bfloat16: finite loss, the
weights move (through the gradient: weight decay is off), everything stays on the device.

The trainer's own parts (``prepare_training`` + ``rl_step``, as ``tokenbalance train`` runs them),
the rollout engine ``auto`` picks for the device, and a reward that varies on a random policy
(``data.task=gpu_check_parity``: :class:`~tests.cuda.helpers.ParityTask`), so that the advantages
are nonzero and NTHR has correct responses to anchor on.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.cuda.helpers import step_config, synchronize
from tokenbalance.algorithms.presets import METHOD_PRESETS
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.loop import prepare_training, rl_step

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", METHOD_PRESETS.names())
def test_every_preset_takes_one_rl_step(policy_dir, parity_task, device, tmp_path, name, dtype):
    config = step_config(policy_dir, device, dtype, name)
    policy, tokenizer = load_policy(policy_dir, device=str(device), dtype=getattr(torch, dtype))
    parts = prepare_training(config, tmp_path, policy, tokenizer, device, DistContext(device=device))
    before = {key: value.detach().clone() for key, value in policy.named_parameters()}

    metrics = rl_step(parts, 0)
    synchronize(device)

    assert math.isfinite(metrics["loss/total"]) and math.isfinite(metrics["optim/grad_norm"])
    assert metrics["optim/grad_norm"] > 0
    assert metrics["reward/mixed_group_frac"] > 0
    moved = [key for key, value in policy.named_parameters() if not torch.equal(value.detach(), before[key])]
    assert len(moved) == len(before), f"parameters left unchanged: {sorted(set(before) - set(moved))}"
    assert all(torch.isfinite(value).all() for value in policy.parameters())
    assert {(p.device.type, p.dtype) for p in policy.parameters()} == {(device.type, getattr(torch, dtype))}
