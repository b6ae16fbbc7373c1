"""Shared fixtures: the trainer tests' tiny policy directory and small run config."""

from tests.trainer.conftest import small_config, tiny_policy_dir  # noqa: F401 - pytest fixtures
