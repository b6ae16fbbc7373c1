"""One RL step (rollout + update) of our trainer vs TRL's ``GRPOTrainer``, same model and batch shape.

Both start from the embedded default's SFT-warmed tiny policy (cached, built on first use), train
GRPO with the same hyper-parameters (clip 0.2 / 0.24, k3 KL 0.001 as a loss, token-mean, lr 2e-4,
one optimizer step per batch) on 16 K&K 3-people prompts x 8 responses of at most 48 tokens,
sampled at T = 1 without top-p / top-k. TRL is the plain ``trl.GRPOTrainer`` (its own loss and
generation, float32, no bf16 autocast), built by
``tokenbalance.integrations.trl.build.build_grpo_trainer``; ours is ``trainer.loop.rl_step`` with
the HF-generate and the fast rollout engine (the default), and with the fast engine plus
``rollout.old_logprobs=sampler`` (no old-policy forward, as TRL skips it when on-policy). Each contender runs ``--steps`` steps per round,
rounds alternate, and the reported time is the median step; a step's tokens differ between
runners (different samples), so tokens/s is reported too.

    .venv/bin/python benchmarks/rl_step_vs_trl.py --steps 6 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import machine_line, markdown_table
from tokenbalance.config import RunConfig
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.embedded import ensure_embedded_policy
from tokenbalance.trainer.loop import prepare_training, rl_step

os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_DISABLED": "true",
        "TOKENIZERS_PARALLELISM": "false",
    }
)


def our_steps(
    policy_dir: Path, engine: str, steps: int, first_step: int, old_logprobs: str = "recompute"
) -> list[tuple[float, int]]:
    config = RunConfig()
    config.rollout.engine = engine
    config.rollout.old_logprobs = old_logprobs
    config.train.method = "grpo"
    config.output.progress = False
    policy, tokenizer = load_policy(policy_dir)
    parts = prepare_training(
        config, Path(tempfile.mkdtemp(prefix="bench-ours-")), policy, tokenizer, torch.device("cpu"), DistContext()
    )
    results = []
    for step in range(first_step, first_step + steps):
        start = time.perf_counter()
        metrics = rl_step(parts, step)
        results.append((time.perf_counter() - start, int(metrics["response/len_mean"] * 128)))
    return results


def trl_steps(policy_dir: Path, steps: int, seed: int) -> list[tuple[float, int]]:
    from transformers import TrainerCallback

    from tokenbalance.integrations.trl.build import build_grpo_trainer
    from tokenbalance.integrations.trl.rewards import KKReward, kk_prompt_dataset

    config = RunConfig()
    _, tokenizer = load_policy(policy_dir)
    dataset = kk_prompt_dataset(16 * steps, difficulty=3, template=config.data.template, seed=seed)
    trainer = build_grpo_trainer(
        str(policy_dir),
        tokenizer=tokenizer,
        train_dataset=dataset,
        reward_funcs=KKReward(tokenizer),
        group_size=config.rollout.group_size,
        prompts_per_step=config.rollout.prompts_per_step,
        max_completion_length=config.rollout.max_new_tokens,
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        method="grpo",
        tokenbalance_loss=False,
        learning_rate=config.optim.lr,
        max_steps=steps,
        seed=seed,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=config.optim.weight_decay,
        adam_beta1=config.optim.beta1,
        adam_beta2=config.optim.beta2,
        max_grad_norm=config.optim.grad_clip,
    )
    results: list[tuple[float, int]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            results.append((time.perf_counter() - self.start, 0))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and results:
                seconds, _ = results[-1]
                results[-1] = (seconds, int(logs["completions/mean_length"] * 128))

    trainer.add_callback(StepTimer())
    trainer.train()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = RunConfig()
    policy_dir = ensure_embedded_policy(config, device=torch.device("cpu"), progress=False, log=lambda *_: None)
    sampler = "ours, fast engine, sampler log-probs"
    runs: dict[str, list[tuple[float, int]]] = {
        "TRL GRPOTrainer": [],
        "ours, HF generate": [],
        "ours, fast engine": [],
        sampler: [],
    }
    for round_index in range(args.rounds):
        first = round_index * args.steps
        # the first step of each runner pays one-time costs (allocations, TRL's dataloader): dropped
        runs["TRL GRPOTrainer"] += trl_steps(policy_dir, args.steps + 1, seed=round_index)[1:]
        runs["ours, HF generate"] += our_steps(policy_dir, "hf", args.steps + 1, first)[1:]
        runs["ours, fast engine"] += our_steps(policy_dir, "fast", args.steps + 1, first)[1:]
        runs[sampler] += our_steps(policy_dir, "fast", args.steps + 1, first, old_logprobs="sampler")[1:]
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)
    trl_median = statistics.median(s for s, _ in runs["TRL GRPOTrainer"])
    rows = []
    for label, results in runs.items():
        seconds = statistics.median(s for s, _ in results)
        tokens = sum(t for _, t in results) / sum(s for s, _ in results)
        rows.append([label, f"{seconds:.2f}", f"{tokens:,.0f}", f"{trl_median / seconds:.2f}x"])
    print(
        f"GRPO, 16 prompts x 8 responses, <= 48 new tokens, T=1; median of {args.steps * args.rounds} steps "
        f"per runner ({args.rounds} alternating rounds, first step of each round dropped)."
    )
    print(machine_line())
    print()
    print(markdown_table(["runner", "median step (s)", "response tokens/s", "speed vs TRL"], rows))


if __name__ == "__main__":
    main()
