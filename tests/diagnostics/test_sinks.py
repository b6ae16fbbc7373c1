"""Metric sinks: JSONL always; TensorBoard and W&B (offline) receive the same values."""

import json

import pytest

from tokenbalance.diagnostics.sinks import MetricsLog, read_metrics


def test_jsonl_truncate_and_non_finite(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.log(step, "train", {"loss/total": step / 10})
    log.log(3, "eval", {"eval/greedy/acc": float("nan")})
    log.truncate_after(2)
    log.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in records] == [(1, "train"), (2, "train")]
    assert records[1]["loss/total"] == 0.2
    raw = MetricsLog(tmp_path)
    raw.log(4, "eval", {"x/y": float("inf")})
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["x/y"] == "inf"


def test_tensorboard_receives_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path, tensorboard=True)
    log.log(1, "train", {"loss/total": 0.5, "reward/mean": 2.0})
    log.log(2, "train", {"loss/total": 0.25, "reward/mean": 3.0})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/total")] == [(1, 0.5), (2, 0.25)]


def test_wandb_runs_offline_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog(tmp_path, wandb=True, run_name="unit", config={"seed": 0})
    log.log(1, "train", {"loss/total": 0.5})
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(p.suffix == ".wandb" for p in runs[0].iterdir())


def test_missing_metrics_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="no metrics.jsonl here"):
        read_metrics(tmp_path / "metrics.jsonl")
