"""The verl stack the end-to-end tests need: a missing part skips their module on a laptop and fails it in CI
(where a skip would count as passing). Imports none of it."""

from __future__ import annotations

import importlib.util
import os

import pytest

VERL_STACK = ("verl", "transfer_queue", "ray")


def require_verl_stack(tests: str) -> None:
    """Call at a test module's top, before it imports the harness; ``tests`` names them in the CI failure."""
    missing = [name for name in VERL_STACK if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{missing} not installed in CI: {tests} would be skipped", pytrace=False)
    pytest.skip(f"{missing} not installed", allow_module_level=True)
