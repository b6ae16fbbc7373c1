"""``scripts/gpu_check.sh`` in the default suite, on the CPU, so that it cannot rot before a GPU
runs it: ``--dry-run`` runs the ``cuda`` tests (all but most per-preset steps) and every benchmark
at tiny shapes through the script, in two halves, and the script keeps its promises (one results
file, never overwritten silently, a failure without a GPU). These tests are not marked ``cuda``:
they run everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.cuda.helpers import DEVICE_ENV, device_problem

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
# every test of tests/cuda but the per-preset steps, of which two (the whole set on the CPU:
# `bash scripts/gpu_check.sh --dry-run`)
SAMPLE = "not test_every_preset or [ar_lopti-bfloat16] or [nthr-float32]"
BENCHMARK_ROWS = (
    "| tokenbalance FastEngine |",  # rollout_speed.py
    "| TRL GRPOTrainer |",  # rl_step_vs_trl.py
    "| ours, fast engine, sampler log-probs |",
    "| ours, fast engine, float32 weights + bf16 autocast, logits in chunks |",  # model.autocast, chunks
    "| ours, fast engine, float32 weights + bf16 autocast, logits in chunks, activation checkpointing (as TRL) |",
    "matmul rate (512x512 bfloat16)",  # update_cost.py
    "## Benchmark: rollout tokens/s at reasoning length",  # rollout_speed.py again, 3 engines
)


def run_script(*args: str, scratch: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """The script with this interpreter; ``scratch`` holds the benchmarks' temporary directories."""
    environment = {key: value for key, value in os.environ.items() if key != DEVICE_ENV}
    environment.update(PYTHON=sys.executable, **env)
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        environment["TMPDIR"] = str(scratch)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=600
    )


def summary(results: str) -> dict[str, str]:
    """``{part: result}`` from the results file's summary table."""
    table = results.split("## Summary", 1)[1]
    rows = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return {part.strip(): result.strip() for part, result in rows[1:]}


@pytest.mark.slow  # minutes: every GPU test and benchmark on the CPU at tiny shapes
def test_dry_run_of_the_tests_writes_one_results_file_and_never_overwrites_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    results = out / "gpu_check.md"
    done = run_script("--dry-run", "--tests-only", str(out), TOKENBALANCE_GPU_CHECK_SELECT=SAMPLE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.md"]  # a directory gets gpu_check.md
    text = results.read_text()
    assert "Mode: **dry run on the CPU**" in text and "## Benchmark" not in text
    assert summary(text) == {"tests": "passed"}
    tests = text.split("## Tests", 1)[1].split("## Summary", 1)[0]
    passed = tests.count(" PASSED")
    assert f"{passed} passed, " in tests and " deselected" in tests and passed >= 20
    assert "FAILED" not in tests and "SKIPPED" not in tests and "ERROR" not in tests
    for name in ("test_engines", "test_presets", "test_checkpoint", "test_nthr_bf16", "test_trl"):
        assert f"tests/cuda/{name}.py::" in tests, name
    assert text.rstrip().endswith("All parts passed.")

    again = run_script("--dry-run", str(results))  # refused before any work: the file stays as it was
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr
    assert results.read_text() == text


@pytest.mark.slow  # minutes: every GPU test and benchmark on the CPU at tiny shapes
def test_dry_run_of_the_benchmarks_at_tiny_shapes(tmp_path):
    results = tmp_path / "bench.md"
    done = run_script("--dry-run", "--bench-only", str(results), scratch=tmp_path / "scratch")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = results.read_text()
    assert summary(text) == {
        "rollout_speed.py": "passed",
        "rl_step_vs_trl.py": "passed",
        "update_cost.py": "passed",
        "rollout_speed.py, reasoning length": "passed",
    }
    assert "## Tests" not in text
    for row in BENCHMARK_ROWS:
        assert row in text, row
    assert "--device cpu --dtype bfloat16" in text and "--shape tiny" in text


def test_a_directory_holding_results_is_refused_too(tmp_path):
    (tmp_path / "gpu_check.md").write_text("earlier results\n")
    done = run_script("--dry-run", str(tmp_path))
    assert done.returncode == 2 and f"{tmp_path / 'gpu_check.md'} exists" in done.stderr
    assert (tmp_path / "gpu_check.md").read_text() == "earlier results\n"


def test_unknown_options_are_refused():
    done = run_script("--dryrun")
    assert done.returncode == 2 and "unknown option --dryrun" in done.stderr and "Usage:" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would run for real")
def test_without_a_gpu_the_script_fails_and_says_why(tmp_path):
    done = run_script(str(tmp_path / "r.md"), "--no-install")
    text = (tmp_path / "r.md").read_text()
    assert done.returncode == 1
    assert "No CUDA GPU is visible to torch: nothing was checked" in text
    assert summary(text) == {"CUDA device": "failed: none visible"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_cuda_tests_skip_with_the_reason_without_a_gpu(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert "needs a CUDA GPU" in device_problem() and "scripts/gpu_check.sh" in device_problem()
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert device_problem() is None
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    assert "expected cuda, cuda:N or cpu" in device_problem()
