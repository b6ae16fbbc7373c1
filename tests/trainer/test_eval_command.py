"""``tokenbalance eval``: a run directory for ``--model`` (its latest checkpoint, as ``diagnose``
takes it), ``--count`` to limit the held-out puzzles, shown in ``--help``."""

import json
import re

import pytest

from tests.trainer.conftest import SMALL_RUN
from tokenbalance.cli import main
from tokenbalance.run.setup import prepare
from tokenbalance.trainer import runner

SETS = [arg for item in SMALL_RUN for arg in ("--set", item)]


def test_eval_takes_a_run_directory_as_its_latest_checkpoint(small_config, capsys):
    run_dir = runner.run_training(small_config, log=lambda *_: None)
    capsys.readouterr()
    assert main(["eval", "--model", str(run_dir), "--json", *SETS]) == 0
    from_run = json.loads(capsys.readouterr().out)
    checkpoint = run_dir / "checkpoints" / "step_000002" / "model"
    assert main(["eval", "--model", str(checkpoint), "--json", *SETS]) == 0
    assert json.loads(capsys.readouterr().out) == from_run
    final = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert from_run["eval/greedy/acc"] == final["eval/greedy/acc"]


def test_eval_refuses_a_run_directory_without_a_checkpoint(tmp_path, capsys):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert main(["eval", "--model", str(tmp_path / "run"), *SETS]) == 2
    assert capsys.readouterr().err == (
        f"tokenbalance eval: error: {tmp_path / 'run'}: a run directory without a complete checkpoint "
        "(no complete checkpoints/step_*)\n"
    )


def test_eval_count_limits_the_puzzles_and_help_says_how(tiny_policy_dir, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--count N held-out examples per difficulty of a generated task (data.eval_count" in help_text
    kept = [item for item in SMALL_RUN if item not in ("output.progress=false", "data.eval_count=4")]
    sets = [arg for item in kept for arg in ("--set", item)]
    assert main(["eval", "--model", str(tiny_policy_dir), "--count", "1", *sets]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if " eval response " in line]
    assert [re.sub(r"^\S+ \S+  ", "", line).split("  |")[0] for line in lines] == [
        "eval response 2/4",
        "eval response 4/4",
    ]  # 1 x 2 difficulties x 2 modes


@pytest.fixture
def chat_policy_dir(tiny_policy_dir, tmp_path):
    """The tiny test policy with a chat template: what tokenbalance takes for a real (chat) model."""
    import shutil

    from tokenbalance.models.loading import load_checked_tokenizer

    path = tmp_path / "chat-policy"
    shutil.copytree(tiny_policy_dir, path)
    tokenizer = load_checked_tokenizer(path)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("command", [("eval",), ("train",), ("diagnose", "buckets")], ids=lambda c: c[0])
def test_a_chat_model_with_the_tiny_models_template_is_refused_naming_the_settings(
    command, chat_policy_dir, tmp_path, monkeypatch, capsys
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(runner, "load_run_policy", no_model)
    monkeypatch.setattr("tokenbalance.models.load_policy", no_model)
    where = ["--run-dir", str(tmp_path / "run")] if command == ("train",) else []
    assert main([*command, "--model", str(chat_policy_dir), *where, *SETS]) == 2
    assert capsys.readouterr().err == (
        f"tokenbalance {command[0]}: error: model.path={chat_policy_dir}: a chat model (its tokenizer has a chat "
        "template) with data.template='compact', the embedded tiny model's prompt, scores every answer as a format "
        "error; pass --set data.template=qwen-instruct --set data.max_prompt_tokens=320 --set "
        "rollout.max_new_tokens=400 (the settings of docs/results.md's SmolLM2 runs), or another data.template\n"
    )


def test_the_named_settings_pass_the_check(chat_policy_dir):
    from tokenbalance.config import REAL_MODEL_SETTINGS, RunConfig, apply_overrides

    named = [f"{key}={value}" for key, value in REAL_MODEL_SETTINGS]
    config = apply_overrides(
        RunConfig(), [*SMALL_RUN, f"model.path={chat_policy_dir}", *named, "data.max_prompt_tokens=4000"]
    )
    prepare(config)  # the tiny tokenizer spells the qwen-instruct prompt in more tokens than 320
    assert (config.data.template, config.rollout.max_new_tokens) == ("qwen-instruct", 400)
