"""Your data and your reward function as a task (tokenbalance.tasks.function): the loader, the
contract of what the function returns, reading rows (text and chat prompts), the config options,
and the TRL and verl rewards calling the same function through the same checks."""

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.tasks.reward_modules import (
    EVAL_ROWS,
    GSM8K_MODULE,
    GSM8K_SOURCE,
    TRAIN_ROWS,
    install_module,
    write_jsonl,
)
from tokenbalance.config import DataConfig, RunConfig, apply_overrides, load_config, save_config
from tokenbalance.integrations.trl.rewards import TaskReward
from tokenbalance.integrations.verl.reward import compute_score
from tokenbalance.run.examples import task_for
from tokenbalance.tasks import FunctionTask, RewardFunction, Task, load_reward_function
from tokenbalance.tasks.base import TaskExample
from tokenbalance.tasks.function import RewardOutputError
from tokenbalance.tasks.registry import TASK_FACTORIES


@pytest.fixture
def gsm8k(tmp_path, monkeypatch):
    """The user's module on sys.path; returns the module."""
    install_module(tmp_path, monkeypatch)
    return __import__(GSM8K_MODULE)


# ---- loading the function -------------------------------------------------------------------------


def test_module_file_and_callable_give_the_same_function(gsm8k, tmp_path):
    from_module = load_reward_function(f"{GSM8K_MODULE}:gsm8k")
    from_file = load_reward_function(f"{tmp_path / GSM8K_MODULE}.py:gsm8k")
    assert from_module is gsm8k.gsm8k and load_reward_function(gsm8k.gsm8k) is gsm8k.gsm8k
    assert from_file is not from_module  # the file is loaded as a module of its own
    for function in (from_module, from_file):
        assert [function("so 7", "7"), function("it is 8", "7"), function("none", "7")] == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("gsm8k_reward", "data.reward='gsm8k_reward': expected MODULE:FUNCTION (e.g. mypkg.rewards:gsm8k)"),
        ("gsm8k_reward:", "expected MODULE:FUNCTION"),
        ("no_such_rewards:gsm8k", "data.reward='no_such_rewards:gsm8k': cannot import module 'no_such_rewards'"),
        (
            "gsm8k_reward:gsm8",
            "data.reward='gsm8k_reward:gsm8': module 'gsm8k_reward' has no attribute 'gsm8'; did you mean 'gsm8k'?",
        ),
        (
            "gsm8k_reward:TOLERANCE",
            "data.reward='gsm8k_reward:TOLERANCE': gsm8k_reward.TOLERANCE is 1e-06, not a function",
        ),
        ("gsm8k_reward:re.nothing", "'gsm8k_reward.re' has no attribute 'nothing'"),
        ("missing_file.py:gsm8k", "missing_file.py: no such file"),
    ],
)
def test_loader_names_the_module_and_the_attribute(gsm8k, spec, message):
    with pytest.raises(ValueError) as err:
        load_reward_function(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
    install_module(tmp_path, monkeypatch, "broken_rewards", "import no_such_dependency\n")
    with pytest.raises(ValueError, match="^data.reward='broken_rewards:f': importing module 'broken_rewards' raised "):
        load_reward_function("broken_rewards:f")
    install_module(tmp_path, monkeypatch, "dividing_rewards", "x = 1 / 0\n")
    with pytest.raises(ValueError, match="raised ZeroDivisionError: division by zero$"):
        load_reward_function("dividing_rewards:f")


def test_a_function_without_a_positional_parameter_is_refused():
    def keywords_only(*, response, answer):
        return 0.0

    with pytest.raises(ValueError, match="takes no positional parameter; it is called as fn\\(response, \\*\\*row\\)"):
        RewardFunction(keywords_only)


# ---- what the function is given and what it may return ------------------------------------------------


def test_columns_are_passed_by_the_function_signature():
    def named(completion, answer, unit=""):
        return 0.0

    def any_column(response, **row):
        return 0.0

    row = {"question": "q", "answer": "7", "completion": "not the response", "unit": "kg"}
    assert RewardFunction(named).columns_for(row) == {"answer": "7", "unit": "kg"}
    assert RewardFunction(named).required_columns == ("answer",)
    assert RewardFunction(named).missing_columns({"question": "q"}) == ["answer"]
    assert RewardFunction(any_column).columns_for(row) == row  # no column named like its response parameter
    assert RewardFunction(any_column).required_columns == ()


@pytest.mark.parametrize(
    "value, reward, metrics",
    [
        (1, 1.0, {}),
        (0.25, 0.25, {}),
        (True, 1.0, {}),
        (np.float32(0.5), 0.5, {}),
        (torch.tensor(-0.5), -0.5, {}),
        ((1.0, True), 1.0, {"correct": 1.0}),
        ((0.0, np.bool_(False)), 0.0, {"correct": 0.0}),
        ({"reward": 1.0, "correct": True, "chars": 12}, 1.0, {"chars": 12.0, "correct": 1.0}),
        ({"score": 0.1, "format_ok": True}, 0.1, {"format_ok": 1.0}),
    ],
)
def test_accepted_returns(value, reward, metrics):
    result = RewardFunction(lambda response: value).score("x", {}, "file: row 0")
    assert result.reward == reward and dict(result.metrics) == metrics


@pytest.mark.parametrize(
    "value, problem",
    [
        (None, "returned None for the response 'x'; a reward function returns a finite number, (number, correct)"),
        ("1.0", "returned str '1.0' for the response 'x'; a reward function returns a finite number"),
        (math.nan, "returned nan for the response 'x'; the reward must be a finite number"),
        (-math.inf, "returned -inf for the response 'x'; the reward must be a finite number"),
        ((1.0,), "returned tuple (1.0,) for the response 'x'; a tuple is (reward, correct)"),
        ((1.0, "yes"), "correct must be true or false, got str 'yes'"),
        ({"correct": True}, "a dict needs one of 'reward' or 'score'"),
        ({"reward": 1.0, "score": 1.0}, "a dict needs one of 'reward' or 'score'"),
        ({"reward": 1.0, "note": "fine"}, "its 'note' is not a number (a dict's other keys are logged as metrics)"),
        ((0.5, True), "correct=True, but a response is correct when its reward equals data.max_reward=1; set"),
        ((1.0, False), "correct=False, but a response is correct when its reward equals data.max_reward=1"),
    ],
)
def test_refused_returns_name_the_row_and_the_value(value, problem):
    with pytest.raises(RewardOutputError) as err:
        RewardFunction(lambda response: value, max_reward=1.0).score("x", {}, "train.jsonl: row 3")
    message = str(err.value)
    assert message.startswith("train.jsonl: row 3: ") and problem in message and "\n" not in message


def test_max_reward_sets_what_counts_as_correct():
    three = RewardFunction(lambda response: (3.0, True), max_reward=3)
    assert three.score("x", {}, "row").metrics == {"correct": 1.0}
    with pytest.raises(ValueError, match="data.max_reward: must be a finite number, got nan"):
        RewardFunction(lambda response: 0.0, max_reward=math.nan)


# ---- reading rows --------------------------------------------------------------------------------


def test_text_rows_become_examples_with_the_row_as_ground_truth(gsm8k, tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS[:2])
    task = FunctionTask(f"{GSM8K_MODULE}:gsm8k", prompt_column="question")
    assert isinstance(task, Task) and task.max_reward == 1.0 and task.special_tokens == ()
    first, second = task.read_examples(str(path))
    assert first.prompt == TRAIN_ROWS[0]["question"] and first.ground_truth == TRAIN_ROWS[0]
    assert (first.data_source, first.index, second.index) == ("function", 0, 1)
    assert first.extra["where"] == f"{path}: row 0 (line 1)"
    assert task.score("3 + 4 = 7", first).reward == 1.0 and task.score("30", first).reward == 0.0
    assert task.score_without_prompt("30", TRAIN_ROWS[1], "auto").reward == 1.0


def test_chat_prompts_go_through_the_renderer(gsm8k, tmp_path):
    system = {"role": "system", "content": "Answer with a number."}
    messages = [[system, {"role": "user", "content": "What is 6 x 7?"}], [{"role": "user", "content": "2 + 2?"}]]
    chat_file = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": m, "answer": a} for m, a in zip(messages, ["42", "4"])]), chat_file)
    text_file = write_jsonl(tmp_path / "text.jsonl", [{"prompt": "2 + 2?", "answer": "4"}])

    def render(chat):
        return "".join(f"<{m['role']}>{m['content']}" for m in chat) + "<assistant>"

    task = FunctionTask(f"{GSM8K_MODULE}:gsm8k", render_chat=render)
    from_messages = task.read_examples(str(chat_file))  # auto: messages through the chat template
    assert [e.prompt for e in from_messages] == [
        "<system>Answer with a number.<user>What is 6 x 7?<assistant>",
        "<user>2 + 2?<assistant>",
    ]
    assert from_messages[0].question == "What is 6 x 7?" and from_messages[0].ground_truth["answer"] == "42"
    assert task.read_examples(str(chat_file), template="chat") == from_messages
    text = task.read_examples(str(text_file))  # auto: text as is
    assert text[0].prompt == "2 + 2?"
    assert task.read_examples(str(text_file), template="chat")[0].prompt == "<user>2 + 2?<assistant>"
    assert task.render_prompt(text[0], "chat") == "<user>2 + 2?<assistant>"
    with pytest.raises(
        ValueError, match=r"chat.parquet: row 0: column 'prompt': chat messages, but data.template=text"
    ):
        task.read_examples(str(chat_file), template="text")
    with pytest.raises(ValueError, match="column 'prompt': chat messages are rendered with the policy's chat template"):
        FunctionTask(f"{GSM8K_MODULE}:gsm8k").read_examples(str(chat_file))


@pytest.mark.parametrize(
    "row, message",
    [
        (
            {"question": "q", "answer": "1"},
            "row 0 (line 1): column 'prompt': missing (the prompt: data.prompt_column); the row's columns: question, answer",
        ),
        ({"prompt": "q"}, "row 0 (line 1): column 'answer': missing; gsm8k_reward:gsm8k takes it as a parameter"),
        ({"prompt": "  ", "answer": "1"}, "row 0 (line 1): column 'prompt': empty prompt"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, "row 0 (line 1): column 'prompt': expected text or chat"),
        ({"prompt": 7, "answer": "1"}, "row 0 (line 1): column 'prompt': expected text or chat messages"),
    ],
)
def test_bad_rows_name_the_file_row_and_column(gsm8k, tmp_path, row, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [row])
    with pytest.raises(ValueError) as err:
        FunctionTask(f"{GSM8K_MODULE}:gsm8k").read_examples(str(path))
    assert str(err.value).startswith(f"{path}: {message}")


def test_the_check_tries_the_first_rows_with_an_empty_response(gsm8k, tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    logged = FunctionTask(f"{GSM8K_MODULE}:gsm8k_logged", prompt_column="question")
    logged.check_reward(logged.read_examples(str(path)))
    assert gsm8k.CALLS == [("", row["answer"], 0.0) for row in TRAIN_ROWS[:4]]
    raising = FunctionTask(f"{GSM8K_MODULE}:raising_reward", prompt_column="question")
    with pytest.raises(
        ValueError,
        match=r"train.jsonl: row 0 \(line 1\): gsm8k_reward:raising_reward raised KeyError: 'unit' for the empty response",
    ):
        raising.check_reward(raising.read_examples(str(path)))


def test_a_reward_that_raises_while_training_names_its_file_function_and_row(gsm8k, tmp_path):
    """Scoring a rollout (after the check's empty responses passed): what the function raises is one
    line naming the row, the reward as ``FILE.py:FUNCTION`` and the error, passed on as it is by
    the trainer's scoring (before: "the 'function' reward raised ..." on "function:0")."""
    from tokenbalance.trainer.scoring import score_responses

    rewards = tmp_path / "my_reward.py"
    rewards.write_text("def picky(response, answer):\n    return float(response.split()[0] == answer)\n")
    path = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS[:2])
    task = FunctionTask(f"{rewards}:picky", prompt_column="question")
    examples = task.read_examples(str(path))
    assert task.score("7 apples", examples[0]).reward == 1.0
    with pytest.raises(ValueError) as err:
        score_responses(task, ["7", "   "], examples)
    assert str(err.value) == (
        f"{path}: row 1 (line 2): data.reward={rewards}:picky raised IndexError: list index out of range for the "
        "response '   '; fix the reward function so that it returns a reward for any text"
    )


def test_a_json_array_file_is_read_as_rows(gsm8k, tmp_path):
    """A ``.json`` file holding one array of rows (``json.dump(rows, f)``) is read as those rows;
    a broken array is named as an array, not as an invalid first JSON line."""
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(TRAIN_ROWS[:3], indent=2))
    task = FunctionTask(f"{GSM8K_MODULE}:gsm8k", prompt_column="question")
    examples = task.read_examples(str(array))
    assert [e.ground_truth for e in examples] == TRAIN_ROWS[:3]
    assert examples[2].extra["where"] == f"{array}: row 2"
    array.write_text(json.dumps(TRAIN_ROWS[:3], indent=2)[:-3])
    with pytest.raises(ValueError, match=r"rows.json: a JSON array of rows \(it starts with '\['\), but invalid JSON"):
        task.read_examples(str(array))
    array.write_text('[{"question": "q", "answer": "1"}, 3]')
    with pytest.raises(ValueError, match=r"rows.json: row 1: expected an object with named columns, got int"):
        task.read_examples(str(array))


# ---- the config options --------------------------------------------------------------------------


def test_config_options_make_the_function_task(gsm8k, tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    held_out = write_jsonl(tmp_path / "test.jsonl", EVAL_ROWS)
    files = [f"data.train_file={train}", f"data.eval_file={held_out}", "data.prompt_column=question"]
    registered = dict(TASK_FACTORIES)
    config = apply_overrides(RunConfig(), [f"data.reward={GSM8K_MODULE}:gsm8k", *files])
    assert (config.data.task, config.data.template, config.data.max_reward) == ("function", "auto", 1.0)
    task = task_for(config.data)  # the config names the task; the setup builds it
    assert isinstance(task, FunctionTask) and task.prompt_column == "question"
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml").data == config.data
    assert task_for(load_config(tmp_path / "config.yaml").data).reward.name == f"{GSM8K_MODULE}:gsm8k"
    assert TASK_FACTORIES == registered  # no config registers a task

    relative = DataConfig(reward="rewards.py:gsm8k", train_file="a.jsonl", eval_file="b.jsonl")
    assert relative.reward == f"{Path.cwd() / 'rewards.py'}:gsm8k"  # a saved config names the same file


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.task=function"], "data.task='function' is your reward function's task: set data.reward"),
        (["data.reward=r:f", "data.task=arith"], "data.task='arith': data.reward replaces the task's reward"),
        (
            ["data.reward=r:f", "data.eval_file=e.jsonl"],
            "data.train_file: data.reward needs your prompts in a parquet/JSONL file \\(--data FILE\\)",
        ),
        (["data.reward=r:f", "data.train_file=t.jsonl"], "data.eval_file: data.reward needs your held-out prompts"),
        (
            ["data.reward=r:f", "data.train_file=t.jsonl", "data.eval_file=e.jsonl", "data.template=plain"],
            "data.template: unknown value 'plain'; valid: 'auto', 'text', 'chat'",
        ),
        (
            ["data.reward=r", "data.train_file=t.jsonl", "data.eval_file=e.jsonl"],
            "data.reward='r': expected MODULE:FUNCTION",
        ),
    ],
)
def test_config_errors_at_load(overrides, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(RunConfig(), overrides)


def test_the_policys_renderer_is_given_without_loading_the_function_again(gsm8k):
    task = FunctionTask(f"{GSM8K_MODULE}:gsm8k")
    rendering = task.with_render_chat(lambda chat: "|".join(m["content"] for m in chat))
    assert rendering.reward is task.reward and task.render_chat is None
    chat = [{"role": "user", "content": "2 + 2?"}, {"role": "user", "content": "again"}]
    assert (
        rendering.render_prompt(TaskExample("", "", {}, "function", extra={"prompt": chat}), "auto") == "2 + 2?|again"
    )
    with pytest.raises(ValueError, match="chat messages are rendered with the policy's chat template"):
        task.render_prompt(TaskExample("", "", {}, "function", extra={"prompt": chat}), "auto")


# ---- the same function as the TRL and the verl reward ----------------------------------------------------


def test_trl_and_verl_call_the_same_function(gsm8k):
    completions = ["The answer is 7.", "30 eggs", "I think 13"]
    answers = [row["answer"] for row in TRAIN_ROWS[:3]]
    expected = [gsm8k.gsm8k(c, a) for c, a in zip(completions, answers)]
    assert expected == [1.0, 1.0, 0.0]

    trl_reward = TaskReward(None, reward=f"{GSM8K_MODULE}:gsm8k_logged")
    assert trl_reward.__name__ == "gsm8k_logged" and trl_reward.max_reward == 1.0
    prompts = [row["question"] for row in TRAIN_ROWS[:3]]
    rewards = trl_reward(prompts, completions, answer=answers, question=prompts, trainer_state=object())
    assert rewards == expected
    assert gsm8k.CALLS == [(c, a, r) for c, a, r in zip(completions, answers, expected)]
    assert TaskReward(None, reward=gsm8k.gsm8k)(prompts, completions, answer=answers) == expected

    verl = [
        compute_score("gsm8k", c, {"answer": a}, {"index": i}, reward=f"{GSM8K_MODULE}:gsm8k_logged")
        for i, (c, a) in enumerate(zip(completions, answers))
    ]
    assert verl == [{"score": r, "correct": r, "chars": float(len(c))} for c, r in zip(completions, expected)]
    assert compute_score("gsm8k", "so 7", "7", {"answer": "7"}, reward=f"{GSM8K_MODULE}:gsm8k")["score"] == 1.0

    # the same check of what the function returns, named in each runner's own terms
    with pytest.raises(RewardOutputError, match="^TRL batch row 0: gsm8k_reward:nan_reward returned nan"):
        TaskReward(None, reward=f"{GSM8K_MODULE}:nan_reward")(prompts[:1], completions[:1], answer=answers[:1])
    with pytest.raises(RewardOutputError, match="^verl row 5: gsm8k_reward:no_reward returned None"):
        compute_score("gsm8k", "7", {"answer": "7"}, {"index": 5}, reward=f"{GSM8K_MODULE}:no_reward")
    with pytest.raises(RewardOutputError, match="reward_kwargs.max_reward=2; set reward_kwargs.max_reward"):
        compute_score("gsm8k", "7", {"answer": "7"}, reward=gsm8k.__name__ + ":gsm8k_logged", max_reward=2.0)
    with pytest.raises(ValueError, match="^reward='gsm8k_reward:gsm8': module 'gsm8k_reward' has no attribute"):
        TaskReward(None, reward=f"{GSM8K_MODULE}:gsm8")
    with pytest.raises(ValueError, match="give task \\('arith'\\) or reward, not both"):
        TaskReward(None, task="arith", reward=gsm8k.gsm8k)


def test_the_documented_example_is_the_tested_one():
    """docs/tasks.md's reward function is the module's ``gsm8k`` line for line, its rows are rows of
    the tests' files, and its command names the options these tests use."""
    docs = (Path(__file__).parents[2] / "docs" / "tasks.md").read_text()
    section = docs.split("## Your data and your reward", 1)[1].split("\n## ", 1)[0]
    function = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert function.count("\n") == 5 and "def gsm8k(response, answer):" in function
    assert all(line in GSM8K_SOURCE.splitlines() for line in function.splitlines() if line)
    for row in (TRAIN_ROWS[0], TRAIN_ROWS[1], EVAL_ROWS[1]):
        assert json.dumps(row) in section
    assert "--data train.jsonl --eval-data test.jsonl" in section and "--prompt-column question" in section
    assert "--reward gsm8k_reward.py:gsm8k" in section  # the file form: no PYTHONPATH to set
