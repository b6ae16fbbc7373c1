"""The ``cuda`` tests: where they run, and their skip where no GPU exists.

``TOKENBALANCE_GPU_CHECK_DEVICE`` picks the device: ``cuda`` (the default), ``cuda:N`` or ``cpu``.
With ``cuda`` and no GPU, every test marked ``cuda`` is skipped, reported with the reason;
``cpu`` runs the same checks on the CPU (``scripts/gpu_check.sh --dry-run`` does, and so does
``tests/cuda/test_gpu_check_script.py`` in the default suite, so the checks cannot rot unseen).
"""

from __future__ import annotations

import pytest
import torch

from tests.cuda.helpers import check_device, device_problem, parity_task_registered, tiny_policy


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None:
        problem = device_problem()
        if problem is not None:
            pytest.skip(problem)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the checks run on (``TOKENBALANCE_GPU_CHECK_DEVICE``; module docstring). On the
    CPU the tests use one thread: tiny shapes gain nothing from more on a shared machine."""
    device = check_device()
    if device.type == "cpu":
        torch.set_num_threads(1)
    return device


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory):
    """A tiny Qwen2 policy (random weights, the K&K tokenizer) saved as a Hugging Face directory."""
    return tiny_policy(tmp_path_factory.mktemp("cuda-policy") / "tiny")


@pytest.fixture
def parity_task():
    """``data.task=gpu_check_parity`` (:class:`~tests.cuda.helpers.ParityTask`) for the test's duration."""
    with parity_task_registered() as name:
        yield name
