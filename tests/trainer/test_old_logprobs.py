"""rollout.old_logprobs='sampler': the sampler's log-probs stand in for the old-policy forward."""

import math

import pytest
import torch

from tests.tolerances import assert_close_in
from tests.trainer.conftest import replace_section
from tokenbalance.config import RolloutConfig
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models import load_policy
from tokenbalance.trainer import loop
from tokenbalance.trainer.batch import with_logprobs
from tokenbalance.trainer.distributed import DistContext


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_sampler_logprobs_equal_the_recomputed_ones(small_config, tmp_path, engine):
    replace_section(small_config, "rollout", engine=engine, old_logprobs="sampler")
    policy, tokenizer = load_policy(small_config.model.path)
    parts = loop.prepare_training(small_config, tmp_path / "run", policy, tokenizer, torch.device("cpu"), DistContext())
    batch, _, _ = loop.rollout(parts, 0)

    def old(sampler: bool):
        return with_logprobs(
            batch,
            policy=policy,
            reference=parts.state.reference,
            method=parts.method,
            temperature=1.0,
            micro_batch=64,
            with_entropy=True,
            sampler_logprobs=sampler,
        ).old

    reused, recomputed = old(True), old(False)
    mask_BT = batch.mask_BT
    assert_close_in(reused.logp_BT[mask_BT], recomputed.logp_BT[mask_BT], torch.float32)  # a float32 model
    assert (reused.logp_BT[~mask_BT] == 0).all()
    assert reused.entropy_BT is None and recomputed.entropy_BT is not None


def test_a_run_with_sampler_logprobs_trains(small_config):
    replace_section(small_config, "rollout", old_logprobs="sampler")
    replace_section(small_config, "train", steps=1)
    records = read_metrics(loop_run(small_config) / "metrics.jsonl")
    (train,) = [r for r in records if r["kind"] == "train"]
    assert math.isfinite(train["loss/total"]) and train["optim/steps"] >= 2
    assert train["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy: the ratio starts at 1


def loop_run(config):
    from tokenbalance.trainer.runner import run_training

    return run_training(config, log=lambda *_: None)


def test_sampler_logprobs_refuse_a_truncated_distribution():
    with pytest.raises(ValueError, match="rollout.old_logprobs='sampler' needs the untruncated distribution"):
        RolloutConfig(old_logprobs="sampler", top_p=0.9)
