"""Checkpoints of a supervised warm start, so that a long SFT build (the synthetic chain of thought
takes hours on a CPU) can stop and continue bit for bit.

Layout of the checkpoint directory (``sft.save_every > 0``)::

    step_000050/   model.safetensors (shared weights kept shared), optimizer.safetensors (with the
                   batch sampler's random-generator state), sft_state.json (step, losses, the
                   optimizer's scalars, a fingerprint of what is being trained)

A step directory is written under a temporary name and renamed into place when complete; the
older ones are then removed. A checkpoint whose fingerprint (the SFT settings, seed, examples and
tokenizer vocabulary) differs from the SFT asked for is refused, naming the directory to delete.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from tokenbalance.outputs import umask_modes
from tokenbalance.trainer.checkpoint import checkpoint_dirs, optimizer_from_flat, optimizer_to_flat

STATE = "sft_state.json"
GENERATOR_KEY = "__generator_state__"


def fingerprint(settings: dict, seed: int, pairs: list, vocab: dict[str, int]) -> str:
    """A hash of everything that decides the SFT's numbers but its progress."""
    text = json.dumps(
        {"settings": settings, "seed": seed, "pairs": [[p.prompt, p.response] for p in pairs], "vocab": vocab},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def save(
    directory: Path, step: int, model, optimizer, generator: torch.Generator, losses: list[float], key: str
) -> None:
    """Write step ``step``'s checkpoint into ``directory`` (atomically), then drop the older ones."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=f".step_{step:06d}."))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        tensors, meta = optimizer_to_flat(optimizer)
        save_file({**tensors, GENERATOR_KEY: generator.get_state()}, str(tmp / "optimizer.safetensors"))
        (tmp / STATE).write_text(json.dumps({"step": step, "losses": losses, "fingerprint": key, "optimizer": meta}))
        final = directory / f"step_{step:06d}"
        umask_modes(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for older in checkpoint_dirs(directory):
        if older.name < final.name:
            shutil.rmtree(older, ignore_errors=True)


def latest(directory: Path) -> Path | None:
    complete = [p for p in checkpoint_dirs(directory) if (p / STATE).is_file()]
    return complete[-1] if complete else None


def restore(directory: Path, model, optimizer, generator: torch.Generator, key: str) -> tuple[int, list[float]]:
    """Load the newest complete checkpoint into ``model``, ``optimizer`` and ``generator``; returns
    (its step, the losses so far); (0, []) when there is none."""
    checkpoint = latest(directory)
    if checkpoint is None:
        return 0, []
    state = json.loads((checkpoint / STATE).read_text())
    if state.get("fingerprint") != key:
        raise ValueError(
            f"{checkpoint}: an SFT checkpoint of other settings, examples or tokenizer; delete {directory} to "
            "start this SFT from step 0"
        )
    load_model(model, str(checkpoint / "model.safetensors"))
    tensors = load_file(str(checkpoint / "optimizer.safetensors"))
    generator.set_state(tensors.pop(GENERATOR_KEY))
    optimizer_from_flat(optimizer, tensors, state["optimizer"])
    return int(state["step"]), [float(x) for x in state["losses"]]
