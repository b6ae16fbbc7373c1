"""Stop a verl run at the next step with a checkpoint of the last completed one, when a file asks.

Our trainers (``tokenbalance_sync``, ``tokenbalance_lopti``, ``tokenbalance_nthr``) call
:func:`stop_if_requested` at ``on_step_begin``: when the file :data:`STOP_FILE_ENV` names exists,
the completed step is saved (unless it is already the newest checkpoint), the answer is written into
the file and :class:`StopRequested` ends the run. A file, not a signal: the fit loop runs in a Ray
actor that the launcher's signals never reach. docs/verl.md, "Stopping a run with a checkpoint".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tokenbalance.integrations.verl.names import STOP_FILE_ENV, SYNC_TRAINER
from tokenbalance.run.cell_launch import latest_checkpoint


class StopRequested(RuntimeError):
    """The run stopped because its stop file exists (a checkpoint saved first when one was missing)."""


def step_to_save(completed_step: int, newest_checkpoint: int | None) -> int | None:
    """The step to checkpoint before stopping: ``completed_step`` (the one before the step that begins),
    or None when no step has completed yet or it is already the newest checkpoint (a ``save_freq``
    step, or the checkpoint this sitting resumed from)."""
    if completed_step < 1 or completed_step == newest_checkpoint:
        return None
    return completed_step


def stop_answer(completed_step: int, saved_step: int | None) -> str:
    """What the stop did, one phrase (written into the stop file, and the exception's message)."""
    if saved_step is not None:
        return f"checkpoint global_step_{saved_step} saved before step {saved_step + 1}"
    if completed_step < 1:
        return "no step completed, no checkpoint saved"
    return f"global_step_{completed_step} was already the newest checkpoint"


def requested_stop_file(env: Mapping[str, str] = os.environ) -> Path | None:
    """The stop file when it exists; None when :data:`STOP_FILE_ENV` is unset or names no file."""
    name = env.get(STOP_FILE_ENV, "")
    return Path(name) if name and Path(name).exists() else None


def save_checkpoint_at(trainer, step: int) -> None:
    """verl's ``_save_checkpoint`` for ``step``: it names the folder and the tracker from
    ``trainer.global_steps``, which is set to ``step`` for the save and restored after."""
    current = trainer.global_steps
    trainer.global_steps = step
    try:
        trainer._save_checkpoint()
    finally:
        trainer.global_steps = current


def stop_if_requested(trainer, env: Mapping[str, str] = os.environ) -> None:
    """At ``on_step_begin`` (``trainer.global_steps`` = the step about to run): nothing without a stop
    file; else save the completed step if :func:`step_to_save` says so (the rollout replicas put to
    sleep first, as verl does before it loads a checkpoint), write the answer into the file and raise
    :class:`StopRequested`."""
    path = requested_stop_file(env)
    if path is None:
        return
    completed = trainer.global_steps - 1
    step = step_to_save(completed, latest_checkpoint(Path(trainer.config.trainer.default_local_dir)))
    if step is not None:
        trainer.checkpoint_manager.sleep_replicas()
        save_checkpoint_at(trainer, step)
    answer = stop_answer(completed, step)
    try:
        path.write_text(answer + "\n")
    except OSError:
        pass  # the answer is also the exception's message, in the launch's log
    raise StopRequested(f"stop requested ({path}): {answer}; launch again (trainer.resume_mode=auto) to resume")


def build_sync_trainer():
    """Define and register the ``tokenbalance_sync`` trainer: verl's ``PPOTrainerSync`` plus the stop
    on request, nothing else (imports verl's v1 trainer)."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    if SYNC_TRAINER in TRAINER_REGISTRY:
        return TRAINER_REGISTRY[SYNC_TRAINER]

    class TokenBalanceSyncTrainer(PPOTrainerSync):
        """verl's sync trainer with :func:`stop_if_requested` at each step's beginning. verl's base
        class reads ``trainer_mode`` for its sync-only choices (the replay buffer, the data loader's
        batch, TransferQueue's checkpoint): it reads "sync" here, as for verl's own sync trainer."""

        def on_step_begin(self):
            stop_if_requested(self)
            super().on_step_begin()

        @property
        def trainer_mode(self) -> str:
            return "sync"

        @trainer_mode.setter
        def trainer_mode(self, name: str) -> None:
            """verl's ``__init__`` sets it from ``trainer.v1.trainer_mode``: this trainer stays "sync"."""

    return register_trainer(SYNC_TRAINER)(TokenBalanceSyncTrainer)
