"""Bad input gives a clear error naming the cause; failures leave nothing that looks valid."""

import json

import pytest

from tests.trainer.conftest import replace_section
from tokenbalance.models import load_policy
from tokenbalance.run.checkpoints import latest_checkpoint
from tokenbalance.tasks.kk.task import KKTask
from tokenbalance.trainer import checkpoint
from tokenbalance.trainer.runner import run_training


def test_missing_model_directory(small_config, tmp_path):
    replace_section(small_config, "model", path=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="must be a local directory"):
        run_training(small_config, log=lambda *_: None)


def test_prompt_longer_than_the_limit(small_config):
    replace_section(small_config, "data", max_prompt_tokens=8)
    with pytest.raises(ValueError, match=r"has \d+ tokens, more than data.max_prompt_tokens=8"):
        run_training(small_config, log=lambda *_: None)


def test_empty_dataset_file(small_config, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    replace_section(small_config, "data", train_file=str(empty))
    with pytest.raises(ValueError, match="empty.jsonl"):
        run_training(small_config, log=lambda *_: None)


def test_reward_that_raises_is_named(small_config, monkeypatch):
    def broken(self, response, example):
        raise KeyError("solution")

    monkeypatch.setattr(KKTask, "score", broken)
    with pytest.raises(ValueError, match="the 'kk' reward raised KeyError: 'solution' on example kk_logic:"):
        run_training(small_config, log=lambda *_: None)


def test_existing_run_directory_is_not_overwritten(small_config):
    run_dir = run_training(small_config, log=lambda *_: None)
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        run_training(small_config, log=lambda *_: None)
    assert json.loads((run_dir / "run_state.json").read_text())["status"] == "completed"


def test_failed_checkpoint_leaves_no_partial_directory(small_config, monkeypatch, tiny_policy_dir, tmp_path):
    model, tokenizer = load_policy(tiny_policy_dir)
    import torch

    optimizer = torch.optim.AdamW(model.parameters())
    checkpoint.save_checkpoint(tmp_path, 1, model, tokenizer, optimizer, {})

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_checkpoint(tmp_path, 2, model, tokenizer, optimizer, {})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]
    assert latest_checkpoint(tmp_path).name == "step_000001"


def test_optimizer_state_round_trips_without_pickle(tiny_policy_dir, tmp_path):
    import torch

    model, tokenizer = load_policy(tiny_policy_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.tensor([[5, 6, 7]])).logits.sum().backward()
    optimizer.step()
    path = checkpoint.save_checkpoint(tmp_path, 3, model, tokenizer, optimizer, {"data_position": 6})
    fresh = torch.optim.AdamW(model.parameters(), lr=0.5)
    state = checkpoint.load_trainer_state(path, fresh)
    assert state["step"] == 3 and state["data_position"] == 6
    assert fresh.param_groups[0]["lr"] == 0.01
    for param in model.parameters():
        a, b = optimizer.state[param], fresh.state[param]
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], atol=0, rtol=0)
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"], atol=0, rtol=0)
        assert float(a["step"]) == float(b["step"]) == 1.0
