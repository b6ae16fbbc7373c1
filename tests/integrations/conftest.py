"""Fixtures of the host integration tests."""

import os

import pytest


@pytest.fixture(scope="module")
def trl_offline():
    """The TRL tests' environment for one module: offline hub, no W&B, no tokenizers fork warning (the
    smoke run's ``OFFLINE_ENV``); a flag the user's own shell sets is kept. Restored after the module,
    so that no later test sees it."""
    from tokenbalance.integrations.trl.smoke import OFFLINE_ENV  # imports TRL: only where the tests need it

    with pytest.MonkeyPatch.context() as patch:
        for key, value in OFFLINE_ENV.items():
            if key not in os.environ:
                patch.setenv(key, value)
        yield
