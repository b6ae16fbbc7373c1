import torch


def assert_values(actual, expected, atol=1e-7):
    """Compare a tensor with hand-written (nested list) values."""
    torch.testing.assert_close(actual.detach(), torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)
