"""The grid's small multiples: 95% t intervals over seeds, rows paired with their baselines, missing data named."""

import pytest

from tokenbalance.ablate.curves import METRICS, Metric, compared_rows, curves_figure, ema, reward_curves, seed_band
from tokenbalance.ablate.grid import Cell, GridPlan, grid_method, grid_preset
from tokenbalance.ablate.results import CellResult
from tokenbalance.ablate.stats import mean_ci

REWARD = Metric("reward/mean", "train", "reward", "reward")
ACC = Metric("eval/greedy/acc", "eval", "acc", "acc")


def cell_result(row: str, seed: int, rewards: list[float], accs: list[float], complete: bool = True) -> CellResult:
    train = [{"step": s + 1, "reward/mean": v} for s, v in enumerate(rewards)]
    evals = [{"step": 10 * s, "eval/greedy/acc": v} for s, v in enumerate(accs)]
    return CellResult(Cell(grid_method(row), seed), "completed", complete, evals[0], evals[-1], train, evals)


def test_the_band_is_the_mean_and_its_t_interval_over_complete_seeds_of_the_smoothed_series():
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
    # two seeds: t_{0.975, 1} = 12.706, sd = |a - b| / sqrt(2), half-width = t * sd / sqrt(2) = t * |a - b| / 2
    half = [12.7062047361747 * abs(a - b) / 2 for a, b in zip(first, second)]
    assert band.low == pytest.approx([m - h for m, h in zip(band.mean, half)], rel=1e-9)
    assert band.high == pytest.approx([m + h for m, h in zip(band.mean, half)], rel=1e-9)
    evals = seed_band(results, "grpo", ACC)  # evaluations are drawn as measured, not smoothed
    assert evals is not None and evals.steps == [0, 10] and evals.mean == pytest.approx([0.3, 0.3])
    assert evals.high == pytest.approx([0.3 + 12.7062047361747 * 0.1] * 2, rel=1e-9)
    assert seed_band(results, "lopti", REWARD) is None
    one = seed_band(results, "ar", REWARD)  # one seed: no interval
    assert one is not None and one.low == one.mean == one.high == [5.0]


def test_a_three_seed_band_is_the_95_percent_t_interval_of_the_mean():
    accs = [[0.2, 0.2], [0.4, 0.6], [0.9, 0.7]]  # per seed, at steps 0 and 10
    band = seed_band([cell_result("grpo", s, [0.0], a) for s, a in enumerate(accs)], "grpo", ACC)
    # step 0: mean 0.5, sd sqrt((0.09 + 0.01 + 0.16) / 2) = 0.3606, t_{0.975, 2} = 4.3027: 0.5 -+ 0.8957
    # step 10: mean 0.5, sd sqrt((0.09 + 0.01 + 0.04) / 2) = 0.2646: 0.5 -+ 0.6572
    assert band is not None and band.seeds == 3 and band.mean == pytest.approx([0.5, 0.5], abs=1e-12)
    assert band.low == pytest.approx([0.5 - 0.895669, 0.5 - 0.657241], abs=1e-6)
    assert band.high == pytest.approx([0.5 + 0.895669, 0.5 + 0.657241], abs=1e-6)
    half = mean_ci([0.2, 0.4, 0.9]).half_width  # the report's interval, the same numbers
    assert band.high[0] - band.mean[0] == pytest.approx(half, rel=1e-12)


def test_the_legend_says_what_the_band_is_and_a_one_seed_row_has_none():
    rows = tuple(grid_method(k) for k in ("grpo", "ar"))
    plan = GridPlan(grid_preset("kk-smoke"), rows, (0, 1), 4, ())
    results = [
        cell_result("grpo", 0, [0.1, 0.2], [0.3, 0.4]),
        cell_result("grpo", 1, [0.2, 0.4], [0.3, 0.5]),
        cell_result("ar", 0, [0.1, 0.3], [0.3, 0.5]),
    ]
    fig = curves_figure(plan, results)
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [
        "line: mean over the row's seeds",
        "band: 95% t interval of the mean",
        "grey: GRPO, the baseline (2 seeds)",
    ]
    first = fig.axes[0]
    assert first.get_title() == "+ AR\n(1 seed)" and len(first.collections) == 1  # the baseline's band only
    assert [ax.get_ylabel() for ax in fig.axes] == [m.name + (f"\n({m.unit})" if m.unit else "") for m in METRICS]


def test_every_non_baseline_row_is_drawn_against_its_baseline(tmp_path):
    rows = tuple(grid_method(k) for k in ("grpo", "ar_lopti", "rpp", "rpp_ar"))
    plan = GridPlan(grid_preset("kk-smoke"), rows, (0,), 4, ())
    pairs = [(row.key, None if base is None else base.key) for _, row, base in compared_rows(plan)]
    assert pairs == [("ar_lopti", "grpo"), ("rpp_ar", "rpp")]
    results = [cell_result("grpo", 0, [0.1, 0.2], [0.3, 0.4]), cell_result("ar_lopti", 0, [0.1, 0.3], [0.3, 0.5])]
    path = reward_curves(plan, results, tmp_path / "curves.png")  # rpp rows have no data: drawn as such
    assert path.read_bytes().startswith(b"\x89PNG") and len(METRICS) == 6


@pytest.mark.parametrize("rows", [("grpo", "ar_lopti"), ("grpo", "ar", "lopti", "ar_lopti")])
def test_the_key_fits_inside_a_narrow_figure(rows):
    plan = GridPlan(grid_preset("kk-smoke"), tuple(grid_method(k) for k in rows), (0,), 4, ())
    results = [cell_result(k, 0, [0.1, 0.2], [0.3, 0.4]) for k in rows]
    fig = curves_figure(plan, results)
    fig.canvas.draw()
    key = fig.legends[0].get_window_extent()
    assert fig.get_figwidth() >= 4.5
    assert 0 <= key.x0 and key.x1 <= fig.bbox.width  # nothing of the key cut off at either side
