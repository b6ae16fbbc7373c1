"""A grid's cells read back from their run directories: accuracy is the **last** ``kind: eval`` record of
``metrics.jsonl``, start accuracy the first (step 0), cost the ``timing/*`` keys; also ``run_state.json`` and
``eval_outcomes.jsonl``."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenbalance.ablate.grid import Cell, GridPlan
from tokenbalance.ablate.runner import cell_dir
from tokenbalance.ablate.stats import paired_outcomes
from tokenbalance.diagnostics.plots import load_run
from tokenbalance.diagnostics.sinks import metrics_path
from tokenbalance.run.checkpoints import checkpoint_step
from tokenbalance.run.fingerprints import pairing_mismatch, read_fingerprints
from tokenbalance.run.lock import is_locked
from tokenbalance.run.state import NOT_STARTED, RunStatus, read_run_state
from tokenbalance.trainer.evaluate import read_outcomes

MODES = ("greedy", "sample")
_LEVEL_KEY = re.compile(r"^eval/(greedy|sample)/acc_(\d+)$")


@dataclass
class CellResult:
    """One cell as found on disk. ``complete``: completed at the planned steps with a final eval. ``evals``: every
    evaluation record, in step order (``first_eval`` and ``last_eval`` are its ends)."""

    cell: Cell
    status: str
    complete: bool = False
    first_eval: dict = field(default_factory=dict)
    last_eval: dict = field(default_factory=dict)
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    outcomes: dict[tuple[int, str], dict] = field(default_factory=dict)  # (step, mode): per-example outcomes
    fingerprints: dict | None = None  # fingerprints.json (None: a cell of older code, or of a host that writes none)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and finite values of ``key`` in the train records."""
        return _series(self.train, key)

    def eval_series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and finite values of ``key`` in the evaluation records."""
        return _series(self.evals, key)

    def mean_of(self, key: str) -> float:
        _, values = self.series(key)
        return sum(values) / len(values) if values else math.nan


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def read_cell(run_dir: Path, cell: Cell, steps: int) -> CellResult:
    if not metrics_path(run_dir).is_file():
        return CellResult(cell, NOT_STARTED if not run_dir.exists() else "no metrics")
    try:
        run = load_run(run_dir)
    except ValueError as err:  # a damaged line is named (file, line), not read around
        return CellResult(cell, f"damaged: {err}")
    status = str(read_run_state(run_dir).get("status", "unknown"))
    if status == RunStatus.RUNNING and not is_locked(run_dir):  # its process ended without saying so (killed)
        status = f"stopped, last checkpoint at step {checkpoint_step(run_dir)}"
    try:
        fingerprints = read_fingerprints(run_dir)
    except ValueError as err:  # a damaged fingerprints file is named, never read as "no fingerprints"
        return CellResult(cell, f"damaged: {err}")
    last = run.eval[-1] if run.eval else {}
    complete = status == RunStatus.COMPLETED and bool(last) and int(last.get("step", -1)) == steps
    first = run.eval[0] if run.eval else {}
    outcomes = read_outcomes(run_dir)
    return CellResult(cell, status, complete, first, last, run.train, run.eval, outcomes, fingerprints)


def collect(plan: GridPlan, out_dir: Path) -> list[CellResult]:
    return [read_cell(cell_dir(Path(out_dir), cell), cell, plan.steps) for cell in plan.cells]


def accuracy_columns(results: list[CellResult], mode: str) -> list[str]:
    """``eval/<mode>/acc_<d>`` for every difficulty found (numeric order), then ``eval/<mode>/acc``."""
    levels = sorted(
        {
            int(m.group(2))
            for r in results
            for k in r.last_eval
            for m in [_LEVEL_KEY.match(k)]
            if m and m.group(1) == mode
        }
    )
    return [f"eval/{mode}/acc_{d}" for d in levels] + [f"eval/{mode}/acc"]


def per_seed(results: list[CellResult], row: str, key: str, *, start: bool = False) -> dict[int, float]:
    """``{seed: value}`` of ``key`` in the complete cells of ``row`` (last eval; first with ``start``)."""
    out = {}
    for r in results:
        record = r.first_eval if start else r.last_eval
        value = record.get(key)
        if r.complete and r.cell.method.key == row and isinstance(value, (int, float)) and math.isfinite(value):
            out[r.cell.seed] = float(value)
    return out


def start_per_seed(results: list[CellResult], key: str) -> dict[int, float]:
    """The start policy's value per seed (step-0 eval of the first complete cell of each seed)."""
    out: dict[int, float] = {}
    for r in results:
        value = r.first_eval.get(key)
        if (
            r.complete
            and r.cell.seed not in out
            and int(r.first_eval.get("step", -1)) == 0
            and isinstance(value, (int, float))
            and math.isfinite(value)
        ):
            out[r.cell.seed] = float(value)
    return out


PAIRING_RULES = ("fingerprint", "step0", "launch")
"""How a report decides that two cells of a seed are a pair: ``fingerprint`` (their ``fingerprints.json`` agree; a cell
without one pairs with nothing), ``step0`` (as ``fingerprint``, but two cells of which one has no fingerprints pair
when their step-0 evaluations agree on every ``eval/*`` value: the weaker evidence older records allow, named in the
report), ``launch`` (the seed alone: a verl grid, whose scripts give every cell of a seed the same model and data and
whose cells write no fingerprints)."""


def _step0_values(result: CellResult) -> dict:
    if int(result.first_eval.get("step", -1)) != 0:
        return {}
    return {k: v for k, v in result.first_eval.items() if k.startswith("eval/")}


def pair_problem(first: CellResult, second: CellResult, pairing: str = "fingerprint") -> str | None:
    """Why ``first`` and ``second`` (two cells of a seed) are not a pair under the rule ``pairing``
    (:data:`PAIRING_RULES`); None when they are."""
    if pairing == "launch" or first is second:  # one launch, or a cell against its own step 0
        return None
    why = pairing_mismatch(first.fingerprints, second.fingerprints)
    if why is not None and pairing == "step0" and (first.fingerprints is None or second.fingerprints is None):
        a, b = _step0_values(first), _step0_values(second)
        return None if a and a == b else "no fingerprints, and the step-0 evaluations differ"
    return why


def require_pair(first: CellResult, second: CellResult, pairing: str = "fingerprint") -> None:
    """``ValueError`` naming both cells when they are not a pair (:func:`pair_problem`): what every paired comparison
    checks before it takes a difference."""
    why = pair_problem(first, second, pairing)
    if why is not None:
        raise ValueError(f"{first.cell.name} and {second.cell.name} are not a pair: {why}")


@dataclass(frozen=True)
class RowPairs:
    """A row's seeds paired with its baseline row's cell of the same seed (``seeds``), and those dropped with why."""

    seeds: tuple[int, ...]
    dropped: tuple[tuple[int, str], ...] = ()


def row_pairs(results: list[CellResult], row: str, baseline: str, pairing: str = "fingerprint") -> RowPairs:
    """The seeds at which ``row``'s and ``baseline``'s complete cells are a pair under ``pairing``, and the others at
    which both are complete, with why not."""
    cells = {(r.cell.method.key, r.cell.seed): r for r in results if r.complete}
    kept, dropped = [], []
    for (key, seed), cell in sorted(cells.items(), key=lambda item: item[0][1]):
        other = cells.get((baseline, seed))
        if key != row or other is None:
            continue
        why = pair_problem(cell, other, pairing)
        if why is None:
            kept.append(seed)
        else:
            dropped.append((seed, why))
    return RowPairs(tuple(kept), tuple(dropped))


def paired_cell_outcomes(
    results: list[CellResult], plan: GridPlan, mode: str, pairing: str = "fingerprint"
) -> list[tuple[str, str, dict]]:
    """Per row (its key, the key or ``start`` it is compared with) the per-seed :class:`PairedOutcomes` of the final
    evaluation's examples against the baseline row's cell of the same seed (a baseline row: against its own step-0
    evaluation), where both cells wrote outcomes of the same examples and are a pair (:func:`pair_problem`)."""

    cells = {(r.cell.method.key, r.cell.seed): r for r in results if r.complete}
    rows = []
    for method in plan.methods:
        compared = method.baseline or "start"
        per_seed_outcomes = {}
        for seed in plan.seeds:
            cell = cells.get((method.key, seed))
            other = cell if method.baseline is None else cells.get((method.baseline, seed))
            if cell is None or other is None or pair_problem(cell, other, pairing) is not None:
                continue
            mine = cell.outcomes.get((plan.steps, mode))
            theirs = other.outcomes.get((0 if method.baseline is None else plan.steps, mode))
            if mine and theirs and mine["examples"] == theirs["examples"]:
                per_seed_outcomes[seed] = paired_outcomes(theirs["correct"], mine["correct"])
        if per_seed_outcomes:
            rows.append((method.key, compared, per_seed_outcomes))
    return rows
