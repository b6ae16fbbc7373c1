"""The table of a verl grid from its cells' verl logs: sittings merged by step, validation per data
source as the local grid's columns, and the same report (means, CIs over seeds, paired differences)."""

import csv
import json
import math

import pytest
import torch

from tests.tolerances import dtype_atol
from tokenbalance.ablate.verl import results as verl_results
from tokenbalance.ablate.verl.results import evaluation_record, merged_steps
from tokenbalance.cli import main
from tokenbalance.run.cell import cell_status
from tokenbalance.tasks.kk.reward import score_response

GRID = ["ablate", "--runner", "verl", "--preset", "kk-smoke", "--methods", "grpo,ar", "--seeds", "0,1"]
GRID += ["--verl-models", "3b"]
T975_DF1 = 12.706204736174696  # two seeds: t(0.975, 1) = tan(0.475 pi)
ATOL = dtype_atol(torch.float64)
CI_ATOL = dtype_atol(torch.float64, ulps=1024)  # the t quantile is found by bisection to 1e-13 relative


def line(step: int, data: dict) -> str:
    return json.dumps({"step": step, "data": data}, separators=(",", ":")) + "\n"


def validation(acc3: float, acc4: float, samples: int = 1) -> dict:
    return {
        f"val-aux/kk_logic3/correct/mean@{samples}": acc3,
        f"val-aux/kk_logic4/correct/mean@{samples}": acc4,
        f"val-core/kk_logic3/reward/mean@{samples}": -3.0,  # the score: not the accuracy the table reads
        f"val-aux/kk_logic4/score/mean@{samples}": -3.0,
    }


def training(step_s: float) -> dict:
    return {
        "critic/score/mean": -2.5,
        "timing_s/step": step_s,
        "timing_s/gen": 1.0,
        "timing_s/old_log_prob": 0.25,
        "timing_s/ref": 0.5,
        "timing_s/update_actor": 2.0,
    }


# (row, seed) -> accuracy at step 2 per people count (3, 4); every cell of a seed starts at START[seed]
FINAL = {("grpo", 0): (0.5, 0.3), ("grpo", 1): (0.6, 0.2), ("ar", 0): (0.7, 0.4), ("ar", 1): (0.65, 0.35)}
START = {0: (0.1, 0.0), 1: (0.2, 0.1)}


@pytest.fixture
def grid(tmp_path):
    out = tmp_path / "out"
    assert main([*GRID, "--out", str(out)]) == 0
    for (row, seed), (acc3, acc4) in FINAL.items():
        cell = out / "verl" / "cells" / f"{row}-3b-seed{seed}"
        (cell / "STATUS").write_text("completed: sitting 1 on node at 2026-01-01T00:00:00+0000\n")
        text = (
            line(0, validation(*START[seed]))
            + line(1, training(10.0))
            + line(2, training(12.0) | validation(acc3, acc4))
        )
        (cell / "metrics.sitting-1.jsonl").write_text(text)
    return out


def accuracy(out) -> dict:
    with open(out / "verl" / "report-3b" / "accuracy.csv") as table:
        return {(r["mode"], r["row"], r["column"]): r for r in csv.DictReader(table)}


def test_the_table_holds_the_validation_scores_per_people_count_and_their_average(grid, capsys):
    assert main([*GRID, "--out", str(grid), "--report-only"]) == 0
    rows = accuracy(grid)
    assert {mode for mode, _, _ in rows} == {"greedy"}  # mean@1 of a greedy validation
    grpo_3 = rows[("greedy", "grpo", "eval/greedy/acc_3")]
    assert float(grpo_3["mean"]) == pytest.approx((0.5 + 0.6) / 2, abs=ATOL) and grpo_3["seeds"] == "0 1"
    start_avg = rows[("greedy", "start", "eval/greedy/acc")]
    assert float(start_avg["mean"]) == pytest.approx(((0.1 + 0.0) / 2 + (0.2 + 0.1) / 2) / 2, abs=ATOL)
    # + AR vs GRPO on the average, paired by seed: 0.55 - 0.40 and 0.50 - 0.40
    ar = rows[("greedy", "ar", "eval/greedy/acc")]
    assert ar["baseline"] == "grpo" and float(ar["diff_mean"]) == pytest.approx(0.125, abs=ATOL)
    half = T975_DF1 * (0.05 / math.sqrt(2)) / math.sqrt(2)  # sd of (0.15, 0.10) is 0.05 / sqrt(2)
    assert float(ar["diff_ci_low"]) == pytest.approx(0.125 - half, abs=CI_ATOL)
    assert float(ar["relative_change"]) == pytest.approx(0.125 / 0.4, abs=ATOL)
    report = (grid / "verl" / "report-3b" / "results.md").read_text()
    assert "| Method | 3 people | 4 people | Avg | Δ Avg vs baseline [95% CI] | relative | seeds |" in report
    assert "cells complete: 4 of 4" in report and "greedy validation (verl's val_kwargs.do_sample=False" in report
    with open(grid / "verl" / "report-3b" / "step_cost.csv") as table:
        cost = {r["row"]: r for r in csv.DictReader(table)}
    assert float(cost["grpo"]["timing/step_s_mean"]) == pytest.approx(11.0, abs=ATOL)
    assert float(cost["grpo"]["timing/logprob_s_mean"]) == pytest.approx(0.75, abs=ATOL)  # old_log_prob + ref
    assert "# tokenbalance ablate: grid `kk-smoke on verl, 3b`" in capsys.readouterr().out


def test_a_cell_not_completed_is_left_out_and_named(grid):
    cell = grid / "verl" / "cells" / "ar-3b-seed1"
    (cell / "STATUS").write_text("failed at step 3: exit status 1 in sitting 1 on node at t; steps up to 2 logged\n")
    assert main([*GRID, "--out", str(grid), "--report-only"]) == 1  # a planned cell gives no accuracy
    ar = accuracy(grid)[("greedy", "ar", "eval/greedy/acc")]
    assert ar["seeds"] == "0" and float(ar["mean"]) == pytest.approx(0.55, abs=ATOL)
    report = (grid / "verl" / "report-3b" / "results.md").read_text()
    assert "not complete: ar-3b-seed1 (failed at step 3: exit status 1" in report


def test_sittings_merge_by_step_the_later_one_winning(tmp_path):
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "metrics.sitting-1.jsonl").write_text(line(0, {"a": 1.0}) + line(1, {"a": 2.0, "b": 3.0}) + '{"step":2,"da')
    (cell / "metrics.sitting-10.jsonl").write_text(line(2, {"a": 7.0}))
    (cell / "metrics.sitting-2.jsonl").write_text(line(1, {"a": 4.0}) + line(2, {"a": 5.0}))
    # sitting 1's torn last line (a kill mid-write) is left out; 2 then 10 in numeric order
    assert merged_steps(cell) == {0: {"a": 1.0}, 1: {"a": 4.0, "b": 3.0}, 2: {"a": 7.0}}
    (cell / "metrics.sitting-2.jsonl").write_text("not json\n" + line(2, {"a": 5.0}))
    with pytest.raises(ValueError, match=r"metrics.sitting-2.jsonl:1: not a verl metrics line"):
        merged_steps(cell)


def test_a_log_that_is_not_utf8_names_its_file_and_line(tmp_path):
    """A sitting's metrics or a STATUS with bytes that are not UTF-8 (a disk fault, another encoding):
    the metrics file is named with its line, as a damaged line is; the STATUS is shown, not a crash."""
    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "metrics.sitting-1.jsonl").write_bytes(line(0, {"a": 1.0}).encode() + b'{"step":1,"data":{"\xff":1}}\n')
    with pytest.raises(ValueError) as err:
        merged_steps(cell)
    assert (
        str(err.value) == f"{cell / 'metrics.sitting-1.jsonl'}:2: not UTF-8 text (byte 0xff); not a verl metrics file"
    )
    (cell / "STATUS").write_bytes(b"failed at step 3: \xfe\n")
    assert cell_status(cell) == "failed at step 3: \ufffd"


def test_validation_keys_become_columns_per_people_count():
    data = validation(0.25, 0.75) | {"val-aux/kk_logic5/score/mean@1": 1.0, "val-core/arith/correct/mean@1": 0.5}
    assert evaluation_record(4, data, do_sample=False) == {
        "step": 4,
        "eval/greedy/acc_3": 0.25,
        "eval/greedy/acc_4": 0.75,
        "eval/greedy/acc": 0.5,
    }
    assert evaluation_record(4, validation(0.25, 0.75), do_sample=True)["eval/sample/acc"] == 0.5
    assert evaluation_record(4, validation(0.25, 0.75, samples=8), do_sample=False)["eval/sample/acc_3"] == 0.25
    assert evaluation_record(4, training(1.0), do_sample=False) == {}


def test_the_table_reads_the_accuracy_the_kk_reward_gives_verl():
    """The verl reward (integrations/verl/reward.py) returns the score and ``KKScore.metrics()``."""
    gold = {"solution_text_format": "(1) Zoey is a knight\n(2) Oliver is a knave"}
    assert verl_results.ACCURACY_VARIABLE in score_response("no answer", gold).metrics()


def test_each_unusable_cell_says_why_and_the_report_exits_1(grid, capsys):
    cells = grid / "verl" / "cells"
    (cells / "ar-3b-seed1" / "metrics.sitting-1.jsonl").write_text(line(1, training(1.0)) + line(2, training(1.0)))
    text = line(0, validation(0.1, 0.0)) + line(1, training(1.0) | validation(0.2, 0.1)) + line(2, training(1.0))
    (cells / "grpo-3b-seed1" / "metrics.sitting-1.jsonl").write_text(text)
    (cells / "ar-3b-seed0" / "STATUS").write_text("not started\n")
    assert main([*GRID, "--out", str(grid), "--report-only"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cells without a final accuracy: 3: ar-3b-seed0 (not started); grpo-3b-seed1 (completed, but")
    report = (grid / "verl" / "report-3b" / "results.md").read_text()
    assert "grpo-3b-seed1 (completed, but its last validation is at step 1, not at its last training step 2" in report
    assert "ar-3b-seed1 (completed, but its logs hold no validation of `correct` per data source" in report
    assert "ar-3b-seed0 (not started)" in report


def test_cells_of_two_models_that_trained_one_model_path_are_unusable(tmp_path, capsys):
    out = tmp_path / "out"
    flags = ["ablate", "--runner", "verl", "--preset", "kk-smoke", "--methods", "grpo", "--seeds", "0"]
    assert main([*flags, "--out", str(out)]) == 0  # 3b and 7b
    for model in ("3b", "7b"):
        cell = out / "verl" / "cells" / f"grpo-{model}-seed0"
        (cell / "STATUS").write_text("completed: sitting 1 on node at t\n")
        (cell / "metrics.sitting-1.jsonl").write_text(line(0, validation(0.1, 0.0)) + line(1, training(1.0)))
        with open(cell / "metrics.sitting-1.jsonl", "a") as metrics:
            metrics.write(line(1, validation(0.5, 0.4)))
        (cell / "launch.json").write_text(json.dumps({"MODEL": model, "MODEL_PATH": "/models/one"}))
    assert main([*flags, "--out", str(out), "--report-only"]) == 1
    report = (out / "verl" / "report-7b" / "results.md").read_text()
    assert "grpo-7b-seed0 (completed, but it trained /models/one, as the 3b cells did: one model path for two" in report
    assert "(set MODEL_PATH_7B for the 7b cells)" in report
    capsys.readouterr()


def test_the_last_three_validations_are_averaged_beside_the_last(tmp_path):
    out = tmp_path / "out"
    flags = ["ablate", "--runner", "verl", "--preset", "kk-smoke", "--methods", "grpo", "--seeds", "0"]
    assert main([*flags, "--verl-models", "3b", "--out", str(out)]) == 0
    cell = out / "verl" / "cells" / "grpo-3b-seed0"
    (cell / "STATUS").write_text("completed: sitting 1 on node at t\n")
    accuracies = {0: (0.0, 0.0), 20: (0.1, 0.2), 40: (0.3, 0.1), 60: (0.5, 0.3), 70: (0.7, 0.5)}
    text = "".join(line(step, (training(1.0) if step else {}) | validation(*acc)) for step, acc in accuracies.items())
    (cell / "metrics.sitting-1.jsonl").write_text(text)
    assert main([*flags, "--out", str(out), "--report-only"]) == 0
    last = accuracy_of(out / "verl" / "report-3b")
    last3 = accuracy_of(out / "verl" / "report-3b-last3")
    assert float(last["eval/greedy/acc_3"]["mean"]) == pytest.approx(0.7, abs=ATOL)
    assert float(last3["eval/greedy/acc_3"]["mean"]) == pytest.approx((0.3 + 0.5 + 0.7) / 3, abs=ATOL)
    assert float(last3["eval/greedy/acc"]["mean"]) == pytest.approx((0.2 + 0.4 + 0.6) / 3, abs=ATOL)
    assert (
        "the mean of a cell's last 3 validations after step 0" in (out / "verl/report-3b-last3/results.md").read_text()
    )


def accuracy_of(report) -> dict:
    with open(report / "accuracy.csv") as table:
        return {r["column"]: r for r in csv.DictReader(table) if r["row"] == "grpo"}


def test_the_report_reads_the_grids_own_plan(grid, capsys):
    """Without flags, ``--report-only`` reports the grid as written (its plan.json), not kk-tiny's
    default rows and seeds; a flag may name a part of it, not a cell the grid does not have."""
    out = ["--out", str(grid)]
    assert main(["ablate", "--runner", "verl", "--report-only", *out]) == 0
    assert "cells complete: 4 of 4" in (grid / "verl" / "report-3b" / "results.md").read_text()
    assert main(["ablate", "--runner", "verl", "--report-only", "--seeds", "1", *out]) == 0
    assert "cells complete: 2 of 2" in (grid / "verl" / "report-3b" / "results.md").read_text()
    capsys.readouterr()
    assert main(["ablate", "--runner", "verl", "--report-only", "--seeds", "0,5", *out]) == 2
    assert "--report-only --seeds: 5 is not in the grid's plan (plan.json: 0,1)" in capsys.readouterr().err
    assert main(["ablate", "--runner", "verl", "--report-only", "--preset", "kk-tiny", *out]) == 2
    assert "was written with --preset kk-smoke, not kk-tiny" in capsys.readouterr().err
    (grid / "verl" / "plan.json").unlink()  # a grid from before plans were kept: the flags, against cells.txt
    assert main([*GRID[:-2], "--verl-models", "3b,7b", "--report-only", *out]) == 2
    assert "--report-only: cell grpo-7b-seed0 is not in the grid (" in capsys.readouterr().err
