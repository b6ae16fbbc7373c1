"""The one setup path (:func:`tokenbalance.run.setup.prepare`): what it builds, that a run, a probe
batch and ``eval`` build the task, the tokenizer and the examples once, that a config with
``data.reward`` registers nothing, and the one-line errors it gives before any model work."""

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from tests.tasks.reward_modules import EVAL_ROWS, GSM8K_MODULE, TRAIN_ROWS, install_module, write_jsonl
from tests.trainer.conftest import SMALL_RUN
from tokenbalance.analysis.probe import probe_batch
from tokenbalance.cli import main
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import loading
from tokenbalance.run.examples import eval_examples, rl_examples, sft_pairs, task_for
from tokenbalance.run.setup import embedded_key, prepare
from tokenbalance.tasks import FunctionTask, get_task
from tokenbalance.tasks.registry import TASK_FACTORIES
from tokenbalance.trainer import runner


@pytest.fixture
def built(monkeypatch) -> Counter:
    """Counts of what gets built: K&K tasks, their example generations, tokenizers loaded."""
    counts: Counter = Counter()
    make_kk, load_tokenizer = TASK_FACTORIES["kk"], loading.load_tokenizer

    def kk():
        counts["task"] += 1
        task = make_kk()
        generate = task.examples

        def examples(*args, **kwargs):
            counts["examples"] += 1
            return generate(*args, **kwargs)

        task.examples = examples
        return task

    def tokenizer(directory):
        counts["tokenizer"] += 1
        return load_tokenizer(directory)

    monkeypatch.setitem(TASK_FACTORIES, "kk", kk)
    monkeypatch.setattr(loading, "load_tokenizer", tokenizer)
    return counts


def test_prepare_builds_the_examples_and_their_prompt_ids(small_config, built):
    setup = prepare(small_config)
    # SMALL_RUN: RL on 2 people (all 298 puzzles), 4 held-out puzzles each of 2 and 3 people
    assert built == {"task": 1, "examples": 3, "tokenizer": 1}
    assert [len(setup.train_examples), len(setup.eval_examples)] == [298, 8]
    assert list(setup.train_examples) == rl_examples(small_config.data)
    assert list(setup.eval_examples) == eval_examples(small_config.data)
    tokenizer = setup.tokenizer
    for examples, ids in ((setup.train_examples, setup.train_prompt_ids), (setup.eval_examples, setup.eval_prompt_ids)):
        assert list(ids) == tokenizer([e.prompt for e in examples], add_special_tokens=False)["input_ids"]
    assert setup.sft_pairs is None  # model.path: nothing to build
    assert setup.with_tokenizer(tokenizer) is setup  # the policy's tokenizer is the prepared one: nothing again
    other = loading.load_checked_tokenizer(Path(small_config.model.path))
    again = setup.with_tokenizer(other)
    assert again.tokenizer is other and again.train_prompt_ids == setup.train_prompt_ids
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.task = None  # type: ignore[misc]


def test_a_run_builds_the_task_the_tokenizer_and_the_examples_once(small_config, built):
    small_config.train.steps = 1
    runner.run_training(small_config, log=lambda *_: None)
    assert built == {"task": 1, "examples": 3, "tokenizer": 1}


def test_the_probe_batch_and_eval_build_them_once(small_config, built, capsys):
    probe = probe_batch(small_config, prompts=2, log=lambda *_: None)
    assert built == {"task": 1, "examples": 3, "tokenizer": 1} and probe.task.name == "kk"
    built.clear()
    sets = [arg for item in SMALL_RUN for arg in ("--set", item)]
    assert main(["eval", "--model", small_config.model.path, "--json", "--count", "2", *sets]) == 0
    assert built == {"task": 1, "examples": 3, "tokenizer": 1}
    assert '"eval/greedy/acc_2"' in capsys.readouterr().out


def test_the_embedded_policy_s_sft_pairs_only_when_it_is_built(tmp_path):
    config = apply_overrides(
        RunConfig(), [*SMALL_RUN, "data.train_difficulties=[3]", "sft.train_count=3", f"model.cache_dir={tmp_path}"]
    )
    setup = prepare(config)
    assert setup.tokenizer is None and setup.train_prompt_ids == ()  # the tokenizer comes with the policy
    assert setup.sft_pairs == tuple(sft_pairs(config.data, config.sft)) and len(setup.sft_pairs) == 3
    (tmp_path / embedded_key(config)).mkdir()
    (tmp_path / embedded_key(config) / "tokenbalance_sft.json").write_text("{}")
    assert prepare(config).sft_pairs is None  # built already: no SFT


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    install_module(tmp_path, monkeypatch)
    write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    write_jsonl(tmp_path / "test.jsonl", EVAL_ROWS)
    return [
        f"data.train_file={tmp_path / 'train.jsonl'}",
        f"data.eval_file={tmp_path / 'test.jsonl'}",
        f"data.reward={GSM8K_MODULE}:gsm8k",
        "data.prompt_column=question",
    ]


def test_a_config_with_data_reward_names_its_task_and_registers_none(user_files, tiny_policy_dir):
    registered = dict(TASK_FACTORIES)
    config = apply_overrides(RunConfig(), [*user_files, f"model.path={tiny_policy_dir}"])
    assert config.data.task == "function" and TASK_FACTORIES == registered
    with pytest.raises(ValueError, match="unknown task 'function'; valid tasks: kk, arith"):
        get_task("function")
    task = task_for(config.data)
    assert isinstance(task, FunctionTask) and task.reward.name == f"{GSM8K_MODULE}:gsm8k" and task.render_chat is None
    setup = prepare(config)
    assert isinstance(setup.task, FunctionTask) and setup.task.render_chat is not None  # the policy's template
    assert [e.prompt for e in setup.train_examples] == [row["question"] for row in TRAIN_ROWS]
    assert TASK_FACTORIES == registered
    with pytest.raises(ValueError, match=r"^data.task: unknown value 'chess'; valid: 'kk', 'arith'$"):
        apply_overrides(RunConfig(), ["data.task=chess"])  # what the choices list: the registered tasks


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.template=nope"], r"^data.template: unknown value 'nope'; valid: "),
        (["data.train_file=missing.jsonl"], r"^data.train_file='missing.jsonl': no such file$"),
        (["train.device=cuda:99"], r"^train.device='cuda:99': "),
        (["output.wandb_project=x"], r"^output.wandb_project='x': applies only with output.wandb=true"),
        (
            ["data.max_prompt_tokens=8"],
            r"^prompt 0 \(data_source 'kk_logic', index \d+\) has \d+ tokens, more than data.max_prompt_tokens=8; ",
        ),
        (["data.template=nope", "data.max_prompt_tokens=8"], r"^data.template: unknown value 'nope'"),  # the first
    ],
)
def test_prepare_names_the_first_problem_in_one_line(small_config, monkeypatch, overrides, message):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the checks")

    monkeypatch.setattr(loading, "load_policy", no_model)
    with pytest.raises(ValueError, match=message):
        prepare(apply_overrides(small_config, overrides))


def test_another_tokenizer_checks_the_prompts_again(small_config):
    """The embedded policy's tokenizer comes after prepare: its prompts are checked when it does."""
    setup = dataclasses.replace(prepare(small_config), max_prompt_tokens=8)
    with pytest.raises(ValueError, match=r"^prompt 0 .* more than data.max_prompt_tokens=8"):
        setup.with_tokenizer(loading.load_checked_tokenizer(Path(small_config.model.path)))
