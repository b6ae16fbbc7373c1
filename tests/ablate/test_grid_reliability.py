"""``tokenbalance ablate`` keeps the promises of docs/reliability.md: nothing of the user's in --out
is replaced, every flag takes effect or is refused by name before any work, and an interrupted grid
says how to continue. The verl scripts embed every value as data: tests/ablate/test_verl_sittings.py."""

import shlex
from pathlib import Path

import pytest

from tokenbalance.ablate import runner
from tokenbalance.cli import main
from tokenbalance.outputs import written_files

SMOKE = ["ablate", "--preset", "kk-smoke", "--no-progress"]


@pytest.mark.parametrize("name", ["results.md", "grid.json", "logs"])
@pytest.mark.parametrize("mode", [[], ["--report-only"], ["--runner", "verl"]])
def test_a_users_file_in_out_is_never_replaced(tmp_path, capsys, name, mode):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).mkdir() if name == "logs" else (out / name).write_text("mine\n")
    before = sorted(p.name for p in out.rglob("*"))
    assert main([*SMOKE, "--out", str(out), *mode]) == 2
    assert f"{name} exist(s) there and tokenbalance did not write them" in capsys.readouterr().err
    assert sorted(p.name for p in out.rglob("*")) == before
    if name != "logs":
        assert (out / name).read_text() == "mine\n"


def test_the_verl_script_of_a_users_verl_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "verl").mkdir(parents=True)
    (out / "verl" / "run_grid.sh").write_text("# mine\n")
    assert main([*SMOKE, "--out", str(out), "--runner", "verl"]) == 2
    assert "verl exist(s) there" in capsys.readouterr().err
    assert (out / "verl" / "run_grid.sh").read_text() == "# mine\n"


def test_a_grid_from_before_the_manifest_is_adopted(tmp_path):
    out = tmp_path / "out"
    (out / "cells").mkdir(parents=True)
    (out / "grid.json").write_text('{"preset": "kk-smoke", "rows": [], "seeds": [0], "steps": 2}\n')
    assert runner.adopt_earlier_grid(out) == ["grid.json", "cells"]
    assert written_files(out) == {"grid.json", "cells"}
    assert runner.adopt_earlier_grid(out) == []  # once: a manifest now exists


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--methods", ""], "--methods: empty value ''"),
        (["--seeds", " , "], "--seeds: empty value ' , '"),
        (["--set", "train.steps=3"], "--set train.steps=3: the grid sets train.steps in every cell; use --steps"),
        (["--set", "train.seed=4"], "use --seeds"),
        (["--set", "train.method=grpo"], "use --methods"),
        (["--set", "output.run_dir=x"], "use --out"),
        (["--set", "train.start_eval_cache=x"], "use --out (the cells share OUT/start_evals/)"),
        (["--runner", "verl", "--set", "optim.lr=0.1"], "--runner verl: --set apply to the local grid only"),
        (["--runner", "verl", "--model", "m", "--device", "cpu"], "--runner verl: --model, --device apply"),
        (["--runner", "verl", "--verl-models", ""], "--verl-models: empty value"),
        (["--verl-models", "3b"], "--verl-models: applies to --runner verl only"),
        (["--jobs", "0"], "--jobs: must be >= 1"),
        (["--steps", "99999999"], "--steps: must be in [1, 10000000], got 99999999"),
        (["--steps", "0"], "--steps: must be in [1, 10000000], got 0"),
        (["--report-only", "--jobs", "2"], "--report-only: runs no cell, so --jobs and --isolation do not apply"),
        (["--runner", "verl", "--records", "r"], "--runner verl: --records apply to the local grid only"),
        (["--runner", "verl", "--no-figure", "--figure-prompts", "4"], "--no-figure, --figure-prompts apply to the"),
    ],
)
def test_every_flag_takes_effect_or_is_refused_by_name(tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert main([*SMOKE, "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # refused before anything is written


def test_ctrl_c_of_the_grid_says_how_to_continue(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt()

    monkeypatch.setattr(runner, "run_grid", interrupted)
    out = tmp_path / "out"
    assert main([*SMOKE, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokenbalance ablate: interrupted; the grid in")
    assert "Continue it with: tokenbalance ablate --preset kk-smoke" in err


RULE = str(Path(__file__).resolve().parents[2] / "examples" / "rules" / "positive_only.py") + ":positive_only"


def test_the_continue_command_runs_as_printed_with_a_rule_row_and_the_figure_flags(tmp_path, capsys, monkeypatch):
    """The ``Continue it with`` line names a token-rule row as ``--methods`` takes it (not by its
    registered name, which ``--methods`` rejects) and keeps ``--no-figure`` / ``--figure-prompts``:
    run as printed, it gets to the same grid and prints the same line."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt()

    monkeypatch.setattr(runner, "run_grid", interrupted)
    flags = ["--methods", f"grpo,{RULE}", "--seeds", "0", "--no-figure", "--figure-prompts", "3"]
    assert main([*SMOKE, "--out", str(tmp_path / "out"), *flags]) == 130
    line = capsys.readouterr().err.strip()
    command = line.split("Continue it with: ", 1)[1]
    assert f"--methods grpo,{RULE} " in command and "--no-figure --figure-prompts 3" in command
    words = shlex.split(command)
    assert words[:2] == ["tokenbalance", "ablate"]
    assert main([*words[1:], "--no-progress"]) == 130
    assert capsys.readouterr().err.strip() == line


def test_the_verl_report_command_runs_as_printed_with_a_rule_row(tmp_path, capsys, monkeypatch):
    """The ``--report-only`` command ``--runner verl`` prints (and writes into the scripts' header)
    runs as printed from another directory, with a token-rule row named by a relative file and a
    relative --out: both are printed absolute."""
    (tmp_path / "half_rule.py").write_text(
        "import torch\nfrom tokenbalance.algorithms import register_token_rule\n\n"
        "@register_token_rule('half_weight', stage='passes')\n"
        "def half_weight(inputs):\n    return torch.full_like(inputs.advantages_BT, 0.5)\n"
    )
    monkeypatch.chdir(tmp_path)
    methods = "grpo,half_rule.py:half_weight"
    assert main(["ablate", "--preset", "kk-smoke", "--runner", "verl", "--methods", methods, "--out", "rel"]) == 0
    printed = capsys.readouterr().out
    command = printed.split("the table afterwards: ", 1)[1].strip()
    assert f"--out {tmp_path / 'rel'} " in command
    assert f"--methods grpo,{tmp_path / 'half_rule.py'}:half_weight " in command
    slurm = (tmp_path / "rel/verl/slurm_array.sh").read_text()
    assert command.removesuffix(" --report-only") in slurm
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(shlex.split(command)[1:]) == 1  # it reports; no cell has run yet, each named
    assert "cells without a final accuracy: 8: grpo-3b-seed0 (not started); half_weight-3b-seed0" in (
        capsys.readouterr().err
    )
