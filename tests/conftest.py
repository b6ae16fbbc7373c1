"""Suite-wide guards: no test may leave torch's global default dtype changed for the tests after it,
and nothing registers the task ``function`` (a config with ``data.reward`` names it; the run's setup
builds it)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def default_dtype_unchanged():
    before = torch.get_default_dtype()
    yield
    after = torch.get_default_dtype()
    torch.set_default_dtype(before)
    assert after == before, f"the test changed torch's default dtype to {after}; restore it (a fixture)"


@pytest.fixture(autouse=True)
def function_task_never_registered():
    yield
    from tokenbalance.tasks.function import FUNCTION_TASK
    from tokenbalance.tasks.registry import TASK_FACTORIES

    assert FUNCTION_TASK not in TASK_FACTORIES, "the task 'function' was registered (a config must not register it)"


@pytest.fixture
def online(monkeypatch):
    """The verl scripts run as on a node with hub access unless a test says otherwise. No test module
    leaves an offline flag behind (the TRL tests' are a fixture, ``trl_offline``), but the shell that
    runs pytest may set one (``HF_HUB_OFFLINE=1`` on an offline machine), and with it every cell would
    refuse its hub name: these tests check the scripts, not the user's machine."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
