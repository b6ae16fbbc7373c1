"""DAPO dynamic sampling in the trainer: rounds until the step has its informative groups, the data
position saved and restored exactly, every trained group informative."""

import json

import pytest
import torch

from tests.trainer.conftest import replace_section
from tests.trainer.test_loop import interrupted_and_resumed, undocumented, without_timing
from tokenbalance.config import apply_overrides
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models import load_policy
from tokenbalance.tasks.base import ScoreResult
from tokenbalance.trainer import batch as batch_module
from tokenbalance.trainer import loop
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.runner import run_training

DYNAMIC = ["train.method=grpo", "method.dynamic_sampling.enabled=true", "method.dynamic_sampling.max_extra_rounds=3"]


def parity_scores(task, texts, examples):
    """A reward that varies within some groups and not others: 3 for an even response length, else -3."""
    return [ScoreResult(reward=3.0 if len(text) % 2 == 0 else -3.0) for text in texts]


def rare_scores(task, texts, examples):
    """Full reward for one response length in five: most groups are all wrong (uninformative)."""
    return [ScoreResult(reward=3.0 if len(text) % 5 == 0 else -3.0) for text in texts]


@pytest.fixture
def dynamic_config(small_config, monkeypatch):
    monkeypatch.setattr(batch_module, "score_responses", parity_scores)
    config = apply_overrides(small_config, DYNAMIC)
    config.output.run_dir = small_config.output.run_dir
    return config


def test_trained_groups_are_informative_and_the_position_advances_by_rounds(dynamic_config, tmp_path):
    policy, tokenizer = load_policy(dynamic_config.model.path)
    parts = loop.prepare_training(
        dynamic_config, tmp_path / "run", policy, tokenizer, torch.device("cpu"), DistContext()
    )
    per_step = dynamic_config.rollout.prompts_per_step
    for step in range(3):
        before = parts.state.data_position
        batch, first, metrics = loop.rollout(parts, step)
        rounds = int(metrics["sampling/rounds"])
        assert 1 <= rounds <= 4 and parts.state.data_position == before + rounds * per_step
        assert first.group_ids_P.tolist() == list(range(before, before + per_step))
        kept = int(metrics["sampling/groups_kept"])
        assert metrics["sampling/shortfall"] == per_step - kept
        if kept:  # every trained group has two different rewards, and they are the groups drawn
            rewards_PG = batch.rewards_PG
            assert batch.rewards_PG.shape == (kept, dynamic_config.rollout.group_size)
            assert bool((rewards_PG.amax(1) > rewards_PG.amin(1)).all())
            assert set(batch.group_ids_P.tolist()) <= set(range(before, parts.state.data_position))
            assert len(batch.texts_B) == batch.packed.input_ids_BL.shape[0] == kept * batch.group_size


def test_disabled_dynamic_sampling_is_one_round_of_every_group(small_config, tmp_path, monkeypatch):
    monkeypatch.setattr(batch_module, "score_responses", parity_scores)
    policy, tokenizer = load_policy(small_config.model.path)
    parts = loop.prepare_training(small_config, tmp_path / "run", policy, tokenizer, torch.device("cpu"), DistContext())
    batch, first, metrics = loop.rollout(parts, 0)
    assert batch is first and metrics == {} and parts.state.data_position == small_config.rollout.prompts_per_step


def test_a_dynamic_sampling_run_resumes_exactly(dynamic_config, tmp_path, monkeypatch):
    replace_section(dynamic_config, "train", steps=3)
    reference = run_training(dynamic_config, log=lambda *_: None)
    records = [r for r in read_metrics(reference / "metrics.jsonl") if r["kind"] == "train"]
    assert undocumented(read_metrics(reference / "metrics.jsonl")) == set()
    rounds = [int(r["sampling/rounds"]) for r in records]
    assert max(rounds) > 1  # the run really drew extra rounds
    state = json.loads((reference / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert state["data_position"] == sum(rounds) * dynamic_config.rollout.prompts_per_step

    crashed = tmp_path / "crashed"
    interrupted_and_resumed(dynamic_config, crashed, monkeypatch)
    assert without_timing(read_metrics(crashed / "metrics.jsonl")) == without_timing(
        read_metrics(reference / "metrics.jsonl")
    )


def dynamic_rounds_on_a_rank(policy_dir, rows, ctx) -> list:
    """Three steps of dynamic-sampling rollouts on one of two gloo ranks (module level: spawnable)."""
    import tempfile
    from pathlib import Path

    from tests.trainer.conftest import SMALL_RUN
    from tokenbalance.config import RunConfig

    torch.set_num_threads(1)
    batch_module.score_responses = rare_scores  # this process's copy of the module
    config = apply_overrides(
        RunConfig(), [*SMALL_RUN, f"model.path={policy_dir}", "rollout.prompts_per_step=4", *DYNAMIC]
    )
    policy, tokenizer = load_policy(policy_dir)
    run_dir = Path(tempfile.mkdtemp(prefix=f"rank{ctx.rank}-"))
    parts = loop.prepare_training(config, run_dir, policy, tokenizer, torch.device("cpu"), ctx)
    out = []
    for step in range(3):
        batch, first, metrics = loop.rollout(parts, step)
        kept = int(metrics["sampling/groups_kept"])
        trained = len(batch.examples_P) if kept else 0
        out.append(
            (kept, trained, int(metrics["sampling/rounds"]), parts.state.data_position, first.group_ids_P.tolist())
        )
    return out


def test_two_ranks_draw_disjoint_prompts_and_train_equal_numbers_of_groups(tiny_policy_dir, tmp_path):
    from tests.trainer.test_distributed import on_two_gloo_ranks

    rank0, rank1 = on_two_gloo_ranks(dynamic_rounds_on_a_rank, tiny_policy_dir, tmp_path)
    for (kept0, n0, rounds0, pos0, ids0), (kept1, n1, rounds1, pos1, ids1) in zip(rank0, rank1):
        assert (kept0, n0, rounds0, pos0) == (kept1, n1, rounds1, pos1)  # same decisions, same batch sizes
        assert kept0 <= 2 and set(ids0).isdisjoint(ids1) and len(ids0) == len(ids1) == 2
    assert max(rounds for _, _, rounds, _, _ in rank0) > 1
