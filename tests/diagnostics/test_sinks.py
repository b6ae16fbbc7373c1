"""Metric sinks: JSONL always; TensorBoard and W&B (offline) receive the same values."""

import json
import math

import pytest

from tokenbalance.commands.diagnose import _write_json
from tokenbalance.diagnostics.plots import load_run
from tokenbalance.diagnostics.sinks import MetricsLog, dump_json, read_metrics, restore_non_finite


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


def test_both_writers_write_non_finite_numbers_as_null(tmp_path):
    values = {"a/nan": float("nan"), "a/inf": float("inf"), "a/neg_inf": -float("inf"), "a/ok": 0.5}
    MetricsLog(tmp_path).log(4, "eval", values)
    line = (tmp_path / "metrics.jsonl").read_text().splitlines()[-1]
    assert json.loads(line) == {"step": 4, "kind": "eval", "a/nan": None, "a/inf": None, "a/neg_inf": None, "a/ok": 0.5}
    assert "NaN" not in line and "Infinity" not in line

    out = tmp_path / "diagnose.json"
    _write_json(str(out), {"buckets": [{"dp_mean": float("nan"), "n": 3}], "edges": (0.0, float("inf"))})
    assert json.loads(out.read_text()) == {"buckets": [{"dp_mean": None, "n": 3}], "edges": [0.0, None]}
    assert dump_json({"x": [float("-inf")]}) == '{"x": [null]}'


def test_reader_turns_null_and_old_nan_strings_into_floats(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "kind": "train", "a": null, "b": 0.25}\n'
        '{"step": 2, "kind": "train", "a": "nan", "b": "inf", "c": "-inf"}\n'  # files written before null
    )
    new, old = read_metrics(path)
    assert math.isnan(new["a"]) and new["b"] == 0.25 and new["kind"] == "train"
    assert math.isnan(old["a"]) and old["b"] == math.inf and old["c"] == -math.inf
    run = load_run(tmp_path)
    steps, values = run.series("a")
    assert steps == [1.0, 2.0] and all(math.isnan(v) for v in values)
    assert run.series("b") == ([1.0, 2.0], [0.25, math.inf]) and run.mean("b") == 0.25
    assert restore_non_finite({"x": [None, "inf", "text", 1]})["x"][1:] == [math.inf, "text", 1]


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


def test_wandb_project_entity_name_and_mode_come_from_the_config(tmp_path, monkeypatch):
    import wandb

    seen = {}

    class Run:
        def log(self, *args, **kwargs):
            pass

        def finish(self):
            pass

    def init(**kwargs):
        seen.update(kwargs)
        return Run()

    monkeypatch.setattr(wandb, "init", init)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    options = {"project": "p", "entity": "team", "name": None, "mode": "online"}
    MetricsLog(tmp_path, wandb=True, run_name="run-a", config={}, wandb_options=options).close()
    assert {k: seen[k] for k in ("project", "entity", "name", "mode")} == {
        "project": "p",
        "entity": "team",
        "name": "run-a",  # the run directory's name when none is given
        "mode": "online",
    }
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the environment wins
    MetricsLog(tmp_path, wandb=True, run_name="run-a", config={}, wandb_options=options | {"name": "n"}).close()
    assert (seen["mode"], seen["name"]) == ("disabled", "n")
