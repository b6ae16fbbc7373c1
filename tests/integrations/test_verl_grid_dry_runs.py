"""Every documented verl command composes a config verl's own ``validate_config`` accepts: each
``bash examples/verl/kk_*.sh`` line of docs/verl.md and docs/scale.md, and every cell of the default
grid (10 rows x 2 models), as ``DRY_RUN=1`` checks them; and the launcher's dry run stops at that
check. The scripts run with a ``python`` that records the launcher's overrides (bash only); the
configs are then composed in this process (hydra's compose API, verl installed). Marked ``slow``
(about 30 compositions: minutes on a loaded 2-core machine)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("verl") is None:
    if os.environ.get("CI"):
        pytest.fail("verl not installed in CI: the documented commands' dry runs would be skipped", pytrace=False)
    pytest.skip("verl not installed", allow_module_level=True)

from tests.integrations.verl_cpu.launch import REPO_ROOT
from tokenbalance.ablate.verl.check_config import composed_config, verl_config_problem
from tokenbalance.ablate.verl.check_config import main as check_main
from tokenbalance.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("online")]
DOCS = ("docs/verl.md", "docs/scale.md")
FAKE_PYTHON = """#!/usr/bin/env bash
case "$1 $2" in
  "-m tokenbalance.integrations.verl.main")
    echo "launcher" >> "$RECORD_DIR/order"
    printf '%s\\0' "${@:3}" > "$(mktemp "$RECORD_DIR/launch.XXXXXX")"
    exit 0 ;;
esac
exec @PYTHON@ "$@"
"""


def documented_commands() -> list[str]:
    """The ``bash examples/verl/kk_*.sh`` lines of the docs' code blocks, comments stripped."""
    commands = []
    for doc in DOCS:
        inside = False
        for text in (REPO_ROOT / doc).read_text().splitlines():
            if text.startswith("```"):
                inside = not inside
            elif inside and "bash examples/verl/kk_" in text:
                commands.append(text.split(" #", 1)[0].strip())
    return commands


def run_recorded(tmp_path: Path, words: list[str], env: dict[str, str], cwd: Path = REPO_ROOT) -> list[list[str]]:
    """Run ``words`` with the recording ``python``; each launch's overrides."""
    record = tmp_path / "record"
    record.mkdir(exist_ok=True)
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python").write_text(FAKE_PYTHON.replace("@PYTHON@", shlex.quote(sys.executable)))
    (fake / "python").chmod(0o755)
    full = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "RECORD_DIR": str(record), **env}
    done = subprocess.run(words, cwd=cwd, env=full, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    launches = sorted(record.glob("launch.*"))
    overrides = [path.read_text().split("\0")[:-1] for path in launches]
    for path in launches:
        path.unlink()
    return overrides


def test_the_documented_commands_pass_verls_validate_config(tmp_path):
    commands = documented_commands()
    assert len(commands) >= 10 and any("N_GPUS=1" in command for command in commands)
    for command in commands:
        words = shlex.split(command)
        env = dict(word.split("=", 1) for word in words if "=" in word and words.index(word) < words.index("bash"))
        (overrides,) = run_recorded(tmp_path, words[words.index("bash") :], {"DRY_RUN": "0", **env})
        assert verl_config_problem(overrides) is None, command


def test_every_cell_of_the_default_grid_passes_verls_validate_config(tmp_path):
    out = tmp_path / "grid"
    assert main(["ablate", "--runner", "verl", "--seeds", "0", "--out", str(out)]) == 0
    launches = run_recorded(tmp_path, ["bash", str(out / "verl" / "run_grid.sh")], {"DRY_RUN": "1"})
    assert len(launches) == 20  # 10 rows x 2 models
    for overrides in launches:
        assert verl_config_problem(overrides) is None, overrides[-3:]
    assert (tmp_path / "record" / "order").read_text().split() == ["launcher"] * 20  # verl imported once a cell


def test_a_dry_run_stops_at_verls_validate_config(tmp_path, capsys):
    """The one-GPU command as docs/scale.md had it (a batch of 8 prompts under a mini-batch of 32): verl
    rejects it, and the launcher's dry run says so in one line, status 2, before ``config valid``."""
    command = ["bash", "examples/verl/kk_ar_lopti.sh", "data.train_batch_size=8"]
    (overrides,) = run_recorded(tmp_path, command, {"DRY_RUN": "0", "N_GPUS": "1", "MODEL": "3b"})
    assert verl_config_problem(overrides) == "train_batch_size (8) must be >= actor.ppo_mini_batch_size (32)"
    assert check_main(overrides) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "verl's validate_config rejects this config: train_batch_size (8) must be >= actor.ppo_mini_batch_size "
        "(32); nothing launched"
    )
    scratch = tmp_path / "tmpdir"  # TMPDIR: where the dry run's hydra directory goes
    scratch.mkdir()
    env = {**os.environ, "DRY_RUN": "1", "N_GPUS": "1", "MODEL": "3b", "TMPDIR": str(scratch)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the real launcher
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "verl's validate_config rejects this config: train_batch_size (8) must be >= actor.ppo_mini_batch_size "
        "(32); nothing launched"
    )
    assert "config valid" not in done.stdout


def test_an_appended_plus_key_the_scripts_add_composes_with_the_users_value(tmp_path):
    """docs/verl.md's ``+...token_mean_scope=micro_batch`` appended to a kk_*.sh line: verl composes it (no
    second ``+`` for hydra to refuse) and the user's value wins over the script's ``mini_batch``."""
    scope = "actor_rollout_ref.actor.policy_loss.token_mean_scope"
    command = ["bash", "examples/verl/kk_ar_lopti.sh", f"+{scope}=micro_batch"]
    (overrides,) = run_recorded(tmp_path, command, {"DRY_RUN": "1", "N_GPUS": "1", "MODEL": "3b"})
    assert verl_config_problem(overrides) is None
    assert composed_config(overrides).actor_rollout_ref.actor.policy_loss.token_mean_scope == "micro_batch"
