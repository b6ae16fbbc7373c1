"""Tasks: make examples, render prompts, score responses (the protocol: :mod:`tokenbalance.tasks.base`).

Built in: ``kk`` (Knights & Knaves, bit-exact with Logic-RL / AR-Lopti) and ``arith``; a new task subclasses
:class:`BaseTask` and calls ``register_task``; your own rows and reward need no subclass (:class:`FunctionTask`). Only
the standard library, numpy and torch load at import. docs/tasks.md."""

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
