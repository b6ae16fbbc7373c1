"""Which examples a run trains and evaluates on.

Generated data comes from the task (:meth:`~tokenbalance.tasks.base.Task.example_source`): for each
difficulty, disjoint held-out, RL and SFT sources, so the held-out set is never trained on (K&K's
index ranges are in :mod:`tokenbalance.tasks.kk.task`; arith uses one seed per use). With
``data.train_file`` / ``data.eval_file`` the examples come from the task's file reader
(:meth:`~tokenbalance.tasks.base.Task.read_examples`: Logic-RL / DeepScaleR files) instead. With
``data.reward`` the task is your function (:mod:`tokenbalance.tasks.function`) and both files are
yours; :func:`function_task_for_run` gives it the policy's chat template before the data is read.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from tokenbalance.config import EVAL_SET_USES, DataConfig
from tokenbalance.tasks import get_task
from tokenbalance.tasks.base import Task, TaskExample
from tokenbalance.tasks.function import register_function_task
from tokenbalance.tasks.registry import TASK_FACTORIES

_memo: dict | None = None  # set inside ``reused_examples()``


@contextlib.contextmanager
def reused_examples() -> Iterator[None]:
    """Within the block, the same data asked for twice is built (or read) once: the checks before
    a run read the data files and the run reads them again. Files are keyed by their size and
    modification time, generated data by every setting it depends on."""
    global _memo
    outer, _memo = _memo, {} if _memo is None else _memo
    try:
        yield
    finally:
        _memo = outer


def _memoized(key: tuple, build: Callable[[], list[TaskExample]]) -> list[TaskExample]:
    if _memo is None:
        return build()
    if key not in _memo:
        _memo[key] = build()
    return list(_memo[key])


def _file_key(path: str) -> tuple:
    path = os.path.abspath(path)  # the checks read the path as given, the run the absolute one
    try:
        stat = os.stat(path)
    except OSError:
        return (path,)
    return (path, stat.st_size, stat.st_mtime_ns)


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


def function_task_for_run(config: DataConfig, tokenizer) -> Task:
    """With ``data.reward``: the task ``get_task(config.task)`` gives from now on, whose chat
    prompts are rendered with ``tokenizer``'s chat template (generation prompt added); a tokenizer
    without one refuses chat prompts, naming it. Called before the data is read (the checks before
    a run, ``tokenbalance eval``), so the run's reads find the same task."""
    if getattr(tokenizer, "chat_template", None):

        def render(messages: list[dict]) -> str:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    else:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__

        def render(messages: list[dict]) -> str:
            raise ValueError(
                f"chat messages need a chat template, and the policy's tokenizer ({name}) has none; give text "
                "prompts (data.template=text)"
            )

    register_function_task(
        str(config.reward), prompt_column=config.prompt_column, max_reward=config.max_reward, render_chat=render
    )
    return get_task(config.task)


def _key(config: DataConfig, *parts) -> tuple:
    return (id(TASK_FACTORIES.get(config.task)), config.task, config.template, *parts)


def rl_examples(config: DataConfig) -> list[TaskExample]:
    if config.train_file:
        path = config.train_file
        return _memoized(_key(config, "file", *_file_key(path)), lambda: _from_file(config, path))
    levels = tuple(config.train_difficulties)
    count = config.rl_count
    return _memoized(_key(config, "rl", levels, count), lambda: _generated(config, levels, "rl", count))


def eval_examples(config: DataConfig) -> list[TaskExample]:
    if config.eval_file:
        path = config.eval_file
        return _memoized(_key(config, "file", *_file_key(path)), lambda: _from_file(config, path))
    levels, count, use = tuple(config.eval_difficulties), config.eval_count, EVAL_SET_USES[config.eval_set]
    return _memoized(_key(config, use, levels, count), lambda: _generated(config, levels, use, count))


def sft_examples(config: DataConfig, count: int) -> list[TaskExample]:
    return _generated(config, config.train_difficulties, "sft", count)
