"""One setup path: :func:`prepare` runs the checks before work and builds, once, the task, the policy's tokenizer, the
RL and held-out examples, their token ids and (for the embedded policy) its SFT pairs. Training, the probe batch,
``eval`` and the grid call it before any model loads; every error is one line, seconds in. The embedded tokenizer
exists only once that policy is built (:meth:`RunSetup.with_tokenizer`). docs/reliability.md."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenbalance import __version__
from tokenbalance.algorithms.token_rules import probe_rule
from tokenbalance.checks import check_choice
from tokenbalance.config import RunConfig, to_dict
from tokenbalance.models.loading import check_policy_dir, check_special_tokens, load_checked_tokenizer
from tokenbalance.outputs import check_writable_dir
from tokenbalance.run.checks import check_real_model_settings, check_reporting, resolve_device
from tokenbalance.run.examples import (
    SFTPair,
    check_sft_target,
    encode_prompts,
    eval_examples,
    rl_examples,
    row_pairs,
    sft_pairs,
    task_for,
    with_policy_template,
)
from tokenbalance.tasks.base import Task, TaskExample
from tokenbalance.tasks.function import FunctionTask


@dataclass(frozen=True)
class RunSetup:
    """What a run works on, built once by :func:`prepare`; the prompt ids are row by row those of the examples,
    encoded with ``tokenizer`` (empty while it is None: the embedded policy's, not built yet). ``sft_pairs``: the
    embedded policy's warm start, only when it must be built."""

    task: Task
    train_examples: tuple[TaskExample, ...]
    eval_examples: tuple[TaskExample, ...]
    max_prompt_tokens: int
    tokenizer: Any = None
    train_prompt_ids: tuple[list[int], ...] = ()
    eval_prompt_ids: tuple[list[int], ...] = ()
    sft_pairs: tuple[SFTPair, ...] | None = None

    def with_tokenizer(self, tokenizer) -> RunSetup:
        """This setup for the policy's ``tokenizer``: itself when it is the one prepared; otherwise the task's tags
        checked and every prompt encoded with it (too long: named)."""
        if tokenizer is self.tokenizer:
            return self
        check_special_tokens(tokenizer, self.task.special_tokens)  # tags the reward reads from decoded text
        return dataclasses.replace(
            self,
            tokenizer=tokenizer,
            train_prompt_ids=tuple(encode_prompts(tokenizer, self.train_examples, self.max_prompt_tokens)),
            eval_prompt_ids=tuple(encode_prompts(tokenizer, self.eval_examples, self.max_prompt_tokens)),
        )


def prepare(config: RunConfig, *, resume: bool = False, tokenizer=None) -> RunSetup:
    """Check ``config`` before any model work and build the run's setup: the settings (:func:`check_settings`), the
    policy directory and tokenizer (``tokenizer``: one already loaded), the examples (schema, targets), a chat model
    against the tiny template, the task's tags, prompt lengths, the embedded cache directory's writability, and your
    reward function on the empty response of each file's first rows."""
    data = config.data
    task = check_settings(config, resume=resume)
    if tokenizer is None and config.model.path is not None:
        tokenizer = load_checked_tokenizer(check_policy_dir(config.model.path))
    if config.model.path is not None and data.reward is not None:
        task = with_policy_template(task, tokenizer)  # chat prompts: the policy's template
    setup = RunSetup(task, tuple(rl_examples(data, task)), tuple(eval_examples(data, task)), data.max_prompt_tokens)
    pairs = None
    if config.model.path is None and data.reward is not None:
        pairs = row_pairs(data, list(setup.train_examples))  # before a tokenizer and model are built on them
    builds_policy = tokenizer is None and builds_embedded_policy(config)
    if tokenizer is not None:
        check_real_model_settings(config, tokenizer)
        setup = setup.with_tokenizer(tokenizer)
    elif builds_policy:
        check_writable_dir(config.model.cache_dir, "model.cache_dir")
    if isinstance(task, FunctionTask):
        task.check_reward(setup.train_examples)
        task.check_reward(setup.eval_examples)
    if builds_policy:
        pairs = pairs if pairs is not None else sft_pairs(data, config.sft, task)
        setup = dataclasses.replace(setup, sft_pairs=tuple(pairs))
    return setup


def check_settings(config: RunConfig, *, resume: bool = False) -> Task:
    """The checks of the settings alone (seconds; no data read): the token rule (run once on a synthetic batch), the
    policy's source, the task (your function imports and is callable: it is returned) and its template, the SFT
    target, the device, the data files exist, the reporting extras and W&B settings."""
    rule = config.method().token_rule
    if rule is not None:
        probe_rule(rule)  # a rule that raises or returns the wrong thing: named now, not after a rollout
    _check_policy_source(config, resume=resume)
    task = task_for(config.data)  # data.reward: imports your function (not found, not callable: named)
    check_choice("data.template", config.data.template, task.templates)
    if config.model.path is None:
        check_sft_target(task, config.sft)
    resolve_device(config.train.device)
    for key in ("train_file", "eval_file"):
        path = getattr(config.data, key)
        if path is not None and not Path(path).is_file():
            raise ValueError(f"data.{key}={path!r}: no such file")
    check_reporting(config.output, os.environ)
    return task


def _check_policy_source(config: RunConfig, *, resume: bool) -> None:
    """``data.reward`` needs a policy (``--model``) or targets to build the tiny one on; targets build only the tiny
    one (a resume's ``model.path`` is the tiny one the run built)."""
    data = config.data
    if data.reward is not None and config.model.path is None and data.target_column is None:
        raise ValueError(
            "data.reward: give the policy to train with --model PATH (a Hugging Face model directory), or "
            "--target-column NAME (the column holding a good response to each prompt) to build the embedded tiny "
            "model on your rows and warm-start it on that column"
        )
    if data.target_column is not None and config.model.path is not None and not resume:
        raise ValueError(
            f"data.target_column={data.target_column!r}: it builds the embedded tiny model on your rows, "
            "without --model; to warm-start your own model on it, run `tokenbalance sft --model PATH --out DIR "
            "--target-column NAME` (with the same --data, --eval-data, --reward) and train --model DIR"
        )


def embedded_key(config: RunConfig) -> str:
    """The name of the embedded policy's cache directory under ``model.cache_dir``: a hash of every setting that
    changes what is built (model sizes, SFT, data, seed, package version)."""
    data = config.data
    relevant = {
        # model.autocast is how RL forwards compute, not what the SFT builds: not part of the key
        "model": {k: v for k, v in to_dict(config.model).items() if k not in ("path", "cache_dir", "autocast")},
        "sft": config.sft.result_settings(),
        "data": (
            {"task": data.task, "template": data.template, "train_difficulties": list(data.train_difficulties)}
            if data.reward is None
            else {  # your rows: the file's bytes and the columns read from it (not the reward function)
                "task": data.task,
                "template": data.template,
                "rows": hashlib.sha256(Path(str(data.train_file)).read_bytes()).hexdigest(),
                "prompt_column": data.prompt_column,
                "target_column": data.target_column,
            }
        ),
        "seed": config.train.seed,
        "version": __version__,
    }
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:12]
    return f"{config.data.task}-tiny-{digest}"


def builds_embedded_policy(config: RunConfig) -> bool:
    """Whether a run of ``config`` builds the embedded policy: no ``model.path``, and its cache directory holds no
    finished build (its SFT summary)."""
    cached = Path(config.model.cache_dir) / embedded_key(config) / "tokenbalance_sft.json"
    return config.model.path is None and not cached.is_file()
