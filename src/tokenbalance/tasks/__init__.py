"""Tasks: make examples, render prompts, score responses (see :mod:`tokenbalance.tasks.base`).

* ``kk``: Knights & Knaves logic puzzles, bit-exact with the Logic-RL / AR-Lopti data
  (:mod:`tokenbalance.tasks.kk`);
* ``arith``: generated multi-step arithmetic with ``\\boxed{}`` answers, checked with math-verify
  (:mod:`tokenbalance.tasks.arith`).

A new task: implement :class:`Task` (subclass :class:`BaseTask`) and ``register_task(name, factory)`` (:mod:`tokenbalance.tasks.registry`).
Your prompts and a reward function, without a subclass: :class:`FunctionTask` (``data.reward``,
``tokenbalance train --data FILE --eval-data FILE --reward MODULE:FUNCTION``;
:mod:`tokenbalance.tasks.function`).

This package imports only the standard library, numpy and torch at module level; pyarrow and
math-verify are imported inside the functions that need them.
"""

from tokenbalance.tasks.base import EXAMPLE_USES, BaseTask, ExampleSource, ScoreResult, Task, TaskExample
from tokenbalance.tasks.function import FunctionTask, RewardFunction, load_reward_function
from tokenbalance.tasks.registry import DEFAULT_TASK, TASK_NAMES, get_task, register_task, task_names, unregister_task

__all__ = [
    "DEFAULT_TASK",
    "EXAMPLE_USES",
    "TASK_NAMES",
    "BaseTask",
    "ExampleSource",
    "FunctionTask",
    "RewardFunction",
    "ScoreResult",
    "Task",
    "TaskExample",
    "get_task",
    "load_reward_function",
    "register_task",
    "task_names",
    "unregister_task",
]
