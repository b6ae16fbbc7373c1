"""Build a TRL trainer (plain ``GRPOTrainer`` or ours) with sampling settings matching our trainer.

For benchmarks and smoke runs: temperature 1.0, no top-p / top-k / min-p / repetition penalty, one
optimizer step per generation batch, no bf16 autocast unless asked, no hub, reports or checkpoints
(docs/trl.md, "Use").

    trainer = build_grpo_trainer("runs/tiny/init", train_dataset=task_prompt_dataset(64),
                                 reward_funcs=TaskReward(tok), method="lopti", output_dir="runs/trl")
"""

from __future__ import annotations

import torch

from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.presets import resolve_method
from tokenbalance.integrations.trl.config import grpo_config_for_method, method_fields
from tokenbalance.integrations.trl.optimiser import optimiser_fields

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}
QUIET = {"report_to": "none", "save_strategy": "no", "logging_steps": 1, "disable_tqdm": True, "log_completions": False}


def build_grpo_trainer(
    model,
    *,
    tokenizer,
    train_dataset,
    reward_funcs,
    group_size: int,
    prompts_per_step: int,
    max_completion_length: int,
    output_dir: str,
    method: Method | str = "grpo",
    tokenbalance_loss: bool = True,
    world_size: int = 1,
    nthr_max_reward: float | None = None,
    optimiser: str = "paper",
    **config,
):
    """A ready-to-``train()`` trainer; ``tokenbalance_loss=False`` gives a plain ``trl.GRPOTrainer``.

    Args:
        model: a local model directory or a ``PreTrainedModel`` (when the method has a KL term,
            TRL loads the reference model from ``model.config._name_or_path``: a local directory).
        tokenizer: the processing class (``None``: loaded by TRL from the model directory).
        train_dataset: rows with a ``prompt`` column plus whatever ``reward_funcs`` read.
        reward_funcs: TRL reward function(s), e.g. :class:`~tokenbalance.integrations.trl.rewards.TaskReward`.
        group_size: completions per prompt (``num_generations``).
        prompts_per_step: prompts per optimizer step over all ranks.
        max_completion_length: the longest completion, in tokens.
        output_dir: TRL's output directory.
        method: the tokenbalance method (preset name or object). The plain trainer gets the same
            TRL loss fields (epsilon, beta, loss_type, ...) minus the passes (``num_iterations=1``).
        tokenbalance_loss: our subclass (True) or TRL's ``GRPOTrainer`` with its own loss (False).
        world_size: data-parallel processes (the per-device batch is split over them).
        nthr_max_reward: NTHR's largest reward (its correct completions), see
            :class:`~tokenbalance.integrations.trl.trainer.TokenBalanceGRPOTrainer`.
        optimiser: ``"paper"`` (the method's paper's optimiser, :mod:`.optimiser`) or ``"trl"``
            (TRL's defaults), for both trainers; ``config`` fields win.
        config: any other ``GRPOConfig`` field (learning_rate, max_steps, seed, bf16, use_vllm, ...);
            ``max_steps`` counts optimizer steps, two per batch for Lopti.
    """
    from trl import GRPOConfig, GRPOTrainer

    from tokenbalance.integrations.trl.trainer import TokenBalanceGRPOTrainer

    method = resolve_method(method)
    completions = prompts_per_step * group_size
    if completions % world_size:
        raise ValueError(f"prompts_per_step x group_size = {completions} must split evenly over {world_size} ranks")
    settings = {
        **optimiser_fields(method, optimiser),
        "output_dir": output_dir,
        "num_generations": group_size,
        "per_device_train_batch_size": completions // world_size,
        "gradient_accumulation_steps": 1,
        "max_completion_length": max_completion_length,
        "use_cpu": not torch.cuda.is_available(),
        "bf16": False,  # transformers 5 defaults to bf16 autocast, even on CPU; our trainer does not autocast
        **SAMPLING,
        **QUIET,
        **config,
    }
    if tokenbalance_loss:
        args = grpo_config_for_method(method, optimiser=optimiser, **settings)
        return TokenBalanceGRPOTrainer(
            model,
            reward_funcs,
            args,
            method=method,
            nthr_max_reward=nthr_max_reward,
            train_dataset=train_dataset,
            processing_class=tokenizer,
        )
    fields = {**method_fields(method), "num_iterations": 1}
    args = GRPOConfig(**{**fields, **settings})
    return GRPOTrainer(model, reward_funcs, args, train_dataset=train_dataset, processing_class=tokenizer)
