"""A finished run kept as a record and restored: its files (the per-example outcomes where the run
wrote them), and a record of another experiment is never replaced."""

from tokenbalance.config import RunConfig, apply_overrides, load_config, save_config
from tokenbalance.run import records
from tokenbalance.run.records import keep, restore
from tokenbalance.run.state import EVAL_OUTCOMES
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
    assert (kept / "grpo-seed0" / "metrics.jsonl").read_text() == "{}\n"
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
