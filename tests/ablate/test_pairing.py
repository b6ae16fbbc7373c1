"""Pairing by fingerprint (issue 56): two cells of a seed are compared only when their fingerprints agree; a record
without one pairs with nothing (or, asked for, by its step-0 evaluation); the report names every dropped pair. And
the report's statistics: the interval over start-policy means and Holm's correction, on hand-made tables."""

import math

import pytest

from tokenbalance.ablate.grid import GRID_METHODS, GRID_PRESETS, Cell, make_plan
from tokenbalance.ablate.report import accuracy_rows, pairing_summary
from tokenbalance.ablate.results import CellResult, pair_problem, require_pair, row_pairs
from tokenbalance.ablate.stats import cluster_difference, holm_adjusted, mean_ci, t_test_p
from tokenbalance.run.fingerprints import pairing_mismatch

PRINT_A = {"start_policy": "a" * 64, "prompt_order": "b" * 64, "eval_set": "c" * 64}
PRINT_B = {**PRINT_A, "start_policy": "d" * 64}


def cell(row: str, seed: int, accuracy: float, fingerprints=PRINT_A, start: float = 0.5) -> CellResult:
    first = {"step": 0, "kind": "eval", "eval/sample/acc": start}
    last = {"step": 100, "kind": "eval", "eval/sample/acc": accuracy}
    return CellResult(
        Cell(GRID_METHODS[row], seed), "completed", True, first, last, [], [first, last], {}, fingerprints
    )


def test_cells_from_different_start_policies_refuse_to_pair_naming_both():
    grpo, ar_lopti = cell("grpo", 1, 0.5), cell("ar_lopti", 1, 0.6, PRINT_B)
    with pytest.raises(ValueError, match=r"^ar_lopti-seed1 and grpo-seed1 are not a pair: start policy differs "):
        require_pair(ar_lopti, grpo)
    assert pair_problem(ar_lopti, grpo) == "start policy differs (dddddddddddd vs aaaaaaaaaaaa)"
    require_pair(cell("ar_lopti", 1, 0.6), grpo)  # the same fingerprints: a pair
    other_order = {**PRINT_A, "prompt_order": "e" * 64}
    assert pairing_mismatch(PRINT_A, other_order).startswith("prompt order differs")


def test_a_record_without_fingerprints_is_unpaired_unless_step0_pairing_is_asked_for():
    grpo, old = cell("grpo", 0, 0.5), cell("ar_lopti", 0, 0.6, None)
    assert pair_problem(old, grpo) == "no fingerprints in the first (a record of older code)"
    assert pair_problem(old, grpo, "step0") is None  # the same step-0 evaluation
    moved = cell("ar_lopti", 0, 0.6, None, start=0.49)
    assert pair_problem(moved, grpo, "step0") == "no fingerprints, and the step-0 evaluations differ"
    assert pair_problem(moved, grpo, "launch") is None  # a verl grid pairs by its launch


def test_the_report_drops_unpaired_seeds_and_names_them():
    plan = make_plan(GRID_PRESETS["arith-decisions"], methods=["grpo", "ar_lopti"], seeds=[0, 1, 2, 3])
    results = [cell("grpo", s, 0.50 + 0.01 * s) for s in range(4)]
    results += [cell("ar_lopti", 0, 0.53), cell("ar_lopti", 1, 0.54), cell("ar_lopti", 2, 0.90, PRINT_B)]
    results += [cell("ar_lopti", 3, 0.56, None)]
    assert row_pairs(results, "ar_lopti", "grpo").seeds == (0, 1)
    entry = next(
        e for e in accuracy_rows(plan, results, "sample") if e["row"].key == "ar_lopti" and e["column"].endswith("acc")
    )
    assert entry["difference"].n == 2 and entry["difference"].mean == pytest.approx(0.03)  # seeds 0, 1 only
    assert [seed for seed, _ in entry["dropped"]] == [2, 3]
    line = pairing_summary(plan, results, "fingerprint")
    assert "+ AR + Lopti vs GRPO: seed 2: start policy differs" in line
    assert "seed 3: no fingerprints in the first (a record of older code)" in line


def test_the_interval_over_start_policy_means_by_hand():
    # seeds 0 and 4 share start policy 0, 1 and 5 policy 1: differences 0.02, 0.04 | 0.00, 0.02 -> means 0.03, 0.01
    method = {0: 0.52, 4: 0.54, 1: 0.50, 5: 0.52}
    baseline = {0: 0.50, 4: 0.50, 1: 0.50, 5: 0.50}
    clustered = cluster_difference(method, baseline, lambda seed: seed % 4)
    assert clustered.n == 2 and clustered.mean == pytest.approx(0.02)
    # sd of (0.03, 0.01) = 0.01414; t_0.975,1 = 12.706; half-width 12.706 * 0.01414 / sqrt(2) = 0.12706
    assert clustered.half_width == pytest.approx(0.127062, rel=1e-4)
    one_policy = cluster_difference(method, baseline, lambda seed: 0)
    assert one_policy.n == 1 and math.isnan(one_policy.half_width)  # one start policy gives no interval


def test_holm_and_the_t_test_by_hand():
    # p = 0.01, 0.04, 0.03 -> ranked 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> 0.06 (kept non-decreasing)
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    adjusted = holm_adjusted([0.2, math.nan])
    assert adjusted[0] == pytest.approx(0.2) and math.isnan(adjusted[1])  # NaN: not counted in m
    assert holm_adjusted([0.6, 0.5]) == pytest.approx([1.0, 1.0])  # capped at 1
    # 1, 2, 3, 4: mean 2.5, sd 1.29099, t = 3.87298 on 3 df -> two-sided p = 0.030466 (tables)
    assert t_test_p(mean_ci([1.0, 2.0, 3.0, 4.0])) == pytest.approx(0.030466, rel=1e-4)


def test_the_step_control_compares_lopti_with_the_two_step_row():
    plan = make_plan(GRID_PRESETS["arith-steps"])
    baselines = {m.key: m.baseline for m in plan.methods}
    assert baselines == {"grpo": None, "grpo_2step": "grpo", "lopti": "grpo_2step", "ar_lopti": "grpo_2step"}
    assert plan.seeds == tuple(range(8, 16))
    assert [plan.preset.policy_seed(s) for s in plan.seeds] == [4, 5, 6, 7, 4, 5, 6, 7]
