"""Tasks: make examples, render prompts, score responses (see :mod:`tokenbalance.tasks.base`).

* ``kk``: Knights & Knaves logic puzzles, bit-exact with the Logic-RL / AR-Lopti data
  (:mod:`tokenbalance.tasks.kk`);
* ``arith``: generated multi-step arithmetic with ``\\boxed{}`` answers, checked with math-verify
  (:mod:`tokenbalance.tasks.arith`).

A new task: implement :class:`Task` (subclass :class:`BaseTask`) and ``register_task(name, factory)``.

This package imports only the standard library, numpy and torch at module level; pyarrow and
math-verify are imported inside the functions that need them.
"""

from tokenbalance.tasks.base import (
    DEFAULT_TASK,
    EXAMPLE_USES,
    TASK_NAMES,
    BaseTask,
    ExampleSource,
    ScoreResult,
    Task,
    TaskExample,
    get_task,
    register_task,
    task_names,
    unregister_task,
)

__all__ = [
    "DEFAULT_TASK",
    "EXAMPLE_USES",
    "TASK_NAMES",
    "BaseTask",
    "ExampleSource",
    "ScoreResult",
    "Task",
    "TaskExample",
    "get_task",
    "register_task",
    "task_names",
    "unregister_task",
]
