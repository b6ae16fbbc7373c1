"""A user's reward module and data files, written where a test wants them: the GSM8K-style example
of docs/tasks.md (``gsm8k`` is its five lines) plus the variants the tests need."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GSM8K_MODULE = "gsm8k_reward"

GSM8K_SOURCE = '''\
import math
import re

CALLS = []  # (response, answer, reward) of every call, in order
TOLERANCE = 1e-6


def gsm8k(response, answer):
    numbers = re.findall(r"-?\\d+(?:\\.\\d+)?", response.replace(",", ""))
    return float(bool(numbers) and float(numbers[-1]) == float(answer))


def gsm8k_logged(response, answer):
    """gsm8k, recorded, with its correctness flag and the response length as a metric."""
    reward = gsm8k(response, answer)
    CALLS.append((response, answer, reward))
    return {"reward": reward, "correct": reward == 1.0, "chars": len(response)}


def nan_reward(response, answer):
    return math.nan


def nan_once_answered(response, answer):
    return math.nan if response else 0.0


def no_reward(response, answer):
    return None


def text_reward(response, answer):
    return "0"


def raising_reward(response, answer, **row):
    return row["unit"]
'''

# GSM8K-style rows: a question and its numeric answer
TRAIN_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "7"},
    {"question": "A box holds 6 eggs. How many eggs are in 5 boxes?", "answer": "30"},
    {"question": "Sara had 20 stickers and gave away 8. How many are left?", "answer": "12"},
    {"question": "What is 9 plus 16?", "answer": "25"},
    {"question": "A train travels 60 km each hour for 3 hours. How far does it go?", "answer": "180"},
    {"question": "Split 24 sweets equally among 4 children. How many does each get?", "answer": "6"},
]
EVAL_ROWS = [
    {"question": "Ann reads 5 pages a day for 7 days. How many pages?", "answer": "35"},
    {"question": "What is 100 minus 58?", "answer": "42"},
    {"question": "Three bags hold 11 marbles each. How many marbles?", "answer": "33"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def install_module(directory: Path, monkeypatch, name: str = GSM8K_MODULE, source: str = GSM8K_SOURCE):
    """Write ``name.py`` into ``directory`` and put the directory on ``sys.path`` (undone after the
    test, the module forgotten), as a user's own module on PYTHONPATH."""
    (directory / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.setitem(sys.modules, name, None)  # recorded so that the test's import is undone...
    monkeypatch.delitem(sys.modules, name)  # ...and removed now, so that it is imported from directory
    return directory / f"{name}.py"
