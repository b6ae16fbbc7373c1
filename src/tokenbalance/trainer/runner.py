"""From a config to a finished run, shared by ``tokenbalance train`` and the tests: the checks before any work
(:func:`tokenbalance.run.setup.prepare`), device, ranks, the run directory claimed and locked (and repaired on
``--resume``), then the policy, the loop and the before/after table. Order: docs/reliability.md."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from tokenbalance.config import RunConfig, absolute_paths, load_config
from tokenbalance.diagnostics.sinks import METRICS_FILE, parse_metrics_lines, read_metrics
from tokenbalance.run.checkpoints import STATE_FILE, checkpoint_step, latest_checkpoint, verify_checkpoint
from tokenbalance.run.checks import resolve_device
from tokenbalance.run.lock import RunLock
from tokenbalance.run.repair import check_new_run_dir, clean_interrupted_writes, recover_latest, undo_failed_start
from tokenbalance.run.resume import RESUMABLE_KEYS, changed_setting
from tokenbalance.run.setup import RunSetup, prepare
from tokenbalance.run.state import LOG_FILE, RunStatus, resume_command, run_status
from tokenbalance.trainer.distributed import DistContext, barrier, init_distributed
from tokenbalance.trainer.progress import progress_log


def compute_device(config: RunConfig) -> torch.device:
    """The device a command computes on, with this process's torch threads set from ``train.threads``
    (:func:`tokenbalance.threads.use_threads`). A fixed count stays in the config; 0 stays 0 (automatic: the RL loop
    then adapts the count to the load, ``timing/threads``)."""
    from tokenbalance.threads import use_threads

    use_threads(config.train.threads)
    return resolve_device(config.train.device)


def default_run_dir(config: RunConfig) -> Path:
    return Path("runs") / f"{config.method().name}-{time.strftime('%Y%m%d-%H%M%S')}"  # a token rule's own name


def policy_path(config: RunConfig, device: torch.device, ctx: DistContext, log, setup: RunSetup | None = None) -> str:
    """``model.path``, or the embedded tiny policy (built by rank 0, reused by the others; from the ``setup``'s task
    and SFT pairs when given)."""
    if config.model.path is not None:
        return config.model.path
    from tokenbalance.trainer.embedded import ensure_embedded_policy

    if not ctx.is_main:
        barrier(ctx)
    path = ensure_embedded_policy(
        config,
        device=device,
        progress=config.output.progress and ctx.is_main,
        log=log if ctx.is_main else (lambda *_: None),
        task=setup.task if setup is not None else None,
        pairs=setup.sft_pairs if setup is not None else None,
    )
    if ctx.is_main:
        barrier(ctx)
    return str(path)


def before_after_table(run_dir: Path) -> str:
    """Held-out accuracy per difficulty and mean reward at the first and the last evaluation of a run (the reward is
    what moves on a task of your own whose responses are seldom fully right)."""
    evals = [r for r in read_metrics(run_dir / METRICS_FILE) if r.get("kind") == "eval"]
    if not evals:
        return "no evaluation logged"
    first, last = evals[0], evals[-1]
    keys = sorted({k for k in first if k.startswith("eval/") and ("/acc" in k or k.endswith("/reward"))})
    lines = [
        f"{'held-out accuracy, reward':<28}{'step ' + str(first['step']):>10}{'step ' + str(last['step']):>10}"
        f"{'change':>10}"
    ]
    for key in keys:
        before, after = first[key], last.get(key, float("nan"))
        lines.append(f"{key.removeprefix('eval/'):<28}{before:>10.3f}{after:>10.3f}{after - before:>+10.3f}")
    return "\n".join(lines)


def load_run_policy(config: RunConfig, path: str, *, embedded: bool, device: torch.device, tokenizer=None):
    """``load_policy`` at the run's dtype (``tokenizer``: the one prepared from ``path``, not loaded again); a damaged
    embedded policy's message says how to rebuild it."""
    from tokenbalance.models import load_policy

    try:
        return load_policy(path, device=device, dtype=getattr(torch, config.model.dtype), tokenizer=tokenizer)
    except ValueError as err:
        if not embedded:
            raise
        raise ValueError(
            f"{err}. This is the cached embedded policy: delete {path} and the next run builds it again"
        ) from None


def check_checkpoint_config(checkpoint: Path, config: RunConfig) -> None:
    """``ValueError`` when ``config`` differs from the config ``checkpoint`` recorded (its ``trainer_state.json``;
    checkpoints written before it recorded one are not checked) outside
    :data:`~tokenbalance.run.resume.RESUMABLE_KEYS`."""
    from tokenbalance.config import from_dict

    recorded = json.loads((checkpoint / STATE_FILE).read_text()).get("config")
    if not isinstance(recorded, dict):
        return
    changed = changed_setting(from_dict(RunConfig, recorded), config)
    if changed is not None:
        key, before, after = changed
        raise ValueError(
            f"{checkpoint.parent.parent / 'config.yaml'}: {key} is {after!r}, but the run was trained with {before!r} "
            f"(its checkpoint {checkpoint.name}); a resume may change only {', '.join(RESUMABLE_KEYS)}. Put it back, "
            f"or start a new run from the checkpoint's weights: --model {checkpoint / 'model'} --run-dir NEW_DIR"
        )


def repair_for_resume(run_dir: Path, log, config: RunConfig | None = None) -> None:
    """Before a resume does any work (lock held): clean interrupted writes, re-point a lost ``latest``, read the
    checkpoint, refuse a ``config`` that differs from the checkpoint's outside the resumable settings (naming the
    key), and check ``metrics.jsonl`` (a torn last line is reported here and dropped by the loop)."""
    removed = clean_interrupted_writes(run_dir)
    if removed:
        log(f"removed what an interrupted write left in {run_dir}: {', '.join(removed)}")
    note = recover_latest(run_dir)
    if note:
        log(note)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        verify_checkpoint(checkpoint)
        if config is not None:
            check_checkpoint_config(checkpoint, config)
    metrics = run_dir / METRICS_FILE
    if metrics.is_file():
        _, torn = parse_metrics_lines(metrics)
        if torn is not None:
            log(f"{metrics}: its last line is torn (an interrupted write) and is dropped: {torn[:60]!r}")
    if run_status(run_dir) is RunStatus.RUNNING:
        log(f"{run_dir}: the previous process ended without recording how (status 'running'); resuming")


def stopped_message(run_dir: Path, reason: str) -> str:
    """Where a stopped run stands and the command that continues it."""
    if not (run_dir / "config.yaml").is_file():
        return f"{reason}; nothing was trained yet in {run_dir}: run the same command again"
    step = checkpoint_step(run_dir)
    where = f"its last checkpoint is step {step}" if step else "it has no checkpoint yet (a resume starts at step 0)"
    return f"{reason}; the run in {run_dir} stopped ({where}). Continue it with: {resume_command(run_dir)}"


def run_training(config: RunConfig | None, *, run_dir: Path | None = None, resume: bool = False, log=print) -> Path:
    """Train per ``config`` (or continue ``run_dir`` when ``resume``); returns the run directory."""
    from tokenbalance.trainer.loop import prepare_training, train

    if resume:
        if run_dir is None or not (Path(run_dir) / "config.yaml").is_file():
            raise ValueError(f"--resume {run_dir}: not a run directory (no config.yaml)")
        if config is None:  # the saved config as it is (the CLI passes it with the changes a resume allows)
            config = load_config(Path(run_dir) / "config.yaml")
    if config is None:
        raise ValueError("run_training: a config is required unless resuming a run directory")
    run_dir = Path(run_dir) if run_dir is not None else Path(config.output.run_dir or default_run_dir(config))
    if os.environ.get("RANK", "0") == "0" and not resume:
        check_new_run_dir(run_dir)
    setup = prepare(config, resume=resume)  # paths as given
    run_dir = Path(os.path.abspath(run_dir))
    config = absolute_paths(config)  # config.yaml names files the same from any working directory
    config.output.run_dir = str(run_dir)
    device = compute_device(config)  # train.threads=0 stays 0: the loop adapts the count
    ctx = init_distributed(device)
    lock = RunLock(run_dir).acquire() if ctx.is_main else None
    with progress_log(run_dir / LOG_FILE if ctx.is_main else None):
        try:
            if resume and ctx.is_main:
                repair_for_resume(run_dir, log, config)
            torch.manual_seed(config.train.seed)
            embedded = config.model.path is None
            config.model.path = policy_path(config, device, ctx, log, setup)
            policy, tokenizer = load_run_policy(
                config, config.model.path, embedded=embedded, device=device, tokenizer=setup.tokenizer
            )
            parts = prepare_training(config, run_dir, policy, tokenizer, device, ctx, resume=resume, setup=setup)
            if ctx.is_main:
                log(
                    f"run directory: {run_dir}  (method {config.train.method}, steps "
                    f"{parts.start_step}..{config.train.steps}, rollout engine {type(parts.runtime.engine).__name__})"
                )
            try:
                train(parts)
            except Exception:
                if ctx.is_main and not resume:  # failed before its first status: the same command runs again
                    undo_failed_start(run_dir)
                raise
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (the CLI raises it): say how to continue
            raise KeyboardInterrupt(stopped_message(run_dir, str(err) or "interrupted")) from None
        except OSError as err:  # a full disk, a lost mount: an environment error, not a bug
            what = f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")
            raise ValueError(stopped_message(run_dir, f"cannot write ({what})")) from None
        finally:
            if lock is not None:
                lock.release()
    if ctx.is_main:
        log(before_after_table(run_dir))
        log(f"status: {run_status(run_dir)}; metrics: {run_dir / 'metrics.jsonl'}")
    return run_dir
