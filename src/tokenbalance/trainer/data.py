"""Which examples a run trains and evaluates on.

Generated data comes from the task (:meth:`~tokenbalance.tasks.base.Task.example_source`): for each
difficulty, disjoint held-out, RL and SFT sources, so the held-out set is never trained on (K&K's
index ranges are in :mod:`tokenbalance.tasks.kk.task`; arith uses one seed per use). With
``data.train_file`` / ``data.eval_file`` the examples come from the task's file reader
(:meth:`~tokenbalance.tasks.base.Task.read_examples`: Logic-RL / DeepScaleR files) instead.
"""

from __future__ import annotations

from tokenbalance.config import DataConfig
from tokenbalance.tasks import get_task
from tokenbalance.tasks.base import TaskExample

RL_COUNT = 900  # RL prompts asked for per difficulty (the Logic-RL train split's size)


def _generated(config: DataConfig, difficulties, use: str, count: int) -> list[TaskExample]:
    task = get_task(config.task)
    examples: list[TaskExample] = []
    for level in difficulties:
        source = task.example_source(use, level, count)
        examples += task.examples(
            source.split,
            difficulty=level,
            count=source.count,
            start_index=source.start_index,
            seed=source.seed,
            template=config.template,
        )
    return examples


def _from_file(config: DataConfig, path: str) -> list[TaskExample]:
    examples = get_task(config.task).read_examples(path, template=config.template)
    if not examples:
        raise ValueError(
            f"{path}: the file holds no examples; point data.train_file / data.eval_file at a non-empty file"
        )
    return examples


def rl_examples(config: DataConfig) -> list[TaskExample]:
    if config.train_file:
        return _from_file(config, config.train_file)
    return _generated(config, config.train_difficulties, "rl", RL_COUNT)


def eval_examples(config: DataConfig) -> list[TaskExample]:
    if config.eval_file:
        return _from_file(config, config.eval_file)
    return _generated(config, config.eval_difficulties, "eval", config.eval_count)


def sft_examples(config: DataConfig, count: int) -> list[TaskExample]:
    return _generated(config, config.train_difficulties, "sft", count)
