"""The threading policy (tokenbalance/threads.py): what a process chooses before torch loads, and
the thread count a command gives torch."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tokenbalance import threads
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.trainer.runner import compute_device


def test_a_quiet_machine_keeps_the_default_wait_policy_and_fixes_mkl():
    chosen = threads.choose_environment({}, busy_cpus=0.0)
    assert chosen == {"MKL_DYNAMIC": "FALSE", "OMP_WAIT_POLICY": ""}  # "": no variable, OpenMP's default


def test_a_busy_machine_makes_idle_threads_sleep():
    assert threads.choose_environment({}, busy_cpus=1.0)["OMP_WAIT_POLICY"] == "PASSIVE"
    assert threads.choose_environment({}, busy_cpus=0.49)["OMP_WAIT_POLICY"] == ""


def test_what_the_user_set_is_kept():
    environ = {"OMP_WAIT_POLICY": "ACTIVE", "MKL_DYNAMIC": "TRUE"}
    assert threads.choose_environment(environ, busy_cpus=2.0) == {}


def test_what_a_parent_chose_is_decided_again():
    inherited = {"OMP_WAIT_POLICY": "PASSIVE", "MKL_DYNAMIC": "FALSE", threads.AUTO_ENV: "MKL_DYNAMIC,OMP_WAIT_POLICY"}
    assert threads.choose_environment(inherited, busy_cpus=0.0)["OMP_WAIT_POLICY"] == ""


def test_prepare_process_before_torch_sets_the_environment_and_names_what_it_chose():
    code = (
        "import os, sys, json; from tokenbalance import threads; chosen = threads.prepare_process(); "
        "assert 'torch' not in sys.modules; "
        "print(json.dumps({k: os.environ.get(k) for k in ('MKL_DYNAMIC', 'OMP_WAIT_POLICY', threads.AUTO_ENV)}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_DYNAMIC", "OMP_WAIT_POLICY", threads.AUTO_ENV)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["MKL_DYNAMIC"] == "FALSE"
    assert seen["OMP_WAIT_POLICY"] in (None, "PASSIVE")  # depends on the load during the sample
    assert seen[threads.AUTO_ENV] == "MKL_DYNAMIC,OMP_WAIT_POLICY"


def test_prepare_process_after_torch_changes_nothing():
    environ: dict[str, str] = {}
    assert "torch" in sys.modules
    assert threads.prepare_process(environ) == {} and environ == {}


def test_busy_cpus_of_others_sees_a_spinning_process():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = threads.busy_cpus_of_others(sample_s=0.5)
    finally:
        spinner.kill()
    assert busy >= threads.BUSY_CPUS_FOR_PASSIVE


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_use_threads_sets_the_count_and_zero_means_the_cpus_available(restore_threads, monkeypatch):
    assert threads.use_threads(1) == 1 and torch.get_num_threads() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads.use_threads(0) == threads.available_cpus() == torch.get_num_threads()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(threads.available_cpus() * 4))  # more ranks than CPUs
    assert threads.use_threads(0) == 1


def test_compute_device_records_the_count_used(restore_threads, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    config = apply_overrides(RunConfig(), ["train.threads=0", "train.device=cpu"])
    assert compute_device(config) == torch.device("cpu")
    assert config.train.threads == threads.available_cpus() == torch.get_num_threads()
