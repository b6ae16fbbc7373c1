"""The diagnostics inside a training run: keys logged and documented, values consistent, LLD Δ = 0
without an update, and a run with the diagnostics off logs no ``diag/`` key."""

import math

import pytest
import torch

from tests.trainer.conftest import replace_section
from tests.trainer.test_loop import undocumented
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.trainer import loop
from tokenbalance.trainer.runner import run_training
from tokenbalance.trainer.update import UpdateRecord

torch.set_num_threads(1)


def train_records(config):
    records = read_metrics(run_training(config, log=lambda *_: None) / "metrics.jsonl")
    return [r for r in records if r["kind"] == "train"], records


def test_every_diagnostic_logs_documented_keys(small_config, mixed_rewards):
    replace_section(small_config, "train", steps=2)
    replace_section(small_config, "diagnostics", grad_norm_every=2, grad_norm_rows=4, lld=True)
    train, records = train_records(small_config)
    assert undocumented(records) == set()
    first, second = train
    assert sum(first[f"diag/bucket{b}/token_frac"] for b in range(4)) == pytest.approx(1.0)
    assert first["diag/bucket3/hi"] == 1.0 and first["diag/bucket1/lo"] == 0.25
    assert "diag/grad_norm/all" in first and "diag/grad_norm/all" not in second  # steps 1, 3, ... only
    assert first["diag/grad_norm/all"] > 0 and "diag/grad_norm/bucket0/layer1" in first
    assert first["diag/grad_norm/bucket0"] <= first["diag/grad_norm/all"] + sum(
        first[f"diag/grad_norm/bucket{b}"] for b in range(1, 4)
    )  # triangle inequality of the vector sum
    assert first["diag/lld/groups"] == 2 and math.isfinite(first["diag/lld/delta_mean"])
    assert first["diag/lld/delta_mean"] != 0.0  # the update moved the correct responses
    assert first["timing/diag_s"] >= 0 and first["diag/grad_norm/probe_tokens"] > 0


def test_lld_is_zero_when_no_update_happens(small_config, mixed_rewards, monkeypatch):
    replace_section(small_config, "train", steps=1)
    replace_section(small_config, "diagnostics", lld=True, lld_epsilon=-1e-4)

    def no_update(spec, policy, optimizer, ctx):
        return UpdateRecord(metrics={}, clipped_BT=torch.zeros_like(spec.batch.old_logp_BT, dtype=torch.bool))

    monkeypatch.setattr(loop, "run_update", no_update)
    (train,), _ = train_records(small_config)
    assert train["diag/lld/groups"] == 2
    assert abs(train["diag/lld/delta_mean"]) < 1e-5 and train["diag/lld/frac_below_eps"] == 0.0


def test_diagnostics_off_logs_no_diag_keys(small_config):
    replace_section(small_config, "train", steps=1)
    replace_section(small_config, "diagnostics", bucket_stats=False)
    (train,), _ = train_records(small_config)
    assert not [k for k in train if k.startswith("diag/")]
