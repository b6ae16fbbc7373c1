"""The trainer tests' tiny policy directory (random weights) for the grid tests."""

from tests.trainer.conftest import tiny_policy_dir  # noqa: F401 - pytest fixture
