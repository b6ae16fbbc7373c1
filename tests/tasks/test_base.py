"""The task registry, the Task protocol and the layering rule of tokenbalance.tasks."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tokenbalance.tasks as tasks_package
from tokenbalance.tasks import TASK_NAMES, ScoreResult, Task, TaskExample, get_task

TASKS_DIR = Path(tasks_package.__file__).parent
ALLOWED_TOP_LEVEL = {"numpy", "torch", "tokenbalance"}


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


def test_module_level_imports_follow_the_layering_rule():
    # tasks/ imports only the standard library, numpy, torch and tokenbalance.tasks at module level.
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for path in sorted(TASKS_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:  # module level only; lazy imports live inside functions
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                root = module.split(".")[0]
                assert root in stdlib or root in ALLOWED_TOP_LEVEL, f"{path.name} imports {module}"
                if root == "tokenbalance":
                    assert module.startswith("tokenbalance.tasks"), f"{path.name} imports {module}"


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
