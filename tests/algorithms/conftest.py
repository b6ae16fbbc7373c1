import pytest
import torch

from tokenbalance.algorithms.token_rules import TOKEN_RULES


@pytest.fixture
def isolated_rules(monkeypatch):
    """The test registers token rules into its own copy of the registry."""
    monkeypatch.setattr(TOKEN_RULES, "_items", dict(TOKEN_RULES._items))


def assert_values(actual, expected, atol=1e-7):
    """Compare a tensor with hand-written (nested list) values."""
    torch.testing.assert_close(actual.detach(), torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)
