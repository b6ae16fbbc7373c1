"""Tasks: make examples, render prompts, score responses (see :mod:`tokenbalance.tasks.base`).

* ``kk``: Knights & Knaves logic puzzles, bit-exact with the Logic-RL / AR-Lopti data
  (:mod:`tokenbalance.tasks.kk`);
* ``arith``: generated multi-step arithmetic with ``\\boxed{}`` answers, checked with math-verify
  (:mod:`tokenbalance.tasks.arith`).

This package imports only the standard library, numpy and torch at module level; pyarrow and
math-verify are imported inside the functions that need them.
"""

from tokenbalance.tasks.base import TASK_NAMES, ScoreResult, Task, TaskExample, get_task

__all__ = ["TASK_NAMES", "ScoreResult", "Task", "TaskExample", "get_task"]
