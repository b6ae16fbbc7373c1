"""What a grid does with a cell, from its run directory (:class:`~tokenbalance.run.state.RunDirState`, as ``train
--resume``): :class:`Action` ``done``, ``extend`` (completed with fewer steps), ``resume`` or ``start``. Nothing is
deleted; another config, a live holder or files without a run are refused naming the cell. docs/ablate.md "Restarting
a grid"."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import NamedTuple

from tokenbalance.config import RunConfig, load_config
from tokenbalance.run.lock import LOCK_FILE
from tokenbalance.run.resume import changed_setting
from tokenbalance.run.state import CONFIG_FILE, RunDirState, has_final_eval


class Action(str, Enum):
    START = "start"
    RESUME = "resume"
    EXTEND = "extend"
    DONE = "done"

    def __str__(self) -> str:
        return self.value

    @property
    def continues(self) -> bool:
        """Whether the cell's run goes on with ``train --resume`` (resume, extend)."""
        return self in (Action.RESUME, Action.EXTEND)


class CellAction(NamedTuple):
    """What a sitting does with a cell (module docstring) and the step it continues from."""

    action: Action
    from_step: int


def cell_action(run_dir: Path, planned: RunConfig) -> CellAction:
    """What to do with the cell in ``run_dir`` (module docstring) and the step it continues from."""
    state = RunDirState.read(run_dir)
    if state.locked:
        raise ValueError(
            f"{run_dir}: a live process holds this cell (its lock: {run_dir / LOCK_FILE}), e.g. a cell of an "
            "earlier grid still running; stop it or wait for it, then run the grid again"
        )
    if not state.has_config:
        if state.has_files:
            raise ValueError(
                f"{run_dir}: holds files but no run (no config.yaml); a grid never deletes them. Move them away "
                "and run the grid again"
            )
        return CellAction(Action.START, 0)
    changed = changed_setting(load_config(run_dir / CONFIG_FILE), planned)
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
            return CellAction(Action.RESUME, state.state_step)  # its final evaluation was lost (a torn line)
        done = state.state_step == planned.train.steps
        return CellAction(Action.DONE if done else Action.EXTEND, state.state_step)
    return CellAction(Action.RESUME, state.resume_step)
