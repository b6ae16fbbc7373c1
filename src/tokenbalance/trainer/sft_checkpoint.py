"""Checkpoints of an SFT build (``sft.save_every``), to stop and continue bit for bit: ``step_000050/`` holds
``model.safetensors``, ``optimizer.safetensors`` (with the sampler's RNG state) and ``sft_state.json`` (step, losses,
optimizer scalars, a fingerprint of what is trained; another fingerprint is refused). Stored as
:func:`tokenbalance.run.checkpoints.sft_store` says; docs/training.md."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from tokenbalance.run.checkpoints import OPTIMIZER_FILE, SFT_MODEL_FILE, SFT_STATE_FILE, sft_store
from tokenbalance.trainer.checkpoint import optimizer_from_flat, optimizer_to_flat

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
    store = sft_store(directory)
    tmp = store.new_temp(step)
    try:
        save_model(model, str(tmp / SFT_MODEL_FILE))
        tensors, meta = optimizer_to_flat(optimizer)
        save_file({**tensors, GENERATOR_KEY: generator.get_state()}, str(tmp / OPTIMIZER_FILE))
        state = {"step": step, "losses": losses, "fingerprint": key, "optimizer": meta}
        (tmp / SFT_STATE_FILE).write_text(json.dumps(state))
        store.place(tmp, step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    store.prune(1)


def latest(directory: Path) -> Path | None:
    return sft_store(directory).newest()


def restore(directory: Path, model, optimizer, generator: torch.Generator, key: str) -> tuple[int, list[float]]:
    """Load the newest complete checkpoint into ``model``, ``optimizer`` and ``generator``; returns (its step, the
    losses so far); (0, []) when there is none."""
    checkpoint = latest(directory)
    if checkpoint is None:
        return 0, []
    state = json.loads((checkpoint / SFT_STATE_FILE).read_text())
    if state.get("fingerprint") != key:
        raise ValueError(
            f"{checkpoint}: an SFT checkpoint of other settings, examples or tokenizer; delete {directory} to "
            "start this SFT from step 0"
        )
    load_model(model, str(checkpoint / SFT_MODEL_FILE))
    tensors = load_file(str(checkpoint / OPTIMIZER_FILE))
    generator.set_state(tensors.pop(GENERATOR_KEY))
    optimizer_from_flat(optimizer, tensors, state["optimizer"])
    return int(state["step"]), [float(x) for x in state["losses"]]
