"""The trainer tests' tiny policy directory, for the benchmarks that read one."""

from tests.trainer.conftest import tiny_policy_dir  # noqa: F401  (the fixture)
