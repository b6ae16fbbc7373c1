"""The arith task: deterministic generation, exact answers, math-verify scoring (correct, wrong,
unparsable, time-limited) and the DeepScaleR-style reader."""

import ast
import operator
import threading
import time
from fractions import Fraction

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbalance.tasks.arith import (
    LEVEL_SPECS,
    ArithTask,
    arith_rows,
    generate_problem,
    generate_problems,
    last_boxed_content,
    read_math_examples,
    render_arith_prompt,
    render_expression,
    score_math,
    write_arith_parquet,
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def independent_value(question):
    """Evaluate *our own generated* question text with a whitelist walk over ``ast`` (test only)."""
    expression = question.removeprefix("Compute ").removesuffix(".")

    def walk(node):
        if isinstance(node, ast.BinOp):
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        assert isinstance(node, ast.Constant) and type(node.value) is int
        return Fraction(node.value)

    return walk(ast.parse(expression, mode="eval").body)


def test_known_problems_are_stable():
    # Hand-checkable: 8 + 16 + 12 = 36; 7 - (15 - (18 - 13)) = 7 - 10 = -3.
    first = generate_problem(1, "train", 0)
    assert (first.question, first.answer) == ("Compute 8 + 16 + 12.", 36)
    second = generate_problem(2, "train", 0)
    assert (second.question, second.answer) == ("Compute 7 - (15 - (18 - 13)).", -3)


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_answers_are_exact_and_within_bounds(level):
    spec = LEVEL_SPECS[level]
    problems = generate_problems(level, "test", 40)
    for problem in problems:
        assert independent_value(problem.question) == problem.answer
        assert abs(problem.answer) <= spec.max_value
        operators = sum(problem.question.count(f" {op} ") for op in "+-*/")
        assert operators == spec.operations


def test_generation_is_deterministic_and_slices_are_independent():
    assert generate_problems(3, "train", 5) == generate_problems(3, "train", 5)
    assert generate_problems(3, "train", 2, start_index=3) == generate_problems(3, "train", 5)[3:]
    assert generate_problems(3, "train", 5) != generate_problems(3, "test", 5)
    assert generate_problems(3, "train", 5, seed=1) != generate_problems(3, "train", 5)


def test_rendering_uses_the_fewest_parentheses():
    assert render_expression(("-", 10, ("-", 4, 3))) == "10 - (4 - 3)"
    assert render_expression(("-", ("-", 10, 4), 3)) == "10 - 4 - 3"
    assert render_expression(("*", ("+", 1, 2), -3)) == "(1 + 2) * (-3)"
    assert render_expression(("/", 12, ("*", 2, 3))) == "12 / (2 * 3)"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"level": 0, "split": "train"}, r"level: must be an integer in \[1, 5\], got 0"),
        ({"level": 2, "split": "dev"}, r"split must be one of train, test, got 'dev'"),
        ({"level": 2, "split": "train", "count": 0}, r"count: must be an integer in \[1, inf\], got 0"),
    ],
)
def test_bad_generation_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_problems(**kwargs)


def test_last_boxed_content():
    assert last_boxed_content("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed_content("\\fbox{7}") == "7"
    assert last_boxed_content("\\boxed 5") is None
    assert last_boxed_content("\\boxed{12") is None


@pytest.mark.parametrize(
    ("response", "reward", "metrics"),
    [
        ("<think>2*18</think> The answer is \\boxed{36}.", 1.0, (1, 1, 1)),
        ("\\boxed{\\frac{72}{2}}", 1.0, (1, 1, 1)),
        ("\\boxed{36.0}", 1.0, (1, 1, 1)),
        ("<think>\\boxed{35}</think> so \\boxed{36}", 1.0, (1, 1, 1)),  # box inside think ignored
        ("<think>\\boxed{36}</think> so \\boxed{35}", 0.0, (1, 1, 0)),
        ("\\boxed{35}", 0.0, (1, 1, 0)),
        ("36", 0.0, (0, 0, 0)),  # no box
        ("\\boxed{}", 0.0, (1, 0, 0)),  # empty box
        ("\\boxed{\\frac{}{}}", 0.0, (1, 0, 0)),  # unparsable
        ("\\boxed{" + "1+" * 150 + "1}", 0.0, (1, 0, 0)),  # longer than MAX_ANSWER_CHARS
        ("\\boxed{__import__('os').system('echo pwned')}", 0.0, (1, 0, 0)),  # never executed
    ],
)
def test_score_math(response, reward, metrics, capfd):
    result = score_math(response, "36", timeout_s=2)
    assert result.reward == reward
    assert (result.metrics["boxed"], result.metrics["parsed"], result.metrics["correct"]) == metrics
    assert "pwned" not in capfd.readouterr().out


def test_gold_forms_and_bad_gold():
    assert score_math("\\boxed{-3}", "\\boxed{-3}").reward == 1.0
    assert score_math("\\boxed{5}", ["4", "5"]).reward == 1.0
    assert score_math("\\boxed{5}", 5).reward == 1.0
    with pytest.raises(ValueError, match="ground_truth must be an answer string"):
        score_math("\\boxed{5}", 5.0)
    with pytest.raises(ValueError, match=r"timeout_s: must be an integer in \[1, inf\]"):
        score_math("\\boxed{5}", "5", timeout_s=0.5)


def test_time_limit_stops_a_pathological_answer():
    start = time.monotonic()
    result = score_math("\\boxed{9^{9^{9^{9^{9}}}}}", "3", timeout_s=1)
    assert result.reward == 0.0
    assert time.monotonic() - start < 10


def test_scoring_off_the_main_thread_works():
    results = []
    thread = threading.Thread(target=lambda: results.append(score_math("\\boxed{36}", "36")))
    thread.start()
    thread.join(30)
    assert results and results[0].reward == 1.0


def test_task_object_and_templates():
    task = ArithTask(timeout_s=2)
    examples = task.examples("test", difficulty=1, count=3)
    assert examples[0].question == generate_problem(1, "test", 0).question
    assert examples[0].prompt == "User: " + examples[0].question + (
        " Let's think step by step and output the final answer within \\boxed{}.\nAssistant:"
    )
    assert task.render_prompt(examples[0], "raw") == examples[0].question + (
        " Let's think step by step and output the final answer within \\boxed{}."
    )
    answer = examples[0].ground_truth
    assert task.score(f"\\boxed{{{answer}}}", examples[0]).reward == 1.0
    with pytest.raises(ValueError, match="unknown template 'qwen-base'; valid templates: plain, qwen-instruct, raw"):
        render_arith_prompt("x", "qwen-base")


def test_deepscaler_reader_round_trip_and_errors(tmp_path):
    path = write_arith_parquet(arith_rows(generate_problems(2, "test", 3)), tmp_path / "a.parquet")
    examples = read_math_examples(path)
    problem = generate_problem(2, "test", 1)
    assert examples[1].question == problem.question and examples[1].ground_truth == str(problem.answer)
    assert examples[1].prompt.startswith(problem.question) and examples[1].difficulty == 2
    assert examples[1].data_source == "arith"

    dsr_rows = [
        {
            "data_source": "aime_dsr",
            "prompt": [{"content": "What is 1+1? Let's think", "role": "user"}],
            "reward_model": {"ground_truth": "2", "style": "rule"},
        },
        {
            "data_source": "aime_dsr",
            "prompt": [{"content": "Q2", "role": "user"}],
            "reward_model": {"ground_truth": None, "style": "rule"},
        },
    ]
    bad = tmp_path / "dsr.parquet"
    pq.write_table(pa.Table.from_pylist(dsr_rows), bad)
    with pytest.raises(
        ValueError,
        match=r"dsr.parquet: row 1: column 'reward_model.ground_truth': expected str or int or list, got NoneType",
    ):
        read_math_examples(bad)
    good = tmp_path / "dsr_ok.parquet"
    pq.write_table(pa.Table.from_pylist(dsr_rows[:1]), good)
    (example,) = read_math_examples(good)
    assert (example.prompt, example.question, example.ground_truth, example.data_source, example.index) == (
        "What is 1+1? Let's think",
        "What is 1+1? Let's think",
        "2",
        "aime_dsr",
        0,
    )
    no_prompt = tmp_path / "np.parquet"
    pq.write_table(pa.Table.from_pylist([{"reward_model": {"ground_truth": "2"}}]), no_prompt)
    with pytest.raises(ValueError, match=r"np.parquet: row 0: column 'prompt': missing"):
        read_math_examples(no_prompt)
