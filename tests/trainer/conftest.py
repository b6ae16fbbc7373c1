"""A tiny policy directory (random weights) and a small run config, shared by the trainer tests."""

import dataclasses
import os
from typing import NamedTuple

import pytest
import torch

from tokenbalance.cli import main
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import TinyModelConfig, build_tiny_model, save_policy, train_tokenizer
from tokenbalance.tasks.kk import tokenizer_corpus

SMALL_RUN = [
    "data.eval_count=4",
    "data.train_difficulties=[2]",
    "data.eval_difficulties=[2, 3]",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=12",
    "optim.mini_batch_size=4",
    "optim.micro_batch_size=2",
    "optim.lr=0.01",
    "train.steps=2",
    "train.eval_every=0",
    "train.save_every=1",
    "train.threads=1",
    "output.progress=false",
]


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("policy") / "tiny"
    tokenizer = train_tokenizer(list(tokenizer_corpus(people=(2, 3), count=40, template="compact")))
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer, seed=0
    )
    save_policy(model, tokenizer, path)
    return path


@pytest.fixture
def small_config(tiny_policy_dir, tmp_path):
    config = apply_overrides(RunConfig(), SMALL_RUN + [f"model.path={tiny_policy_dir}"])
    config.output.run_dir = str(tmp_path / "run")
    return config


class CliRun(NamedTuple):
    """One ``tokenbalance`` command run in this process, as a finished subprocess has it."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def tokenbalance(capsys):
    """``tokenbalance(*args, cwd=None)``: run one command through ``tokenbalance.cli.main`` in this
    process (the same parsing, one-line error handler and exit statuses as the entry point); a traceback
    fails the test as an exception. Returns ``CliRun(returncode, stdout, stderr)`` of that command only."""

    def run(*args, cwd=None):
        capsys.readouterr()
        before = os.getcwd()
        try:
            if cwd is not None:
                os.chdir(cwd)
            status = main([str(a) for a in args])
        finally:
            os.chdir(before)
        out, err = capsys.readouterr()
        return CliRun(status, out, err)

    return run


def replace_section(config, section, **changes):
    setattr(config, section, dataclasses.replace(getattr(config, section), **changes))
    return config
