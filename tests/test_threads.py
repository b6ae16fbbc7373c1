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


def test_compute_device_sets_the_count_and_keeps_automatic_as_zero(restore_threads, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    config = apply_overrides(RunConfig(), ["train.threads=0", "train.device=cpu"])
    assert compute_device(config) == torch.device("cpu")
    assert config.train.threads == 0 and torch.get_num_threads() == threads.available_cpus()
    fixed = apply_overrides(RunConfig(), ["train.threads=1", "train.device=cpu"])
    compute_device(fixed)
    assert fixed.train.threads == 1 == torch.get_num_threads()


def test_threads_follow_the_cpus_others_leave_free():
    assert threads.threads_for_load(most=2, cpus=2, busy_others=0.0) == 2
    assert threads.threads_for_load(most=2, cpus=2, busy_others=0.4) == 2  # a stray process: keep both
    assert threads.threads_for_load(most=2, cpus=2, busy_others=0.5) == 1  # half a CPU busy costs a thread
    assert threads.threads_for_load(most=2, cpus=2, busy_others=1.9) == 1  # never below one
    assert threads.threads_for_load(most=8, cpus=16, busy_others=3.0) == 8  # never above the allowed count
    assert threads.threads_for_load(most=16, cpus=16, busy_others=3.0) == 13


def test_others_busy_cpus_subtracts_this_process():
    # 2 CPUs, 1 s of wall time = 100 jiffies each: 150 busy jiffies, of which this process used 1 CPU second
    assert threads.others_busy_cpus((0.0, 0.0), (150.0, 200.0), own_cpu_s=1.0, wall_s=1.0, cpus=2) == 0.5
    assert threads.others_busy_cpus((0.0, 0.0), (50.0, 200.0), own_cpu_s=1.0, wall_s=1.0, cpus=2) == 0.0
    assert threads.others_busy_cpus((10.0, 200.0), (10.0, 200.0), own_cpu_s=0.0, wall_s=1.0, cpus=2) == 0.0


class FakeMachine:
    """/proc/stat, this process's CPU time and a clock that a test advances by hand: ``run(wall_s,
    own_cpus, others_cpus)`` (2 CPUs, 100 jiffies per second each)."""

    def __init__(self) -> None:
        self.busy = self.total = self.own = self.now = 0.0
        self.applied: list[int] = []

    def run(self, wall_s: float, own_cpus: float, others_cpus: float) -> None:
        self.now += wall_s
        self.own += own_cpus * wall_s
        self.busy += (own_cpus + others_cpus) * wall_s * 100
        self.total += 2 * wall_s * 100

    def adapter(self, most: int = 2) -> threads.ThreadAdapter:
        return threads.ThreadAdapter(
            most,
            self.applied.append,
            cpus=2,
            cpu_times=lambda: (self.busy, self.total),
            own_cpu_s=lambda: self.own,
            clock=lambda: self.now,
        )


def test_the_adapter_drops_a_thread_when_a_job_starts_and_takes_it_back_when_it_ends():
    machine = FakeMachine()
    adapter = machine.adapter()
    machine.run(2.0, own_cpus=2.0, others_cpus=0.0)  # alone
    assert adapter.adapt() == 2 and machine.applied == []  # nothing to change: nothing applied
    machine.run(2.0, own_cpus=1.0, others_cpus=1.0)  # a torch job starts and takes half the machine
    assert adapter.adapt() == 1 and machine.applied == [1]
    machine.run(2.0, own_cpus=0.7, others_cpus=1.3)  # it goes on
    assert adapter.adapt() == 1 and machine.applied == [1]
    machine.run(2.0, own_cpus=1.0, others_cpus=0.0)  # it ended
    assert adapter.adapt() == 2 and machine.applied == [1, 2]


def test_the_adapter_keeps_the_count_within_its_window_and_without_load_figures():
    machine = FakeMachine()
    adapter = machine.adapter()
    machine.run(threads.ADAPT_WINDOW_S / 2, own_cpus=0.0, others_cpus=2.0)
    assert adapter.adapt() == 2  # too short a window to judge
    machine.run(threads.ADAPT_WINDOW_S, own_cpus=0.0, others_cpus=2.0)
    assert adapter.adapt() == 1  # the whole window since the last decision counts
    blind = threads.ThreadAdapter(2, machine.applied.append, cpus=2, cpu_times=lambda: None, clock=lambda: machine.now)
    machine.run(5.0, own_cpus=0.0, others_cpus=2.0)
    assert blind.adapt() == 2


def test_a_step_reports_the_fewest_threads_any_of_its_phases_used():
    """A burst of other work during one phase changes that phase's numbers, so the step's
    ``timing/threads`` is the fewest threads of its phases, not the count it ended with."""
    machine = FakeMachine()
    adapter = machine.adapter()
    machine.run(2.0, own_cpus=2.0, others_cpus=0.0)
    adapter.adapt()  # rollout: alone
    machine.run(2.0, own_cpus=1.0, others_cpus=1.0)
    adapter.adapt()  # log-probs: beside a burst
    machine.run(2.0, own_cpus=2.0, others_cpus=0.0)
    assert adapter.adapt() == 2  # update: alone again
    assert adapter.take_fewest() == 1  # the step's figure
    machine.run(2.0, own_cpus=2.0, others_cpus=0.0)
    adapter.adapt()
    assert adapter.take_fewest() == 2  # the next step ran at two threads throughout
