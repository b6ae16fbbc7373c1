"""Suite-wide guards: no test may leave torch's global default dtype changed for the tests after it,
nor the task ``function`` (a config with ``data.reward`` registers it) in the registry."""

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
def forget_function_task():
    """A config with data.reward registers the task 'function'; other tests expect kk and arith only."""
    yield
    from tokenbalance.tasks.function import FUNCTION_TASK
    from tokenbalance.tasks.registry import TASK_FACTORIES, unregister_task

    if FUNCTION_TASK in TASK_FACTORIES:
        unregister_task(FUNCTION_TASK)
