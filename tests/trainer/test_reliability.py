"""Reliability (docs/reliability.md): no command replaces a file it did not write, nothing typed is
taken for something else, and every input or environment error is one message that comes before
any model work. The commands run through ``tokenbalance.cli.main`` as a user runs them (the
argument parsing, the one-line error handler and the signal handler included), in process so that
each failing case costs milliseconds; ``test_cli_train.py`` runs the CLI in subprocesses too."""

import argparse
import ast
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import SMALL_RUN, replace_section
from tokenbalance.cli import build_parser, main
from tokenbalance.commands.train import config_from_args
from tokenbalance.config import RunConfig, apply_overrides, load_config, save_config
from tokenbalance.diagnostics import sinks
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models import load_policy
from tokenbalance.outputs import check_files_replaceable
from tokenbalance.run.checks import wandb_problem
from tokenbalance.run.lock import RunLock
from tokenbalance.tasks.kk import generate_rows
from tokenbalance.trainer import checkpoint, loop, runner
from tokenbalance.trainer.embedded import embedded_key

SETS = [arg for item in SMALL_RUN for arg in ("--set", item)]
SFT = ["--set", "sft.steps=1", "--set", "sft.batch_size=2", "--set", "sft.train_count=2"]
SFT += ["--set", "data.train_difficulties=[2]", "--no-progress"]


@pytest.fixture
def no_model_work(monkeypatch):
    """Fail the test if a command gets as far as building or loading a policy."""

    def model_work(*args, **kwargs):
        raise AssertionError("model work started before the error was found")

    monkeypatch.setattr(runner, "policy_path", model_work)
    monkeypatch.setattr(runner, "load_run_policy", model_work)


def kk_rows_file(path, mutate=None, count=3):
    rows = generate_rows(2, "test", count=count, template="compact")
    if mutate is not None:
        mutate(rows[1])
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ---------------------------------------------------------------------------------------------
# 1. Data loss: no command deletes or overwrites a file it did not write
# ---------------------------------------------------------------------------------------------


def test_sft_out_replaces_only_an_sft_policy_it_wrote(tiny_policy_dir, tmp_path, tokenbalance):
    sft = ["sft", "--model", str(tiny_policy_dir), *SFT, "--out"]
    run_dir = tmp_path / "run"  # what `sft --out` deleted whole before: a run directory
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("kept\n")
    for force in ([], ["--force"]):
        status, _, err = tokenbalance(*sft, str(run_dir), *force)
        assert status == 2 and "holds files `tokenbalance sft` did not write (checkpoints, metrics.jsonl)" in err
    assert (run_dir / "metrics.jsonl").read_text() == "kept\n" and sorted(os.listdir(run_dir)) == [
        "checkpoints",
        "metrics.jsonl",
    ]

    out = tmp_path / "sft"
    assert tokenbalance(*sft, str(out)).returncode == 0
    status, _, err = tokenbalance(*sft, str(out))
    assert status == 2 and "holds an SFT policy written earlier; pass --force" in err
    assert tokenbalance(*sft, str(out), "--force").returncode == 0
    (out / "notes.txt").write_text("mine")
    status, _, err = tokenbalance(*sft, str(out), "--force")
    assert status == 2 and "did not write (notes.txt)" in err and (out / "notes.txt").read_text() == "mine"
    load_policy(out)  # the policy written before is still whole


def test_sft_out_continues_a_stopped_sft_from_its_checkpoints(
    tiny_policy_dir, tmp_path, capsys, monkeypatch, tokenbalance
):
    """``sft.save_every`` on ``tokenbalance sft --out`` (it was silently ignored): a stopped SFT leaves
    checkpoints beside --out, the next command continues from them, and the policy equals one never stopped."""
    from safetensors.torch import load_file

    from tokenbalance.trainer import sft_checkpoint

    sft = ["sft", "--model", str(tiny_policy_dir), *SFT, "--set", "sft.steps=3", "--set", "sft.save_every=1"]
    assert tokenbalance(*sft, "--out", str(tmp_path / "whole")).returncode == 0
    assert not (tmp_path / ".whole.sft-checkpoints").exists()  # removed once the policy is saved

    real_save = sft_checkpoint.save

    def save_then_stop(directory, step, *args):
        real_save(directory, step, *args)
        if step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(sft_checkpoint, "save", save_then_stop)
    status, _, err = tokenbalance(*sft, "--out", str(tmp_path / "stopped"))
    assert status == 130 and "interrupted" in err
    assert not (tmp_path / "stopped").exists()
    assert [p.name for p in (tmp_path / ".stopped.sft-checkpoints").glob("step_*")] == ["step_000002"]
    monkeypatch.setattr(sft_checkpoint, "save", real_save)
    assert main([*sft, "--out", str(tmp_path / "stopped")]) == 0
    assert "continuing the SFT from the checkpoints in" in capsys.readouterr().out
    whole, resumed = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("whole", "stopped"))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert not (tmp_path / ".stopped.sft-checkpoints").exists()


def test_eval_responses_into_a_new_directory_is_written_and_an_empty_value_refused(
    tiny_policy_dir, tmp_path, capsys, tokenbalance
):
    """``--responses newdir/x.json``: the directory is checked before the evaluation and created for
    the file (before: the numbers were computed, then lost on the missing directory);
    ``--responses ""`` (an unset variable) is refused, not ignored."""
    with pytest.raises(SystemExit) as exit_info:  # argparse's exit, as for every empty path flag
        main(["eval", "--model", str(tiny_policy_dir), "--responses", "", *SETS])
    assert exit_info.value.code == 2 and "argument --responses: empty value" in capsys.readouterr().err
    target = tmp_path / "newdir" / "deeper" / "x.json"
    status, _, err = tokenbalance("eval", "--model", str(tiny_policy_dir), "--responses", str(target), *SETS)
    assert status == 0, err
    assert json.loads(target.read_text())["written_by"] == "tokenbalance eval"
    (tmp_path / "afile").write_text("mine")
    status, _, err = tokenbalance(
        "eval", "--model", str(tiny_policy_dir), "--responses", str(tmp_path / "afile/x.json")
    )
    assert status == 2 and "afile is a file, not a directory" in err


def test_train_starts_only_in_a_new_or_empty_directory(tiny_policy_dir, tmp_path, tokenbalance, no_model_work):
    train = ["train", "--model", str(tiny_policy_dir), *SETS, "--run-dir"]
    user = tmp_path / "user"
    user.mkdir()
    (user / "config.yaml").write_text("mine: 1\n")  # a config.yaml of the user's: train overwrote it
    (user / "notes.txt").write_text("mine")
    status, _, err = tokenbalance(*train, str(user))
    assert status == 2 and "holds files tokenbalance did not write (config.yaml, notes.txt)" in err
    assert (
        sorted(os.listdir(user)) == ["config.yaml", "notes.txt"] and (user / "config.yaml").read_text() == "mine: 1\n"
    )
    (user / "metrics.jsonl").write_text("")  # config.yaml and a log: a run, to be continued, not restarted
    status, _, err = tokenbalance(*train, str(user))
    assert status == 2 and f"{user} already holds a run; pass --resume {user}" in err
    status, _, err = tokenbalance(*train, str(user / "notes.txt" / "run"))
    assert status == 2 and f"{user / 'notes.txt'} is a file, not a directory" in err


def test_gen_data_plot_and_diagnose_replace_only_their_own_files(tiny_policy_dir, tmp_path, tokenbalance, monkeypatch):
    gen = ["gen-data", "kk", "--people", "2", "--split", "test", "--count", "2", "--out"]
    user = tmp_path / "user.parquet"
    user.write_text("mine")
    for force in ([], ["--force"]):
        status, _, err = tokenbalance(*gen, str(user), *force)
        assert status == 2 and "was not written by tokenbalance gen-data; it is never replaced" in err
    assert user.read_text() == "mine"
    ours = tmp_path / "kk.parquet"
    assert tokenbalance(*gen, str(ours)).returncode == 0
    status, _, err = tokenbalance(*gen, str(ours))
    assert status == 2 and "written by an earlier gen-data); pass --force" in err
    assert tokenbalance(*gen, str(ours), "--force").returncode == 0

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "kind": "train", "reward/mean": 0.5}\n')
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "training.png").write_text("mine")
    status, _, err = tokenbalance("plot", str(run), "--out", str(figures), "--format", "png")
    assert status == 2 and "training.png exist(s) there and tokenbalance did not write them" in err
    assert (figures / "training.png").read_text() == "mine"
    assert tokenbalance("plot", str(run), "--format", "png").returncode == 0
    assert (run / "plots" / "training.png").read_bytes().startswith(b"\x89PNG")
    check_files_replaceable(run / "plots", ["training.png", "lld.png"], "--out")  # a new plot may replace its own

    from tokenbalance.commands import diagnose

    monkeypatch.setattr(diagnose, "probe", lambda *a, **k: pytest.fail("the experiment ran"))
    mine = tmp_path / "result.json"
    mine.write_text("mine")
    status, _, err = tokenbalance("diagnose", "buckets", str(tiny_policy_dir), "--json", str(mine), "--force")
    assert status == 2 and "was not written by tokenbalance; it is never replaced" in err
    status, _, err = tokenbalance("diagnose", "lld", str(tiny_policy_dir), "--json", str(mine / "x.json"))
    assert status == 2 and "is a file, not a directory" in err  # an unwritable --json: before the experiment


# ---------------------------------------------------------------------------------------------
# 2. Nothing typed is silently taken for something else
# ---------------------------------------------------------------------------------------------


def test_paths_and_strings_from_the_command_line_are_verbatim():
    args = build_parser().parse_args(
        ["train", "--model", "null", "--run-dir", "123", "--set", "data.train_file=data/a #1.jsonl"]
    )
    config = config_from_args(args)
    assert (config.model.path, config.output.run_dir, config.data.train_file) == ("null", "123", "data/a #1.jsonl")
    assert apply_overrides(RunConfig(), ["train.device=cuda:1"]).train.device == "cuda:1"


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.path=", "model.path: empty value ''; give a path or leave the option out"),
        ("data.train_file=", "data.train_file: empty value ''"),
        ("output.wandb=flase", "output.wandb: expected true or false, got 'flase'"),
        ("diagnostics.lld=1", "diagnostics.lld: expected true or false, got 1"),
        ("train.eval_every=2.5", "train.eval_every: expected an integer, got 2.5"),
        ("data.train_difficulties=3", r"data.train_difficulties: expected a list of integers, e.g. \[3\], got 3"),
        ("data.eval_difficulties=[2.5]", r"expected a list of integers, e.g. \[3\], got \[2.5\]"),
        ("train.method_overrides=3", "train.method_overrides: expected a mapping, got 3"),
        ("method.lopti.strict_less=flase", "method.lopti.strict_less: expected true or false, got 'flase'"),
        ("method.max_response_len=2.5", "method.max_response_len: expected an integer or null, got 2.5"),
    ],
)
def test_values_are_checked_against_their_declared_type(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(RunConfig(), [override])


def test_a_yaml_config_is_type_checked_too(tmp_path):
    (tmp_path / "c.yaml").write_text("output:\n  tensorboard: 'no'\n")
    with pytest.raises(ValueError, match="output.tensorboard: expected true or false, got 'no'"):
        load_config(tmp_path / "c.yaml")


def test_empty_flags_and_changes_on_resume_are_refused(tmp_path, capsys, tokenbalance):
    for argv in (["train", "--model", ""], ["train", "--resume", ""], ["sft", "--out", ""]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and "empty value (an unset shell variable?)" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    save_config(RunConfig(), run / "config.yaml")
    for change in (["--seed", "3"], ["--model", str(tmp_path)], ["--config", str(run / "config.yaml")]):
        status, _, err = tokenbalance("train", "--resume", str(run), *change)
        assert status == 2 and "cannot change a run that has started" in err
        assert sorted(os.listdir(run)) == ["config.yaml"]


def unsatisfiable_statements(row):
    """Statements the row's gold answer does not satisfy: "each says the other is a knave" has only
    mixed solutions, "each says the other is a knight" only equal ones."""
    mixed = row["solution"][0] != row["solution"][1]
    statements = "(('telling-truth', 1), ('telling-truth', 0))" if mixed else "(('lying', 1), ('lying', 0))"
    row["reward_model"]["ground_truth"]["statements"] = statements


@pytest.mark.parametrize(
    "mutate, column, problem",
    [
        (lambda row: row.update(solution=[not v for v in row["solution"]]), "solution", "contradicts the gold"),
        (lambda row: row.update(names=row["names"][::-1]), "names", "differ from the people of the gold answer"),
        (
            lambda row: row.update(solution_text_format=row["solution_text_format"].replace("knave", "KNIGHT")),
            "solution_text_format",
            "contradicts the gold answer",
        ),
        (unsatisfiable_statements, "reward_model.ground_truth.statements", "does not satisfy these statements"),
    ],
)
def test_rows_contradicting_their_own_solution_are_refused(tmp_path, mutate, column, problem):
    from tokenbalance.tasks.kk import read_kk_examples

    path = kk_rows_file(tmp_path / "rows.jsonl", mutate)
    with pytest.raises(ValueError, match=re.escape(f"{path}: row 1 (line 2): column {column!r}: ") + ".*" + problem):
        read_kk_examples(path)


# ---------------------------------------------------------------------------------------------
# 3. Every error is a message, before any model work
# ---------------------------------------------------------------------------------------------


def test_input_errors_are_one_line_before_any_model_work(
    tiny_policy_dir, tmp_path, tokenbalance, monkeypatch, no_model_work
):
    monkeypatch.chdir(tmp_path)  # where the default run directory would appear
    contradicting = kk_rows_file(tmp_path / "contradicting.jsonl", lambda r: r.update(solution=[True] * 2))
    schema = kk_rows_file(tmp_path / "schema.jsonl", lambda r: r.pop("quiz"))
    broken_tokenizer = tmp_path / "policy"
    shutil.copytree(tiny_policy_dir, broken_tokenizer)
    (broken_tokenizer / "tokenizer.json").write_text('{"version": ')
    cases = [
        (["--device", "tpu"], "train.device='tpu': unknown device; valid: auto, cpu, cuda, cuda:N"),
        (["--set", "data.template=fancy"], "data.template: unknown value 'fancy'; valid: "),
        (["--set", f"data.train_file={contradicting}"], "row 1 (line 2): column 'solution': [True, True]"),
        (["--set", f"data.eval_file={schema}"], "schema.jsonl: row 1 (line 2): column 'quiz': missing"),
        (["--set", "data.max_prompt_tokens=8"], "tokens, more than data.max_prompt_tokens=8"),
        (["--model", str(broken_tokenizer)], f"{broken_tokenizer}: cannot load the tokenizer (JSONDecodeError"),
        (["--model", str(tmp_path / "null")], "must be a local directory"),
    ]
    for args, message in cases:
        status, _, err = tokenbalance("train", "--model", str(tiny_policy_dir), *SETS, *args)
        assert status == 2 and message in err, (args, err)
        assert err.count("\n") == 1 and err.startswith("tokenbalance train: error: "), err
    assert sorted(os.listdir(tmp_path)) == ["contradicting.jsonl", "policy", "schema.jsonl"]  # no run directory


def test_wandb_settings_that_cannot_work_are_one_line_before_any_model_work(
    tiny_policy_dir, tmp_path, tokenbalance, monkeypatch, no_model_work
):
    """W&B online without a login, a misspelt ``WANDB_MODE`` and a ``wandb_*`` option while W&B is off
    fail before the model loads and leave no run directory, so the corrected command just runs."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no login
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "run"
    train = ["train", "--model", str(tiny_policy_dir), *SETS, "--run-dir", str(run_dir)]
    online = ["--set", "output.wandb=true", "--set", "output.wandb_mode=online"]
    status, _, err = tokenbalance(*train, *online)
    assert status == 2 and "W&B online needs a login and this machine has none" in err and "wandb login" in err
    monkeypatch.setenv("WANDB_MODE", "onlin")
    status, _, err = tokenbalance(*train, "--set", "output.wandb=true")
    assert status == 2 and "WANDB_MODE='onlin' in the environment (it wins over output.wandb_mode): not a W&B" in err
    monkeypatch.delenv("WANDB_MODE")
    status, _, err = tokenbalance(*train, "--set", "output.wandb_project=mine")
    assert status == 2 and "output.wandb_project='mine': applies only with output.wandb=true" in err
    assert len(err.strip().splitlines()) == 1 and not run_dir.exists()
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password k" + "0" * 39 + "\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_problem(config_from_args(build_parser().parse_args([*train, *online])).output, os.environ) is None


def test_a_wandb_start_that_fails_is_one_line_and_the_same_command_then_runs(
    tiny_policy_dir, tmp_path, tokenbalance, monkeypatch
):
    """W&B failing to start after the checks (a service or network error) is one line, and the run
    directory it leaves is accepted by the same command (before: config.yaml and wandb/ were left,
    and the same command was refused)."""
    import wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)

    def broken(**kwargs):
        (Path(kwargs["dir"]) / "wandb").mkdir()  # as wandb does before it fails
        raise RuntimeError("wandb service did not answer")

    class Fake:
        def log(self, *args, **kwargs):
            pass

        def finish(self):
            pass

    run_dir = tmp_path / "run"
    command = ["train", "--model", str(tiny_policy_dir), *SETS, "--run-dir", str(run_dir), "--set", "output.wandb=true"]
    monkeypatch.setattr(wandb, "init", broken)
    status, _, err = tokenbalance(*command)
    assert status == 2 and err.count("\n") == 1
    assert "output.wandb: W&B did not start (RuntimeError: wandb service did not answer); fix that" in err
    assert sorted(os.listdir(run_dir)) == [".lock"]
    monkeypatch.setattr(wandb, "init", lambda **kwargs: Fake())
    status, _, err = tokenbalance(*command)
    assert status == 0, err
    assert json.loads((run_dir / "run_state.json").read_text())["status"] == "completed"


def test_a_token_rule_that_returns_the_wrong_thing_fails_before_any_model_work(
    tiny_policy_dir, tmp_path, tokenbalance, no_model_work
):
    rules = tmp_path / "my_rules.py"
    rules.write_text(
        "import torch\nfrom tokenbalance.algorithms import register_token_rule\n\n"
        "@register_token_rule('flat_rule', stage='passes')\ndef flat_rule(inputs):\n    return torch.ones(3)\n"
    )
    status, _, err = tokenbalance("train", "--model", str(tiny_policy_dir), *SETS, "--method", f"{rules}:flat_rule")
    assert status == 2 and err.count("\n") == 1
    assert f"token rule 'flat_rule' ({rules}:flat_rule) returned shape (3,); expected [B, T]" in err


def test_options_that_cannot_apply_are_refused_naming_why(tiny_policy_dir, tmp_path, tokenbalance, no_model_work):
    """``--prompt-column`` and ``data.max_reward`` without ``data.reward`` (the generated task has its
    own prompts and rewards), and an unregistered ``method.token_rule`` name, are one line naming the
    flag and what to do (before: accepted and ignored; a message with an empty list)."""
    train = ["train", "--model", str(tiny_policy_dir), *SETS, "--run-dir", str(tmp_path / "run")]
    cases = [
        (
            ["--prompt-column", "question"],
            "data.prompt_column='question' (--prompt-column): applies only with data.reward",
        ),
        (["--set", "data.max_reward=3"], "data.max_reward=3.0: applies only with data.reward"),
        (["--set", "method.token_rule=no_such_rule"], "method.token_rule='no_such_rule': no token rule of that name ("),
    ]
    for args, message in cases:
        status, _, err = tokenbalance(*train, *args)
        assert status == 2 and message in err and err.count("\n") == 1, (args, err)
    assert "FILE.py:RULE or MODULE:RULE" in err and not (tmp_path / "run").exists()


def damage(directory, how):
    if how == "weights":  # a download cut short
        weights = directory / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:200])
    elif how == "config":
        (directory / "config.json").write_text('{"model_type": "llama", ')
    elif how == "shape":  # a config.json of another model
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    elif how == "missing":  # silently re-initialised by transformers before
        from safetensors.torch import load_file, save_file

        tensors = load_file(directory / "model.safetensors")
        del tensors["model.layers.1.mlp.up_proj.weight"]
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    "how, message",
    [
        ("weights", "cannot load the model (SafetensorError: "),
        ("config", "config.json: not a valid JSON file"),
        ("shape", "cannot load the model (RuntimeError: "),
        ("missing", "the weights lack 1 tensor(s) that config.json asks for (e.g. model.layers.1.mlp.up_proj.weight)"),
    ],
)
def test_damaged_or_mismatched_weights_are_named(tiny_policy_dir, tmp_path, how, message):
    directory = tmp_path / "policy"
    shutil.copytree(tiny_policy_dir, directory)
    damage(directory, how)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_policy(directory)


def test_a_damaged_cached_policy_says_which_entry_to_delete(small_config, tiny_policy_dir, tmp_path):
    replace_section(small_config, "model", path=None, cache_dir=str(tmp_path / "cache"))
    entry = tmp_path / "cache" / embedded_key(small_config)
    shutil.copytree(tiny_policy_dir, entry)
    (entry / "tokenbalance_sft.json").write_text("{}")
    damage(entry, "weights")
    with pytest.raises(ValueError, match=re.escape(f"This is the cached embedded policy: delete {entry} and the")):
        runner.run_training(small_config, log=lambda *_: None)


def test_a_full_disk_and_a_kill_are_repaired_on_resume(small_config, tiny_policy_dir, tmp_path, monkeypatch):
    """The disk fills during a metrics append at step 2 (a torn last line); then, as after a SIGKILL,
    ``latest`` and temporary files are lost or left over. The resume, from another working directory
    (config.yaml holds absolute paths), repairs all of it and continues from step 1."""
    monkeypatch.chdir(tmp_path)
    replace_section(small_config, "model", path=os.path.relpath(tiny_policy_dir))
    replace_section(small_config, "output", run_dir="runs/r")
    real_log = sinks.MetricsLog.log

    def disk_full_at_step_2(self, step, kind, metrics):
        if step == 2 and kind == "train":
            with self.path.open("a") as out:
                out.write('{"step": 2, "kind": "tr')
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        return real_log(self, step, kind, metrics)

    monkeypatch.setattr(sinks.MetricsLog, "log", disk_full_at_step_2)
    run_dir = tmp_path / "runs" / "r"
    with pytest.raises(ValueError, match=r"cannot write \(No space left on device: .*metrics.jsonl\); the run in "):
        runner.run_training(small_config, log=lambda *_: None)
    state = json.loads((run_dir / "run_state.json").read_text())
    assert (
        state["status"] == "failed"
        and state["step"] == 1
        and state["resume"] == f"tokenbalance train --resume {run_dir}"
    )
    saved = load_config(run_dir / "config.yaml")
    assert saved.model.path == str(tiny_policy_dir) and saved.output.run_dir == str(run_dir)

    monkeypatch.setattr(sinks.MetricsLog, "log", real_log)
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "latest").unlink()
    (checkpoints / ".step_000002.abc" / "model").mkdir(parents=True)
    (run_dir / ".run_state.json.xyz").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    notes = []
    runner.run_training(None, run_dir=run_dir, resume=True, log=notes.append)
    text = "\n".join(map(str, notes))
    assert "removed what an interrupted write left" in text and "checkpoints/.step_000002.abc" in text
    assert "latest was missing; continuing from step_000001, the newest complete checkpoint" in text
    assert "its last line is torn (an interrupted write) and is dropped" in text
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_000001", "step_000002"]
    assert json.loads((run_dir / "run_state.json").read_text())["status"] == "completed"
    assert os.listdir(elsewhere) == []

    # a damaged checkpoint is named before any model work, with the way back to the previous one
    (checkpoints / "step_000002" / "trainer_state.json").write_text('{"step": 2, ')
    replace_section(small_config, "train", steps=3)
    with pytest.raises(ValueError, match=r"step_000002/trainer_state.json: unreadable .* move .*step_000002 out of"):
        runner.run_training(None, run_dir=run_dir, resume=True, log=lambda *_: None)
    # a malformed line before the last is named by file and line, not skipped
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not JSON"):
        read_metrics(run_dir / "metrics.jsonl")


def test_one_process_per_run_directory(tiny_policy_dir, tmp_path, tokenbalance, no_model_work):
    run = tmp_path / "run"
    run.mkdir()
    save_config(apply_overrides(RunConfig(), [*SMALL_RUN, f"model.path={tiny_policy_dir}"]), run / "config.yaml")
    with RunLock(run):
        status, _, err = tokenbalance("train", "--resume", str(run))
    assert status == 2 and f"is in use by another tokenbalance process (pid {os.getpid()} on host " in err


def test_sigterm_marks_the_run_interrupted_and_prints_the_resume_command(
    tiny_policy_dir, tmp_path, tokenbalance, monkeypatch
):
    real_step = loop.rl_step

    def terminated_in_step_2(parts, step):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` or a scheduler's preemption
        return real_step(parts, step)

    monkeypatch.setattr(loop, "rl_step", terminated_in_step_2)
    run = tmp_path / "run"
    status, _, err = tokenbalance("train", "--model", str(tiny_policy_dir), *SETS, "--run-dir", str(run))
    assert status == 143 and "Traceback" not in err
    assert f"terminated (SIGTERM); the run in {run} stopped (its last checkpoint is step 1). Continue it with: " in err
    assert err.strip().endswith(f"tokenbalance train --resume {run}")
    state = json.loads((run / "run_state.json").read_text())
    assert (state["status"], state["step"], state["reason"]) == ("interrupted", 1, "terminated (SIGTERM)")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # main() restores the handler it replaced


def test_ctrl_c_between_a_checkpoint_and_its_latest_pointer_reports_that_checkpoint(
    tiny_policy_dir, tmp_path, tokenbalance, monkeypatch
):
    """Ctrl-C after ``step_000001`` is renamed into place but before ``latest`` names it (the window a
    real SIGINT hit once in CI): the message and ``run_state.json`` say step 1, as the resume does."""
    real_write = checkpoint.write_text_atomic

    def interrupted_before_latest(path, text):
        if Path(path).name == "latest":
            raise KeyboardInterrupt
        return real_write(path, text)

    monkeypatch.setattr(checkpoint, "write_text_atomic", interrupted_before_latest)
    run = tmp_path / "run"
    status, _, err = tokenbalance("train", "--model", str(tiny_policy_dir), *SETS, "--run-dir", str(run))
    assert status == 130 and "(its last checkpoint is step 1)" in err, err
    assert not (run / "checkpoints" / "latest").exists() and (run / "checkpoints" / "step_000001").is_dir()
    state = json.loads((run / "run_state.json").read_text())
    assert (state["status"], state["step"]) == ("interrupted", 1)

    monkeypatch.setattr(checkpoint, "write_text_atomic", real_write)
    notes = []
    runner.run_training(None, run_dir=run, resume=True, log=notes.append)
    assert "latest was missing; continuing from step_000001" in "\n".join(map(str, notes))
    assert json.loads((run / "run_state.json").read_text())["status"] == "completed"


def test_ctrl_c_in_a_real_process_is_one_message_and_a_resumable_run(tiny_policy_dir, tmp_path):
    """The same across a process boundary: Ctrl-C (SIGINT) once the first checkpoint exists."""
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "tokenbalance.cli", "train", "--model", str(tiny_policy_dir), *SETS]
        + ["--set", "train.steps=1000", "--run-dir", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell's background job ignores SIGINT and its children inherit that: give the child a terminal's default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints" / "step_000001").is_dir() and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130 and "Traceback" not in err, err
    assert err.strip().endswith(f"Continue it with: tokenbalance train --resume {run}"), err
    state = json.loads((run / "run_state.json").read_text())
    assert state["status"] == "interrupted" and state["step"] >= 1
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no half checkpoint


def test_messages_name_only_flags_that_exist():
    """Every ``--flag`` an error message suggests is an option of some command (one message used to
    suggest a ``--pad-token`` that never existed)."""
    flags = set()

    def collect(parser):
        for action in parser._actions:
            flags.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    collect(sub)

    collect(build_parser())
    package = Path(runner.__file__).parents[1]
    mentioned = {}
    for path in package.rglob("*.py"):
        if "integrations" in path.parts:  # their own launchers (verl, TRL scripts) have their own flags
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                for text in (n.value for n in ast.walk(node.exc) if isinstance(n, ast.Constant)):
                    for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]+", str(text)):
                        mentioned.setdefault(flag, path.name)
    assert len(mentioned) > 10
    assert {flag: where for flag, where in mentioned.items() if flag not in flags} == {}


def command_flags(*names: str) -> set[str]:
    """The ``--flags`` of one (sub)command, e.g. ``command_flags("diagnose", "buckets")``."""
    parser = build_parser()
    for name in names:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return {s for action in parser._actions for s in action.option_strings if s.startswith("--")}


@pytest.mark.parametrize(
    "command", [("train",), ("eval",), ("sft", "--out", "OUT"), ("diagnose", "buckets")], ids=lambda c: c[0]
)
def test_each_commands_error_paths_name_only_its_own_flags(command, tmp_path, monkeypatch, capsys):
    """Run each command's error paths about your data and reward and check that every ``--flag`` the
    message suggests is one of that command's own (``eval --set data.reward=...`` used to suggest a
    ``--data`` that only ``train`` had)."""

    def no_model(*args, **kwargs):
        raise AssertionError("a policy was built or loaded: the error paths end before any model work")

    monkeypatch.setattr(runner, "load_run_policy", no_model)
    monkeypatch.setattr(runner, "policy_path", no_model)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text('{"prompt": "2 + 2 =", "answer": "4"}\n')
    (tmp_path / "rewards.py").write_text("def exact(response, answer):\n    return float(response.strip() == answer)\n")
    argv = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    cases = [
        ["--set", "data.reward=rewards.py:exact"],
        ["--reward", "rewards.py:exact"],
        ["--reward", "rewards.py:exact", "--data", "rows.jsonl"],
        ["--reward", "rewards.py:exact", "--data", "rows.jsonl", "--eval-data", "rows.jsonl"],
        ["--target-column", "answer"],
        ["--reward", "rewards.py:exact", "--data", "rows.jsonl", "--eval-data", "rows.jsonl", "--target-column", "x"],
    ]
    own = command_flags(*[c for c in command[:2] if not c.startswith("-") and c != "OUT"])
    suggested: dict[str, str] = {}
    for case in cases:
        if command[0] != "sft" or "--reward" in case or "--set" in case:
            status = main([*argv, *case, "--no-progress"])
            err = capsys.readouterr().err
            if status == 2:
                assert err.count("\n") == 1, err
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]+", err):
                    suggested.setdefault(flag, err)
    assert {flag for flag in suggested if flag not in own} == set(), suggested
    assert "--data" in suggested or "--target-column" in suggested  # the paths were run


def test_a_full_disk_while_writing_a_checkpoint_is_one_message_and_a_resumable_run(small_config, monkeypatch):
    """safetensors reports a full disk as its own error type: the run still ends with the one-line
    message and the --resume command, with no half-written checkpoint left behind."""
    from safetensors import SafetensorError

    from tokenbalance.trainer import checkpoint

    real_save = checkpoint.save_file

    def disk_full_at_step_2(tensors, path, *args, **kwargs):
        if "step_000002" in path:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", disk_full_at_step_2)
    run_dir = Path(small_config.output.run_dir)
    with pytest.raises(ValueError, match=r"cannot write \(cannot write the checkpoint \(.*No space left on device"):
        runner.run_training(small_config, log=lambda *_: None)
    state = json.loads((run_dir / "run_state.json").read_text())
    assert state["status"] == "failed" and state["step"] == 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000001"]


def test_a_resume_refuses_a_config_yaml_edited_after_the_checkpoint(small_config, capsys):
    """The user edits the method in config.yaml between sittings: the resume names the key instead
    of continuing the run as another method; a change a resume may make (more steps) still works."""
    run_dir = runner.run_training(small_config, log=lambda *_: None)
    config_file = run_dir / "config.yaml"
    original = config_file.read_text()
    assert "method: ar_lopti\n" in original
    config_file.write_text(original.replace("method: ar_lopti\n", "method: grpo\n"))
    assert main(["train", "--resume", str(run_dir), "--steps", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{config_file}: train.method is 'grpo', but the run was trained with 'ar_lopti'" in err
    config_file.write_text(original)
    assert main(["train", "--resume", str(run_dir), "--steps", "3", "--no-progress"]) == 0
    assert json.loads((run_dir / "run_state.json").read_text()) | {"peak_rss_mb": 0} == {
        "status": "completed",
        "step": 3,
        "peak_rss_mb": 0,
    }
