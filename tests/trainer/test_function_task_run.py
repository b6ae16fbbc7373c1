"""``tokenbalance train --data FILE --eval-data FILE --reward MODULE:FUNCTION``: a user's GSM8K-style
file and reward module (written here, put on sys.path) train the tiny policy for two steps and
resume; every bad input is one line before any model work; a bad reward at scoring time names the
row and the value."""

import json
import math

import pytest
import yaml

from tests.tasks.reward_modules import EVAL_ROWS, GSM8K_MODULE, TRAIN_ROWS, install_module, write_jsonl
from tests.trainer.conftest import SMALL_RUN
from tokenbalance.cli import main
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models.loading import load_checked_tokenizer
from tokenbalance.run.examples import rl_examples, task_for
from tokenbalance.tasks.function import CHECKED_ROWS
from tokenbalance.trainer import runner
from tokenbalance.trainer.runner import run_training

RUN = [o for o in SMALL_RUN if not o.startswith("data.")] + ["train.method=grpo"]
PROMPTS_PER_STEP, GROUP_SIZE = 2, 4  # SMALL_RUN's rollout


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """The user's reward module on sys.path and their train / held-out files; returns the module."""
    install_module(tmp_path, monkeypatch)
    write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    write_jsonl(tmp_path / "test.jsonl", EVAL_ROWS)
    return __import__(GSM8K_MODULE)


def train_args(tmp_path, policy, *extra):
    sets = [arg for override in RUN for arg in ("--set", override)]
    return ["train", "--model", str(policy), "--run-dir", str(tmp_path / "run"), *sets, *extra]


def yours(tmp_path, reward="gsm8k_logged", data="train.jsonl"):
    return [
        "--data",
        str(tmp_path / data),
        "--eval-data",
        str(tmp_path / "test.jsonl"),
        "--reward",
        f"{GSM8K_MODULE}:{reward}",
        "--prompt-column",
        "question",
    ]


def mean(values):
    return sum(values) / len(values)


def test_train_two_steps_on_your_file_and_reward_then_resume(user_files, tmp_path, tiny_policy_dir):
    assert main(train_args(tmp_path, tiny_policy_dir, *yours(tmp_path))) == 0
    run_dir = tmp_path / "run"
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in evals] == [0, 2]

    # every call of the function, in order: the check before work (the empty response on the first
    # rows of each file), the held-out set before training (greedy, then one sample), G responses
    # to each prompt of steps 1 and 2, the held-out set after training
    calls = list(user_files.CALLS)
    checks = min(CHECKED_ROWS, len(TRAIN_ROWS)) + min(CHECKED_ROWS, len(EVAL_ROWS))
    per_eval, per_step = 2 * len(EVAL_ROWS), PROMPTS_PER_STEP * GROUP_SIZE
    assert len(calls) == checks + 2 * per_eval + 2 * per_step
    assert all(response == "" for response, _, _ in calls[:checks])
    phases = {"eval 0": calls[checks : checks + per_eval]}
    start = checks + per_eval
    for step in (1, 2):
        phases[f"step {step}"] = calls[start : start + per_step]
        start += per_step
    phases["eval 2"] = calls[start:]
    assert {answer for _, answer, _ in phases["eval 0"]} == {row["answer"] for row in EVAL_ROWS}
    assert {answer for _, answer, _ in phases["step 1"]} <= {row["answer"] for row in TRAIN_ROWS}

    # the logged values are the function's: rewards (0/1) and response lengths are integers, so the
    # means the trainer logs (float64 over float32 copies of them) equal these exactly
    for record in train:
        rewards = [reward for _, _, reward in phases[f"step {record['step']}"]]
        chars = [len(response) for response, _, _ in phases[f"step {record['step']}"]]
        assert record["reward/mean"] == mean(rewards) and record["reward/acc"] == mean(rewards)
        assert record["reward/correct"] == mean(rewards)  # the function's flag agrees with max_reward=1
        assert record["reward/chars"] == mean(chars) and record["reward/chars"] > 0
        assert math.isfinite(record["loss/total"])
    for record in evals:
        phase = phases[f"eval {record['step']}"]
        greedy, sample = phase[: len(EVAL_ROWS)], phase[len(EVAL_ROWS) :]
        assert record["eval/greedy/reward"] == mean([reward for _, _, reward in greedy])
        assert record["eval/sample/reward"] == mean([reward for _, _, reward in sample])
        assert record["eval/greedy/acc"] == record["eval/greedy/acc_0"] == record["eval/greedy/reward"]
        assert not [key for key in record if key.endswith("format_error")]  # no format_ok in the scores: n/a

    # the end-of-run table: accuracy and the mean reward, before and after
    table = runner.before_after_table(run_dir).splitlines()
    assert table[0].split() == ["held-out", "accuracy,", "reward", "step", "0", "step", "2", "change"]
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in table[1:]}
    assert set(rows) == {f"{mode}/{key}" for mode in ("greedy", "sample") for key in ("acc", "acc_0", "reward")}
    for mode in ("greedy", "sample"):
        before, after = evals[0][f"eval/{mode}/reward"], evals[1][f"eval/{mode}/reward"]
        assert rows[f"{mode}/reward"] == pytest.approx([before, after, after - before], abs=5e-4)

    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]
    assert saved["task"] == "function" and saved["reward"] == f"{GSM8K_MODULE}:gsm8k_logged"
    assert (saved["template"], saved["prompt_column"], saved["max_reward"]) == ("auto", "question", 1.0)
    assert saved["train_file"] == str(tmp_path / "train.jsonl") and saved["eval_file"] == str(tmp_path / "test.jsonl")

    # a resume reads the reward from config.yaml alone
    user_files.CALLS.clear()
    assert main(["train", "--resume", str(run_dir), "--steps", "3"]) == 0
    resumed = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in resumed] == [1, 2, 3]
    step3 = user_files.CALLS[checks : checks + per_step]
    assert resumed[-1]["reward/mean"] == mean([reward for _, _, reward in step3])
    assert main(["train", "--resume", str(run_dir), "--reward", f"{GSM8K_MODULE}:gsm8k"]) == 2


def test_the_end_of_run_table_shows_the_mean_reward_beside_the_accuracies(tmp_path):
    lines = [
        {"step": 0, "kind": "eval", "eval/greedy/acc": 0.0, "eval/greedy/reward": 0.25, "eval/greedy/response_len": 9},
        {"step": 1, "kind": "train", "reward/mean": 0.3},
        {
            "step": 40,
            "kind": "eval",
            "eval/greedy/acc": 0.0,
            "eval/greedy/reward": 0.375,
            "eval/greedy/response_len": 7,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert runner.before_after_table(tmp_path).splitlines() == [
        "held-out accuracy, reward       step 0   step 40    change",
        "greedy/acc                       0.000     0.000    +0.000",
        "greedy/reward                    0.250     0.375    +0.125",
    ]


@pytest.mark.parametrize(
    "case, message",
    [
        ("no file", "data.train_file='{tmp}/nowhere.jsonl': no such file"),
        (
            "no prompt column",
            "{tmp}/train.jsonl: row 0 (line 1): column 'prompt': missing (the prompt: data.prompt_column); the row's columns: question, answer",
        ),
        (
            "no answer column",
            "{tmp}/questions.jsonl: row 0 (line 1): column 'answer': missing; gsm8k_reward:gsm8k takes it as a parameter",
        ),
        (
            "no module",
            "data.reward='no_such_rewards:gsm8k': cannot import module 'no_such_rewards' (No module named 'no_such_rewards')",
        ),
        (
            "no function",
            "data.reward='gsm8k_reward:gsm8': module 'gsm8k_reward' has no attribute 'gsm8'; did you mean 'gsm8k'?",
        ),
        ("not callable", "data.reward='gsm8k_reward:TOLERANCE': gsm8k_reward.TOLERANCE is 1e-06, not a function"),
        (
            "nan",
            "{tmp}/train.jsonl: row 0 (line 1): gsm8k_reward:nan_reward returned nan for the response ''; the reward must be a finite number",
        ),
        (
            "none",
            "{tmp}/train.jsonl: row 0 (line 1): gsm8k_reward:no_reward returned None for the response ''; a reward function returns",
        ),
        ("string", "{tmp}/train.jsonl: row 0 (line 1): gsm8k_reward:text_reward returned str '0' for the response ''"),
        (
            "raises",
            "{tmp}/train.jsonl: row 0 (line 1): gsm8k_reward:raising_reward raised KeyError: 'unit' for the empty response",
        ),
        (
            "chat without a template",
            "{tmp}/chat.jsonl: row 0 (line 1): column 'question': chat messages need a chat template, and the policy's tokenizer",
        ),
        ("no model", "data.reward: give the policy to train with --model PATH"),
        (
            "no held-out file",
            "data.eval_file: data.reward needs your held-out prompts in a parquet/JSONL file (--eval-data FILE)",
        ),
    ],
)
def test_bad_input_is_one_line_before_any_model_work(
    user_files, tmp_path, tiny_policy_dir, monkeypatch, capsys, case, message
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(runner, "load_run_policy", no_model)
    monkeypatch.setattr(runner, "policy_path", no_model)
    write_jsonl(tmp_path / "questions.jsonl", [{"question": row["question"]} for row in TRAIN_ROWS])
    write_jsonl(tmp_path / "chat.jsonl", [{"question": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}])
    args = train_args(tmp_path, tiny_policy_dir, *yours(tmp_path, "gsm8k"))
    changes = {
        "no file": ["--data", str(tmp_path / "nowhere.jsonl")],
        "no prompt column": ["--prompt-column", "prompt"],
        "no answer column": ["--data", str(tmp_path / "questions.jsonl")],
        "no module": ["--reward", "no_such_rewards:gsm8k"],
        "no function": ["--reward", f"{GSM8K_MODULE}:gsm8"],
        "not callable": ["--reward", f"{GSM8K_MODULE}:TOLERANCE"],
        "nan": ["--reward", f"{GSM8K_MODULE}:nan_reward"],
        "none": ["--reward", f"{GSM8K_MODULE}:no_reward"],
        "string": ["--reward", f"{GSM8K_MODULE}:text_reward"],
        "raises": ["--reward", f"{GSM8K_MODULE}:raising_reward"],
        "chat without a template": ["--data", str(tmp_path / "chat.jsonl")],
        "no held-out file": [],
    }
    dropped = {"no model": "--model", "no held-out file": "--eval-data"}.get(case)
    if dropped is not None:  # the flag and its value
        args = args[: args.index(dropped)] + args[args.index(dropped) + 2 :]
    assert main(args + changes.get(case, [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(tmp=tmp_path) in err, err
    assert not (tmp_path / "run").exists()


def test_a_bad_reward_at_scoring_time_names_the_row_and_the_value(user_files, tmp_path, tiny_policy_dir):
    config = apply_overrides(
        RunConfig(),
        RUN
        + [
            f"model.path={tiny_policy_dir}",
            f"output.run_dir={tmp_path / 'run'}",
            f"data.train_file={tmp_path / 'train.jsonl'}",
            f"data.eval_file={tmp_path / 'test.jsonl'}",
            f"data.reward={GSM8K_MODULE}:nan_once_answered",  # 0 for the empty response, NaN for any other
            "data.prompt_column=question",
        ],
    )
    message = r"\.jsonl: row \d+ \(line \d+\): gsm8k_reward:nan_once_answered returned nan for the response .+; the reward must be a finite number"
    with pytest.raises(ValueError, match=message):
        run_training(config, log=lambda *_: None)


def test_chat_prompts_use_the_policy_chat_template(user_files, tmp_path, tiny_policy_dir):
    tokenizer = load_checked_tokenizer(tiny_policy_dir)
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    write_jsonl(tmp_path / "chat.jsonl", [{"prompt": chat, "answer": "4"}, {"prompt": "3 + 3?", "answer": "6"}])
    overrides = [f"data.train_file={tmp_path / 'chat.jsonl'}", f"data.eval_file={tmp_path / 'chat.jsonl'}"]
    config = apply_overrides(RunConfig(), [*overrides, f"data.reward={GSM8K_MODULE}:gsm8k"]).data
    task = task_for(config, tokenizer)
    assert [e.prompt for e in rl_examples(config, task)] == [
        "<|system|>Be brief.\n<|user|>2 + 2?\n<|assistant|>",
        "3 + 3?",
    ]
    assert task.render_prompt(rl_examples(config, task)[1], "chat") == "<|user|>3 + 3?\n<|assistant|>"
