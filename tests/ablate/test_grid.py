"""``tokenbalance ablate`` on a tiny grid (2 rows x 2 seeds x 2 steps, the tiny random policy, in
process): the table's numbers are the cells' own metrics.jsonl values; a grid interrupted mid-cell
runs only its unfinished cells again (each resumed from the checkpoint the trainer resumes from, or
from step 0; nothing deleted), and the resumed cells end where the uninterrupted ones did; a changed
config, a second grid and a cell held by a live process are refused; killing the grid ends its cell."""

import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch

import tokenbalance
from tests.trainer.conftest import SMALL_RUN
from tokenbalance.ablate.grid import GRID_METHODS, Cell
from tokenbalance.ablate.results import read_cell
from tokenbalance.ablate.runner import CellProcess, child_environment, read_log
from tokenbalance.cli import main
from tokenbalance.commands.ablate import GRID_KEYS
from tokenbalance.config import load_config
from tokenbalance.run.lock import RunLock, is_locked
from tokenbalance.run.state import last_logged_step
from tokenbalance.tasks.base import ScoreResult
from tokenbalance.tasks.kk.task import KKTask

T975_DF1 = 12.706204736174696  # two seeds: t(0.975, 1) (tan(0.475 pi))
T80_DF1 = 1.3763819204711734  # t(0.80, 1) (tan(0.3 pi))
CELLS = ["grpo-seed0", "ar_lopti-seed0", "grpo-seed1", "ar_lopti-seed1"]


def grid_args(policy, out, *extra):
    grid_sets = [item for item in SMALL_RUN if item.split("=")[0] not in GRID_KEYS]  # the grid's own flags set those
    sets = [arg for item in grid_sets for arg in ("--set", item)]
    return [
        "ablate",
        "--preset",
        "kk-smoke",
        "--methods",
        "grpo,ar_lopti",
        "--seeds",
        "0,1",
        "--steps",
        "2",
        "--model",
        str(policy),
        "--out",
        str(out),
        "--isolation",
        "inprocess",
        "--figure-prompts",
        "2",
        "--no-progress",
        *sets,
        *extra,
    ]


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def last_eval(run_dir):
    return [r for r in records(run_dir) if r["kind"] == "eval"][-1]


@pytest.fixture(scope="module", autouse=True)
def pseudo_reward():
    """A random policy solves no puzzle: a reward that is a fixed function of the response text (a
    third correct) gives the cells nonzero, different accuracies and a learning signal."""

    def score(self, response, example):
        return ScoreResult(3.0 if zlib.crc32(response.encode()) % 3 == 0 else -1.0, {})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KKTask, "score", score)
        yield


@pytest.fixture(scope="module")
def grid(tiny_policy_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("grid") / "results"
    assert main(grid_args(tiny_policy_dir, out)) == 0
    return out


def test_table_numbers_are_the_cells_own_metrics(grid):
    cells = {name: last_eval(grid / "cells" / name) for name in CELLS}
    assert all(r["step"] == 2 for r in cells.values())
    rows = list(csv.DictReader(open(grid / "accuracy.csv")))
    columns = {r["column"] for r in rows}
    assert {"eval/greedy/acc_2", "eval/greedy/acc_3", "eval/greedy/acc", "eval/sample/acc"} <= columns
    checked = 0
    for row in rows:
        if row["row"] == "start":
            values = [records(grid / "cells" / f"grpo-seed{s}")[0][row["column"]] for s in (0, 1)]
        else:
            values = [cells[f"{row['row']}-seed{s}"][row["column"]] for s in (0, 1)]
        mean = sum(values) / 2
        sd = abs(values[0] - values[1]) / math.sqrt(2)
        assert row["n"] == "2" and row["seeds"] == "0 1"
        assert float(row["mean"]) == pytest.approx(mean, abs=1e-15)
        assert float(row["ci_high"]) == pytest.approx(mean + T975_DF1 * sd / math.sqrt(2), abs=1e-12)
        if row["row"] == "grpo":  # a baseline row is compared with the start policy (what RL did)
            start = [records(grid / "cells" / f"grpo-seed{s}")[0][row["column"]] for s in (0, 1)]
            assert row["baseline"] == "start" and row["diff_n"] == "2"
            assert float(row["diff_mean"]) == pytest.approx(
                (values[0] - start[0] + values[1] - start[1]) / 2, abs=1e-15
            )
        if row["row"] == "ar_lopti":
            base = [cells[f"grpo-seed{s}"][row["column"]] for s in (0, 1)]
            diffs = [v - b for v, b in zip(values, base)]
            assert row["baseline"] == "grpo" and row["diff_n"] == "2"
            assert float(row["diff_mean"]) == pytest.approx(sum(diffs) / 2, abs=1e-15)
            half = T975_DF1 * (abs(diffs[0] - diffs[1]) / math.sqrt(2)) / math.sqrt(2)
            assert float(row["diff_ci_low"]) == pytest.approx(sum(diffs) / 2 - half, abs=1e-12)
            detectable = (T975_DF1 + T80_DF1) * (abs(diffs[0] - diffs[1]) / math.sqrt(2)) / math.sqrt(2)
            assert float(row["diff_detectable_80"]) == pytest.approx(detectable, abs=1e-12)
            if sum(base):
                assert float(row["relative_change"]) == pytest.approx(sum(diffs) / sum(base), abs=1e-12)
        checked += 1
    assert checked == len(rows) == 2 * 3 * 3  # modes x rows (start, grpo, ar_lopti) x columns (2, 3 people, Avg)
    assert len({row["mean"] for row in rows}) > 3  # the pseudo-reward makes the accuracies differ
    # the start row is the same policy for both rows of a seed: their step-0 evaluations agree
    for s in (0, 1):
        assert records(grid / "cells" / f"grpo-seed{s}")[0] == records(grid / "cells" / f"ar_lopti-seed{s}")[0]
    # the Markdown table shows the same means (3 decimals), the cells.csv the raw values
    greedy = float(next(r for r in rows if r["row"] == "grpo" and r["column"] == "eval/greedy/acc")["mean"])
    report = (grid / "results.md").read_text()
    assert "| GRPO | " in report and f"{greedy:.3f}" in report and "paired by seed" in report
    assert "cells ran one at a time on this machine" in report
    # GRPO's Δ from the start policy, in both tables of both modes
    assert report.count(" vs start policy (step 0) |") == 2
    # ... and example by example: the paired-differences table and the outcomes table of each mode
    assert report.count("| GRPO | start policy (step 0) |") == 4 and report.count("McNemar p of that split") == 2
    raw = {r["cell"]: r for r in csv.DictReader(open(grid / "cells.csv"))}
    assert float(raw["ar_lopti-seed1"]["eval/sample/acc"]) == cells["ar_lopti-seed1"]["eval/sample/acc"]
    cost = {r["row"]: r for r in csv.DictReader(open(grid / "step_cost.csv"))}
    steps = [
        r["timing/step_s"] for s in (0, 1) for r in records(grid / "cells" / f"grpo-seed{s}") if r["kind"] == "train"
    ]
    per_cell = [sum(steps[:2]) / 2, sum(steps[2:]) / 2]
    assert float(cost["grpo"]["timing/step_s_mean"]) == pytest.approx(sum(per_cell) / 2, rel=1e-12)


def test_cells_share_their_start_policy_evaluation(grid):
    # one greedy generation for both seeds' four cells, one sampled per seed; each run scored them itself
    entries = sorted(p.name.split("-")[0] for p in (grid / "start_evals").iterdir())
    assert entries == ["greedy", "sample", "sample"]
    logs = "".join((grid / "cells" / name / "train.log").read_text() for name in CELLS)
    assert logs.count("responses generated and shared") == 3 and logs.count("responses read from") == 5
    assert all(
        load_config(grid / "configs" / f"{name}.yaml").train.start_eval_cache == str(grid / "start_evals")
        for name in CELLS
    )


def test_figures_are_written(grid):
    assert (grid / "reward_curves.png").stat().st_size > 1000
    assert (grid / "figure1_buckets.png").stat().st_size > 1000
    data = json.loads((grid / "figure1_buckets.json").read_text())
    assert set(data["rows"]) == {"grpo", "ar_lopti"} and data["responses"] == 2 * 4
    for row in data["rows"].values():
        assert len(row["grad_norm"]) == len(row["token_frac"]) == 4
        assert sum(row["token_frac"]) == pytest.approx(1.0) and row["grad_norm_all"] > 0


def test_figure_1_takes_all_the_training_prompts_when_there_are_fewer_than_asked(grid, tmp_path):
    """``data.rl_count`` smaller than ``--figure-prompts``: the figure's batch takes every training
    prompt, with a note, instead of crashing the finished grid's report on every rerun."""
    from tokenbalance.ablate import figure1
    from tokenbalance.config import save_config

    config = load_config(grid / "configs" / "grpo-seed0.yaml")
    config.data.train_difficulties, config.data.rl_count = [3], 1
    save_config(config, tmp_path / "few.yaml")
    notes: list[str] = []
    data = figure1.measure(tmp_path / "few.yaml", [GRID_METHODS["grpo"]], prompts=2, log=notes.append)
    assert data["responses"] == 1 * 4  # one prompt x group of 4
    assert notes == [
        "figure 1: 1 prompt(s), all the training data holds (data.rl_count or data.train_file), fewer than "
        "--figure-prompts 2"
    ]
    assert figure1.figure_prompts(2, 5) == (2, None)


def test_figure_1_computes_as_the_run_does(tiny_policy_dir, tmp_path):
    """``model.autocast=bfloat16`` (and ``optim.logit_chunk_tokens``) in the cells' config: every forward
    of Figure 1's measurement (sampling, log-probs, the gradient norms, the one-step update) runs under
    the run's autocast, as the run's own steps do."""
    from tokenbalance.ablate import figure1
    from tokenbalance.config import RunConfig, apply_overrides, save_config

    precision = ["model.autocast=bfloat16", "optim.logit_chunk_tokens=4"]
    config = apply_overrides(RunConfig(), [*SMALL_RUN, f"model.path={tiny_policy_dir}", *precision])
    save_config(config, tmp_path / "cell.yaml")
    linear_dtypes: list[torch.dtype] = []

    def record(module, inputs, output):
        if isinstance(module, torch.nn.Linear):
            linear_dtypes.append(output.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        data = figure1.measure(tmp_path / "cell.yaml", [GRID_METHODS["grpo"]], prompts=1, log=lambda _: None)
    finally:
        hook.remove()
    assert data["responses"] == 4 and data["rows"]["grpo"]["grad_norm_all"] > 0
    assert linear_dtypes and set(linear_dtypes) == {torch.bfloat16}


def test_interrupted_grid_reruns_only_unfinished_cells(grid, tiny_policy_dir):
    cells = grid / "cells"
    finished = {name: last_eval(cells / name) for name in CELLS}
    # ar_lopti-seed1 "killed" after its step-1 checkpoint: metrics cut there, status running
    killed = cells / "ar_lopti-seed1"
    kept = [line for line in (killed / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 1]
    (killed / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    (killed / "run_state.json").write_text(json.dumps({"status": "running", "step": 1}))
    (killed / "checkpoints" / "latest").write_text("step_000001\n")
    # grpo-seed1 "killed" before its first checkpoint: resumed from step 0 (nothing deleted)
    early = cells / "grpo-seed1"
    for path in sorted((early / "checkpoints").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (early / "run_state.json").write_text(json.dumps({"status": "running", "step": 0}))
    untouched = {name: (cells / name / "metrics.jsonl").stat().st_mtime_ns for name in CELLS[:2]}

    assert main(grid_args(tiny_policy_dir, grid)) == 0
    log = read_log(grid)
    sitting = max(i for i, r in enumerate(log) if r["event"] == "sitting")
    assert log[sitting]["skipped"] == ["grpo-seed0", "ar_lopti-seed0"]
    ran = {r["cell"]: (r["action"], r["from_step"], r["status"]) for r in log[sitting + 1 :]}
    assert ran == {"grpo-seed1": ("resume", 0, "completed"), "ar_lopti-seed1": ("resume", 1, "completed")}
    assert {name: (cells / name / "metrics.jsonl").stat().st_mtime_ns for name in CELLS[:2]} == untouched
    resumed = (killed / "metrics.jsonl").read_text().splitlines()
    assert resumed[: len(kept)] == kept and json.loads(resumed[-1])["step"] == 2
    # resuming and restarting are exact: every cell ends where the uninterrupted grid ended
    assert {name: last_eval(cells / name) | {"timing": 0} for name in CELLS} == {
        name: finished[name] | {"timing": 0} for name in CELLS
    }

    # a third sitting finds every cell complete and runs nothing
    assert main(grid_args(tiny_policy_dir, grid)) == 0
    assert read_log(grid)[-1] == read_log(grid)[-1] | {"event": "sitting", "skipped": CELLS}


def test_a_changed_experiment_is_refused_not_mixed(grid, tiny_policy_dir, capsys):
    assert main(grid_args(tiny_policy_dir, grid, "--set", "optim.lr=0.02")) == 2
    error = capsys.readouterr().err
    assert "grpo-seed0: this cell was started with another config (optim.lr: 0.01 in the cell, 0.02 planned)" in error
    with RunLock(grid):  # a second grid on one --out is refused, naming the holder
        assert main(grid_args(tiny_policy_dir, grid)) == 2
    assert f"in use by another tokenbalance process (pid {os.getpid()}" in capsys.readouterr().err
    assert main(grid_args(tiny_policy_dir, grid, "--set", "method.ar.alpha=0.5")) == 2
    assert "published hyper-parameters" in capsys.readouterr().err


def test_subprocess_cell_reports_the_child_status(tmp_path):
    run_dir = tmp_path / "cell"
    run_dir.mkdir()
    steps = []
    write = "import json, sys, time; time.sleep(0.6); open(sys.argv[1], 'w').write(json.dumps({'status': sys.argv[2]}))"
    for status, code, expected in (("completed", 0, "completed"), ("failed", 3, "failed (exit 3, status failed)")):
        command = [sys.executable, "-c", write + f"; sys.exit({code})", str(run_dir / "run_state.json"), status]
        cell = CellProcess(command, tmp_path / "cell.log", run_dir)
        while (reported := cell.poll()) is None:  # as the grid polls its running cells
            steps.append(last_logged_step(run_dir))
            time.sleep(0.1)
        assert reported == expected
    assert steps and set(steps) == {0}  # polled while the child ran (no metrics yet: step 0)
    source = Path(tokenbalance.__file__).resolve().parent.parent
    assert child_environment()["PYTHONPATH"].split(os.pathsep)[0] == str(source)  # the cells run this code


def test_a_cell_whose_process_died_is_reported_stopped_not_running(tmp_path):
    run_dir = tmp_path / "grpo-seed0"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "reward/mean": 0.5}) + "\n")
    (run_dir / "run_state.json").write_text(json.dumps({"status": "running", "step": 1}))  # as a SIGKILL leaves it
    checkpoint = run_dir / "checkpoints" / "step_000001"  # complete (what a resume needs), not yet named by latest
    (checkpoint / "model").mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "optimizer.safetensors").write_bytes(b"")
    cell = Cell(GRID_METHODS["grpo"], 0)
    with RunLock(run_dir):
        assert is_locked(run_dir) and read_cell(run_dir, cell, 2).status == "running"
    assert not is_locked(run_dir)
    result = read_cell(run_dir, cell, 2)
    assert (result.status, result.complete) == ("stopped, last checkpoint at step 1", False)


def test_a_cell_with_a_complete_checkpoint_that_latest_does_not_name_resumes_from_it(grid, tiny_policy_dir):
    """A cell stopped between renaming its checkpoint into place and writing ``latest``: the grid
    plans it as the trainer resumes it (from that checkpoint), and deletes nothing."""
    from tokenbalance.config import load_config
    from tokenbalance.run.plan import cell_action

    cell = grid / "cells" / "grpo-seed0"
    (cell / "checkpoints" / "latest").unlink()
    (cell / "run_state.json").write_text(json.dumps({"status": "running", "step": 1}))
    step_2 = sorted((cell / "checkpoints").glob("step_*"))[-1]
    planned = load_config(grid / "configs" / "grpo-seed0.yaml")
    assert cell_action(cell, planned) == ("resume", int(step_2.name.removeprefix("step_")))
    checkpoint_files = sorted(p.relative_to(cell) for p in step_2.rglob("*"))
    assert main(grid_args(tiny_policy_dir, grid)) == 0
    assert sorted(p.relative_to(cell) for p in step_2.rglob("*")) == checkpoint_files
    assert json.loads((cell / "run_state.json").read_text())["status"] == "completed"


def test_a_cell_held_by_a_live_process_is_refused_and_kept(grid, tiny_policy_dir, capsys):
    cell = grid / "cells" / "grpo-seed1"
    (cell / "run_state.json").write_text(json.dumps({"status": "running", "step": 0}))
    before = sorted(p.relative_to(cell) for p in cell.rglob("*"))
    with RunLock(cell):
        assert main(grid_args(tiny_policy_dir, grid)) == 2
    assert "grpo-seed1" in capsys.readouterr().err
    assert sorted(p.relative_to(cell) for p in cell.rglob("*")) == before


def test_killing_the_grid_ends_its_running_cell(tiny_policy_dir, tmp_path):
    """SIGKILL of the grid's process (no handler runs) still ends its cell's process: the kernel
    sends the child SIGTERM, so it stops as on Ctrl-C (status interrupted, lock released)."""
    out = tmp_path / "grid"
    args = grid_args(tiny_policy_dir, out, "--set", "train.save_every=1")
    args[args.index("--steps") + 1] = "1000"
    args[args.index("--isolation") + 1] = "subprocess"
    grid = subprocess.Popen([sys.executable, "-m", "tokenbalance.cli", *args], stdout=subprocess.DEVNULL)
    cell = out / "cells" / "grpo-seed0"
    try:
        deadline = time.monotonic() + 120
        while not (is_locked(cell) and (cell / "checkpoints" / "latest").is_file()):
            assert grid.poll() is None and time.monotonic() < deadline, "the cell did not start"
            time.sleep(0.2)
        grid.kill()
        grid.wait()
        deadline = time.monotonic() + 60
        while is_locked(cell):
            assert time.monotonic() < deadline, "the cell's process outlived the grid"
            time.sleep(0.2)
    finally:
        grid.kill()
    assert json.loads((cell / "run_state.json").read_text())["status"] == "interrupted"


def test_two_cells_at_once_each_with_one_thread(tiny_policy_dir, tmp_path):
    """``--jobs 2``: two cell processes run together (each started before the other ended), each with
    one thread, recorded in its config.yaml; both complete."""
    out = tmp_path / "grid"
    args = grid_args(tiny_policy_dir, out, "--jobs", "2", "--no-figure", "--set", "train.save_every=1")
    args[args.index("--seeds") + 1] = "0"
    args[args.index("--steps") + 1] = "8"  # long enough that two processes starting together overlap
    args[args.index("--isolation") + 1] = "subprocess"
    assert main(args) == 0
    cells = [out / "cells" / name for name in ("grpo-seed0", "ar_lopti-seed0")]
    # the two cell processes overlapped: each started (its lock record) before the other ended
    started = [
        time.mktime(time.strptime(json.loads((c / ".lock").read_text())["since"], "%Y-%m-%d %H:%M:%S")) for c in cells
    ]
    ended = [(c / "run_state.json").stat().st_mtime for c in cells]
    assert started[0] <= ended[1] and started[1] <= ended[0]
    assert json.loads((cells[0] / ".lock").read_text())["pid"] != json.loads((cells[1] / ".lock").read_text())["pid"]
    for cell in cells:
        assert json.loads((cell / "run_state.json").read_text())["status"] == "completed"
        assert "threads: 1\n" in (cell / "config.yaml").read_text()
    assert {r["jobs"] for r in read_log(out) if r["event"] == "cell"} == {2}
    assert "cells ran 2 at a time on this machine" in (out / "results.md").read_text()  # the cost table says so


def test_a_torn_final_evaluation_is_evaluated_again_and_a_damaged_line_is_named(grid, tiny_policy_dir, capsys):
    cell = grid / "cells" / "ar_lopti-seed0"
    metrics = cell / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    final = json.loads(lines[-1])
    assert final["kind"] == "eval" and final["step"] == 2
    metrics.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # torn by a kill
    assert main(grid_args(tiny_policy_dir, grid)) == 0
    repaired = json.loads(metrics.read_text().splitlines()[-1])
    assert {k: v for k, v in repaired.items() if not k.startswith("timing")} == {
        k: v for k, v in final.items() if not k.startswith("timing")
    }
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    report = grid_args(tiny_policy_dir, grid, "--report-only")
    del report[report.index("--isolation") : report.index("--isolation") + 2]  # runs no cell
    assert main(report) == 0
    assert f"damaged: {metrics}: line 2 is not JSON" in capsys.readouterr().out
    metrics.write_text("\n".join(lines) + "\n")  # the module's grid intact for the tests after this one


def test_finished_cells_are_kept_as_records_and_restored_on_another_machine(grid, tiny_policy_dir, tmp_path):
    """``--records``: a sitting keeps every finished cell's config, metrics and status there; a grid
    in a new directory (a new machine) restores them and runs nothing, with the same table."""
    from tokenbalance.run import records

    kept = tmp_path / "records"
    assert main(grid_args(tiny_policy_dir, grid, "--records", str(kept))) == 0  # all done: kept now
    assert sorted(p.name for p in kept.iterdir() if p.is_dir()) == sorted(CELLS)
    kept_files = sorted((*records.RECORD_FILES, *records.OPTIONAL_RECORD_FILES))  # the cells wrote their outcomes
    assert all(sorted(p.name for p in (kept / c).iterdir()) == kept_files for c in CELLS)
    elsewhere = tmp_path / "new-machine"
    assert main(grid_args(tiny_policy_dir, elsewhere, "--records", str(kept))) == 0
    log = read_log(elsewhere)
    assert [r["event"] for r in log] == ["sitting"] and sorted(log[0]["restored"]) == sorted(CELLS)
    assert (elsewhere / "accuracy.csv").read_text() == (grid / "accuracy.csv").read_text()
    changed = load_config(grid / "configs" / "grpo-seed0.yaml")
    changed.optim.lr = 0.02
    assert not records.record_matches(kept / "grpo-seed0", changed)  # another experiment is not restored


def test_report_only_with_records_restores_the_finished_cells_and_runs_none(grid, tiny_policy_dir, tmp_path):
    """``--report-only --records``: on a machine with none of the cells (a fresh clone of committed records), the
    finished cells are restored and reported, an unfinished one stays missing, and no cell runs; the start policy
    need not be there (a record names it by its folder's name)."""
    kept = tmp_path / "records"
    assert main(grid_args(tiny_policy_dir, grid, "--records", str(kept))) == 0
    shutil.rmtree(kept / "ar_lopti-seed0")  # a cell not finished anywhere yet
    elsewhere = tmp_path / "fresh-clone"
    absent_policy = tmp_path / "not-built-here" / Path(tiny_policy_dir).name
    report = grid_args(absent_policy, elsewhere, "--report-only", "--records", str(kept), "--no-figure")
    del report[report.index("--isolation") : report.index("--isolation") + 2]
    assert main(report) == 0
    log = read_log(elsewhere)
    assert [r["event"] for r in log] == ["sitting"] and log[0]["runs_cells"] is False
    assert sorted(log[0]["restored"]) == sorted(c for c in CELLS if c != "ar_lopti-seed0")
    assert not (elsewhere / "cells" / "ar_lopti-seed0").exists()  # not run, not restored
    report_text = (elsewhere / "results.md").read_text()
    assert "not complete: ar_lopti-seed0 (not started)" in report_text
    assert "3 cell(s) restored from records ran elsewhere, not counted" in report_text
    assert "the cells were restored from records and ran elsewhere, how many at a time not known here" in report_text
    assert "at a time on this machine" not in report_text
    with open(elsewhere / "cells.csv", newline="") as f:
        status = {row["cell"]: row["complete"] for row in csv.DictReader(f)}
    assert status["grpo-seed0"] == "True" and status.get("ar_lopti-seed0") != "True"
    assert (grid / "cells" / "grpo-seed0" / "metrics.jsonl").read_bytes() == (
        elsewhere / "cells" / "grpo-seed0" / "metrics.jsonl"
    ).read_bytes()


def test_a_grid_of_another_config_never_replaces_the_records_it_shares(grid, tiny_policy_dir, tmp_path, capsys):
    """Two grids sharing one ``--records`` directory: a grid whose cells have another config (or
    fewer steps) than the finished records of the same names is refused before any work, naming
    the setting; the records stay as they were."""
    kept = tmp_path / "records"
    assert main(grid_args(tiny_policy_dir, grid, "--records", str(kept))) == 0
    before = {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    capsys.readouterr()
    variant = tmp_path / "variant"
    assert main(grid_args(tiny_policy_dir, variant, "--records", str(kept), "--set", "optim.lr=0.02")) == 2
    err = capsys.readouterr().err.strip()
    assert "is the record of another config (optim.lr:" in err and "0.02 in this grid" in err
    assert "Use another --records directory" in err and len(err.splitlines()) == 1
    shorter = tmp_path / "shorter"
    assert main(grid_args(tiny_policy_dir, shorter, "--records", str(kept), "--steps", "1")) == 2
    assert "is the record of 2 steps, more than the 1 planned" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before
    assert not (variant / "cells").exists() and not (shorter / "cells").exists()
