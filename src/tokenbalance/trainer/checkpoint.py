"""RL checkpoints written and read: ``checkpoints/step_000010/`` holds ``model/`` (save_pretrained),
``optimizer.safetensors`` (keyed "<param index>.<name>") and ``trainer_state.json`` (step, optimizer scalars, seeds,
data position, config); nothing pickled. Naming, completeness and pruning: :mod:`tokenbalance.run.checkpoints`;
docs/training.md."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tokenbalance.models import save_policy
from tokenbalance.outputs import write_text_atomic
from tokenbalance.run.checkpoints import LATEST, MODEL_DIR, OPTIMIZER_FILE, STATE_FILE, checkpoint_name, rl_store


def optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The optimizer's state as tensors (``"<param index>.<name>"``, for safetensors) and JSON."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entry in state["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"scalars": scalars, "param_groups": state["param_groups"]}


def optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    """Restore ``optimizer`` in place from :func:`optimizer_to_flat`'s tensors and JSON."""
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer, state: dict) -> Path:
    """Write checkpoint ``step`` atomically and point ``latest`` at it; returns its directory."""
    store = rl_store(run_dir)
    tmp = store.new_temp(step)
    try:
        save_policy(model, tokenizer, tmp / MODEL_DIR)
        tensors, meta = optimizer_to_flat(optimizer)
        save_file(tensors, str(tmp / OPTIMIZER_FILE))
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step, "optimizer": meta}, indent=1))
        final = store.place(tmp, step)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if type(err).__name__ == "SafetensorError":  # safetensors reports a full disk as its own error type
            final = store.root / checkpoint_name(step)
            raise OSError(errno.EIO, f"cannot write the checkpoint ({err})", str(final)) from None
        raise
    write_text_atomic(store.root / LATEST, final.name + "\n")
    return final


def load_trainer_state(checkpoint: Path, optimizer) -> dict:
    """Restore the optimizer in place and return the JSON trainer state."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    optimizer_from_flat(optimizer, load_file(str(checkpoint / OPTIMIZER_FILE)), state.pop("optimizer"))
    return state
