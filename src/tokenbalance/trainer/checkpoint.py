"""Checkpoints: the policy in Hugging Face format plus a small trainer state, written atomically.

Layout of ``RUN_DIR/checkpoints/step_000010/``::

    model/                   save_pretrained (safetensors) + tokenizer files
    optimizer.safetensors    every optimizer state tensor, keyed "<param index>.<name>"
    trainer_state.json       step, optimizer scalars and param groups, RNG seeds, data position

Nothing is pickled, so loading a checkpoint never runs code. A checkpoint directory is built
under a temporary name and renamed into place only when complete; ``RUN_DIR/checkpoints/latest``
names the newest one and is itself replaced atomically. With ``train.keep_checkpoints`` k > 0,
:func:`prune_checkpoints` then removes the complete checkpoints older than the newest k. Only
names the trainer writes (``step_`` and six or more digits) are ever read or removed: a user's
``step_000001_best`` or ``step_000002.keep`` beside them is not a checkpoint and is never touched.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tokenbalance.models import save_policy
from tokenbalance.outputs import umask_modes, write_text_atomic

__all__ = [
    "checkpoint_dirs",
    "checkpoint_step",
    "optimizer_from_flat",
    "optimizer_to_flat",
    "is_complete_checkpoint",
    "latest_checkpoint",
    "load_trainer_state",
    "prune_checkpoints",
    "pruned_note",
    "resume_checkpoint",
    "save_checkpoint",
    "write_text_atomic",
]

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
CHECKPOINT_NAME = re.compile(r"step_[0-9]{6,}")


def checkpoint_dirs(root: Path) -> list[Path]:
    """The folders in ``root`` named exactly as :func:`save_checkpoint` names them (``step_000010``),
    oldest first; anything else there (``step_000001_best``, ``step_2.keep``) is the user's."""
    if not Path(root).is_dir():
        return []
    found = [p for p in Path(root).iterdir() if CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step_")))


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
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".step_{step:06d}."))
    try:
        save_policy(model, tokenizer, tmp / "model")
        tensors, meta = optimizer_to_flat(optimizer)
        save_file(tensors, str(tmp / OPTIMIZER_FILE))
        (tmp / STATE_FILE).write_text(json.dumps({**state, "step": step, "optimizer": meta}, indent=1))
        umask_modes(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if type(err).__name__ == "SafetensorError":  # safetensors reports a full disk as its own error type
            raise OSError(errno.EIO, f"cannot write the checkpoint ({err})", str(final)) from None
        raise
    write_text_atomic(root / "latest", final.name + "\n")
    return final


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Remove the complete checkpoints (:func:`checkpoint_dirs`) older than the newest ``keep`` (never
    the one ``latest`` names); returns the removed directories. Incomplete ones are left to the resume's
    repair, which knows whether a process is still writing them."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(run_dir) / "checkpoints"
    newest = resume_checkpoint(run_dir)
    complete = [p for p in checkpoint_dirs(root) if is_complete_checkpoint(p)]
    removed = [p for p in complete[:-keep] if p != newest]
    for path in removed:
        shutil.rmtree(path)
    return removed


def pruned_note(removed: list[Path], keep: int) -> str:
    """The line the trainer prints after :func:`prune_checkpoints` removed ``removed``."""
    names = ", ".join(p.name for p in removed)
    return f"{removed[0].parent}: removed {names} (train.keep_checkpoints={keep} keeps the newest {keep})"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The directory ``latest`` points to, or None when the run has no complete checkpoint."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise ValueError(f"{pointer}: points to {path.name}, which is not a complete checkpoint")
    return path


def is_complete_checkpoint(path: Path) -> bool:
    return (path / STATE_FILE).is_file() and (path / OPTIMIZER_FILE).is_file() and (path / "model").is_dir()


def resume_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a resume continues from: the one ``latest`` names when it is complete, else the
    newest complete ``step_*`` (a run stopped between renaming a checkpoint into place and writing
    ``latest`` has one that ``latest`` does not name yet); None when there is none."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    try:
        named = root / pointer.read_text().strip() if pointer.is_file() else None
    except OSError:
        named = None
    if named is not None and is_complete_checkpoint(named):
        return named
    complete = [p for p in checkpoint_dirs(root) if is_complete_checkpoint(p)]
    return complete[-1] if complete else None


def policy_dir(path: str) -> str:
    """A policy directory from a policy directory, a checkpoint directory or a run directory (its
    ``latest`` checkpoint, or the newest complete ``step_*`` when ``latest`` is lost): what
    ``--model`` and ``diagnose CHECKPOINT`` accept. Any other path is returned as given."""
    directory = Path(path)
    if directory.is_dir() and not (directory / "config.json").is_file() and (directory / "checkpoints").is_dir():
        checkpoint = resume_checkpoint(directory)
        if checkpoint is None:
            raise ValueError(f"{path}: a run directory without a complete checkpoint (no complete checkpoints/step_*)")
        directory = checkpoint
    if (directory / "model" / "config.json").is_file():
        directory = directory / "model"
    return str(directory)


def checkpoint_step(run_dir: Path) -> int:
    """The step a resume continues from (:func:`resume_checkpoint`); 0 when there is none."""
    path = resume_checkpoint(run_dir)
    try:
        return int(path.name.removeprefix("step_")) if path is not None else 0
    except ValueError:
        return 0


def load_trainer_state(checkpoint: Path, optimizer) -> dict:
    """Restore the optimizer in place and return the JSON trainer state."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    optimizer_from_flat(optimizer, load_file(str(checkpoint / OPTIMIZER_FILE)), state.pop("optimizer"))
    return state
