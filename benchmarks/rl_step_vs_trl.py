"""One RL step (rollout + update) of our trainer vs TRL's ``GRPOTrainer``, same model and batch shape.

Both start from the embedded default's SFT-warmed tiny policy (cached, built on first use), train
GRPO with the same hyper-parameters (clip 0.2 / 0.24, k3 KL 0.001 as a loss, token-mean, lr 2e-4,
one optimizer step per batch) on 16 K&K 3-people prompts x 8 responses of at most 48 tokens,
sampled at T = 1 without top-p / top-k. TRL is the plain ``trl.GRPOTrainer`` (its own loss and
generation, float32, no bf16 autocast), built by
``tokenbalance.integrations.trl.build.build_grpo_trainer``; ours is ``trainer.loop.rl_step`` with
the HF-generate and the fast rollout engine (the default), and with the fast engine plus
``rollout.old_logprobs=sampler`` (no old-policy forward, as TRL skips it when on-policy), and with
float32 weights under bfloat16 autocast and the output layer in chunks of 1024 positions
(``model.autocast=bfloat16``, ``optim.logit_chunk_tokens=1024``, whatever ``--dtype``), and that
again with activation checkpointing (``optim.activation_checkpointing=true``: TRL's GRPOConfig
turns gradient checkpointing on by default, so this is the like-for-like row for memory). Each
contender runs ``--steps`` steps per round, rounds alternate, and the reported time is the median
step; a step's tokens differ between runners (different samples), so tokens/s is reported too.

``--device`` / ``--dtype`` / ``--shape`` run it elsewhere: both runners then load the same local
policy directory of that shape with random weights (``benchmarks/_shapes.py``; no SFT, no hub)
with parameters in ``--dtype`` (TRL through ``model_init_kwargs``, no autocast on either side);
on CUDA each runner's peak GPU memory is reported too. A random policy earns a constant K&K reward,
so its advantages are zero; each step still does all of its work (sampling to the token budget,
the log-prob passes, forward and backward of the update).

    .venv/bin/python benchmarks/rl_step_vs_trl.py --steps 6 --rounds 2
    python benchmarks/rl_step_vs_trl.py --device cuda --dtype bfloat16 --shape qwen2.5-0.5b --steps 3 --rounds 1
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import machine_line, markdown_table, synchronize
from _shapes import DTYPES, add_data_option, add_placement_options, placement, random_policy_dir, run_config
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import load_policy
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.embedded import ensure_embedded_policy
from tokenbalance.trainer.loop import prepare_training, rl_step

CPU = torch.device("cpu")

os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_DISABLED": "true",
        "TOKENIZERS_PARALLELISM": "false",
    }
)


# float32 master weights, every forward under bfloat16 autocast, the output layer 1024 positions at a time
MIXED_OVERRIDES = ("model.autocast=bfloat16", "optim.logit_chunk_tokens=1024")
MIXED = "ours, fast engine, float32 weights + bf16 autocast, logits in chunks"
# ... and every decoder layer's activations recomputed in the backward, as TRL's GRPOConfig does by default
CHECKPOINTED_OVERRIDES = (*MIXED_OVERRIDES, "optim.activation_checkpointing=true")
CHECKPOINTED = MIXED + ", activation checkpointing (as TRL)"


def our_steps(
    policy_dir: Path,
    engine: str,
    steps: int,
    first_step: int,
    old_logprobs: str = "recompute",
    device: torch.device = CPU,
    dtype: str = "float32",
    max_new_tokens: int | None = None,
    data_count: int | None = None,
    overrides: tuple[str, ...] = (),
) -> list[tuple[float, int]]:
    config = apply_overrides(run_config(data_count), list(overrides))
    config.rollout.engine = engine
    config.rollout.old_logprobs = old_logprobs
    config.rollout.max_new_tokens = max_new_tokens or config.rollout.max_new_tokens
    config.model.dtype = dtype
    config.train.method = "grpo"
    config.output.progress = False
    policy, tokenizer = load_policy(policy_dir, device=device, dtype=DTYPES[dtype])
    parts = prepare_training(
        config,
        Path(tempfile.mkdtemp(prefix="bench-ours-")),
        policy,
        tokenizer,
        device,
        DistContext(device=device),
    )
    results = []
    for step in range(first_step, first_step + steps):
        synchronize(device)
        start = time.perf_counter()
        metrics = rl_step(parts, step)
        synchronize(device)
        results.append((time.perf_counter() - start, int(metrics["response/len_mean"] * 128)))
    return results


def trl_steps(
    policy_dir: Path,
    steps: int,
    seed: int,
    device: torch.device = CPU,
    dtype: str = "float32",
    max_new_tokens: int | None = None,
) -> list[tuple[float, int]]:
    from transformers import TrainerCallback

    from tokenbalance.integrations.trl.build import build_grpo_trainer
    from tokenbalance.integrations.trl.rewards import TaskReward, task_prompt_dataset

    config = RunConfig()
    _, tokenizer = load_policy(policy_dir)
    dataset = task_prompt_dataset(16 * steps, difficulty=3, template=config.data.template, seed=seed)
    trainer = build_grpo_trainer(
        str(policy_dir),
        tokenizer=tokenizer,
        train_dataset=dataset,
        reward_funcs=TaskReward(tokenizer),
        group_size=config.rollout.group_size,
        prompts_per_step=config.rollout.prompts_per_step,
        max_completion_length=max_new_tokens or config.rollout.max_new_tokens,
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        use_cpu=device.type == "cpu",
        model_init_kwargs={"dtype": dtype},
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
            synchronize(device)
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            results.append((time.perf_counter() - self.start, 0))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and results:
                seconds, _ = results[-1]
                results[-1] = (seconds, int(logs["completions/mean_length"] * 128))

    trainer.add_callback(StepTimer())
    trainer.train()
    return results


def peak_memory(device: torch.device, run: Callable[[], list]):
    """``run()``'s result and the GPU memory allocated at its peak (bytes; 0 off CUDA)."""
    if device.type != "cuda":
        return run(), 0
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    result = run()
    synchronize(device)
    return result, torch.cuda.max_memory_allocated(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=RunConfig().rollout.max_new_tokens)
    add_placement_options(parser, shapes=("embedded", "tiny", "qwen2.5-0.5b"), default_shape="embedded")
    add_data_option(parser)
    args = parser.parse_args(argv)
    device, _ = placement(args)
    torch.set_num_threads(args.threads)
    config = RunConfig()
    if args.shape == "embedded":
        policy_dir = ensure_embedded_policy(config, device=torch.device("cpu"), progress=False, log=lambda *_: None)
    else:
        policy_dir = random_policy_dir(args.shape, Path(tempfile.mkdtemp(prefix="bench-policy-")), DTYPES[args.dtype])
    where = dict(device=device, dtype=args.dtype, max_new_tokens=args.max_new_tokens)
    ours = dict(where, data_count=args.data_count)
    sampler = "ours, fast engine, sampler log-probs"

    def float32_master(overrides: tuple[str, ...]) -> Callable[[int, int, int], list[tuple[float, int]]]:
        # float32 storage whatever --dtype says: the overrides choose the compute (autocast, checkpointing)
        return lambda steps, first, seed: our_steps(
            policy_dir, "fast", steps, first, **dict(ours, dtype="float32"), overrides=overrides
        )

    contenders = {
        "TRL GRPOTrainer": lambda steps, first, seed: trl_steps(policy_dir, steps, seed, **where),
        "ours, HF generate": lambda steps, first, seed: our_steps(policy_dir, "hf", steps, first, **ours),
        "ours, fast engine": lambda steps, first, seed: our_steps(policy_dir, "fast", steps, first, **ours),
        sampler: lambda steps, first, seed: our_steps(policy_dir, "fast", steps, first, "sampler", **ours),
        MIXED: float32_master(MIXED_OVERRIDES),
        CHECKPOINTED: float32_master(CHECKPOINTED_OVERRIDES),
    }
    runs: dict[str, list[tuple[float, int]]] = {label: [] for label in contenders}
    peaks = dict.fromkeys(contenders, 0)
    for round_index in range(args.rounds):
        first = round_index * args.steps
        for label, run in contenders.items():
            # the first step of each runner pays one-time costs (allocations, TRL's dataloader): dropped
            results, peak = peak_memory(device, functools.partial(run, args.steps + 1, first, round_index))
            runs[label] += results[1:]
            peaks[label] = max(peaks[label], peak)
        print(f"round {round_index + 1}/{args.rounds} done", flush=True)
    trl_median = statistics.median(s for s, _ in runs["TRL GRPOTrainer"])
    rows = []
    for label, results in runs.items():
        seconds = statistics.median(s for s, _ in results)
        tokens = sum(t for _, t in results) / sum(s for s, _ in results)
        rows.append([label, f"{seconds:.2f}", f"{tokens:,.0f}", f"{trl_median / seconds:.2f}x"])
        if device.type == "cuda":
            rows[-1].append(f"{peaks[label] / 2**30:.2f}")
    print(
        f"GRPO, 16 prompts x 8 responses, <= {args.max_new_tokens} new tokens, T=1; policy: {args.shape}, "
        f"{args.dtype} on {device}; median of {args.steps * args.rounds} steps per runner ({args.rounds} "
        "alternating rounds, first step of each round dropped)."
    )
    print(machine_line(device))
    print()
    header = ["runner", "median step (s)", "response tokens/s", "speed vs TRL"]
    print(markdown_table(header + (["peak GPU memory (GiB)"] if device.type == "cuda" else []), rows))


if __name__ == "__main__":
    main()
