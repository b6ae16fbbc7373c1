"""The task registry and the Task protocol (the import rule of tokenbalance.tasks: tests/test_layering.py)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tokenbalance.tasks as tasks_package
from tokenbalance.tasks import (
    EXAMPLE_USES,
    TASK_NAMES,
    ExampleSource,
    ScoreResult,
    Task,
    TaskExample,
    get_task,
    register_task,
    unregister_task,
)

TASKS_DIR = Path(tasks_package.__file__).parent


def test_registry_names_and_unknown_name():
    assert TASK_NAMES == ("kk", "arith")
    for name in TASK_NAMES:
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name
    with pytest.raises(ValueError, match=r"unknown task 'gsm8k'; valid tasks: kk, arith"):
        get_task("gsm8k")


def test_protocol_round_trip_for_each_task():
    kk = get_task("kk")
    (example,) = kk.examples("test", difficulty=4, count=1)
    assert isinstance(example, TaskExample)
    assert (example.difficulty, example.index, example.data_source) == (4, 1000, "kk_logic")
    assert kk.render_prompt(example, "qwen-instruct") == example.prompt
    answer = example.ground_truth["solution_text_format"]
    assert kk.score(f" ok </think><answer>{answer}</answer>", example) == ScoreResult(
        reward=3.0, metrics={"format_ok": 1.0, "answer_parsed": 1.0, "correct": 1.0}
    )
    assert kk.score("<think> no </think>", example).reward == -3.0

    arith = get_task("arith")
    (problem,) = arith.examples("train", difficulty=1, count=1)
    assert arith.score(f"\\boxed{{{problem.ground_truth}}}", problem).reward == 1.0
    assert arith.score("no idea", problem) == ScoreResult(0.0, {"boxed": 0.0, "parsed": 0.0, "correct": 0.0})


def test_no_eval_or_exec_in_tasks():
    for path in sorted(TASKS_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        calls = {
            node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert not calls & {"eval", "exec", "sympify", "compile"}, path.name


def test_importing_tasks_does_not_load_pyarrow_or_math_verify():
    code = (
        "import sys, tokenbalance.tasks, tokenbalance.tasks.kk, tokenbalance.tasks.arith;"
        "print(sorted(m for m in ('pyarrow', 'math_verify', 'pandas', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_what_the_trainer_reads_from_each_task():
    kk, arith = get_task("kk"), get_task("arith")
    assert (kk.max_reward, arith.max_reward) == (3.0, 1.0)
    assert kk.special_tokens == ("<think>", "</think>", "<answer>", "</answer>") and arith.special_tokens == ()
    # K&K: the held-out / RL / SFT index ranges documented in tasks/kk/task.py (n = 2 has ~398 puzzles)
    ranges = {
        (use, n): (s.split, s.start_index, s.count, s.seed)
        for use in EXAMPLE_USES
        for n in (2, 3)
        if (use, n) != ("validation", 2)
        for s in [kk.example_source(use, n, 150)]
    }
    assert ranges == {
        ("eval", 2): ("test", 0, 100, None),
        ("rl", 2): ("train", 100, 298, None),
        ("sft", 2): ("train", 100, 298, None),
        ("eval", 3): ("test", 1000, 150, None),
        ("validation", 3): ("test", 10000, 150, None),
        ("rl", 3): ("train", 100, 150, None),
        ("sft", 3): ("train", 2000, 150, None),
    }
    assert [arith.example_source(use, 2, 7) for use in EXAMPLE_USES] == [
        ExampleSource("test", count=7, seed=0),
        ExampleSource("test", count=7, seed=3),
        ExampleSource("train", count=7, seed=1),
        ExampleSource("train", count=7, seed=2),
    ]
    with pytest.raises(ValueError, match="use: unknown value 'train'"):
        kk.example_source("train", 3, 1)
    with pytest.raises(ValueError, match="2 people has no validation range"):
        kk.example_source("validation", 2, 10)
    assert kk.example_source("rl", 3, 1900).count == 1900  # train 100 .. 1999, below the SFT range
    with pytest.raises(ValueError, match="data.rl_count: at most 1900"):
        kk.example_source("rl", 3, 1901)
    # the held-out and validation ranges cannot overlap, whatever the count
    assert kk.example_source("eval", 3, 9000).count == 9000
    for use in ("eval", "validation"):
        with pytest.raises(ValueError, match="data.eval_count: at most 9000 K&K puzzles"):
            kk.example_source(use, 4, 9001)

    (puzzle,) = kk.examples("train", difficulty=3, count=1, start_index=2000, template="plain")
    for target in ("answer", "cot"):
        response = kk.sft_response(puzzle, target)
        assert kk.score(response, puzzle).reward == kk.max_reward
        assert response.endswith(f"</think>\n<answer> {puzzle.ground_truth['solution_text_format']} </answer>")
    assert kk.sft_response(puzzle, "cot").startswith(" " + puzzle.extra["cot_head"])
    (problem,) = arith.examples("train", difficulty=1, count=1, start_index=5, seed=1)
    assert problem.index == 5 and arith.score(arith.sft_response(problem, "answer"), problem).reward == 1.0
    corpus = list(arith.tokenizer_corpus((1,), "plain"))
    assert len(corpus) == 600 and corpus[1] == arith.sft_response(  # prompt, answer, working
        arith.examples("train", difficulty=1, count=1, seed=2)[0], "answer"
    )


def test_register_task_checks_its_arguments():
    with pytest.raises(ValueError, match="task name must be"):
        register_task("a b", lambda: get_task("kk"))
    with pytest.raises(ValueError, match="factory must be callable"):
        register_task("x", "KKTask")
    with pytest.raises(ValueError, match="'kk' is already registered"):
        register_task("kk", lambda: get_task("arith"))
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        unregister_task("nope")
    assert "kk" in TASK_NAMES and "nope" not in TASK_NAMES and repr(TASK_NAMES) == "('kk', 'arith')"
