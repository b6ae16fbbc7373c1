"""What a verl grid cell launches, kept in ``launch.json`` so that a resume runs the same experiment.

:func:`launch_record` holds everything that decides a cell's numbers and that a sitting can change
without rewriting the grid: the launch and the extra overrides, the model path, the environment
``examples/verl/common.sh`` reads and the content of the scripts it runs. A later sitting that
differs is refused, naming the key. Also the cell's model path (``MODEL_PATH_3B`` ...), the keys a
cell sets itself, and its checkpoint directory (claimed by a mark, pruned to the kept ones). Standard
library only (:mod:`tokenbalance.run.cell` runs it on the node). docs/ablate.md "The grid at paper scale".
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

LAUNCH_RECORD = "launch.json"
CHECKPOINT_MARK = ".tokenbalance-cell"  # in a checkpoint directory: the cell that owns it
COMMON_SCRIPT = "examples/verl/common.sh"
# the variables examples/verl/common.sh reads that decide a cell's numbers, with its defaults
# (tests/run/test_cell_launch.py reads the script and checks each)
COMMON_DEFAULTS = {"DATA_DIR": "data/kk", "N_GPUS": "4", "VALIDATION": "greedy", "LOSS_SCOPE": "mini_batch"}
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# overrides a cell sets itself (a user's would be replaced), and what to use instead
CELL_KEYS = {
    "trainer.experiment_name": "the cell's name is its experiment",
    "data.seed": "the grid's --seeds set it",
    "actor_rollout_ref.rollout.seed": "the grid's --seeds set it",
    "trainer.resume_mode": "a cell always resumes from its newest checkpoint",
    "hydra.run.dir": "the cell keeps its composed config in its hydra/ directory",
    "trainer.logger": "set LOGGER=[console,file,...] in the environment",
    "actor_rollout_ref.model.path": "set MODEL_PATH_3B / MODEL_PATH_7B in the environment",
}
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
TRACKER = "latest_checkpointed_iteration.txt"  # verl's: the step a resume loads


def override_key(word: str) -> str:
    """The dotted key (or config group) of a hydra override, as hydra's ``key_or_group``: ``key=v``,
    ``+key=v``, ``++key=v``, ``~key``, ``~key=v`` and ``key@package=v`` -> ``key``."""
    return word.split("=", 1)[0].lstrip("+~").split("@", 1)[0].strip()


def is_hydra_key(key: str) -> bool:
    """Whether ``key`` (an :func:`override_key`) sets hydra's own config (``hydra.*`` or a ``hydra/``
    group), not the application's: hydra's ``Override.is_hydra_override``."""
    return key.startswith(("hydra.", "hydra/"))


def last_value(overrides: list[str], key: str) -> str | None:
    """The value the last override of ``key`` sets (hydra's: the last one wins); None when none does."""
    values = [word.split("=", 1)[1] for word in overrides if "=" in word and override_key(word) == key]
    return values[-1] if values else None


def check_overrides(overrides: list[str]) -> None:
    """``ValueError`` naming the first override of a key the cell sets itself."""
    for word in overrides:
        key = override_key(word)
        if key in CELL_KEYS:
            raise ValueError(f"the override {word!r} sets {key}, which the cell sets itself ({CELL_KEYS[key]})")


def model_path(model: str, hub_name: str, env: Mapping[str, str]) -> str:
    """The cell's model: ``MODEL_PATH_<MODEL>`` (``MODEL_PATH_3B``), else the hub name; ``ValueError`` when a
    plain ``MODEL_PATH`` (one model for every cell) is set instead, or the hub cannot be reached."""
    name = f"MODEL_PATH_{model.upper()}"
    path, plain = env.get(name, ""), env.get("MODEL_PATH", "")
    if plain and plain != path:
        raise ValueError(
            f"MODEL_PATH={plain!r} would train every model's cells on one model; set {name} (this cell's {model}) "
            "and the other models' MODEL_PATH_<MODEL> instead"
        )
    if path:
        return path
    offline = [flag for flag in OFFLINE if env.get(flag, "").strip().lower() in ("1", "true", "yes", "on")]
    if offline:
        raise ValueError(f"{name} is not set and {offline[0]} forbids downloading {hub_name}: set {name} to its copy")
    return hub_name


def file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def launched_script(launch: list[str]) -> str | None:
    """The script the launch runs: the word after ``bash``."""
    return next((launch[i + 1] for i, word in enumerate(launch[:-1]) if word == "bash"), None)


def launch_record(
    launch: list[str], overrides: list[str], model: str, path: str, env: Mapping[str, str], root: Path
) -> dict:
    """Everything a sitting can change that decides the cell's numbers; ``root``: where the scripts run."""
    record = {"launch": list(launch), "extra overrides": list(overrides), "MODEL": model, "MODEL_PATH": path}
    record |= {name: env.get(name) or default for name, default in COMMON_DEFAULTS.items()}
    for script in dict.fromkeys([COMMON_SCRIPT, launched_script(launch) or COMMON_SCRIPT]):
        record[f"content of {script}"] = file_digest(root / script)
    return record


def record_change(earlier: dict, now: dict) -> str | None:
    """The first key whose value differs, as one phrase; None when none does."""
    for key in dict.fromkeys([*earlier, *now]):
        before, after = earlier.get(key), now.get(key)
        if before != after:
            if key.startswith("content of "):
                return f"{key.removeprefix('content of ')} was edited (sha256 {str(before)[:12]} -> {str(after)[:12]})"
            return f"{key} changed ({json.dumps(before)} -> {json.dumps(after)})"
    return None


def read_record(cell_dir: Path) -> dict | None:
    try:
        record = json.loads((Path(cell_dir) / LAUNCH_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def checkpoint_dir(default: Path, overrides: list[str]) -> Path:
    """``trainer.default_local_dir`` as the user's overrides set it, else the cell's ``default``."""
    return Path(last_value(overrides, "trainer.default_local_dir") or default)


def claim_checkpoints(directory: Path, cell: str, own: bool) -> None:
    """Mark ``directory`` as ``cell``'s; ``ValueError`` when another cell's mark is there, or when it
    holds files without a mark (verl would resume from them) and is not the cell's ``own`` default."""
    mark = directory / CHECKPOINT_MARK
    if mark.is_file():
        owner = mark.read_text(errors="replace").strip()
        if owner != cell:
            raise ValueError(
                f"the checkpoint directory {directory} is cell {owner}'s: give each cell its own (CHECKPOINT_ROOT=DIR "
                "puts cell C's in DIR/C)"
            )
        return
    if directory.is_dir() and any(directory.iterdir()) and not own:
        raise ValueError(
            f"the checkpoint directory {directory} holds files but no {CHECKPOINT_MARK} mark: verl would resume from "
            "them; give the cell an empty or new directory"
        )
    directory.mkdir(parents=True, exist_ok=True)
    mark.write_text(cell + "\n")


def keep_setting(overrides: list[str], default: str) -> int | None:
    """The checkpoints to keep: ``trainer.max_actor_ckpt_to_keep`` of the overrides, else ``default``
    (``KEEP_CHECKPOINTS``); None (keep every one) for null or a number below 1, as verl reads it."""
    value = last_value(overrides, "trainer.max_actor_ckpt_to_keep") or default
    try:
        return int(value) if int(value) > 0 else None
    except ValueError:
        return None


def latest_checkpoint(directory: Path) -> int | None:
    """The step verl's tracker in ``directory`` names (the checkpoint a resume loads); None without one."""
    try:
        return int((Path(directory) / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def prune_checkpoints(directory: Path, keep: int | None) -> list[str]:
    """Remove the ``global_step_<N>`` directories older than the newest ``keep`` up to the one verl's
    tracker names (the one a resume loads); returns their names. Nothing without a tracker or ``keep``.
    verl rotates only within a sitting, so each sitting would otherwise leave its last ones behind."""
    latest = latest_checkpoint(directory)
    if latest is None or keep is None:
        return []
    steps = sorted(
        int(match.group(1)) for path in directory.iterdir() if (match := _STEP_DIR.match(path.name)) and path.is_dir()
    )
    kept = [step for step in steps if step <= latest][-keep:]
    removed = [step for step in steps if step < latest and step not in kept]
    for step in removed:
        shutil.rmtree(directory / f"global_step_{step}")
    return [f"global_step_{step}" for step in removed]
