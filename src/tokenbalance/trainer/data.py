"""Which examples a run trains and evaluates on.

Generated K&K data keeps three disjoint index ranges per number of people n (the generator's
global indices; docs/tasks.md):

=========  ==============================  ===========================
use        n >= 3                          n = 2 (only ~398 puzzles exist)
=========  ==============================  ===========================
held-out   1000 .. 1000 + eval_count - 1   0 .. 99 (the K&K test split)
RL         100 .. 999 (Logic-RL train)     100 .. 397
SFT        2000 .. 2000 + train_count - 1  100 .. 397 (shared with RL)
=========  ==============================  ===========================

so the held-out set is never trained on. With ``data.train_file`` / ``data.eval_file`` the
examples come from Logic-RL / DeepScaleR files instead.
"""

from __future__ import annotations

from tokenbalance.config import DataConfig
from tokenbalance.tasks import get_task
from tokenbalance.tasks.base import TaskExample

KK_TWO_PEOPLE_LIMIT = 398  # the generator finds no further unique 2-people puzzle at seed 1234


def _kk_range(n: int, use: str, count: int) -> tuple[int, int]:
    if n == 2:
        if use == "eval":
            return 0, min(count, 100)
        return 100, KK_TWO_PEOPLE_LIMIT - 100
    if use == "eval":
        return 1000, count
    if use == "rl":
        return 100, 900
    return 2000, count


def _generated(config: DataConfig, difficulties, use: str, count: int) -> list[TaskExample]:
    task = get_task(config.task)
    examples: list[TaskExample] = []
    for level in difficulties:
        if config.task == "kk":
            start, n = _kk_range(level, use, count)
            examples += task.examples(
                "test" if use == "eval" else "train",
                difficulty=level,
                count=n,
                start_index=start,
                template=config.template,
            )
        else:
            split = "test" if use == "eval" else "train"
            seed = {"eval": 0, "rl": 1, "sft": 2}[use]
            examples += task.examples(split, difficulty=level, count=count, seed=seed, template=config.template)
    return examples


def _from_file(config: DataConfig, path: str) -> list[TaskExample]:
    if config.task == "kk":
        from tokenbalance.tasks.kk import read_kk_examples

        examples = read_kk_examples(path, template=config.template)
    else:
        from tokenbalance.tasks.arith import read_math_examples

        examples = read_math_examples(path)
    if not examples:
        raise ValueError(
            f"{path}: the file holds no examples; point data.train_file / data.eval_file at a non-empty file"
        )
    return examples


def rl_examples(config: DataConfig) -> list[TaskExample]:
    if config.train_file:
        return _from_file(config, config.train_file)
    return _generated(config, config.train_difficulties, "rl", 900)


def eval_examples(config: DataConfig) -> list[TaskExample]:
    if config.eval_file:
        return _from_file(config, config.eval_file)
    return _generated(config, config.eval_difficulties, "eval", config.eval_count)


def sft_examples(config: DataConfig, count: int) -> list[TaskExample]:
    return _generated(config, config.train_difficulties, "sft", count)
