"""A checkpoint written on the device resumes on the CPU, and one written on the CPU resumes on the
device: the weights and the optimizer state arrive bit for bit, on the device that loads them, and
a run moved between devices (``tokenbalance train --resume --device ...``) keeps every step."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.cuda.helpers import step_config
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models import load_policy
from tokenbalance.trainer.checkpoint import load_trainer_state, save_checkpoint
from tokenbalance.trainer.runner import run_training

pytestmark = pytest.mark.cuda

CPU = torch.device("cpu")


def trained(policy_dir, device, dtype, seed):
    """The policy on ``device`` and an AdamW with state after one step on a loss of its logits."""
    policy, tokenizer = load_policy(policy_dir, device=str(device), dtype=dtype)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    ids = torch.randint(4, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(seed)).to(device)
    policy.train()
    policy(ids).logits.float().logsumexp(-1).mean().backward()
    optimizer.step()
    return policy, tokenizer, optimizer


def reload(checkpoint, device, dtype):
    policy, _ = load_policy(checkpoint / "model", device=str(device), dtype=dtype)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    state = load_trainer_state(checkpoint, optimizer)
    return policy, optimizer, state


def assert_same_state(policy, optimizer, saved_policy, saved_optimizer, device):
    for (name, value), saved in zip(policy.named_parameters(), saved_policy.parameters()):
        assert value.device.type == device.type, name
        assert value.dtype == saved.dtype and torch.equal(value.detach().cpu(), saved.detach().cpu()), name
    for param, saved_param in zip(policy.parameters(), saved_policy.parameters()):
        state, saved = optimizer.state[param], saved_optimizer.state[saved_param]
        assert set(state) == set(saved)
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[key].device.type == device.type
            assert torch.equal(state[key].cpu(), saved[key].cpu())
        assert float(state["step"]) == float(saved["step"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_checkpoint_moves_between_the_device_and_the_cpu_bit_for_bit(policy_dir, device, tmp_path, dtype):
    policy, tokenizer, optimizer = trained(policy_dir, device, dtype, seed=0)
    first = save_checkpoint(tmp_path, 1, policy, tokenizer, optimizer, {"seed": 0})
    on_cpu, cpu_optimizer, state = reload(first, CPU, dtype)
    assert state["step"] == 1
    assert_same_state(on_cpu, cpu_optimizer, policy, optimizer, CPU)

    on_cpu.train()  # a step on the CPU, saved there, loaded back on the device
    ids = torch.randint(4, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(1))
    on_cpu(ids).logits.float().logsumexp(-1).mean().backward()
    cpu_optimizer.step()
    second = save_checkpoint(tmp_path, 2, on_cpu, tokenizer, cpu_optimizer, {"seed": 0})
    back, back_optimizer, state = reload(second, device, dtype)
    assert state["step"] == 2
    assert_same_state(back, back_optimizer, on_cpu, cpu_optimizer, device)


def test_a_run_resumes_on_the_cpu_and_back_on_the_device(policy_dir, parity_task, device, tmp_path):
    run_dir = tmp_path / "run"

    def sitting(on: torch.device, steps: int, resume: bool):
        config = step_config(policy_dir, on, "float32", "ar_lopti", f"train.steps={steps}")
        config.output.run_dir = str(run_dir)
        run_training(config, run_dir=run_dir, resume=resume, log=lambda *_: None)
        state = json.loads((run_dir / "run_state.json").read_text())
        assert state["status"] == "completed" and state["step"] == steps
        return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]

    sitting(device, 1, resume=False)  # checkpoint step 1 written from the device
    sitting(CPU, 2, resume=True)  # resumed on the CPU: checkpoint step 2 written from the CPU
    train = sitting(device, 3, resume=True)  # and back on the device
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(math.isfinite(r["loss/total"]) and r["optim/grad_norm"] > 0 for r in train)
    trained_policy, _ = load_policy(run_dir / "checkpoints" / "step_000003" / "model")
    initial, _ = load_policy(policy_dir)
    assert any(not torch.equal(a, b) for a, b in zip(trained_policy.parameters(), initial.parameters()))
