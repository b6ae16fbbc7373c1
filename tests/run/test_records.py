"""A finished run kept as a record and restored: its files (the per-example outcomes where the run
wrote them), and a record of another experiment is never replaced."""

import gzip
import json
from pathlib import Path

import pytest

from tokenbalance.config import RunConfig, apply_overrides, load_config, save_config
from tokenbalance.diagnostics.plots import load_run
from tokenbalance.diagnostics.sinks import read_metrics_text
from tokenbalance.outputs import record_written
from tokenbalance.run import records
from tokenbalance.run.records import keep, restore
from tokenbalance.run.state import EVAL_OUTCOMES, has_final_eval
from tokenbalance.trainer.evaluate import append_outcomes, read_outcomes


def responses(mode, correct):
    return [
        {"mode": mode, "data_source": "arith", "difficulty": 1, "index": i, "correct": c} for i, c in enumerate(correct)
    ]


def test_keeping_a_record_never_replaces_one_another_grid_wrote_meanwhile(tmp_path):
    """Two grids sharing ``--records`` at the same time: a record of another config that appeared
    after this grid's check is kept, and this cell's record is not written (a note says so)."""
    cell = tmp_path / "cells" / "grpo-seed0"
    cell.mkdir(parents=True)
    save_config(RunConfig(), cell / "config.yaml")
    (cell / "metrics.jsonl").write_text("{}\n")
    (cell / "run_state.json").write_text('{"status": "completed"}\n')
    kept = tmp_path / "records"
    assert records.keep(cell, kept, "grpo-seed0") is None
    assert read_metrics_text(kept / "grpo-seed0" / "metrics.jsonl.gz") == "{}\n"
    save_config(apply_overrides(RunConfig(), ["optim.lr=0.02"]), kept / "grpo-seed0" / "config.yaml")
    note = records.keep(cell, kept, "grpo-seed0")
    assert note is not None and "is the record of another config (optim.lr: 0.02 there," in note
    assert note.endswith("it is kept and this cell's record is not written there")
    assert load_config(kept / "grpo-seed0" / "config.yaml").optim.lr == 0.02


def test_records_carry_the_outcomes_where_a_cell_wrote_them(tmp_path):
    for cell, with_outcomes in (("new-seed0", True), ("old-seed0", False)):
        run = tmp_path / "runs" / cell
        run.mkdir(parents=True)
        save_config(RunConfig(), run / "config.yaml")
        for name in ("metrics.jsonl", "run_state.json"):
            (run / name).write_text(f"{name} of {cell}\n")
        if with_outcomes:
            append_outcomes(run, 4, responses("greedy", [True, False]))
        keep(run, tmp_path / "records", cell)
        restore(tmp_path / "records" / cell, tmp_path / "restored" / cell)
        assert (tmp_path / "restored" / cell / EVAL_OUTCOMES).is_file() == with_outcomes
        assert (tmp_path / "restored" / cell / "metrics.jsonl").read_text() == f"metrics.jsonl of {cell}\n"
    assert read_outcomes(tmp_path / "restored" / "new-seed0")[(4, "greedy")]["correct"] == "10"


def finished_cell(run: Path, metrics: str) -> Path:
    """A completed cell of the default config in ``run`` whose ``metrics.jsonl`` is ``metrics``."""
    run.mkdir(parents=True)
    save_config(RunConfig(), run / "config.yaml")
    (run / "metrics.jsonl").write_text(metrics)
    (run / "run_state.json").write_text('{"status": "completed", "step": 2}\n')
    return run


METRICS = "".join(
    json.dumps({"kind": kind, "step": step, "reward/mean": step / 4, "eval/greedy/acc": 0.5}) + "\n"
    for step in range(3)
    for kind in ("train", "eval")
)


def test_a_record_keeps_its_metrics_compressed_and_restores_them_as_they_were(tmp_path):
    cell = finished_cell(tmp_path / "cells" / "grpo-seed0", METRICS)
    assert keep(cell, tmp_path / "records", "grpo-seed0") is None
    record = tmp_path / "records" / "grpo-seed0"
    assert sorted(p.name for p in record.iterdir()) == ["config.yaml", "metrics.jsonl.gz", "run_state.json"]
    compressed = (record / "metrics.jsonl.gz").read_bytes()
    assert gzip.decompress(compressed).decode() == METRICS
    assert len(compressed) < len(METRICS.encode())
    assert keep(cell, tmp_path / "records", "grpo-seed0") is None
    assert (record / "metrics.jsonl.gz").read_bytes() == compressed  # no time stamp: the same text, the same bytes
    restore(record, tmp_path / "restored")
    assert (tmp_path / "restored" / "metrics.jsonl").read_text() == METRICS
    # a record reads as its run does (the report, the figures)
    assert load_run(record).eval == load_run(cell).eval and load_run(record).train == load_run(cell).train
    assert has_final_eval(record, 2) and not has_final_eval(record, 3)


def test_a_record_of_an_older_version_with_plain_metrics_still_counts_and_is_replaced_whole(tmp_path):
    cell = finished_cell(tmp_path / "cells" / "grpo-seed0", METRICS)
    older = finished_cell(tmp_path / "records" / "grpo-seed0", METRICS)  # as keep wrote it before compression
    record_written(tmp_path / "records", ["grpo-seed0"])
    config = load_config(cell / "config.yaml")
    config.train.steps = 2
    assert records.record_matches(older, config)
    restore(older, tmp_path / "restored")
    assert (tmp_path / "restored" / "metrics.jsonl").read_text() == METRICS
    assert keep(cell, tmp_path / "records", "grpo-seed0") is None
    # the plain copy goes with it: two metrics files could disagree
    assert sorted(p.name for p in older.iterdir()) == ["config.yaml", "metrics.jsonl.gz", "run_state.json"]
    assert records.record_matches(older, config)


def test_a_damaged_compressed_record_is_named_not_read_around(tmp_path):
    cell = finished_cell(tmp_path / "cells" / "grpo-seed0", METRICS)
    keep(cell, tmp_path / "records", "grpo-seed0")
    path = tmp_path / "records" / "grpo-seed0" / "metrics.jsonl.gz"
    path.write_bytes(path.read_bytes()[:-12])  # cut short
    with pytest.raises(ValueError, match=r"metrics.jsonl.gz: not a complete gzip file .*the file is damaged"):
        load_run(path.parent)
