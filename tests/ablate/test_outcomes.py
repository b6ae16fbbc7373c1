"""Example-by-example comparisons: the exact McNemar p-value, the outcome lines a run writes and reads
back (the last of a redone evaluation wins), and the report's table of gained / lost examples per
seed (records that carry them: tests/run/test_records.py)."""

import json
import math

import pytest

from tokenbalance.ablate.grid import Cell, GridPlan, grid_method, grid_preset
from tokenbalance.ablate.report import outcomes_markdown
from tokenbalance.ablate.results import CellResult
from tokenbalance.ablate.stats import mcnemar_exact, paired_outcomes
from tokenbalance.run.state import EVAL_OUTCOMES
from tokenbalance.trainer.evaluate import append_outcomes, outcome_lines, read_outcomes


def test_mcnemar_exact_is_the_doubled_binomial_tail():
    assert mcnemar_exact(7, 0) == 2 / 2**7  # the SmolLM2 run's 7 gained, 0 lost: p = 0.016
    assert mcnemar_exact(1, 4) == mcnemar_exact(4, 1) == 2 * (1 + 5) / 2**5
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert math.isclose(mcnemar_exact(20, 5), 2 * sum(math.comb(25, k) for k in range(6)) / 2**25)
    with pytest.raises(ValueError, match="counts must be >= 0"):
        mcnemar_exact(-1, 2)


def test_paired_outcomes_count_what_changed():
    paired = paired_outcomes("0011", "0110")
    assert (paired.examples, paired.gained, paired.lost) == (4, 1, 1) and paired.p_value == 1.0
    with pytest.raises(ValueError, match="4 and 3 examples"):
        paired_outcomes("0011", "001")


def responses(mode, correct):
    return [
        {"mode": mode, "data_source": "arith", "difficulty": 1, "index": i, "correct": c} for i, c in enumerate(correct)
    ]


def test_outcome_lines_and_the_last_of_a_redone_evaluation(tmp_path):
    lines = outcome_lines(5, responses("greedy", [True, False, True]) + responses("sample", [False, False, True]))
    assert [(line["mode"], line["correct"]) for line in lines] == [("greedy", "101"), ("sample", "001")]
    assert lines[0]["examples"] == lines[1]["examples"] and lines[0]["step"] == 5
    other = outcome_lines(5, [dict(r, index=r["index"] + 1) for r in responses("greedy", [True, False, True])])
    assert other[0]["examples"] != lines[0]["examples"]  # other examples, another digest
    append_outcomes(tmp_path, 5, responses("greedy", [False, False, False]))
    append_outcomes(tmp_path, 5, responses("greedy", [True, True, False]))  # redone after a resume
    with open(tmp_path / EVAL_OUTCOMES, "a") as out:
        out.write('{"step": 6, "mo')  # a torn last line
    assert {key: r["correct"] for key, r in read_outcomes(tmp_path).items()} == {(5, "greedy"): "110"}
    assert read_outcomes(tmp_path / "none") == {}


SAME_START = {"start_policy": "a" * 64, "prompt_order": "b" * 64, "eval_set": "c" * 64}


def cell_result(row, seed, final, start="0000", fingerprints=SAME_START):
    digest = "d" * 16
    outcomes = {
        (0, "greedy"): {"examples": digest, "correct": start},
        (4, "greedy"): {"examples": digest, "correct": final},
    }
    return CellResult(Cell(grid_method(row), seed), "completed", True, outcomes=outcomes, fingerprints=fingerprints)


def test_the_report_table_of_gained_and_lost_examples():
    plan = GridPlan(grid_preset("kk-smoke"), (grid_method("grpo"), grid_method("ar_lopti")), (0, 1), 4, ())
    results = [
        cell_result("grpo", 0, "1100"),
        cell_result("ar_lopti", 0, "1011"),
        cell_result("grpo", 1, "0001"),
        cell_result("ar_lopti", 1, "0001"),
    ]
    table = outcomes_markdown(plan, results, "greedy", "greedy decoding")
    assert "| GRPO | start policy (step 0) | 2 / 0 (p = 0.5) | 1 / 0 (p = 1) | 3 / 0 |" in table
    assert "| + AR + Lopti | GRPO | 2 / 1 (p = 1) | 0 / 0 (p = 1) | 2 / 1 |" in table
    assert outcomes_markdown(plan, results, "sample", "sampled") == []  # no outcomes: no table
    results[1].outcomes[(4, "greedy")] = {"examples": "e" * 16, "correct": "1011"}  # other examples: not paired
    table = outcomes_markdown(plan, results, "greedy", "greedy decoding")
    assert "| + AR + Lopti | GRPO | – | 0 / 0 (p = 1) | 0 / 0 |" in table
    assert json.dumps(table)  # plain strings


def test_the_gained_and_lost_table_compares_only_cells_from_one_start():
    plan = GridPlan(grid_preset("kk-smoke"), (grid_method("grpo"), grid_method("ar_lopti")), (0,), 4, ())
    moved = dict(SAME_START, start_policy="f" * 64)  # a start policy rebuilt elsewhere
    results = [cell_result("grpo", 0, "1100"), cell_result("ar_lopti", 0, "1011", fingerprints=moved)]
    table = outcomes_markdown(plan, results, "greedy", "greedy decoding")
    assert "| GRPO | start policy (step 0) | 2 / 0 (p = 0.5) | 2 / 0 |" in table  # a cell against its own start
    assert not any(line.startswith("| + AR + Lopti |") for line in table)
