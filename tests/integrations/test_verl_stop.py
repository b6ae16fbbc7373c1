"""The stop on request of our verl trainers (integrations/verl/stop.py): which step it saves, the save
through verl's ``_save_checkpoint`` with ``global_steps`` set to that step and restored, the answer
in the stop file and the exception; then each registered trainer's ``on_step_begin`` doing it (verl
imported, its trainers built without ``__init__``: no Ray). The sitting and the Slurm task that use
it: tests/ablate/test_verl_sittings.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

stop = pytest.importorskip("tokenbalance.integrations.verl.stop")  # needs verl installed (its version checked)
from tokenbalance.integrations.verl.names import LOPTI_TRAINER, NTHR_TRAINER, STOP_FILE_ENV, SYNC_TRAINER  # noqa: E402


@pytest.mark.parametrize(
    ("completed", "newest", "expected"),
    [
        (12, 0, 12),  # trained since the last checkpoint: save it
        (12, None, 12),  # no checkpoint yet
        (12, 20, 12),  # a resume from an older checkpoint than the tracker's: this sitting's step is saved
        (20, 20, None),  # a save_freq step (or the resume point): already saved
        (0, None, None),  # nothing trained yet in a fresh run
    ],
)
def test_the_step_to_save_is_the_completed_one_unless_it_is_the_newest_checkpoint(completed, newest, expected):
    assert stop.step_to_save(completed, newest) == expected


class FakeTrainer:
    """What the stop uses of verl's trainer: ``global_steps``, ``config.trainer.default_local_dir``,
    ``checkpoint_manager.sleep_replicas`` and ``_save_checkpoint`` (recording the step it saw and
    writing the tracker as verl does)."""

    def __init__(self, checkpoints: Path, global_steps: int):
        self.global_steps = global_steps
        self.config = SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(checkpoints)))
        self.calls: list[str] = []
        self.checkpoint_manager = SimpleNamespace(sleep_replicas=lambda: self.calls.append("sleep"))

    def _save_checkpoint(self):
        self.calls.append(f"save global_step_{self.global_steps}")
        Path(self.config.trainer.default_local_dir, "latest_checkpointed_iteration.txt").write_text(
            str(self.global_steps)
        )


@pytest.fixture
def request_file(tmp_path):
    path = tmp_path / "STOP_REQUESTED"
    path.touch()
    return path


def test_a_stop_saves_the_completed_step_once_and_restores_global_steps(tmp_path, request_file):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("20")
    trainer = FakeTrainer(tmp_path, global_steps=33)  # step 33 begins: 32 completed, 20 the newest checkpoint
    with pytest.raises(stop.StopRequested) as stopped:
        stop.stop_if_requested(trainer, {STOP_FILE_ENV: str(request_file)})
    assert trainer.calls == ["sleep", "save global_step_32"]
    assert trainer.global_steps == 33
    assert str(stopped.value) == (
        f"stop requested ({request_file}): checkpoint global_step_32 saved before step 33; "
        "launch again (trainer.resume_mode=auto) to resume"
    )
    assert request_file.read_text() == "checkpoint global_step_32 saved before step 33\n"
    with pytest.raises(stop.StopRequested, match="global_step_32 was already the newest checkpoint"):
        stop.stop_if_requested(trainer, {STOP_FILE_ENV: str(request_file)})  # the tracker now says 32
    assert trainer.calls == ["sleep", "save global_step_32"]  # not saved twice


@pytest.mark.parametrize(
    ("tracker", "global_steps", "answer"),
    [
        ("40", 41, "global_step_40 was already the newest checkpoint"),  # a save_freq step / the resume point
        (None, 1, "no step completed, no checkpoint saved"),  # a fresh run before its first step
    ],
)
def test_a_stop_with_nothing_new_to_save_only_stops(tmp_path, request_file, tracker, global_steps, answer):
    if tracker is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(tracker)
    trainer = FakeTrainer(tmp_path, global_steps)
    with pytest.raises(stop.StopRequested, match=f"^stop requested .*: {answer}; launch again"):
        stop.stop_if_requested(trainer, {STOP_FILE_ENV: str(request_file)})
    assert trainer.calls == [] and trainer.global_steps == global_steps
    assert request_file.read_text() == answer + "\n"


def test_a_failed_save_restores_global_steps_and_answers_nothing(tmp_path, request_file):
    trainer = FakeTrainer(tmp_path, global_steps=5)

    def broken():
        trainer.calls.append(f"save global_step_{trainer.global_steps}")
        raise OSError("disk full")

    trainer._save_checkpoint = broken  # type: ignore[method-assign]
    with pytest.raises(OSError, match="disk full"):
        stop.stop_if_requested(trainer, {STOP_FILE_ENV: str(request_file)})
    assert trainer.calls == ["sleep", "save global_step_4"] and trainer.global_steps == 5
    assert request_file.read_text() == ""  # the sitting's STATUS then says the request was not answered


@pytest.mark.parametrize("env", [{}, {STOP_FILE_ENV: ""}, {STOP_FILE_ENV: "/nonexistent/STOP_REQUESTED"}])
def test_without_a_stop_file_nothing_happens(tmp_path, env):
    trainer = FakeTrainer(tmp_path, global_steps=7)
    assert stop.stop_if_requested(trainer, env) is None
    assert trainer.calls == [] and trainer.global_steps == 7


def test_each_of_our_trainers_stops_at_on_step_begin_and_the_sync_one_is_verls_sync(
    tmp_path, request_file, monkeypatch
):
    """verl's registry holds the three trainers; each one's ``on_step_begin`` runs the stop (built
    without ``__init__``: its attributes set as verl's would be). Each reads its ``trainer_mode`` as
    "sync" (Lopti's and NTHR's are ``tokenbalance_sync`` subclasses), so verl's base makes the choices
    of its own sync trainer for every row of a grid: the same replay buffer and data loader batch."""
    pytest.importorskip("verl")
    pytest.importorskip("transfer_queue")
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    import tokenbalance.integrations.verl.plugin  # noqa: F401  (registers)

    monkeypatch.setenv(STOP_FILE_ENV, str(request_file))

    for name in (SYNC_TRAINER, LOPTI_TRAINER, NTHR_TRAINER):
        cls = TRAINER_REGISTRY[name]
        assert cls.__mro__[1] is (PPOTrainerSync if name == SYNC_TRAINER else TRAINER_REGISTRY[SYNC_TRAINER])
        trainer = cls.__new__(cls)
        fake = FakeTrainer(tmp_path, global_steps=3)
        trainer.global_steps, trainer.config, trainer.checkpoint_manager = 3, fake.config, fake.checkpoint_manager
        trainer._save_checkpoint = lambda trainer=trainer, fake=fake: fake.calls.append(  # noqa: B023
            f"save global_step_{trainer.global_steps}"
        )
        with pytest.raises(stop.StopRequested, match="checkpoint global_step_2 saved before step 3"):
            trainer.on_step_begin()
        assert fake.calls == ["sleep", "save global_step_2"] and trainer.global_steps == 3
        trainer.trainer_mode = name  # as verl's __init__ sets it
        assert trainer.trainer_mode == "sync"
