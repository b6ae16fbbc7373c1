"""The TRL subclass (``TokenBalanceGRPOTrainer``) trains 2 generation batches on the device: in
float32, and with TRL's bfloat16 autocast (``bf16=True``, the usual GPU setting) for GRPO, Lopti
(two optimizer passes per batch) and NTHR (hidden states from the training forward).

As ``python -m tokenbalance.integrations.trl.smoke``, with the device chosen explicitly: TRL
generates, scores with the parity task (:class:`~tests.cuda.helpers.ParityTask` through
``TaskReward``: mixed groups and correct responses on a random policy) and steps; the weights move
and stay on the device. TRL is imported inside the test, so collecting this file needs no TRL.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.cuda

RUNS = [
    ("grpo", "float32"),
    ("grpo", "bfloat16-autocast"),
    ("lopti@lopti.eta=0.002", "bfloat16-autocast"),  # both passes hold tokens on a random policy
    ("nthr@nthr.beta=0", "bfloat16-autocast"),  # beta = 0: selects tokens on a random policy
]


@pytest.mark.parametrize("spec, precision", RUNS, ids=[f"{s.split('@')[0]}-{p}" for s, p in RUNS])
def test_trl_subclass_trains_two_steps(policy_dir, parity_task, device, tmp_path, monkeypatch, spec, precision):
    from tokenbalance.integrations.trl import TaskReward, build_grpo_trainer, task_prompt_dataset
    from tokenbalance.integrations.trl.config import pass_count
    from tokenbalance.integrations.trl.smoke import OFFLINE_ENV, method_from_spec
    from tokenbalance.models import load_policy

    for key, value in OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    method = method_from_spec(spec)
    passes, steps = pass_count(method), 2
    _, tokenizer = load_policy(policy_dir)
    trainer = build_grpo_trainer(
        str(policy_dir),
        tokenizer=tokenizer,
        train_dataset=task_prompt_dataset(2 * steps, task=parity_task, difficulty=2, template="compact"),
        reward_funcs=TaskReward(tokenizer, task=parity_task),
        method=method,
        group_size=4,
        prompts_per_step=2,
        max_completion_length=16,
        output_dir=str(tmp_path / "trl"),
        max_steps=steps * passes,
        learning_rate=1e-2,
        seed=0,
        shuffle_dataset=False,
        use_cpu=device.type == "cpu",
        bf16=precision == "bfloat16-autocast",
    )
    policy = trainer.accelerator.unwrap_model(trainer.model)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainer.train()

    assert {p.device.type for p in policy.parameters()} == {device.type}
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # autocast keeps float32 master weights
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == steps * passes
    assert len(logged) == steps * passes
    assert all(math.isfinite(entry["loss"]) and math.isfinite(entry["grad_norm"]) for entry in logged)
    assert any(entry.get("reward_std", 0) > 0 for entry in logged)  # mixed groups: nonzero advantages
    if method.name == "lopti":  # two passes per batch, both holding tokens
        assert [entry.get("lopti/pass_index") for entry in logged] == [0.0, 1.0] * steps
        assert all(0 < entry["lopti/low_token_frac"] < 1 for entry in logged)
    if method.name == "nthr":  # its weights came from the hidden states of the training forward
        assert any(entry.get("nthr/mixed_groups", 0) > 0 for entry in logged)
    change = sum(float((p.detach() - before[n]).double().pow(2).sum()) for n, p in policy.named_parameters())
    assert change > 0 and all(torch.isfinite(p).all() for p in policy.parameters())
