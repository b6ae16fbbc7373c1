"""tokenbalance methods inside TRL's ``GRPOTrainer`` (AR, TR-GRPO, Lopti, NTHR), no fork.

    from tokenbalance.integrations.trl import TokenBalanceGRPOTrainer, grpo_config_for_method, TaskReward
    args = grpo_config_for_method("ar_lopti", output_dir="runs/trl", num_generations=8,
                                  per_device_train_batch_size=8, max_completion_length=1024)
    trainer = TokenBalanceGRPOTrainer("Qwen/Qwen2.5-3B-Instruct", TaskReward(tokenizer), args,
                                      method="ar_lopti", train_dataset=dataset)
    trainer.train()

Modules: ``config`` (Method -> GRPOConfig fields, refusals), ``passes`` (our token stages on TRL's
advantages), ``hidden`` (NTHR's hidden states from the training forward), ``trainer`` (the
subclass), ``rewards`` (K&K reward function + dataset), ``build`` (a trainer with our sampling
settings, for benchmarks), ``smoke`` (the CPU / 2-process end-to-end run). docs/trl.md has the rest.

Importing this package checks the installed TRL version first
(:func:`tokenbalance.integrations.versions.require_host`): outside the tested range it fails here
with both versions named, not deep inside TRL.
"""

from tokenbalance.integrations.versions import require_host

TRL_VERSION = require_host("trl")

from tokenbalance.algorithms.presets import resolve_method
from tokenbalance.integrations.trl.build import build_grpo_trainer
from tokenbalance.integrations.trl.config import (
    check_config,
    grpo_config_for_method,
    method_fields,
    unsupported_reason,
)
from tokenbalance.integrations.trl.rewards import TaskReward, task_prompt_dataset
from tokenbalance.integrations.trl.trainer import TokenBalanceGRPOTrainer

__all__ = [
    "TRL_VERSION",
    "TaskReward",
    "TokenBalanceGRPOTrainer",
    "build_grpo_trainer",
    "check_config",
    "grpo_config_for_method",
    "task_prompt_dataset",
    "method_fields",
    "resolve_method",
    "unsupported_reason",
]
