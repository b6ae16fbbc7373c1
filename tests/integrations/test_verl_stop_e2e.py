"""The stop on request through verl's own trainer on CPU (two launches of ``tokenbalance_sync``).

First launch: 3 steps, no periodic checkpoint (``save_freq=-1``); the reward
(``verl_cpu/stop_reward.py``) creates the stop file inside step 2, as a user's ``touch``. At step 3's
beginning the trainer must save ``global_step_2`` through verl's workers (actor shards, data loader
state, the tracker), write its answer into the file and end with a failure, having logged steps 1
and 2 only. Second launch (the request removed, as a new sitting does; ``resume_mode=auto``): it
resumes from that checkpoint and trains step 3 only. The grid's use of it: tests/ablate/test_verl_sittings.py.

Marked ``slow`` (two verl launches, minutes).
"""

from __future__ import annotations

import pytest

from tests.integrations.verl_cpu.stack import require_verl_stack

require_verl_stack("the verl stop end-to-end test")

from tests.integrations.verl_cpu.launch import REPO_ROOT, cpu_overrides, prepare_inputs, run_verl

pytestmark = pytest.mark.slow

STOP_REWARD = REPO_ROOT / "tests" / "integrations" / "verl_cpu" / "stop_reward.py"
LAUNCH_TIMEOUT_S = 480  # as tests/integrations/test_verl_e2e.py: a wrong Ray CPU count hangs silently


def test_a_stop_request_saves_the_completed_step_and_the_next_launch_resumes_from_it(tmp_path):
    inputs = prepare_inputs(tmp_path / "inputs")
    run_dir = tmp_path / "run"
    stop_file, once = tmp_path / "STOP_REQUESTED", tmp_path / "stop-requested-once"
    env = {"TOKENBALANCE_STOP_FILE": stop_file, "STOP_TEST_ONCE": once}
    overrides = [
        *cpu_overrides(inputs, run_dir, ranks=1, steps=3),
        "trainer.v1.trainer_mode=tokenbalance_sync",
        "algorithm.adv_estimator=grpo",
        f"reward.custom_reward_function.path={STOP_REWARD}",
        "trainer.resume_mode=auto",
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={value}" for key, value in env.items()),
    ]
    first = run_verl(overrides, run_dir, timeout_s=LAUNCH_TIMEOUT_S)
    print(f"verl launch stopped on request: exit {first.returncode}, {first.wall_s:.0f} s wall")
    log = (run_dir / "launch.log").read_text(errors="replace")
    assert first.returncode != 0 and "StopRequested" in log, first.log_tail
    assert f"stop requested ({stop_file}): checkpoint global_step_2 saved before step 3" in log
    assert stop_file.read_text() == "checkpoint global_step_2 saved before step 3\n"
    assert sorted(first.steps) == [1, 2]
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert sorted(path.name for path in checkpoints.glob("global_step_*")) == ["global_step_2"]
    assert (checkpoints / "global_step_2" / "data.pt").is_file()
    assert any((checkpoints / "global_step_2" / "actor").iterdir())

    stop_file.unlink()  # a new sitting removes the request
    (run_dir / "metrics.jsonl").rename(run_dir / "metrics.first.jsonl")
    second = run_verl(overrides, run_dir, timeout_s=LAUNCH_TIMEOUT_S)
    print(f"verl launch resumed: exit {second.returncode}, {second.wall_s:.0f} s wall")
    assert second.returncode == 0, second.log_tail
    assert sorted(second.steps) == [3] and "timing_s/step" in second.steps[3]
    assert not stop_file.exists()
