"""The run config of each cell, its start policy, and what a restarted grid does with each cell.

Every cell of seed s trains from the same start policy: ``model.path`` when the config names one,
else the embedded tiny policy built by SFT with seed s (``trainer.embedded``; cached under
``model.cache_dir`` by a key of every setting that changes it, so it is built once per seed and
reused by every row, by later sittings and by ``tokenbalance train`` with the same settings). The
RL seed is s too, so a seed's cells draw the same prompt order and evaluate on the same puzzles
(the held-out set depends only on the data settings).

A cell's state on disk decides what happens to it (:func:`cell_action`):

* ``done``: ``run_state.json`` says ``completed`` at the planned steps; never run again;
* ``extend``: completed with fewer steps than planned; continued with ``--resume --steps``;
* ``resume``: started, not completed, with a checkpoint; continued from its latest checkpoint;
* ``restart``: started, not completed, no checkpoint yet; its directory is removed, run afresh;
* ``start``: nothing there yet.

A cell whose saved config differs from the planned one (other than the keys a resume may change)
is refused, naming the key: its numbers would belong to another experiment.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tokenbalance.ablate.grid import Cell, GridPlan
from tokenbalance.config import RunConfig, absolute_paths, apply_overrides, load_config, to_dict

STATE_FILE = "run_state.json"
# Keys that may differ between a cell's saved config and the plan (how it runs, not what it computes);
# output.* too (where the run directory is, reporting) and train.steps (a grid may extend its cells).
RUNNING_KEYS = ("train.device", "train.threads")


def base_config(
    plan: GridPlan, *, config_path: str | None = None, model: str | None = None, device: str | None = None
) -> RunConfig:
    """The settings every cell shares: ``--config`` (or the defaults), the preset's overrides,
    ``--model`` / ``--device``, then ``--set``. ``method.*`` overrides are refused: every row trains
    with its own preset's published hyper-parameters."""
    config = load_config(config_path) if config_path else RunConfig()
    shorthand = ([f"model.path={Path(model).resolve()}"] if model else []) + (
        [f"train.device={device}"] if device else []
    )
    config = apply_overrides(config, [*plan.preset.overrides, *shorthand, *plan.overrides])
    if config.train.method_overrides:
        raise ValueError(
            f"method overrides {config.train.method_overrides}: a grid trains every row with its preset's "
            "published hyper-parameters; define a method preset (or a row) instead"
        )
    if config.model.path is not None:
        config.model.path = str(Path(config.model.path).resolve())
    return config


def cell_config(base: RunConfig, cell: Cell, *, steps: int, policy: str, run_dir: Path) -> RunConfig:
    """The run config of ``cell``: the shared settings with its method, seed, steps, start policy
    and run directory."""
    return apply_overrides(
        base,
        [
            f"train.method={cell.method.preset}",
            f"train.seed={cell.seed}",
            f"train.steps={steps}",
            f"model.path={policy}",
            f"output.run_dir={run_dir.resolve()}",
            "output.progress=false",
        ],
    )


def start_policy(base: RunConfig, seed: int, *, log=print, progress: bool = True) -> str:
    """Seed ``seed``'s start policy: ``model.path``, or the embedded policy SFT-trained with that
    seed (built on first use, then reused from ``model.cache_dir``)."""
    if base.model.path is not None:
        return base.model.path
    from tokenbalance.trainer.embedded import ensure_embedded_policy
    from tokenbalance.trainer.runner import compute_device

    config = apply_overrides(base, [f"train.seed={seed}"])
    device = compute_device(config)
    path = ensure_embedded_policy(config, device=device, progress=progress, log=log)
    return str(Path(path).resolve())


def read_state(run_dir: Path) -> dict:
    path = run_dir / STATE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}


def _flat(config: RunConfig) -> dict[str, object]:
    return {f"{s}.{k}": v for s, values in to_dict(config).items() for k, v in values.items()}


def config_difference(saved: RunConfig, planned: RunConfig) -> str | None:
    """The first key whose value differs, as text (not the steps, ``output.*`` or :data:`RUNNING_KEYS`).
    Paths compare as absolute paths: a run saves its config with absolute paths."""
    before = _flat(absolute_paths(copy.deepcopy(saved)))
    after = _flat(absolute_paths(copy.deepcopy(planned)))
    for key, value in after.items():
        if key in RUNNING_KEYS or key == "train.steps" or key.startswith("output."):
            continue
        if before.get(key) != value:
            return f"{key}: {before.get(key)!r} in the cell, {value!r} planned"
    return None


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's latest checkpoint (``checkpoints/latest`` names ``step_000010``), or None."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    try:
        return int(name.removeprefix("step_"))
    except ValueError:
        return None


def cell_action(run_dir: Path, planned: RunConfig) -> tuple[str, int]:
    """What to do with the cell in ``run_dir`` (module docstring) and the step it has reached."""
    if not (run_dir / "config.yaml").is_file():
        return ("restart" if run_dir.exists() else "start"), 0
    saved = load_config(run_dir / "config.yaml")
    difference = config_difference(saved, planned)
    if difference is not None:
        raise ValueError(
            f"{run_dir}: this cell was started with another config ({difference}); remove the cell's "
            "directory to run it again with the new settings, or use another --out"
        )
    state = read_state(run_dir)
    if state.get("status") == "completed":
        reached = int(state.get("step", 0) or 0)
        if reached > planned.train.steps:
            raise ValueError(
                f"{run_dir}: completed {reached} steps, more than the {planned.train.steps} planned; "
                "a grid can extend a cell, not shorten it (use another --out)"
            )
        return ("done" if reached == planned.train.steps else "extend"), reached
    checkpoint = checkpoint_step(run_dir)
    if checkpoint is not None:
        return "resume", checkpoint
    return "restart", 0
