"""Shared fixtures: the trainer tests' tiny policy directory and small run config, and rewards
that give every group of 4 two correct and two wrong responses."""

import pytest

from tests.trainer.conftest import small_config, tiny_policy_dir  # noqa: F401 - pytest fixtures
from tokenbalance.tasks.base import ScoreResult
from tokenbalance.tasks.kk.task import KKTask


@pytest.fixture
def mixed_rewards(monkeypatch):
    """Every group of 4 gets two correct and two wrong responses (a random tiny model solves nothing)."""
    calls = {"n": 0}

    def score(self, response, example):
        calls["n"] += 1
        return ScoreResult(3.0 if calls["n"] % 4 in (1, 2) else -1.0, {})

    monkeypatch.setattr(KKTask, "score", score)
