"""``tokenbalance train`` / ``eval`` / ``sft`` as a user runs them: in a subprocess."""

import json
import subprocess
import sys

from tests.trainer.conftest import SMALL_RUN


def tokenbalance(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "tokenbalance.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_train_then_eval_in_a_subprocess(tiny_policy_dir, tmp_path):
    sets = [arg for item in SMALL_RUN for arg in ("--set", item)]
    run_dir = tmp_path / "run"
    result = tokenbalance(
        "train", "--model", str(tiny_policy_dir), "--method", "grpo", "--run-dir", str(run_dir), *sets
    )
    assert result.returncode == 0, result.stderr
    assert "held-out accuracy" in result.stdout and "greedy/acc_3" in result.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["eval", "train", "train", "eval"]
    checkpoint_model = run_dir / "checkpoints" / "step_000002" / "model"
    evaluated = tokenbalance("eval", "--model", str(checkpoint_model), "--json", *sets)
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert metrics["eval/greedy/acc"] == records[-1]["eval/greedy/acc"]


def test_bad_model_path_is_one_clear_line(tmp_path):
    result = tokenbalance("train", "--model", str(tmp_path / "missing"), "--no-progress")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("tokenbalance train: error: policy path")
    assert "Traceback" not in result.stderr


def test_help_config_lists_options():
    result = tokenbalance("train", "--help-config")
    assert result.returncode == 0 and "rollout.group_size = 8" in result.stdout
