"""The run config of each cell, its start policy, and what a restarted grid does with each cell.

Every cell of seed s trains from the same start policy: ``model.path`` when the config names one,
else the embedded tiny policy built by SFT with seed s (``trainer.embedded``; cached under
``model.cache_dir`` by a key of every setting that changes it, so it is built once per seed and
reused by every row, by later sittings and by ``tokenbalance train`` with the same settings). The
RL seed is s too, so a seed's cells draw the same prompt order and evaluate on the same puzzles
(the held-out set depends only on the data settings).

A cell's run directory decides what happens to it (:func:`cell_action`, from
:class:`tokenbalance.trainer.rundir.RunDirState`, the rule ``tokenbalance train --resume`` follows):

* ``done``: ``run_state.json`` says ``completed`` at the planned steps; never run again (unless its
  final evaluation line was torn: then ``train --resume`` evaluates it again, as it does for a run);
* ``extend``: completed with fewer steps than planned; continued with ``--resume --steps``;
* ``resume``: started, not completed; continued with ``--resume`` from the checkpoint the trainer
  resumes from (its newest complete one, whether or not ``latest`` names it yet), or from step 0
  when it has none. Nothing of a cell is ever deleted;
* ``start``: no directory, or an empty one.

Refused before any work, naming the cell: a cell whose saved config differs from the planned one
outside the settings a new sitting may change (its numbers would belong to another experiment), a
cell a live process holds (an earlier grid's child still running), and a directory holding files
but no run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple

from tokenbalance.ablate.grid import Cell, GridPlan
from tokenbalance.config import RunConfig, apply_overrides, load_config, replace_sections
from tokenbalance.run.setup import RunSetup


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
    return replace_sections(
        base,
        train={"method": cell.method.preset, "seed": cell.seed, "steps": steps},
        model={"path": policy},
        output={"run_dir": str(run_dir.resolve()), "progress": False},
    )


def start_policy(base: RunConfig, seed: int, *, log=print, progress: bool = True, setup: RunSetup | None = None) -> str:
    """Seed ``seed``'s start policy: ``model.path``, or the embedded policy SFT-trained with that
    seed (built on first use, then reused from ``model.cache_dir``; from ``base``'s ``setup``: its
    task and SFT pairs, which no seed changes)."""
    if base.model.path is not None:
        return base.model.path
    from tokenbalance.trainer.embedded import ensure_embedded_policy
    from tokenbalance.trainer.runner import compute_device

    config = replace_sections(base, train={"seed": seed})
    device = compute_device(config)
    task, pairs = (setup.task, setup.sft_pairs) if setup is not None else (None, None)
    path = ensure_embedded_policy(config, device=device, progress=progress, log=log, task=task, pairs=pairs)
    return str(Path(path).resolve())


class CellAction(NamedTuple):
    """What a sitting does with a cell (module docstring) and the step it continues from."""

    action: Literal["start", "resume", "extend", "done"]
    from_step: int


def cell_action(run_dir: Path, planned: RunConfig) -> CellAction:
    """What to do with the cell in ``run_dir`` (module docstring) and the step it continues from."""
    from tokenbalance.trainer.rundir import RunDirState, changed_setting, has_final_eval

    state = RunDirState.read(run_dir)
    if state.locked:
        raise ValueError(
            f"{run_dir}: a live process holds this cell (its lock: {run_dir / '.lock'}), e.g. a cell of an earlier "
            "grid still running; stop it or wait for it, then run the grid again"
        )
    if not state.has_config:
        if state.has_files:
            raise ValueError(
                f"{run_dir}: holds files but no run (no config.yaml); a grid never deletes them. Move them away "
                "and run the grid again"
            )
        return CellAction("start", 0)
    changed = changed_setting(load_config(run_dir / "config.yaml"), planned)
    if changed is not None:
        key, before, after = changed
        raise ValueError(
            f"{run_dir}: this cell was started with another config ({key}: {before!r} in the cell, {after!r} "
            "planned); remove the cell's directory to run it again with the new settings, or use another --out"
        )
    if state.completed:
        if state.state_step > planned.train.steps:
            raise ValueError(
                f"{run_dir}: completed {state.state_step} steps, more than the {planned.train.steps} planned; "
                "a grid can extend a cell, not shorten it (use another --out)"
            )
        if state.state_step == planned.train.steps and not has_final_eval(run_dir, planned.train.steps):
            return CellAction("resume", state.state_step)  # its final evaluation was lost (a torn line)
        return CellAction("done" if state.state_step == planned.train.steps else "extend", state.state_step)
    return CellAction("resume", state.resume_step)
