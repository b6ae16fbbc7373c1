"""The grid's small multiples: bands over seeds, rows paired with their baselines, missing data named."""

import pytest

from tokenbalance.ablate.curves import METRICS, Metric, compared_rows, ema, reward_curves, seed_band
from tokenbalance.ablate.grid import Cell, GridPlan, grid_method, grid_preset
from tokenbalance.ablate.results import CellResult

REWARD = Metric("reward/mean", "train", "reward", "reward")
ACC = Metric("eval/greedy/acc", "eval", "acc", "acc")


def cell_result(row: str, seed: int, rewards: list[float], accs: list[float], complete: bool = True) -> CellResult:
    train = [{"step": s + 1, "reward/mean": v} for s, v in enumerate(rewards)]
    evals = [{"step": 10 * s, "eval/greedy/acc": v} for s, v in enumerate(accs)]
    return CellResult(Cell(grid_method(row), seed), "completed", complete, evals[0], evals[-1], train, evals)


def test_the_band_is_the_mean_and_range_over_complete_seeds_of_the_smoothed_series():
    results = [
        cell_result("grpo", 0, [0.0, 1.0, 1.0], [0.2, 0.4]),
        cell_result("grpo", 1, [1.0, 1.0], [0.4, 0.2]),  # logged two steps: the band keeps steps 1 and 2
        cell_result("grpo", 2, [9.0, 9.0, 9.0], [0.9, 0.9], complete=False),  # not complete: left out
        cell_result("ar", 0, [5.0], [0.5]),
    ]
    band = seed_band(results, "grpo", REWARD)
    first, second = ema([0.0, 1.0, 1.0]), ema([1.0, 1.0])
    assert band is not None and band.seeds == 2 and band.steps == [1, 2]
    assert band.mean == pytest.approx([(first[0] + second[0]) / 2, (first[1] + second[1]) / 2], abs=1e-12)
    assert band.low == [first[0], first[1]] and band.high == [second[0], second[1]]
    evals = seed_band(results, "grpo", ACC)  # evaluations are drawn as measured, not smoothed
    assert evals is not None and evals.steps == [0, 10] and evals.mean == pytest.approx([0.3, 0.3])
    assert (evals.low, evals.high) == ([0.2, 0.2], [0.4, 0.4])
    assert seed_band(results, "lopti", REWARD) is None


def test_every_non_baseline_row_is_drawn_against_its_baseline(tmp_path):
    rows = tuple(grid_method(k) for k in ("grpo", "ar_lopti", "rpp", "rpp_ar"))
    plan = GridPlan(grid_preset("kk-smoke"), rows, (0,), 4, ())
    pairs = [(row.key, None if base is None else base.key) for _, row, base in compared_rows(plan)]
    assert pairs == [("ar_lopti", "grpo"), ("rpp_ar", "rpp")]
    results = [cell_result("grpo", 0, [0.1, 0.2], [0.3, 0.4]), cell_result("ar_lopti", 0, [0.1, 0.3], [0.3, 0.5])]
    path = reward_curves(plan, results, tmp_path / "curves.png")  # rpp rows have no data: drawn as such
    assert path.read_bytes().startswith(b"\x89PNG") and len(METRICS) == 6
