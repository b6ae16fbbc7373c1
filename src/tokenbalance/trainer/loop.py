"""The readable RL loop.

One RL step: prompts -> rollout (``group_size`` responses each) -> reward (DAPO dynamic sampling: more rounds) -> old
and reference log-probs -> advantages, token weights and passes -> the update (mini-batches of micro-batches) -> log,
evaluate, checkpoint; docs/training.md ("One RL step", "Differences from the AR-Lopti reference trainer"),
docs/metrics.md (``timing/*``, ``diag/*``). :func:`prepare_training` builds :class:`StepSettings` (fixed for the run),
:class:`TrainState` (what a checkpoint holds) and :class:`Runtime` (engine, task, examples, device, ranks) once."""

from __future__ import annotations

import hashlib
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tokenbalance import __version__
from tokenbalance.algorithms.filtering import (
    dynamic_sampling_metrics,
    filter_values,
    informative_groups,
    select_informative,
)
from tokenbalance.algorithms.methods import Method
from tokenbalance.config import RunConfig, config_yaml, save_config, to_dict
from tokenbalance.diagnostics.sinks import MetricsLog
from tokenbalance.diagnostics.step import StepDiagnostics
from tokenbalance.outputs import write_text_atomic
from tokenbalance.rollout import RolloutEngine, SamplingParams, make_engine
from tokenbalance.run.checkpoints import latest_checkpoint, prune_checkpoints, pruned_note
from tokenbalance.run.examples import encode_prompts
from tokenbalance.run.fingerprints import (
    FINGERPRINTS_FILE,
    eval_set_fingerprint,
    policy_digest,
    prompt_order_fingerprint,
    read_fingerprints,
    source_commit,
    start_policy_fingerprint,
    write_fingerprints,
)
from tokenbalance.run.setup import RunSetup, prepare
from tokenbalance.run.state import RunStatus, has_final_eval, write_end_status, write_run_state
from tokenbalance.tasks.base import Task, TaskExample
from tokenbalance.threads import ThreadAdapter
from tokenbalance.trainer.batch import RolloutBatch, merge_groups, sample_batch, update_inputs, with_logprobs
from tokenbalance.trainer.checkpoint import load_trainer_state, save_checkpoint
from tokenbalance.trainer.distributed import DistContext, barrier, mean_over_ranks, min_over_ranks
from tokenbalance.trainer.evaluate import append_outcomes, evaluate
from tokenbalance.trainer.logprobs import ResponseLogprobs
from tokenbalance.trainer.precision import (
    ForwardSettings,
    check_update_resolution,
    forward_precision,
    frozen_copy,
    slow_autocast_warning,
    typical_weight_magnitude,
)
from tokenbalance.trainer.progress import StepProgress, StepTimer
from tokenbalance.trainer.shared_eval import SharedEvaluation, generation_key
from tokenbalance.trainer.step_policy import StepPolicy
from tokenbalance.trainer.update import UpdateSettings, UpdateSpec, reusable_first_forward, run_update, update_forward


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (seed, step, rank, ...): stable across runs and platforms."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def prompt_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    generator = torch.Generator().manual_seed(derive_seed(seed, epoch, 7919))
    return torch.randperm(num_examples, generator=generator).tolist()


def prompt_indices(num_examples: int, seed: int, position: int, count: int) -> list[int]:
    """Global prompt indices ``position .. position + count - 1`` of the run's prompt stream: consecutive slices of
    per-epoch seeded permutations."""
    indices: list[int] = []
    while len(indices) < count:
        epoch, offset = divmod(position, num_examples)
        take = min(count - len(indices), num_examples - offset)
        indices += prompt_order(num_examples, seed, epoch)[offset : offset + take]
        position += take
    return indices


@dataclass(frozen=True, kw_only=True)
class StepSettings(UpdateSettings):
    """What the config fixes for every step of a run, derived once (:meth:`from_config`): the update's settings
    (mini-batches per rank) and the rollout's."""

    seed: int
    prompts_per_step: int  # all ranks
    group_size: int
    max_new_tokens: int
    top_p: float
    top_k: int
    sampler_logprobs: bool  # old log-probs from the sampler instead of a forward

    @classmethod
    def from_config(cls, config: RunConfig, world_size: int, device: torch.device) -> StepSettings:
        r, o = config.rollout, config.optim
        return cls(
            seed=config.train.seed,
            prompts_per_step=r.prompts_per_step,
            group_size=r.group_size,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            sampler_logprobs=r.old_logprobs == "sampler",
            micro_batch_rows=o.micro_batch_size,
            group_by_length=o.group_by_length,
            mini_batch_rows=max(1, o.mini_batch_size // world_size),
            grad_clip=o.grad_clip,
            token_mean_scope=o.token_mean_scope,
            forward_settings=ForwardSettings.from_config(config, device),
            grad_share=config.diagnostics.logs_grad_share,  # per-token logit-gradient norms for diag/*
        )

    def sampling(self, seed: int) -> SamplingParams:
        return SamplingParams(self.max_new_tokens, self.temperature, self.top_p, self.top_k, seed)


@dataclass
class TrainState:
    """What changes as a run trains, and what its checkpoints hold (the reference is the frozen start policy, rebuilt
    from it)."""

    policy: PreTrainedModel
    optimizer: torch.optim.Optimizer
    reference: PreTrainedModel | None
    data_position: int = 0  # prompts of the stream drawn so far (all ranks)


@dataclass(frozen=True)
class Runtime:
    """What a run works with but never saves: the engine, the task and its examples, the device and ranks."""

    engine: RolloutEngine
    tokenizer: PreTrainedTokenizerBase
    task: Task
    train_examples: list[TaskExample]
    train_prompt_ids: list[list[int]]
    eval_examples: list[TaskExample]
    device: torch.device
    ctx: DistContext
    threads: ThreadAdapter | None = None  # train.threads=0 on a CPU: the count follows the load
    eval_prompt_ids: list[list[int]] | None = None  # the held-out prompts encoded (None: encoded at each evaluation)

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self.engine.eos_token_ids)

    def adapt_threads(self) -> None:
        """Between phases: re-decide the CPU thread count from the load (``train.threads=0``)."""
        if self.threads is not None:
            self.threads.adapt()

    def step_threads(self) -> int:
        """The fewest CPU threads a phase of this step ran with (``timing/threads``)."""
        return self.threads.take_fewest() if self.threads is not None else torch.get_num_threads()


@dataclass
class TrainerParts:
    """A run, built by :func:`prepare_training`: its config and directory, the method (resolved once), the step
    settings, the training state and the runtime."""

    config: RunConfig
    run_dir: Path
    method: Method
    settings: StepSettings
    state: TrainState
    runtime: Runtime
    start_step: int = 0


def make_optimizer(policy, config: RunConfig) -> torch.optim.Optimizer:
    opt = config.optim
    return torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad],
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        weight_decay=opt.weight_decay,
    )


def sample_round(parts: TrainerParts, step: int, round_: int) -> RolloutBatch:
    """The next ``prompts_per_step`` prompts of the stream (this rank's whole groups), G sampled responses to each,
    their rewards; advances the data position."""
    s, state, rt = parts.settings, parts.state, parts.runtime
    share = s.prompts_per_step // rt.ctx.world_size
    first = state.data_position + rt.ctx.rank * share
    mine = prompt_indices(len(rt.train_examples), s.seed, first, share)
    state.data_position += s.prompts_per_step
    seed = derive_seed(s.seed, step, rt.ctx.rank) if round_ == 0 else derive_seed(s.seed, step, rt.ctx.rank, round_)
    with forward_precision(
        state.policy, s.forward_settings.compute_dtype
    ):  # the sampler's forwards: the run's precision
        return sample_batch(
            rt.engine,
            rt.tokenizer,
            rt.task,
            [rt.train_examples[i] for i in mine],
            [rt.train_prompt_ids[i] for i in mine],
            torch.arange(first, first + share),
            group_size=s.group_size,
            sampling=s.sampling(seed),
            device=rt.device,
        )


def rollout(parts: TrainerParts, step: int) -> tuple[RolloutBatch, RolloutBatch, dict[str, float]]:
    """Steps 1-3: prompts, G responses each, rewards; with DAPO dynamic sampling, all-equal groups dropped and rounds
    drawn until the step has its groups. Returns the batch to train on, the first round (what ``reward/*`` describe)
    and the ``sampling/*`` metrics."""
    dynamic, ctx = parts.method.dynamic_sampling, parts.runtime.ctx
    first = sample_round(parts, step, 0)
    if not dynamic.enabled:
        return first, first, {}
    target = dynamic.target(parts.settings.prompts_per_step) // ctx.world_size
    selections, kept, drawn, informative, batch = [], 0, 0, 0, first
    for round_ in range(dynamic.max_rounds):
        batch = first if round_ == 0 else sample_round(parts, step, round_)
        values_PG = filter_values(dynamic, batch.rewards_PG, batch.correct_B.view(-1, batch.group_size))
        informative_P = informative_groups(values_PG)
        chosen = select_informative(informative_P, kept, target)
        selections.append((batch, chosen))
        kept, drawn, informative = (
            kept + len(chosen),
            drawn + len(informative_P),
            informative + int(informative_P.sum()),
        )
        if not dynamic.wants_another_round(min_over_ranks(kept, ctx), target, round_ + 1):
            break
    common = min_over_ranks(kept, ctx)  # equal batches on every rank: the same collectives
    trimmed, left = [], common
    for batch, chosen in selections:
        trimmed.append((batch, chosen[:left]))
        left -= len(trimmed[-1][1])
    metrics = dynamic_sampling_metrics(round_ + 1, drawn, informative, common, target)
    if common == 0:  # nothing informative: train on the first round as a run without filtering would
        return first, first, metrics
    return merge_groups([(b, c) for b, c in trimmed if len(c)], parts.runtime.engine.pad_token_id), first, metrics


def rollout_metrics(batch: RolloutBatch) -> dict[str, float]:
    results, rewards_PG = batch.results_B, batch.rewards_PG
    metrics = {
        "reward/mean": float(rewards_PG.double().mean()),
        "reward/acc": float(batch.correct_B.double().mean()),
        "reward/mixed_group_frac": float((rewards_PG.amax(1) != rewards_PG.amin(1)).double().mean()),
    }
    for key in sorted({k for r in results for k in r.metrics}):
        metrics[f"reward/{key}"] = sum(float(r.metrics.get(key, 0.0)) for r in results) / len(results)
    generation = batch.generation
    metrics["response/len_mean"] = float(generation.response_lengths_B.double().mean())
    metrics["response/truncated_frac"] = float((~generation.finished_B).double().mean())
    return metrics


def rl_step(parts: TrainerParts, step: int) -> dict[str, float]:
    """One RL step, top to bottom (module docstring); returns its metrics, averaged over ranks."""
    s, state, method, rt = parts.settings, parts.state, parts.method, parts.runtime
    timer = StepTimer()
    rt.adapt_threads()
    with timer("rollout"):
        batch, sampled, sampling_metrics = rollout(parts, step)
    diag = step_diagnostics(parts, step, batch)
    rt.adapt_threads()
    with timer("update"):  # the update's first forward (with gradient); the old log-probs come with it
        first = first_update_forward(parts, batch)
    with timer("logprob"):  # the forwards without gradient: the old policy's (unless shared) and the reference's
        batch = with_logprobs(
            batch,
            policy=state.policy,
            reference=state.reference,
            method=method,
            temperature=s.temperature,
            micro_batch=s.micro_batch_rows,
            group_by_length=s.group_by_length,
            with_entropy=diag.wants_entropy,
            sampler_logprobs=s.sampler_logprobs,
            old_forward=first,
            forward_settings=s.forward_settings,
        )
    with timer("update"):
        passes, pass_metrics = update_inputs(method, batch, policy=state.policy, temperature=s.temperature)
    with timer("diag"):
        probe_metrics = diag.before_update(passes, batch)  # the opt-in gradient-norm probe
    rt.adapt_threads()
    with timer("update"):
        spec = UpdateSpec(method, passes, batch, settings=s, first_forward=first)
        record = run_update(spec, state.policy, state.optimizer, rt.ctx)
    del spec, first
    with timer("diag"):
        diag_metrics = diag.after_update(passes, batch, record)
    metrics = rollout_metrics(sampled) | sampling_metrics | pass_metrics | record.metrics | probe_metrics | diag_metrics
    timings = timer.metrics(tokens=float(batch.mask_BT.sum())) | {"timing/threads": float(rt.step_threads())}
    return mean_over_ranks(metrics, rt.ctx) | timings


def step_diagnostics(parts: TrainerParts, step: int, batch: RolloutBatch) -> StepDiagnostics:
    """The step's diagnostics, with the policy's log-probs on the batch's rows."""
    s, rt = parts.settings, parts.runtime
    access = StepPolicy(parts.state.policy, batch.packed, s.temperature, s.micro_batch_rows, rt.ctx, s.forward_settings)
    return StepDiagnostics(
        parts.config.diagnostics, parts.method, step, access, seed=derive_seed(s.seed, step, rt.ctx.rank, 31)
    )


def first_update_forward(parts: TrainerParts, batch: RolloutBatch) -> ResponseLogprobs | None:
    """Step 4's old-policy forward run as the update's first (with gradient) when that micro-batch is the whole batch
    (:func:`~tokenbalance.trainer.update.reusable_first_forward`): one forward instead of two, same bits; else
    ``None``."""
    s, method, policy = parts.settings, parts.method, parts.state.policy
    if s.sampler_logprobs and not method.needs_hidden_states:
        return None  # no old-policy forward to share
    if not reusable_first_forward(method, policy, batch.packed.input_ids_BL.shape[0], s):
        return None
    return update_forward(policy, batch.packed, method, s, with_hidden=method.needs_hidden_states)


def shared_start_evaluation(parts: TrainerParts, note: Callable[[str], None]) -> SharedEvaluation | None:
    """Where the step-0 evaluation's responses are shared with other runs (``train.start_eval_cache``), keyed by
    everything that decides them; None when unset or with several ranks."""
    cfg, rt = parts.config, parts.runtime
    if not cfg.train.start_eval_cache or rt.ctx.enabled:
        return None
    sections = to_dict(cfg)
    settings = {
        "engine": type(rt.engine).__name__,
        "rollout": sections["rollout"],
        "model": {k: v for k, v in sections["model"].items() if k != "path"},  # the weights are in the digest
        "compute_dtype": str(parts.settings.forward_settings.compute_dtype),
        "device": rt.device.type,
        "eos": sorted(rt.eos_token_ids),
        "max_new_tokens": parts.settings.max_new_tokens,
        "versions": [torch.__version__, __version__],
    }
    key = generation_key(policy_digest(parts.state.policy), settings)
    return SharedEvaluation(Path(cfg.train.start_eval_cache), key, parts.settings.seed, note=note)


def run_evaluation(parts: TrainerParts, step: int, note: Callable[[str], None] = print) -> dict[str, float]:
    """The held-out metrics at ``step``; the main rank appends the per-example outcomes to the run directory
    (``eval_outcomes.jsonl``). Step 0's responses may be shared with other runs (:func:`shared_start_evaluation`)."""
    rt = parts.runtime
    rt.adapt_threads()
    responses: list[dict] = []
    shared = shared_start_evaluation(parts, note) if step == 0 else None
    # every rank evaluates the same examples; only the main rank's numbers are logged
    with forward_precision(parts.state.policy, parts.settings.forward_settings.compute_dtype):
        metrics = evaluate(
            rt.engine,
            rt.tokenizer,
            rt.task,
            rt.eval_examples,
            eos_token_ids=rt.eos_token_ids,
            max_new_tokens=parts.settings.max_new_tokens,
            max_prompt_tokens=parts.config.data.max_prompt_tokens,
            seed=parts.settings.seed,
            responses=responses,
            prompt_ids=rt.eval_prompt_ids,
            shared=shared,
        )
    if rt.ctx.is_main:
        append_outcomes(parts.run_dir, step, responses)
    return metrics


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """Peak memory of this process so far: resident set size (MiB; Linux reports KiB, macOS bytes) and, on CUDA, the
    peak of tensors allocated on the device."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peaks = {"peak_rss_mb": rss / (2**20 if sys.platform == "darwin" else 2**10)}
    if device.type == "cuda":
        peaks["peak_cuda_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peaks


def train(parts: TrainerParts) -> dict:
    """Run RL steps ``parts.start_step .. config.train.steps``; returns before/after evaluations."""
    cfg, ctx = parts.config, parts.runtime.ctx
    run_dir = parts.run_dir
    log = (
        MetricsLog(
            run_dir,
            tensorboard=cfg.output.tensorboard and ctx.is_main,
            wandb=cfg.output.wandb and ctx.is_main,
            run_name=run_dir.name,
            config=to_dict(cfg),
            wandb_options={
                "project": cfg.output.wandb_project,
                "entity": cfg.output.wandb_entity,
                "name": cfg.output.wandb_name,
                "mode": cfg.output.wandb_mode,
            },
        )
        if ctx.is_main
        else None
    )
    if log is not None:
        log.truncate_after(parts.start_step if parts.start_step else -1)  # from 0: the step-0 eval is redone
        write_run_state(run_dir, RunStatus.RUNNING, step=parts.start_step)
    evaluations = {}
    progress = StepProgress(cfg.train.steps, start=parts.start_step, enabled=cfg.output.progress and ctx.is_main)
    try:
        with progress:
            if parts.start_step == 0:
                before = run_evaluation(parts, 0, note=progress.line)
                evaluations[0] = before
                if log is not None:
                    log.log(0, "eval", before)
                progress.note_eval(before, 0)
            if 0 < parts.start_step == cfg.train.steps and not has_final_eval(run_dir, cfg.train.steps):
                result = run_evaluation(parts, cfg.train.steps)  # a completed run whose final evaluation line was torn
                evaluations[cfg.train.steps] = result
                if log is not None:
                    log.log(cfg.train.steps, "eval", result)
            for step in range(parts.start_step, cfg.train.steps):
                metrics = rl_step(parts, step)
                done = step + 1
                if log is not None:
                    log.log(done, "train", metrics)
                progress.advance(done, metrics)
                last = done == cfg.train.steps
                if last or (cfg.train.eval_every and done % cfg.train.eval_every == 0):
                    result = run_evaluation(parts, done)
                    evaluations[done] = result
                    if log is not None:
                        log.log(done, "eval", result)
                    progress.note_eval(result, done)
                if last or (cfg.train.save_every and done % cfg.train.save_every == 0):
                    if ctx.is_main:
                        save_checkpoint(
                            run_dir,
                            done,
                            parts.state.policy,
                            parts.runtime.tokenizer,
                            parts.state.optimizer,
                            {
                                "seed": cfg.train.seed,
                                "data_position": parts.state.data_position,
                                "config": to_dict(cfg),
                            },
                        )
                        if cfg.train.keep_checkpoints:
                            removed = prune_checkpoints(run_dir, cfg.train.keep_checkpoints)
                            if removed:
                                print(pruned_note(removed, cfg.train.keep_checkpoints), file=sys.stderr, flush=True)
                        write_run_state(run_dir, RunStatus.RUNNING, step=done)
                    barrier(ctx)
    except BaseException as err:
        if log is not None:
            write_end_status(run_dir, err)
            log.close()
        raise
    if log is not None:
        write_run_state(run_dir, RunStatus.COMPLETED, step=cfg.train.steps, **peak_memory_mb(parts.runtime.device))
        log.close()
    return evaluations


def resume_state(parts: TrainerParts) -> int:
    """Restore policy weights, optimizer and step from the run's latest checkpoint (0 if none)."""
    checkpoint = latest_checkpoint(parts.run_dir)
    if checkpoint is None:
        return 0
    from tokenbalance.models import load_policy

    restored, _ = load_policy(checkpoint / "model", device=str(parts.runtime.device))
    parts.state.policy.load_state_dict(restored.state_dict())
    saved = load_trainer_state(checkpoint, parts.state.optimizer)
    step = int(saved["step"])
    parts.state.data_position = int(saved.get("data_position", step * parts.settings.prompts_per_step))
    return step


def run_fingerprints(parts: TrainerParts) -> dict:
    """What decides whether this run pairs with another (:mod:`tokenbalance.run.fingerprints`): the start policy (the
    policy as loaded, before any checkpoint), the first epoch of its prompt stream and the evaluation set."""
    rt = parts.runtime
    order = prompt_order(len(rt.train_prompt_ids), parts.settings.seed, 0) if rt.train_prompt_ids else []
    eval_ids = rt.eval_prompt_ids
    if eval_ids is None:  # encoded at each evaluation: encode them once more for the fingerprint
        eval_ids = (
            []
            if not rt.eval_examples
            else encode_prompts(rt.tokenizer, rt.eval_examples, parts.config.data.max_prompt_tokens)
        )
    return {
        "start_policy": start_policy_fingerprint(parts.state.policy, rt.tokenizer),
        "prompt_order": prompt_order_fingerprint([rt.train_prompt_ids[i] for i in order]),
        "eval_set": eval_set_fingerprint(eval_ids, [e.ground_truth for e in rt.eval_examples]),
        "version": __version__,
        "commit": source_commit(),
    }


def check_or_write_fingerprints(parts: TrainerParts, *, resume: bool) -> None:
    """Write the run's fingerprints when it starts; on a resume, refuse another start policy, prompt stream or
    evaluation set than the run started from (a run of older code, with none, gets them now)."""
    found = read_fingerprints(parts.run_dir) if resume else None
    now = run_fingerprints(parts)
    if found is not None:
        for key, what in (
            ("start_policy", "start policy"),
            ("prompt_order", "prompt order"),
            ("eval_set", "evaluation set"),
        ):
            if found[key] != now[key]:
                raise ValueError(
                    f"{parts.run_dir / FINGERPRINTS_FILE}: the run started from another {what} ({found[key][:12]}, "
                    f"now {now[key][:12]}); a resume continues the same experiment: start a new run directory"
                )
        return
    if parts.runtime.ctx.is_main:
        write_fingerprints(parts.run_dir, now)


def thread_adapter(config: RunConfig, device: torch.device, ctx: DistContext) -> ThreadAdapter | None:
    """With ``train.threads=0`` in a single CPU process, a :class:`~tokenbalance.threads.ThreadAdapter` starting from
    torch's current count (ranks of one node would see each other as load: none)."""
    if config.train.threads or device.type != "cpu" or ctx.world_size > 1:
        return None
    return ThreadAdapter(torch.get_num_threads(), torch.set_num_threads)


def prepare_training(
    config: RunConfig,
    run_dir: Path,
    policy,
    tokenizer,
    device: torch.device,
    ctx: DistContext,
    *,
    resume: bool = False,
    setup: RunSetup | None = None,
) -> TrainerParts:
    """Build the method, reference model, optimizer and engine on the run's ``setup`` (task, examples, prompt ids:
    :func:`~tokenbalance.run.setup.prepare`'s, for the policy's ``tokenizer``; prepared here when not given); write
    the resolved config."""
    if config.rollout.prompts_per_step % ctx.world_size:
        raise ValueError(
            f"rollout.prompts_per_step={config.rollout.prompts_per_step} must be divisible by "
            f"the number of ranks ({ctx.world_size}): each rank takes whole prompt groups"
        )
    method = config.method()
    if (
        method.dynamic_sampling.enabled
        and method.dynamic_sampling.target(config.rollout.prompts_per_step) % ctx.world_size
    ):
        raise ValueError(
            f"dynamic_sampling.target_groups={method.dynamic_sampling.target(config.rollout.prompts_per_step)} must be "
            f"divisible by the number of ranks ({ctx.world_size}): each rank trains the same number of whole groups"
        )
    parameter_dtype = next(policy.parameters()).dtype
    check_update_resolution(parameter_dtype, config.optim.lr, typical_weight_magnitude(policy))
    forward_settings = ForwardSettings.from_config(config, device)
    slow = slow_autocast_warning(forward_settings.compute_dtype, device)
    if slow is not None:
        warnings.warn(slow, RuntimeWarning, stacklevel=2)
    reference = frozen_copy(policy, forward_settings.compute_dtype) if method.needs_ref_logp else None
    if config.optim.activation_checkpointing:  # after the reference's copy, which never runs a backward
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if setup is None:
        setup = prepare(config, resume=resume, tokenizer=tokenizer)
    setup = setup.with_tokenizer(tokenizer)  # the embedded policy's: its tags checked, the prompts encoded
    parts = TrainerParts(
        config=config,
        run_dir=run_dir,
        method=method,
        settings=StepSettings.from_config(config, ctx.world_size, device),
        state=TrainState(policy=policy, optimizer=make_optimizer(policy, config), reference=reference),
        runtime=Runtime(
            engine=make_engine(config.rollout.engine, policy, tokenizer),  # stops at the tokenizer's and model's EOS
            tokenizer=tokenizer,
            task=setup.task,
            train_examples=list(setup.train_examples),
            train_prompt_ids=list(setup.train_prompt_ids),
            eval_examples=list(setup.eval_examples),
            device=device,
            ctx=ctx,
            threads=thread_adapter(config, device, ctx),
            eval_prompt_ids=list(setup.eval_prompt_ids),
        ),
    )
    if resume:
        check_or_write_fingerprints(parts, resume=True)  # before a checkpoint replaces the start policy's weights
        parts.start_step = resume_state(parts)
        if config.train.steps < parts.start_step:
            raise ValueError(
                f"--steps {config.train.steps}: the run in {run_dir} is already at step {parts.start_step}; "
                "a resume can only extend a run"
            )
        if ctx.is_main:  # record the extended length (and reporting changes) the run now follows
            write_text_atomic(run_dir / "config.yaml", config_yaml(config))
    elif ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, run_dir / "config.yaml")
        check_or_write_fingerprints(parts, resume=False)
    return parts
