"""The documented example of docs/tasks.md ("Your own problem on a CPU") learns: the command of
the docs, ``examples/reverse/config.yaml`` on ``examples/reverse/train.jsonl``, at a reduced size
(half the RL steps, a short held-out file, no step diagnostics), raises the training reward. The
margin is the run's own spread: the mean reward of the last steps exceeds that of the first steps by
more than twice the standard error of their difference (the steps' prompts differ, so a step's
reward varies by about 0.05 around the trend; the measured t values: docs/tasks.md)."""

import json
import statistics
import sys
from pathlib import Path

import pytest

from tests.tasks.reward_modules import write_jsonl
from tokenbalance.cli import main
from tokenbalance.diagnostics.sinks import read_metrics

EXAMPLE = Path(__file__).parents[2] / "examples" / "reverse"
STEPS = 40  # of the documented 80
BLOCK = 10  # steps averaged at each end
HELD_OUT = 20  # rows of test.jsonl scored before and after (the docs: all 200)


def rise_and_standard_error(first: list[float], last: list[float]) -> tuple[float, float]:
    """mean(last) - mean(first), and the standard error of that difference (Welch)."""
    variance = statistics.variance(first) / len(first) + statistics.variance(last) / len(last)
    return statistics.mean(last) - statistics.mean(first), variance**0.5


def test_rise_and_standard_error():
    rise, error = rise_and_standard_error([0.0, 0.5, 1.0], [1.0, 1.5, 2.0, 2.5])  # variances 1/4 and 5/12
    assert rise == 1.25 and error == pytest.approx((0.25 / 3 + 5 / 48) ** 0.5, rel=4 * sys.float_info.epsilon)


@pytest.mark.slow  # a 40-step training run: in the slow tier, which scripts/test.sh and CI run after the default suite
def test_the_reverse_example_raises_its_training_reward(tmp_path):
    held_out = (EXAMPLE / "test.jsonl").read_text().splitlines()[:HELD_OUT]
    write_jsonl(tmp_path / "test.jsonl", [json.loads(line) for line in held_out])
    argv = [
        "train",
        "--config",
        str(EXAMPLE / "config.yaml"),
        "--data",
        str(EXAMPLE / "train.jsonl"),
        "--eval-data",
        str(tmp_path / "test.jsonl"),
        "--reward",
        f"{EXAMPLE / 'rewards.py'}:reverse",
        "--target-column",
        "target",
        "--steps",
        str(STEPS),
        "--run-dir",
        str(tmp_path / "run"),
        "--no-progress",
    ]
    quicker = ["train.eval_every=0", "train.save_every=0", "diagnostics.bucket_stats=false"]
    sets = [arg for override in [*quicker, f"model.cache_dir={tmp_path / 'cache'}"] for arg in ("--set", override)]
    assert main(argv + sets) == 0
    rewards = [r["reward/mean"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(rewards) == STEPS
    rise, error = rise_and_standard_error(rewards[:BLOCK], rewards[-BLOCK:])
    assert rise > 2 * error, (rise, error, rewards)
