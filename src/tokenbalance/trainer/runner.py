"""From a config to a finished run: device, distributed setup, the policy, the run directory,
the loop, and the before/after table. Shared by ``tokenbalance train`` and the tests."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from tokenbalance.config import RunConfig, load_config
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.trainer.distributed import DistContext, barrier, init_distributed


def check_before_work(config: RunConfig) -> None:
    """What can be checked without a model, before the (possibly minutes-long) SFT build or model
    load: the method (already resolved when the config was built) and the data files."""
    config.method()
    for key in ("train_file", "eval_file"):
        path = getattr(config.data, key)
        if path is not None and not Path(path).is_file():
            raise ValueError(f"data.{key}={path!r}: no such file")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r}: CUDA is not available on this machine; use cpu")
    if device.type == "cuda" and "LOCAL_RANK" in os.environ and device.index is None:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def default_run_dir(config: RunConfig) -> Path:
    return Path("runs") / f"{config.train.method}-{time.strftime('%Y%m%d-%H%M%S')}"


def policy_path(config: RunConfig, device: torch.device, ctx: DistContext, log) -> str:
    """``model.path``, or the embedded tiny policy (built by rank 0, reused by the others)."""
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
    )
    if ctx.is_main:
        barrier(ctx)
    return str(path)


def before_after_table(run_dir: Path) -> str:
    """Held-out accuracy at the first and the last evaluation of a run, per difficulty."""
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
    if not evals:
        return "no evaluation logged"
    first, last = evals[0], evals[-1]
    keys = sorted({k for k in first if k.startswith("eval/") and "/acc" in k})
    lines = [
        f"{'held-out accuracy':<28}{'step ' + str(first['step']):>10}{'step ' + str(last['step']):>10}{'change':>10}"
    ]
    for key in keys:
        before, after = first[key], last.get(key, float("nan"))
        lines.append(f"{key.removeprefix('eval/'):<28}{before:>10.3f}{after:>10.3f}{after - before:>+10.3f}")
    return "\n".join(lines)


def run_training(config: RunConfig | None, *, run_dir: Path | None = None, resume: bool = False, log=print) -> Path:
    """Train per ``config`` (or continue ``run_dir`` when ``resume``); returns the run directory."""
    from tokenbalance.models import load_policy
    from tokenbalance.trainer.loop import prepare_training, train

    if resume:
        if run_dir is None or not (Path(run_dir) / "config.yaml").is_file():
            raise ValueError(f"--resume {run_dir}: not a run directory (no config.yaml)")
        if config is None:  # the saved config as it is (the CLI passes it with the changes a resume allows)
            config = load_config(Path(run_dir) / "config.yaml")
    if config is None:
        raise ValueError("run_training: a config is required unless resuming a run directory")
    check_before_work(config)
    device = resolve_device(config.train.device)
    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    ctx = init_distributed(device)
    torch.manual_seed(config.train.seed)
    config.model.path = policy_path(config, device, ctx, log)
    run_dir = Path(run_dir) if run_dir is not None else Path(config.output.run_dir or default_run_dir(config))
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ValueError(
            f"{run_dir} already holds a run; pass --resume {run_dir} to continue it or choose another --run-dir"
        )
    config.output.run_dir = str(run_dir)
    dtype = getattr(torch, config.model.dtype)
    policy, tokenizer = load_policy(config.model.path, device=device, dtype=dtype)
    parts = prepare_training(config, run_dir, policy, tokenizer, device, ctx, resume=resume)
    if ctx.is_main:
        log(
            f"run directory: {run_dir}  (method {config.train.method}, steps {parts.start_step}..{config.train.steps}, "
            f"rollout engine {type(parts.engine).__name__})"
        )
    train(parts)
    if ctx.is_main:
        log(before_after_table(run_dir))
        summary = json.loads((run_dir / "run_state.json").read_text())
        log(f"status: {summary['status']}; metrics: {run_dir / 'metrics.jsonl'}")
    return run_dir
