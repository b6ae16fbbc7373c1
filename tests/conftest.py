"""Suite-wide guard: no test may leave torch's global default dtype changed for the tests after it."""

import pytest
import torch


@pytest.fixture(autouse=True)
def default_dtype_unchanged():
    before = torch.get_default_dtype()
    yield
    after = torch.get_default_dtype()
    torch.set_default_dtype(before)
    assert after == before, f"the test changed torch's default dtype to {after}; restore it (a fixture)"
