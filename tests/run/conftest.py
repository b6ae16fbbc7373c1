"""The trainer tests' tiny policy directory and small run config, shared with the setup tests."""

from tests.trainer.conftest import small_config, tiny_policy_dir  # noqa: F401 (fixtures)
