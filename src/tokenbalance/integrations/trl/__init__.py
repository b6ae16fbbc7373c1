"""tokenbalance methods inside TRL's ``GRPOTrainer`` (AR, TR-GRPO, Lopti, NTHR), no fork.

    args = grpo_config_for_method("ar_lopti", output_dir="runs/trl", num_generations=8)
    trainer = TokenBalanceGRPOTrainer(model, TaskReward(tokenizer), args, train_dataset=dataset)
    trainer.train()

Importing this package checks the installed TRL version first (outside the tested range it fails
here with both versions named). docs/trl.md has the use, the modules and the differences.
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
