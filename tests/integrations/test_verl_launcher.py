"""The verl launcher's command line (``python -m tokenbalance.integrations.verl.main``) before verl
runs: the dry-run switch means one thing (1/true/yes a dry run, 0/false/no/unset not, anything else
refused before any work), and a machine without verl gets one line saying how to install it, not a
traceback. Needs no verl (it is hidden in a subprocess)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenbalance.integrations.verl.main import DRY_RUN_ENV, RUN_DIR, dry_run_value, with_default_run_dir


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "Yes", "on"])
def test_true_looking_values_are_a_dry_run(text):
    assert dry_run_value(text) is True


@pytest.mark.parametrize("text", [None, "", "0", "false", "False", "no", "off"])
def test_false_or_unset_values_train(text):
    assert dry_run_value(text) is False


@pytest.mark.parametrize("text", ["maybe", "2", "ture", "y e s"])
def test_any_other_value_is_refused(text):
    with pytest.raises(ValueError, match=f"{DRY_RUN_ENV}='{text}' \\(from DRY_RUN\\): not a yes/no value"):
        dry_run_value(text)


@pytest.mark.parametrize("word", ["hydra.run.dir=/x", "++hydra.run.dir=/x", "~hydra.run.dir", "hydra.run.dir@hydra=/x"])
def test_a_run_dir_override_of_the_users_is_kept_and_ours_not_added(word):
    """Any override of ``hydra.run.dir`` (set, forced, deleted, with a package) is the user's: ours is
    not appended after it (a delete followed by our value would silently undo the delete)."""
    assert with_default_run_dir(["a=1", word], dry_run=False) == ["a=1", word]


@pytest.mark.parametrize("word", ["hydra.run.dirs=/x", "hydra.job.chdir=true"])
def test_another_key_gets_our_run_dir(word):
    assert with_default_run_dir([word], dry_run=False) == [word, f"hydra.run.dir={RUN_DIR}"]


def launch_without_verl(dry_run: str) -> subprocess.CompletedProcess:
    code = (
        "import sys; sys.modules['verl'] = None\n"  # any import of verl now fails, as on a machine without it
        "from tokenbalance.integrations.verl.main import launch\n"
        "sys.exit(launch(['trainer.total_epochs=1']))\n"
    )
    env = {**os.environ, DRY_RUN_ENV: dry_run}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_a_dry_run_without_verl_is_one_line_naming_the_install():
    done = launch_without_verl("1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tokenbalance verl: error: cannot import verl")
    assert line.endswith("install verl: pip install -e '.[verl]' && pip install 'verl[vllm]' (docs/verl.md)")


def test_a_misspelt_dry_run_is_refused_before_any_import():
    done = launch_without_verl("ture")
    assert done.returncode == 2 and "TOKENBALANCE_VERL_DRY_RUN='ture' (from DRY_RUN): not a yes/no" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("value", "seen"), [("yes", "1"), ("True", "1"), ("", "0"), ("no", "0"), ("maybe", None)])
def test_the_preset_scripts_read_dry_run_the_same_way(value, seen):
    """``examples/verl/common.sh`` (sourced by every kk_*.sh) turns DRY_RUN into 1 or 0 for the
    launcher, and refuses anything else before it runs anything."""
    script = f'source {REPO / "examples/verl/common.sh"} && echo "DRY_RUN=$DRY_RUN"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, "DRY_RUN": value})
    if seen is None:
        assert done.returncode == 2 and "DRY_RUN must be 1/true/yes (a dry run)" in done.stderr
        assert "got 'maybe'; nothing started" in done.stderr and done.stdout == ""
    else:
        assert done.returncode == 0 and done.stdout.strip() == f"DRY_RUN={seen}"


@pytest.mark.parametrize(
    ("name", "value", "refusal"),
    [
        (
            "LOSS_SCOPE",
            "token",
            "LOSS_SCOPE must be mini_batch (verl's normaliser) or micro_batch (the fork's), got 'token'",
        ),
        ("OFFLOAD", "yes", "OFFLOAD must be 1 (the fork's CPU offload) or 0, got 'yes'"),
        ("VALIDATION", "both", "VALIDATION must be greedy or sample, got 'both'"),
    ],
)
def test_the_preset_scripts_refuse_an_unknown_parity_switch(name, value, refusal):
    """The switches between verl's behaviour and the AR-Lopti fork's each take their named values
    only; anything else stops the script before it composes a command."""
    script = f"source {REPO / 'examples/verl/common.sh'} && echo composed"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, name: value})
    assert done.returncode == 2 and refusal in done.stderr and done.stdout == ""
    unset = {k: v for k, v in os.environ.items() if k != name}
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=unset).stdout == "composed\n"


def test_an_appended_plus_key_the_scripts_already_add_replaces_theirs():
    """``+...token_mean_scope=micro_batch`` appended to a kk_*.sh line (docs/verl.md shows it) would be a
    second ``+`` for a key the scripts add, which hydra refuses; it reaches verl as a plain override, after
    the scripts' own, and a ``+`` for a new key stays as written."""
    scope = "actor_rollout_ref.actor.policy_loss.token_mean_scope"
    script = (
        f'source {REPO / "examples/verl/common.sh"} && python() {{ printf "%s\\n" "$@"; }} && '
        f'METHOD=ar run_method ar sync "+{scope}=micro_batch" "+actor_rollout_ref.actor.policy_loss.method=lopti" '
        '"+trainer.extra=1"'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["-m", "tokenbalance.integrations.verl.main"]
    assert [line for line in lines if scope in line] == [f"+{scope}=mini_batch", f"{scope}=micro_batch"]
    assert [line for line in lines if "policy_loss.method=" in line] == [
        "+actor_rollout_ref.actor.policy_loss.method=ar",
        "actor_rollout_ref.actor.policy_loss.method=lopti",
    ]
    assert lines[-1] == "+trainer.extra=1"
