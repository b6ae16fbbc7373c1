"""The readable RL loop.

One RL step:

1. take the next ``prompts_per_step`` prompts (a seeded permutation per epoch; each rank takes
   whole prompts), repeat each ``group_size`` times;
2. sample responses with the rollout engine (seed derived from (seed, step, rank));
3. score them with the task;
4. old log-probs (and last-layer hidden states when the method needs them, NTHR) with the
   current policy, reference log-probs with the frozen initial policy, both at the rollout
   temperature (docs/methods.md §1);
5. advantages, token weights and the update passes (``build_update_passes``);
6. the passes: mini-batches (one AdamW step each) of micro-batches (gradient accumulation);
7. log, evaluate every ``eval_every`` steps, checkpoint every ``save_every`` steps.

The ``diagnostics`` section adds ``diag/*`` metrics through three calls into
:class:`tokenbalance.diagnostics.step.StepDiagnostics` (before the update, per micro-batch, after
the update; docs/metrics.md).

Differences from the AR-Lopti reference: everything runs in one process (or one per rank with
torchrun), the token-mean is global over the mini-batch by default (``optim.token_mean_scope``),
mini-batches are not re-ordered for token balance, and a step with a non-finite gradient norm is
skipped instead of applied.

    tokenbalance train                                       # the embedded tiny default, CPU
    tokenbalance train --model /path/to/Qwen2.5-3B-Instruct --device cuda --set data.template=qwen-instruct
    torchrun --nproc_per_node 2 -m tokenbalance.cli train    # data parallel (gloo on CPU)
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenbalance.algorithms.methods import NTHRInputs, apply_method_overrides, build_update_passes, get_method
from tokenbalance.config import RunConfig, save_config, to_dict
from tokenbalance.diagnostics.sinks import MetricsLog
from tokenbalance.diagnostics.step import StepDiagnostics
from tokenbalance.models import check_special_tokens
from tokenbalance.rollout import make_engine
from tokenbalance.tasks import get_task
from tokenbalance.trainer.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, write_text_atomic
from tokenbalance.trainer.data import eval_examples, rl_examples
from tokenbalance.trainer.distributed import DistContext, barrier, mean_over_ranks, sum_gradients, sum_normaliser
from tokenbalance.trainer.evaluate import evaluate, full_reward
from tokenbalance.trainer.logprobs import (
    ResponseLogprobs,
    batched_response_logprobs,
    pack_sequences,
    response_logprobs,
)
from tokenbalance.trainer.progress import StepProgress
from tokenbalance.trainer.scoring import decode_responses, encode_prompts, score_responses
from tokenbalance.trainer.update import run_update_passes


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (seed, step, rank, ...): stable across runs and platforms."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def prompt_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    generator = torch.Generator().manual_seed(derive_seed(seed, epoch, 7919))
    return torch.randperm(num_examples, generator=generator).tolist()


def step_prompt_indices(num_examples: int, seed: int, step: int, per_step: int) -> list[int]:
    """Global prompt indices of RL step ``step`` (0-based): consecutive slices of per-epoch permutations."""
    indices = []
    position = step * per_step
    while len(indices) < per_step:
        epoch, offset = divmod(position, num_examples)
        take = min(per_step - len(indices), num_examples - offset)
        indices += prompt_order(num_examples, seed, epoch)[offset : offset + take]
        position += take
    return indices


@dataclass
class TrainerParts:
    """Everything the loop works with, built by :func:`prepare_training`."""

    config: RunConfig
    run_dir: Path
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    tokenizer: object
    method: object
    optimizer: torch.optim.Optimizer
    engine: object
    task: object
    train_examples: list
    eval_examples: list
    train_prompt_ids: list
    eos_token_ids: set
    device: torch.device
    ctx: DistContext
    start_step: int = 0


def make_optimizer(policy, config: RunConfig) -> torch.optim.Optimizer:
    opt = config.optim
    return torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad],
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        weight_decay=opt.weight_decay,
    )


def rollout_and_score(parts: TrainerParts, step: int) -> dict:
    """Steps 1-3: this rank's prompts, sampled responses, rewards."""
    cfg = parts.config
    per_step = cfg.rollout.prompts_per_step
    indices = step_prompt_indices(len(parts.train_examples), cfg.train.seed, step, per_step)
    share = per_step // parts.ctx.world_size
    mine = indices[parts.ctx.rank * share : (parts.ctx.rank + 1) * share]
    G = cfg.rollout.group_size
    examples = [parts.train_examples[i] for i in mine for _ in range(G)]
    prompt_ids = [parts.train_prompt_ids[i] for i in mine for _ in range(G)]
    group_ids = torch.tensor([step * per_step + parts.ctx.rank * share + j for j in range(len(mine)) for _ in range(G)])
    generation = parts.engine.generate(
        prompt_ids,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        seed=derive_seed(cfg.train.seed, step, parts.ctx.rank),
    )
    texts = decode_responses(
        parts.tokenizer, generation.response_ids_BT, generation.response_mask_BT, parts.eos_token_ids
    )
    results = score_responses(parts.task, texts, examples)
    return {"generation": generation, "examples": examples, "results": results, "group_ids": group_ids}


def rollout_metrics(rollout: dict, target: float) -> dict[str, float]:
    results = rollout["results"]
    rewards = [r.reward for r in results]
    metrics = {
        "reward/mean": sum(rewards) / len(rewards),
        "reward/acc": sum(r == target for r in rewards) / len(rewards),
    }
    for key in sorted({k for r in results for k in r.metrics}):
        metrics[f"reward/{key}"] = sum(float(r.metrics.get(key, 0.0)) for r in results) / len(results)
    generation = rollout["generation"]
    lengths = generation.response_mask_BT.sum(dim=1).float()
    metrics["response/len_mean"] = float(lengths.mean())
    metrics["response/truncated_frac"] = float((~generation.finished_B).float().mean())
    grouped = torch.tensor(rewards).view(-1, len(rewards) // len(set(rollout["group_ids"].tolist())))
    metrics["reward/mixed_group_frac"] = float((grouped.max(1).values != grouped.min(1).values).float().mean())
    return metrics


def old_logprobs(parts: TrainerParts, generation, packed, with_entropy: bool) -> ResponseLogprobs:
    """The rollout policy's log-probs (and NTHR's hidden states): a no-grad forward, or with
    ``rollout.old_logprobs='sampler'`` the sampler's own log-probs (the same distribution: same
    weights, same temperature, no truncation), which saves that forward."""
    cfg = parts.config
    if cfg.rollout.old_logprobs == "sampler" and not parts.method.needs_hidden_states:
        sampled_BT = generation.sampler_logp_BT
        if sampled_BT is None:
            raise ValueError("rollout.old_logprobs='sampler': the rollout engine returned no log-probs")
        return ResponseLogprobs(logp_BT=sampled_BT.to(parts.device))  # already 0 after each row's EOS
    return batched_response_logprobs(
        parts.policy,
        packed,
        temperature=cfg.rollout.temperature,
        micro_batch=cfg.optim.micro_batch_size,
        with_hidden=parts.method.needs_hidden_states,
        with_entropy=with_entropy,
    )


def rl_step(parts: TrainerParts, step: int) -> dict[str, float]:
    cfg = parts.config
    timings = {}
    start = time.perf_counter()
    rollout = rollout_and_score(parts, step)
    timings["timing/rollout_s"] = time.perf_counter() - start
    generation = rollout["generation"]
    device = parts.device
    packed = pack_sequences(
        generation.prompt_ids_BP.to(device),
        generation.prompt_mask_BP.to(device),
        generation.response_ids_BT.to(device),
        generation.response_mask_BT.to(device),
    )
    mask_BT = generation.response_mask_BT.to(device)
    scores_B = torch.tensor([r.reward for r in rollout["results"]], dtype=torch.float32, device=device)
    temperature = cfg.rollout.temperature
    diag = StepDiagnostics(
        cfg.diagnostics, parts.method, step, seed=derive_seed(cfg.train.seed, step, parts.ctx.rank, 31)
    )

    t0 = time.perf_counter()
    micro = cfg.optim.micro_batch_size
    old = old_logprobs(parts, generation, packed, diag.wants_entropy)
    ref_logp = None
    if parts.method.needs_ref_logp:
        ref_logp = batched_response_logprobs(
            parts.reference, packed, temperature=temperature, micro_batch=micro
        ).logp_BT
    timings["timing/logprob_s"] = time.perf_counter() - t0

    nthr_inputs = None
    if parts.method.needs_hidden_states:
        head = parts.policy.get_output_embeddings()
        nthr_inputs = NTHRInputs(
            tokens_BT=packed.input_ids_BL[:, packed.prompt_len :],
            hidden_BTD=old.hidden_BTD.float(),
            unembed_VD=head.weight.detach().float(),
            temperature=temperature,
            unembed_bias_V=None if getattr(head, "bias", None) is None else head.bias.detach().float(),
            max_reward=full_reward(parts.task),
        )
    t0 = time.perf_counter()
    passes, prep_metrics = build_update_passes(
        parts.method, scores_B, rollout["group_ids"].to(device), mask_BT, old.logp_BT, ref_logp, nthr_inputs
    )
    world = parts.ctx.world_size
    diag_metrics = diag.before_update(
        passes,
        old.logp_BT,
        mask_BT,
        policy=parts.policy,
        micro_batch_rows=micro,
        score_fn=lambda rows: response_logprobs(parts.policy, packed.rows(rows), temperature=temperature).logp_BT,
        reduce_grads=lambda params: sum_gradients(params, parts.ctx),
        reduce_normaliser=lambda normaliser: sum_normaliser(normaliser, parts.ctx),
    )
    update_metrics = run_update_passes(
        method=parts.method,
        passes=passes,
        policy=parts.policy,
        optimizer=parts.optimizer,
        packed=packed,
        old_logp_BT=old.logp_BT,
        ref_logp_BT=ref_logp,
        temperature=temperature,
        mini_batch_rows=max(1, cfg.optim.mini_batch_size // world),
        micro_batch_rows=max(1, cfg.optim.micro_batch_size),
        grad_clip=cfg.optim.grad_clip,
        token_mean_scope=cfg.optim.token_mean_scope,
        ctx=parts.ctx,
        on_micro_batch=diag.on_micro_batch,
    )
    timings["timing/update_s"] = time.perf_counter() - t0 - diag.seconds  # diagnostics: timing/diag_s
    diag_metrics.update(
        diag.after_update(
            passes,
            old.logp_BT,
            mask_BT,
            entropy_BT=old.entropy_BT,
            correct_B=scores_B == full_reward(parts.task),
            group_ids_B=rollout["group_ids"],
            score_fn=lambda rows: (
                batched_response_logprobs(
                    parts.policy, packed.rows(rows), temperature=temperature, micro_batch=micro
                ).logp_BT
            ),
        )
    )
    timings["timing/diag_s"] = diag_metrics.pop("timing/diag_s")
    timings["timing/step_s"] = time.perf_counter() - start
    tokens = float(mask_BT.sum())
    timings["throughput/rollout_tokens_per_s"] = tokens / max(timings["timing/rollout_s"], 1e-9)
    timings["throughput/tokens_per_s"] = tokens / max(timings["timing/step_s"], 1e-9)
    metrics = {**rollout_metrics(rollout, full_reward(parts.task)), **prep_metrics, **update_metrics, **diag_metrics}
    metrics = mean_over_ranks(metrics, parts.ctx)
    return {**metrics, **timings}


def run_evaluation(parts: TrainerParts) -> dict[str, float]:
    cfg = parts.config
    # every rank evaluates the same examples; only the main rank's numbers are logged
    return evaluate(
        parts.engine,
        parts.tokenizer,
        parts.task,
        parts.eval_examples,
        eos_token_ids=parts.eos_token_ids,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        seed=cfg.train.seed,
    )


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """Peak memory of this process so far: resident set size (MiB; Linux reports KiB, macOS bytes)
    and, on CUDA, the peak of tensors allocated on the device."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peaks = {"peak_rss_mb": rss / (2**20 if sys.platform == "darwin" else 2**10)}
    if device.type == "cuda":
        peaks["peak_cuda_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peaks


def write_status(run_dir: Path, status: str, **extra) -> None:
    write_text_atomic(run_dir / "run_state.json", json.dumps({"status": status, **extra}, indent=1) + "\n")


def train(parts: TrainerParts) -> dict:
    """Run RL steps ``parts.start_step .. config.train.steps``; returns before/after evaluations."""
    cfg, ctx = parts.config, parts.ctx
    run_dir = parts.run_dir
    log = (
        MetricsLog(
            run_dir,
            tensorboard=cfg.output.tensorboard and ctx.is_main,
            wandb=cfg.output.wandb and ctx.is_main,
            run_name=run_dir.name,
            config=to_dict(cfg),
        )
        if ctx.is_main
        else None
    )
    if log is not None:
        log.truncate_after(parts.start_step)
        write_status(run_dir, "running", step=parts.start_step)
    evaluations = {}
    progress = StepProgress(cfg.train.steps, start=parts.start_step, enabled=cfg.output.progress and ctx.is_main)
    try:
        with progress:
            if parts.start_step == 0:
                before = run_evaluation(parts)
                evaluations[0] = before
                if log is not None:
                    log.log(0, "eval", before)
                progress.note_eval(before)
            for step in range(parts.start_step, cfg.train.steps):
                metrics = rl_step(parts, step)
                done = step + 1
                if log is not None:
                    log.log(done, "train", metrics)
                progress.advance(done, metrics)
                last = done == cfg.train.steps
                if last or (cfg.train.eval_every and done % cfg.train.eval_every == 0):
                    result = run_evaluation(parts)
                    evaluations[done] = result
                    if log is not None:
                        log.log(done, "eval", result)
                    progress.note_eval(result)
                if last or (cfg.train.save_every and done % cfg.train.save_every == 0):
                    if ctx.is_main:
                        save_checkpoint(
                            run_dir,
                            done,
                            parts.policy,
                            parts.tokenizer,
                            parts.optimizer,
                            {"seed": cfg.train.seed, "data_position": done * cfg.rollout.prompts_per_step},
                        )
                        write_status(run_dir, "running", step=done)
                    barrier(ctx)
    except BaseException as err:
        if log is not None:
            write_status(run_dir, "failed", error=f"{type(err).__name__}: {err}")
            log.close()
        raise
    if log is not None:
        write_status(run_dir, "completed", step=cfg.train.steps, **peak_memory_mb(parts.device))
        log.close()
    return evaluations


def resume_state(parts: TrainerParts) -> int:
    """Restore policy weights, optimizer and step from the run's latest checkpoint (0 if none)."""
    checkpoint = latest_checkpoint(parts.run_dir)
    if checkpoint is None:
        return 0
    from tokenbalance.models import load_policy

    restored, _ = load_policy(checkpoint / "model", device=str(parts.device))
    parts.policy.load_state_dict(restored.state_dict())
    state = load_trainer_state(checkpoint, parts.optimizer)
    return int(state["step"])


def prepare_training(
    config: RunConfig, run_dir: Path, policy, tokenizer, device: torch.device, ctx: DistContext, *, resume: bool = False
) -> TrainerParts:
    """Build the method, reference model, optimizer, engine and data; write the resolved config."""
    if config.rollout.prompts_per_step % ctx.world_size:
        raise ValueError(
            f"rollout.prompts_per_step={config.rollout.prompts_per_step} must be divisible by "
            f"the number of ranks ({ctx.world_size}): each rank takes whole prompt groups"
        )
    method = apply_method_overrides(get_method(config.train.method), config.train.method_overrides)
    reference = None
    if method.needs_ref_logp:
        reference = copy.deepcopy(policy).eval()
        for param in reference.parameters():
            param.requires_grad_(False)
    task = get_task(config.data.task)
    if task.name == "kk":
        check_special_tokens(tokenizer)  # the reward reads <think>/<answer> tags from decoded text
    train_examples = rl_examples(config.data)
    evals = eval_examples(config.data)
    train_ids = encode_prompts(tokenizer, train_examples, config.data.max_prompt_tokens)
    encode_prompts(tokenizer, evals, config.data.max_prompt_tokens)  # fail early on long prompts
    parts = TrainerParts(
        config=config,
        run_dir=run_dir,
        policy=policy,
        reference=reference,
        tokenizer=tokenizer,
        method=method,
        optimizer=make_optimizer(policy, config),
        engine=None,
        task=task,
        train_examples=train_examples,
        eval_examples=evals,
        train_prompt_ids=train_ids,
        eos_token_ids=set(),
        device=device,
        ctx=ctx,
    )
    parts.engine = make_engine(config.rollout.engine, policy, tokenizer)  # stops at the tokenizer's and model's EOS
    parts.eos_token_ids = set(parts.engine.eos_token_ids)
    if resume:
        parts.start_step = resume_state(parts)
    elif ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, run_dir / "config.yaml")
    return parts
