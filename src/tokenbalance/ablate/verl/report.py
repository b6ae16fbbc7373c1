"""The paper-layout tables of a verl grid, from the validation metrics verl wrote in each cell.

Two reports per model: ``OUT/verl/report-<model>/`` (each cell's last validation) and
``report-<model>-last3/`` (the mean of its last three, the paper's reading), each with ``results.md``,
``accuracy.csv``, ``cells.csv``, ``step_cost.csv``, ``reward_curves.png``: the local grid's report
(:mod:`.report`, :mod:`.stats`, :mod:`.curves`) on the cells read by :mod:`.results`: per people count
and their average, mean and 95% CI over seeds, paired differences against the baseline row, the cost
per step from verl's timings and the training-reward curves.
"""

from __future__ import annotations

from pathlib import Path

from tokenbalance.ablate.curves import reward_curves
from tokenbalance.ablate.grid import GridMethod, GridPlan, GridPreset
from tokenbalance.ablate.report import ReportSource, write_report
from tokenbalance.ablate.results import MODES, CellResult
from tokenbalance.ablate.verl.grid import VERL_MODEL_NAMES, VerlCell, verl_cells
from tokenbalance.ablate.verl.results import ACCURACY_VARIABLE, LAST_VALIDATIONS, collect_verl, last_validations_mean
from tokenbalance.run.cell import sitting_files

MODE_TITLES = {
    "greedy": "greedy validation (verl's val_kwargs.do_sample=False, the K&K scripts' setting)",
    "sample": "sampled validation (verl's val_kwargs: the mean over its n samples)",
}
ACCURACY_NOTE = (
    f"Accuracy is a cell's last validation in its verl logs (`val-core` or `val-aux/<data source>/"
    f"{ACCURACY_VARIABLE}/mean@N` at its final step, the K&K reward's `{ACCURACY_VARIABLE}`): one column per "
    "data source ending in a people count (`kk_logic3` ...), Avg their mean; the start-policy row is verl's "
    "validation before training (step 0). The paper's reading, the mean of the last three validations: "
    "report-<model>-last3/ beside this one."
)
LAST3_SUFFIX = "-last3"
LAST3_NOTE = (
    f"Accuracy is the mean of a cell's last {LAST_VALIDATIONS} validations after step 0 (the paper averages its "
    f"last three checkpoints' validations, per third-party notes; with the presets' test_freq 20 and 350 steps: "
    f"steps 320, 340 and 350), each read as in report-<model>/ (`val-aux/<data source>/{ACCURACY_VARIABLE}/mean@N`); "
    "a cell with fewer is left out, named. The start-policy row is verl's validation before training (step 0)."
)
COST_NOTE = (
    "Seconds per RL step from verl's `timing_s/*` of each step (step; gen; old_log_prob + ref; "
    "update_actor), mean over a cell's logged steps, then mean ± 95% CI over seeds. Cells may have run on "
    "different nodes: compare rows only where they ran alike."
)


def report_dir(grid_dir: Path, model: str, suffix: str = "") -> Path:
    return grid_dir / f"report-{model}{suffix}"


def model_plan(preset: str, rows: tuple[GridMethod, ...], seeds: tuple[int, ...], model: str, steps: int) -> GridPlan:
    """The plan the report shows for one model: the rows that run on verl, the steps the cells ran."""
    description = (
        f"the AR-Lopti K&K setting on verl (examples/verl/common.sh), MODEL={model} "
        f"({VERL_MODEL_NAMES.get(model, model)} unless MODEL_PATH_{model.upper()} named a copy), validation on the per-people-count "
        "test files of prepare_kk_data.sh"
    )
    return GridPlan(GridPreset(f"{preset} on verl, {model}", description), rows, seeds, steps)


def steps_run(results: list[CellResult]) -> int:
    """The last training step of the complete cells (0 when none is complete)."""
    return max((int(r.train[-1]["step"]) for r in results if r.complete and r.train), default=0)


def source(grid_dir: Path, cells: list[VerlCell], results: list[CellResult], note: str = ACCURACY_NOTE) -> ReportSource:
    sittings = ", ".join(f"{cell.name} {len(sitting_files(grid_dir / 'cells' / cell.name))}" for cell in cells)
    summary = [
        f"- cells' verl logs: `{grid_dir}/cells/<cell>/metrics.sitting-<k>.jsonl` (verl's file logger, one file "
        "per sitting, merged by step: a later sitting's value replaces an earlier one's at the same step)",
        f"- sittings per cell: {sittings}",
    ]
    modes = tuple(mode for mode in MODES if any(f"eval/{mode}/acc" in r.last_eval for r in results))
    if not modes:
        summary.append(
            f"- no validation of `{ACCURACY_VARIABLE}` per data source found in any cell (yet): the tables are empty"
        )
    return ReportSource(tuple(summary), note, COST_NOTE, modes or ("greedy",), MODE_TITLES, pairing="launch")


def write_verl_reports(
    grid_dir: Path,
    preset: str,
    rows: tuple[GridMethod, ...],
    seeds: tuple[int, ...],
    models: tuple[str, ...],
    *,
    command: str,
) -> tuple[list[Path], list[CellResult]]:
    """Each model's two reports from the cells' verl logs: ``report-<model>`` (each cell's last
    validation) and ``report-<model>-last3`` (the mean of its last three, the paper's reading). Returns
    the ``results.md`` paths and the cells that give no last validation (their status says why)."""
    cells, unsupported = verl_cells(rows, seeds, models)
    skipped = {row.key for row, _ in unsupported}
    verl_rows = tuple(row for row in rows if row.key not in skipped)
    written, unusable = [], []
    for model in models:
        model_cells = [cell for cell in cells if cell.model == model]
        last = collect_verl(grid_dir, model_cells, cells)
        unusable += [result for result in last if not result.complete]
        for suffix, results, note in (
            ("", last, ACCURACY_NOTE),
            (LAST3_SUFFIX, [last_validations_mean(result) for result in last], LAST3_NOTE),
        ):
            plan = model_plan(preset, verl_rows, seeds, model, steps_run(results))
            out = report_dir(grid_dir, model, suffix)
            out.mkdir(parents=True, exist_ok=True)
            curves = reward_curves(plan, results, out / "reward_curves.png")
            report_source = source(grid_dir, model_cells, results, note)
            written.append(
                write_report(plan, results, out, command=command, figures=(curves.name,), source=report_source)
            )
    return written, unusable
