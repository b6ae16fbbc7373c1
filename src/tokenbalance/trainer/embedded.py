"""The embedded default policy: a tiny model, a tokenizer trained on the task's text (``Task.tokenizer_corpus``), an
SFT warm start; with ``data.reward`` and ``data.target_column`` trained on your rows
(:func:`~tokenbalance.run.examples.row_pairs`). Cached atomically under ``model.cache_dir/<key>/``, the key hashing
every setting that changes the result, so a changed setting never reuses a stale cache."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tokenbalance.config import RunConfig
from tokenbalance.models import TinyModelConfig, build_tiny_model, count_parameters, save_policy, train_tokenizer
from tokenbalance.outputs import write_text_atomic
from tokenbalance.run.examples import SFTPair, sft_pairs, task_for
from tokenbalance.run.setup import embedded_key
from tokenbalance.tasks.base import Task
from tokenbalance.trainer.sft import run_sft

SFT_SUMMARY = "tokenbalance_sft.json"


def tiny_config(config: RunConfig) -> TinyModelConfig:
    m = config.model
    return TinyModelConfig(
        arch=m.arch,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        intermediate_size=m.intermediate_size,
    )


def build_embedded_policy(
    config: RunConfig,
    out_dir: Path,
    *,
    device: torch.device,
    progress: bool = True,
    log=print,
    checkpoint_dir: Path | None = None,
    task: Task | None = None,
    pairs: Sequence[SFTPair] | None = None,
) -> dict:
    """Train the tokenizer, build the tiny model, run SFT (resumable in ``checkpoint_dir`` with ``sft.save_every``)
    and save it to ``out_dir``. ``task`` and the SFT ``pairs``: the run's (:class:`~tokenbalance.run.setup.RunSetup`),
    built from ``config`` when not given."""
    started = time.perf_counter()
    task = task if task is not None else task_for(config.data)
    pairs = pairs if pairs is not None else sft_pairs(config.data, config.sft, task)
    if config.data.reward is not None:  # your rows: their prompts and targets
        corpus = [pair.prompt + pair.response for pair in pairs]
    else:
        corpus = list(task.tokenizer_corpus(config.data.train_difficulties, config.data.template))
    tokenizer = train_tokenizer(corpus, vocab_size=config.model.vocab_size)
    model = build_tiny_model(
        tiny_config(config), tokenizer, seed=config.train.seed, attn_implementation=config.model.attn_implementation
    ).to(device)
    log(
        f"embedded policy: tiny {config.model.arch} with {count_parameters(model):,} parameters, "
        f"vocabulary {len(tokenizer)}; SFT for {config.sft.steps} steps"
    )
    return sft_and_save(
        config,
        model,
        tokenizer,
        out_dir,
        device=device,
        progress=progress,
        sft_seconds_since=started,
        checkpoint_dir=checkpoint_dir,
        pairs=pairs,
        parameters=count_parameters(model),
    )


def sft_and_save(
    config: RunConfig,
    model,
    tokenizer,
    out_dir: Path,
    *,
    device: torch.device,
    progress: bool,
    sft_seconds_since: float | None = None,
    checkpoint_dir: Path | None = None,
    pairs: Sequence[SFTPair] | None = None,
    **extra,
) -> dict:
    """SFT ``model`` on ``pairs`` (default: ``config``'s), save it to ``out_dir`` with its summary (the final loss,
    the seconds since ``sft_seconds_since`` when given, and ``extra``); returns the summary. SFT checkpoints in
    ``checkpoint_dir`` (``sft.save_every``) are removed once the policy is saved."""
    losses = run_sft(
        model,
        tokenizer,
        list(pairs) if pairs is not None else sft_pairs(config.data, config.sft),
        config.sft,
        seed=config.train.seed,
        max_prompt_tokens=config.data.max_prompt_tokens,
        device=device,
        progress=progress,
        checkpoint_dir=checkpoint_dir,
    )
    save_policy(model, tokenizer, out_dir)
    summary: dict = {
        "sft_final_loss": sum(losses[-20:]) / len(losses[-20:]),
        # what the bits depend on (docs/training.md "Threads and bit-identical runs")
        "built_with": {"threads": torch.get_num_threads(), "torch": torch.__version__, "device": str(device)},
    }
    if sft_seconds_since is not None:
        summary["sft_seconds"] = time.perf_counter() - sft_seconds_since
    summary |= extra
    write_sft_summary(out_dir, summary)
    if checkpoint_dir is not None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    return summary


def write_sft_summary(out_dir: Path, summary: dict) -> None:
    """``out_dir/tokenbalance_sft.json``: the SFT summary and the names of the files of the policy just saved there
    (what ``tokenbalance sft --force`` may replace: only these)."""
    files = sorted({p.name for p in out_dir.iterdir()} | {SFT_SUMMARY})
    write_text_atomic(out_dir / SFT_SUMMARY, json.dumps({**summary, "files": files}, indent=1) + "\n")


def sft_written_files(out_dir: Path) -> set[str]:
    """The files ``tokenbalance sft`` recorded writing into ``out_dir`` (empty when it wrote none)."""
    from tokenbalance.outputs import recorded_files

    return recorded_files(out_dir / SFT_SUMMARY)


def ensure_embedded_policy(
    config: RunConfig,
    *,
    device: torch.device,
    progress: bool = True,
    log=print,
    task: Task | None = None,
    pairs: Sequence[SFTPair] | None = None,
) -> Path:
    """The cached embedded policy directory, building it first if needed (from the run's ``task`` and SFT ``pairs``
    when given: :func:`build_embedded_policy`)."""
    path = Path(config.model.cache_dir) / embedded_key(config)
    if (path / SFT_SUMMARY).is_file():
        log(f"embedded policy: reusing {path}")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoints = sft_checkpoint_dir(path, log=log)
    build_embedded_policy(
        config, path, device=device, progress=progress, log=log, checkpoint_dir=checkpoints, task=task, pairs=pairs
    )
    return path


def sft_checkpoint_dir(out_dir: Path, *, log=print) -> Path:
    """Where the SFT that saves to ``out_dir`` keeps its ``sft.save_every`` checkpoints: beside it, as
    ``.<name>.sft-checkpoints`` (removed once the policy is saved); says so when a stopped SFT left some."""
    checkpoints = out_dir.parent / f".{out_dir.name}.sft-checkpoints"
    if any(checkpoints.glob("step_*")):
        log(f"continuing the SFT from the checkpoints in {checkpoints}")
    return checkpoints
