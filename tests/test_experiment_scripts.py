"""The long-experiment drivers in scripts/ (the SmolLM2 paired run, the arithmetic 2 x 2), run with a stand-in for
the `tokenbalance` command that records each call, so what they launch, in which order and with which flags is
checked in seconds."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# records its arguments, one call a line; `sft --out D` writes D's summary as the real command would
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
if [ "$1" = build-model ]; then mkdir -p "$4" && touch "$4/config.json"; fi
if [ "$1" = sft ]; then mkdir -p "$5" && touch "$5/tokenbalance_sft.json"; fi
"""


def run_script(name: str, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    stand_in = tmp_path / "tokenbalance"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    calls = tmp_path / "calls.txt"
    full_env = {**os.environ, "TOKENBALANCE": str(stand_in), "CALLS": str(calls), **env}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / name)], cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=60
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_smollm2_stop_after_warm_builds_the_warm_start_and_launches_no_grid(tmp_path):
    done, calls = run_script("smollm2_paired.sh", tmp_path, D=str(tmp_path / "d"), STOP_AFTER="warm")
    assert done.returncode == 0, done.stderr
    assert [call.split()[0] for call in calls] == ["build-model", "sft"]
    assert f"--model {tmp_path}/d/model --out {tmp_path}/d/warm --seed 0" in calls[1]


def test_smollm2_runs_the_grid_from_the_warm_start_with_the_cells_asked_for(tmp_path):
    (tmp_path / "d" / "model").mkdir(parents=True)
    (tmp_path / "d" / "model" / "config.json").touch()
    done, calls = run_script("smollm2_paired.sh", tmp_path, D=str(tmp_path / "d"), JOBS="1")
    assert done.returncode == 0, done.stderr
    assert [call.split()[0] for call in calls] == ["sft", "ablate"]  # the existing model is kept
    assert calls[1].startswith(f"ablate --preset smollm2-kk --model {tmp_path}/d/warm --out {tmp_path}/d/grid")
    assert calls[1].endswith("--no-figure --jobs 1")
    done, calls = run_script("smollm2_paired.sh", tmp_path, D=str(tmp_path / "d"))  # a second run: warm start kept
    assert [call.split()[0] for call in calls[2:]] == ["ablate"] and "--jobs" not in calls[2]


def test_smollm2_refuses_an_unknown_stop_before_any_work(tmp_path):
    done, calls = run_script("smollm2_paired.sh", tmp_path, D=str(tmp_path / "d"), STOP_AFTER="sft")
    assert done.returncode == 2
    assert done.stderr.strip() == "STOP_AFTER: unknown value 'sft'; valid: warm"
    assert calls == [] and not (tmp_path / "d").exists()


def test_arith_2x2_goes_start_policy_by_start_policy_in_two_lanes(tmp_path):
    done, _ = run_script(
        "arith_2x2_grid.sh",
        tmp_path,
        OUT=str(tmp_path / "out"),
        RECORDS="rec",
        METHODS="grpo,ar_lopti",
        LANE_A="arith-decisions",
        LANE_B="arith-decisions-wording",
    )
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    for preset in ("arith-decisions", "arith-decisions-wording"):
        mine = [call for call in calls if f"--preset {preset} " in call]
        assert [call.split("--seeds ")[1].split()[0] for call in mine] == ["0,4", "1,5", "2,6", "3,7"]
        assert all(
            f"--methods grpo,ar_lopti --jobs 1 --set train.threads=1 --no-figure --no-progress "
            f"--out {tmp_path}/out/{preset} --records rec/{preset}/records" in call
            for call in mine
        )
    assert len(calls) == 8
