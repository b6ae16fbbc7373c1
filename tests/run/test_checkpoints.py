"""The checkpoint store: one completeness rule for the RL and the SFT checkpoints, the trainer's own
names only (a user's ``step_000001_best`` is never read or removed), the checkpoint a resume
continues from, pruning, and the repair of a lost ``latest``."""

import shutil

import pytest

from tokenbalance.run import checkpoints as checkpoint
from tokenbalance.run.checkpoints import (
    CheckpointStore,
    latest_checkpoint,
    policy_dir,
    resume_checkpoint,
    rl_store,
    sft_store,
)
from tokenbalance.run.repair import recover_latest


def fake_rl_checkpoint(run_dir, step, *, latest=True):
    """A complete RL checkpoint's files (empty), as save_checkpoint lays them out."""
    path = run_dir / "checkpoints" / f"step_{step:06d}"
    (path / "model").mkdir(parents=True)
    (path / "model" / "config.json").write_text("{}")
    (path / "trainer_state.json").write_text("{}")
    (path / "optimizer.safetensors").write_bytes(b"")
    if latest:
        (run_dir / "checkpoints" / "latest").write_text(path.name + "\n")
    return path


def fake_run(run_dir, steps):
    for step in range(1, steps + 1):
        fake_rl_checkpoint(run_dir, step)
    return run_dir


def test_one_completeness_rule_for_rl_and_sft_checkpoints(tmp_path):
    rl = fake_rl_checkpoint(tmp_path / "run", 1)
    assert rl_store(tmp_path / "run").is_complete(rl)
    for missing in ("trainer_state.json", "optimizer.safetensors", "model"):
        broken = tmp_path / "broken" / missing
        shutil.copytree(rl, broken)
        (shutil.rmtree if missing == "model" else lambda p: p.unlink())(broken / missing)
        assert not rl_store(tmp_path / "run").is_complete(broken), missing
    sft = tmp_path / "sft" / "step_000002"
    sft.mkdir(parents=True)
    for name in ("sft_state.json", "model.safetensors"):
        (sft / name).write_text("")
    assert not sft_store(tmp_path / "sft").is_complete(sft)  # no optimizer.safetensors yet
    (sft / "optimizer.safetensors").write_bytes(b"")
    assert sft_store(tmp_path / "sft").is_complete(sft) and sft_store(tmp_path / "sft").newest() == sft
    assert not rl_store(tmp_path / "run").is_complete(sft)  # a layout is a store's, not a guess
    assert rl_store(tmp_path).layout() == "trainer_state.json, optimizer.safetensors and model/"


def test_latest_must_name_a_complete_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    fake_run(tmp_path, 2)
    assert latest_checkpoint(tmp_path).name == "step_000002"
    (tmp_path / "checkpoints" / "step_000002" / "optimizer.safetensors").unlink()
    with pytest.raises(ValueError, match="points to step_000002, which is not a complete checkpoint"):
        latest_checkpoint(tmp_path)
    assert resume_checkpoint(tmp_path).name == "step_000001"  # a resume takes the newest complete one
    assert checkpoint.checkpoint_step(tmp_path) == 1
    note = recover_latest(tmp_path)
    assert note.endswith(
        "named 'step_000002', which is not a complete checkpoint; continuing from step_000001, the newest complete checkpoint"
    )
    assert latest_checkpoint(tmp_path).name == "step_000001"


def test_step_folders_none_of_them_complete_are_refused(tmp_path):
    (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"no complete checkpoint among step_000001 \(each needs trainer_state.json, "):
        recover_latest(tmp_path)


def test_prune_checkpoints_never_removes_the_newest_or_an_incomplete_one(tmp_path):
    run_dir = fake_run(tmp_path / "run", 3)
    root = run_dir / "checkpoints"
    partial = root / "step_000000"  # no trainer state: not complete, left to a resume's repair
    partial.mkdir()
    (root / "latest").write_text("step_000001\n")  # latest names an older one: it stays too
    removed = checkpoint.prune_checkpoints(run_dir, 1)
    assert [p.name for p in removed] == ["step_000002"]
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000000", "step_000001", "step_000003"]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        checkpoint.prune_checkpoints(run_dir, 0)


def test_pruning_and_resume_touch_only_the_trainers_own_checkpoint_names(tmp_path):
    """A user's copies beside the checkpoints (``step_000001_best``, ``step_000002.keep``, even a
    complete one) are never removed by ``train.keep_checkpoints`` nor taken for a checkpoint."""
    run_dir = fake_run(tmp_path / "run", 2)
    root = run_dir / "checkpoints"
    shutil.copytree(root / "step_000001", root / "step_000001_best")
    shutil.copytree(root / "step_000002", root / "step_000002.keep")
    shutil.copytree(root / "step_000002", root / "step_000009x")
    assert [p.name for p in checkpoint.checkpoint_dirs(root)] == ["step_000001", "step_000002"]
    assert checkpoint.resume_checkpoint(run_dir).name == "step_000002"
    removed = checkpoint.prune_checkpoints(run_dir, 1)
    assert [p.name for p in removed] == ["step_000001"]
    assert sorted(p.name for p in root.glob("step_*")) == [
        "step_000001_best",
        "step_000002",
        "step_000002.keep",
        "step_000009x",
    ]
    assert "removed step_000001 (train.keep_checkpoints=1" in checkpoint.pruned_note(removed, 1)


def test_a_written_checkpoint_is_placed_whole_and_steps_sort_by_number(tmp_path):
    store = CheckpointStore(tmp_path / "ck", ("state.json",))
    for step in (10, 9, 100):
        temp = store.new_temp(step)
        assert temp.name.startswith(f".step_{step:06d}.") and temp not in store.steps()
        (temp / "state.json").write_text(str(step))
        assert store.place(temp, step) == tmp_path / "ck" / f"step_{step:06d}" and not temp.exists()
    assert [p.name for p in store.steps()] == ["step_000009", "step_000010", "step_000100"]
    assert store.prune(2) == [tmp_path / "ck" / "step_000009"]


def test_a_run_directory_is_taken_as_its_newest_policy(tmp_path):
    fake_run(tmp_path, 2)
    (tmp_path / "checkpoints" / "latest").unlink()  # latest lost: the newest complete step
    assert policy_dir(str(tmp_path)) == str(tmp_path / "checkpoints" / "step_000002" / "model")
    assert policy_dir(str(tmp_path / "elsewhere")) == str(tmp_path / "elsewhere")
