"""Same config, same numbers, bit for bit: a run repeated in a new process, beside a competing CPU
load, and interrupted then resumed from a mid-run checkpoint (docs/training.md "Threads and
bit-identical runs"). Two torch threads, so OpenMP's parallel regions and their wait policy are
exercised; every logged value is compared except wall-clock figures, and the final weights too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.trainer.conftest import SMALL_RUN

# minutes of CPU beside a busy loop: in the second tier, which scripts/test.sh and CI run after the default suite
pytestmark = pytest.mark.slow

CLOCK_KEYS = ("timing/", "throughput/", "peak_")


def train(run_dir: Path, policy: Path, *extra: str) -> None:
    sets = [a for s in [*SMALL_RUN, "train.threads=2", "train.steps=4"] for a in ("--set", s)]
    command = [sys.executable, "-m", "tokenbalance.cli", "train", "--model", str(policy), *sets]
    subprocess.run([*command, "--run-dir", str(run_dir), *extra], check=True, capture_output=True, text=True)


def logged(run_dir: Path) -> dict:
    records = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records[(record["step"], record["kind"])] = {
            k: v for k, v in record.items() if not any(k.startswith(p) for p in CLOCK_KEYS)
        }
    return records


def final_weights(run_dir: Path) -> dict:
    return load_file(str(run_dir / "checkpoints" / "step_000004" / "model" / "model.safetensors"))


def test_a_run_repeats_bit_for_bit_beside_a_load_and_across_a_resume(tiny_policy_dir, tmp_path):
    alone, loaded, resumed = tmp_path / "alone", tmp_path / "loaded", tmp_path / "resumed"
    train(alone, tiny_policy_dir)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        train(loaded, tiny_policy_dir)
    finally:
        for spinner in spinners:
            spinner.kill()
    train(resumed, tiny_policy_dir, "--steps", "2")
    subprocess.run(
        [sys.executable, "-m", "tokenbalance.cli", "train", "--resume", str(resumed), "--steps", "4"],
        check=True,
        capture_output=True,
    )
    reference = logged(alone)
    assert [k for k in reference if k[1] == "train"] == [(s, "train") for s in (1, 2, 3, 4)]
    assert logged(loaded) == reference
    continued = logged(resumed)
    assert {k: continued[k] for k in reference} == reference  # plus the end-of-sitting evaluation at step 2
    weights = final_weights(alone)
    for other in (loaded, resumed):
        assert all(bool((weights[name] == tensor).all()) for name, tensor in final_weights(other).items())
