"""The step-count control's pre-registered analysis (docs/preregistration/step-count-control.md) on hand-made cells
with known answers: the pooled start-policy means and their 7-df interval, a dropped pair, the late-entropy mean,
the decision rule's outcomes and the report's withheld decision while cells are missing."""

import math
import statistics

import pytest

from tokenbalance.ablate.grid import GRID_METHODS, Cell, grid_preset
from tokenbalance.ablate.results import CellResult
from tokenbalance.ablate.stats import Estimate
from tokenbalance.ablate.step_control import (
    PRIMARY,
    PRIMARY_KEY,
    SEEDS,
    Condition,
    ContrastResult,
    contrast_result,
    decision,
    final_accuracy,
    late_mean,
    report_markdown,
)

SAME = {"start_policy": "a" * 64, "prompt_order": "b" * 64, "eval_set": "c" * 64}
# grpo_2step - grpo per seed; seeds s and s + 4 share start policy 4 + s % 4
GAIN_A = {8: 0.01, 12: 0.03, 9: 0.02, 13: 0.02, 10: 0.00, 14: 0.02, 11: 0.03, 15: 0.01}  # policy means .02 .02 .01 .02
GAIN_B = {8: 0.03, 12: 0.03, 9: 0.00, 13: 0.02, 10: 0.02, 14: 0.02, 11: 0.01, 15: 0.03}  # policy means .03 .01 .02 .02


def cell(row, seed, accuracy, fingerprints=SAME, entropy=None):
    first = {"step": 0, "kind": "eval", PRIMARY_KEY: 0.4}
    last = {"step": 100, "kind": "eval", PRIMARY_KEY: accuracy, "eval/greedy/acc": accuracy}
    train = [{"step": s, "loss/entropy": entropy(s)} for s in range(1, 101)] if entropy else []
    return CellResult(
        Cell(GRID_METHODS[row], seed), "completed", True, first, last, train, [first, last], {}, fingerprints
    )


def condition(name, gain, moved=()):
    results = []
    for seed in SEEDS:
        results += [cell("grpo", seed, 0.5), cell("grpo_2step", seed, 0.5 + gain[seed])]
        prints = {**SAME, "start_policy": "f" * 64} if seed in moved else SAME
        results += [cell("lopti", seed, 0.5 + gain[seed], prints), cell("ar_lopti", seed, 0.5 + gain[seed])]
    return Condition(name, results, grid_preset(name).policy_seed)


def test_the_pooled_contrast_is_over_the_eight_start_policy_means():
    conditions = [condition("arith-steps", GAIN_A), condition("arith-steps-wording", GAIN_B)]
    c1 = contrast_result(conditions, PRIMARY[0], final_accuracy(PRIMARY_KEY))
    means = [0.02, 0.02, 0.01, 0.02, 0.03, 0.01, 0.02, 0.02]
    assert c1.pooled.n == 8 and c1.pooled.mean == pytest.approx(statistics.mean(means))
    half = 2.3646243 * statistics.stdev(means) / math.sqrt(8)  # t_0.975 with 7 df
    assert c1.pooled.half_width == pytest.approx(half, rel=1e-6)
    assert c1.per_condition["arith-steps"].n == 4 and c1.per_seed["arith-steps"].n == 8
    assert c1.per_condition["arith-steps-wording"].mean == pytest.approx(0.02)
    assert c1.p < 0.001 and not c1.dropped


def test_an_unpaired_cell_drops_its_pair_and_its_policy_rests_on_the_other_seed():
    conditions = [condition("arith-steps", GAIN_A), condition("arith-steps-wording", GAIN_B, moved={9})]
    c2 = contrast_result(conditions, PRIMARY[1], final_accuracy(PRIMARY_KEY))  # + Lopti - GRPO two steps: all 0
    assert c2.dropped == ("arith-steps-wording seed 9: start policy differs (ffffffffffff vs aaaaaaaaaaaa)",)
    assert c2.pooled.n == 8 and c2.per_seed["arith-steps-wording"].n == 7 and c2.pooled.mean == 0.0


def test_late_entropy_is_the_mean_over_steps_91_to_100():
    results = [cell("grpo", 8, 0.5, entropy=lambda s: s / 1000), cell("grpo", 9, 0.5, entropy=lambda s: 0.2)]
    values = late_mean("loss/entropy", range(91, 101))(results, "grpo")
    assert values == {8: pytest.approx(0.0955), 9: pytest.approx(0.2)}
    short = cell("grpo", 10, 0.5, entropy=lambda s: 0.1)
    short.train = short.train[:95]  # steps 96-100 not logged: no value rather than a mean of fewer steps
    assert late_mean("loss/entropy", range(91, 101))([short], "grpo") == {}


def outcome(name, mean, holm_p):
    estimate = Estimate(8, mean, 0.01, 0.008)
    return ContrastResult(next(c for c in PRIMARY if c.name == name), estimate, {}, {}, (), holm_p, holm_p)


@pytest.mark.parametrize(
    ("c1", "c2", "c3", "expected"),
    [
        ((0.01, 0.01), (0.0, 0.9), (0.0, 0.9), "the effect is the second step"),
        ((0.0, 0.9), (0.01, 0.02), (0.0, 0.9), "it is the split"),
        ((0.0, 0.9), (0.0, 0.9), (0.01, 0.04), "it is the split"),
        ((0.01, 0.01), (0.0, 0.9), (0.01, 0.03), "both contribute"),
        ((0.01, 0.06), (0.01, 0.07), (0.0, 0.9), "not attributable at this design's power"),
        ((-0.01, 0.01), (0.0, 0.9), (0.0, 0.9), "none of the pre-registered outcomes: significant harm in C1"),
        (
            (-0.01, 0.01),
            (0.01, 0.01),
            (0.0, 0.9),
            "none of the pre-registered outcomes: significant harm in C1 with a split gain",
        ),
    ],
)
def test_the_decision_rule(c1, c2, c3, expected):
    assert decision([outcome("C1", *c1), outcome("C2", *c2), outcome("C3", *c3)]) == expected


def test_the_rule_needs_all_three_contrasts():
    with pytest.raises(ValueError, match="needs C1, C2 and C3"):
        decision([outcome("C1", 0.01, 0.01)])


def test_the_report_withholds_the_decision_until_every_cell_is_complete():
    conditions = [condition("arith-steps", GAIN_A), condition("arith-steps-wording", GAIN_B)]
    report = report_markdown(conditions)
    assert "Cells complete: 64 of 64" in report and "**Decision: the effect is the second step.**" in report
    assert "| C1: GRPO, two steps (random halves) - GRPO | +0.019 [" in report and "(df 7)" in report
    conditions[1].results[0] = CellResult(Cell(GRID_METHODS["grpo"], 8), "not started")
    partial = report_markdown(conditions)
    assert "Cells complete: 63 of 64" in partial and "Decision: withheld" in partial and "**Decision" not in partial
    assert "arith-steps-wording/grpo-seed8 (not started)" in partial


def load_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "step_control_report.py"
    spec = importlib.util.spec_from_file_location("step_control_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_refuses_a_missing_records_folder_and_a_file_it_did_not_write(tmp_path, capsys):
    script = load_script()
    assert script.main(["--records", str(tmp_path / "none")]) == 2
    assert "no records folder" in capsys.readouterr().err
    for name in ("arith-steps", "arith-steps-wording"):
        (tmp_path / "records" / name / "records").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "analysis.md").write_text("the user's notes\n")
    assert script.main(["--records", str(tmp_path / "records"), "--out", str(tmp_path / "out")]) == 2
    assert (tmp_path / "out" / "analysis.md").read_text() == "the user's notes\n"
    assert script.main(["--records", str(tmp_path / "records"), "--out", str(tmp_path / "new")]) == 0
    written = (tmp_path / "new" / "analysis.md").read_text()
    assert "Cells complete: 0 of 64" in written and "Decision: withheld" in written
