"""End to end on CPU: TRL generates, scores with the K&K reward and trains the tiny model with each
method, in one process and under ``torchrun`` with 2 gloo processes (DDP)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.integrations.test_trl_support import tiny_policy_dir
from tokenbalance.integrations.trl.smoke import run_method

pytestmark = pytest.mark.usefixtures("trl_offline")

METHOD_KEYS = {
    "grpo": "adv/mean",
    "ar": "adv_weighted/mean",
    "tr_grpo": "tr_grpo/w_mean",
    "lopti": "lopti/low_token_frac",
    "nthr": "nthr/mixed_groups",
}
COMMON_KEYS = ("loss/policy", "loss/kl", "clip/frac", "policy/ratio_mean", "rewards/kk/mean", "reward")


def check_run(result: dict, name: str, passes: int, steps: int) -> None:
    assert result["optimizer_steps"] == steps * passes
    assert result["generation_batches"] == steps  # Lopti: one generation, two optimizer steps
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert all(math.isfinite(norm) for norm in result["grad_norms"])
    assert result["parameter_change"] > 0
    keys = set(result["metric_keys"])
    for key in (*COMMON_KEYS, METHOD_KEYS[name]):
        assert key in keys, key
    if passes == 2:
        assert result["pass_index"] == [0.0, 1.0] * steps
        assert {"pass/lopti_low/loss/policy", "pass/lopti_high/loss/policy"} <= keys


@pytest.mark.parametrize("name", list(METHOD_KEYS))
def test_each_preset_trains_on_cpu(name, tmp_path):
    result = run_method(
        name, tiny_policy_dir(), tmp_path, steps=2, group_size=4, prompts_per_step=2, max_completion_length=16
    )
    check_run(result, name, 2 if name == "lopti" else 1, steps=2)


@pytest.mark.slow  # two processes: in the slow tier, which scripts/test.sh and CI run after the default suite
def test_two_processes_keep_identical_parameters(tmp_path):
    """torchrun, 2 CPU ranks: Lopti with both passes non-empty, NTHR selecting tokens, and GRPO."""
    # the random model's reward is K&K's -3 plus an even-token share in [0, 1]: "correct" = share >= 0.5
    specs = ["grpo", "lopti@lopti.eta=0.002", "nthr@nthr.beta=0@nthr.correct_threshold=-2.5"]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "tokenbalance.integrations.trl.smoke",
        "--model",
        str(tiny_policy_dir()),
        "--out",
        str(tmp_path),
        "--methods",
        ",".join(specs),
        "--steps",
        "2",
    ]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for spec in specs:
        name = spec.split("@")[0]
        ranks = [json.loads((tmp_path / f"{name}.rank{rank}.json").read_text()) for rank in (0, 1)]
        assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
        assert ranks[0]["parameter_digest"] == ranks[1]["parameter_digest"]
        check_run(ranks[0], name, 2 if name == "lopti" else 1, steps=2)
        if name == "lopti":
            assert all(norm > 0 for norm in ranks[0]["grad_norms"][2:])  # second batch: both passes train
        if name == "nthr":
            assert any(entry.get("nthr/selected_frac", 0) > 0 for entry in ranks[0]["log"])
