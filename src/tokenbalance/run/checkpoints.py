"""Checkpoint folders of the RL trainer (:func:`rl_store`) and the SFT (:func:`sft_store`): naming, completeness,
listing, finding, pruning (their tensors: trainer/checkpoint.py, trainer/sft_checkpoint.py). Built under a temporary
name and renamed whole; ``checkpoints/latest`` names the newest; only ``step_`` + 6 or more digits is ever read or
removed. Standard library only; docs/training.md "The run directory"."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.outputs import umask_modes

CHECKPOINTS_DIR = "checkpoints"  # in a run directory
LATEST = "latest"  # in CHECKPOINTS_DIR: the name of the newest RL checkpoint
TEMP_PREFIX = ".step_"  # a checkpoint being written: .step_000010.<random>
CHECKPOINT_NAME = re.compile(r"step_[0-9]{6,}")
STATE_FILE = "trainer_state.json"  # RL: step, optimizer scalars and param groups, seeds, data position, config
OPTIMIZER_FILE = "optimizer.safetensors"  # RL and SFT: every optimizer state tensor
MODEL_DIR = "model"  # RL: save_pretrained (safetensors) + tokenizer files
SFT_STATE_FILE = "sft_state.json"  # SFT: step, losses, optimizer scalars, fingerprint
SFT_MODEL_FILE = "model.safetensors"  # SFT: the weights (shared ones kept shared)


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def step_of(checkpoint: Path) -> int:
    """The step a checkpoint folder (named by :func:`checkpoint_name`) holds."""
    return int(Path(checkpoint).name.removeprefix("step_"))


@dataclass(frozen=True)
class CheckpointStore:
    """The ``step_*`` checkpoints in ``root`` whose layout is ``files`` and ``dirs``."""

    root: Path
    files: tuple[str, ...]
    dirs: tuple[str, ...] = ()

    def is_complete(self, checkpoint: Path) -> bool:
        """The one completeness rule: every file and folder of the layout is there (a checkpoint is renamed into place
        only when whole; a folder that lacks one is damaged or not ours)."""
        return all((checkpoint / n).is_file() for n in self.files) and all((checkpoint / n).is_dir() for n in self.dirs)

    def layout(self) -> str:
        """The layout in words: ``trainer_state.json, optimizer.safetensors and model/``."""
        names = [*self.files, *(f"{n}/" for n in self.dirs)]
        return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]

    def steps(self) -> list[Path]:
        """The folders named exactly as the trainer names them, oldest first, complete or not."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir()]
        return sorted(found, key=step_of)

    def complete(self) -> list[Path]:
        return [p for p in self.steps() if self.is_complete(p)]

    def newest(self) -> Path | None:
        complete = self.complete()
        return complete[-1] if complete else None

    def new_temp(self, step: int) -> Path:
        """An empty folder to write checkpoint ``step`` into (hidden: never taken for a checkpoint)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.root, prefix=f".{checkpoint_name(step)}."))

    def place(self, temp: Path, step: int) -> Path:
        """Rename the written ``temp`` into place as checkpoint ``step`` (modes as the umask says)."""
        umask_modes(temp)
        final = self.root / checkpoint_name(step)
        if final.exists():
            shutil.rmtree(final)
        os.replace(temp, final)
        return final

    def prune(self, keep: int, *, spare: Path | None = None) -> list[Path]:
        """Remove the complete checkpoints older than the newest ``keep`` (never ``spare``); returns them. Incomplete
        ones are left to the resume's repair."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        removed = [p for p in self.complete()[:-keep] if p != spare]
        for path in removed:
            shutil.rmtree(path)
        return removed


def rl_store(run_dir: Path) -> CheckpointStore:
    """The RL checkpoints of a run: ``model/``, ``optimizer.safetensors``, ``trainer_state.json``."""
    return CheckpointStore(Path(run_dir) / CHECKPOINTS_DIR, (STATE_FILE, OPTIMIZER_FILE), (MODEL_DIR,))


def sft_store(directory: Path) -> CheckpointStore:
    """The SFT's checkpoints in ``directory``: ``model.safetensors``, ``optimizer.safetensors``, ``sft_state.json``."""
    return CheckpointStore(Path(directory), (SFT_STATE_FILE, SFT_MODEL_FILE, OPTIMIZER_FILE))


def checkpoint_dirs(root: Path) -> list[Path]:
    """The folders in ``root`` named as the trainer names checkpoints, oldest first."""
    return CheckpointStore(Path(root), ()).steps()


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, or None when there is no ``latest``; ``ValueError`` when it names one that is
    not complete."""
    store = rl_store(run_dir)
    pointer = store.root / LATEST
    if not pointer.is_file():
        return None
    path = store.root / pointer.read_text().strip()
    if not store.is_complete(path):
        raise ValueError(f"{pointer}: points to {path.name}, which is not a complete checkpoint")
    return path


def resume_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a resume continues from: the one ``latest`` names when it is complete, else the newest complete
    ``step_*`` (a run stopped between renaming a checkpoint into place and writing ``latest`` has one that ``latest``
    does not name yet); None when there is none."""
    store = rl_store(run_dir)
    pointer = store.root / LATEST
    try:
        named = store.root / pointer.read_text().strip() if pointer.is_file() else None
    except OSError:
        named = None
    if named is not None and store.is_complete(named):
        return named
    return store.newest()


def checkpoint_step(run_dir: Path) -> int:
    """The step a resume continues from (:func:`resume_checkpoint`); 0 when there is none."""
    path = resume_checkpoint(run_dir)
    try:
        return step_of(path) if path is not None else 0
    except ValueError:
        return 0


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """``train.keep_checkpoints``: remove the RL checkpoints older than the newest ``keep`` (never the one a resume
    continues from); returns the removed folders."""
    return rl_store(run_dir).prune(keep, spare=resume_checkpoint(run_dir))


def pruned_note(removed: list[Path], keep: int) -> str:
    """The line the trainer prints after :func:`prune_checkpoints` removed ``removed``."""
    names = ", ".join(p.name for p in removed)
    return f"{removed[0].parent}: removed {names} (train.keep_checkpoints={keep} keeps the newest {keep})"


def policy_dir(path: str) -> str:
    """A policy directory from a policy directory, a checkpoint directory or a run directory (its ``latest``
    checkpoint, or the newest complete ``step_*`` when ``latest`` is lost): what ``--model`` and ``diagnose
    CHECKPOINT`` accept. Any other path is returned as given."""
    directory = Path(path)
    if directory.is_dir() and not (directory / "config.json").is_file() and (directory / CHECKPOINTS_DIR).is_dir():
        checkpoint = resume_checkpoint(directory)
        if checkpoint is None:
            raise ValueError(f"{path}: a run directory without a complete checkpoint (no complete checkpoints/step_*)")
        directory = checkpoint
    if (directory / MODEL_DIR / "config.json").is_file():
        directory = directory / MODEL_DIR
    return str(directory)


def verify_checkpoint(checkpoint: Path) -> None:
    """Read the headers of every file of an RL ``checkpoint`` (JSON files parsed, safetensors headers opened; cheap)
    so that a damaged checkpoint is named before any model work."""
    from safetensors import safe_open

    def damaged(path: Path, err: BaseException) -> ValueError:
        return ValueError(
            f"{path}: unreadable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); the "
            f"checkpoint {checkpoint.name} is damaged. To resume from the previous complete checkpoint, move "
            f"{checkpoint} out of {checkpoint.parent} (then --resume again)"
        )

    for path in (checkpoint / STATE_FILE, checkpoint / MODEL_DIR / "config.json"):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise damaged(path, err) from None
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
        int(state["step"])
        state["optimizer"]["param_groups"]
    except (KeyError, TypeError, ValueError) as err:
        raise damaged(checkpoint / STATE_FILE, err) from None
    tensors = [checkpoint / OPTIMIZER_FILE, *sorted((checkpoint / MODEL_DIR).glob("*.safetensors"))]
    if len(tensors) == 1:
        raise damaged(checkpoint / MODEL_DIR, FileNotFoundError("no *.safetensors weights"))
    for path in tensors:
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for a bad file
            raise damaged(path, err) from None
