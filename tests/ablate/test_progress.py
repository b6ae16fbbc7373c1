"""The grid's time-left estimate: seconds per step from finished cells, and from running cells until a row has one."""

import pytest

from tokenbalance.ablate.progress import StepRates


def test_nothing_measured_gives_no_estimate():
    rates = StepRates()
    rates.note_running("grpo-seed0", "grpo", 30.0, 0)  # started, no step yet
    assert rates.rate("grpo") is None and rates.seconds_left([("grpo", 10)]) is None


def test_running_cells_estimate_until_a_row_has_a_finished_cell():
    rates = StepRates()
    rates.note_running("grpo-seed0", "grpo", 400.0, 4)  # 100 s a step so far
    rates.note_running("ar_lopti-seed0", "ar_lopti", 600.0, 3)  # 200 s a step
    assert rates.rate("grpo") == 100.0 and rates.rate("ar_lopti") == 200.0
    assert rates.rate("nthr") == 150.0  # a row not running: the mean over the rows running
    assert rates.seconds_left([("grpo", 46), ("ar_lopti", 47)]) == pytest.approx(46 * 100 + 47 * 200)
    rates.add("grpo", 5000.0, 50)  # a finished grpo cell: 100 s a step, evaluations included
    rates.note_running("grpo-seed1", "grpo", 300.0, 1)
    assert rates.rate("grpo") == 100.0  # finished cells outrank running ones
    assert rates.rate("ar_lopti") == 200.0  # its own running cell outranks other rows' finished ones
    rates.forget_running("ar_lopti-seed0")
    assert rates.rate("ar_lopti") == 100.0  # now the finished rows' mean
