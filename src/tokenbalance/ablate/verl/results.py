"""Read a verl grid's cells back as the local grid's results: each cell's STATUS
(:mod:`tokenbalance.run.cell`) and its verl metrics, merged by step over its sittings (a later
sitting's value wins, a torn last line is left out, any other bad line named). Validation keys
``val-core|val-aux/<source ending in its level>/<variable>/mean@<N>`` of :data:`ACCURACY_VARIABLE`
become ``eval/<mode>/acc_<level>`` records (``sample`` when the cell's composed config samples or
N > 1, else ``greedy``). A cell that gives no final accuracy says why; a completed cell whose model path
another model's cells trained too is unusable. docs/ablate.md "The grid at paper scale".
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import yaml

from tokenbalance.ablate.results import CellResult
from tokenbalance.ablate.verl.grid import VerlCell
from tokenbalance.run.cell import cell_status, line_status, sitting_files
from tokenbalance.run.cell_launch import read_record
from tokenbalance.run.state import RunStatus

# the K&K reward's accuracy (0/1 per response; tokenbalance.integrations.verl.reward returns it as an extra)
ACCURACY_VARIABLE = "correct"
_VALIDATION = re.compile(r"^val-(?:core|aux)/[^/]+?(?P<level>\d+)/(?P<variable>[^/]+)/mean@(?P<samples>\d+)$")
# verl's per-step keys -> the local grid's (the cost table and the curves read these)
TRAIN_KEYS = {
    "reward/mean": ("critic/score/mean",),
    "response/len_mean": ("response_length/mean",),
    "loss/entropy": ("actor/entropy",),  # the old policy's entropy over the batch (verl's ray_trainer)
    "timing/step_s": ("timing_s/step",),
    "timing/rollout_s": ("timing_s/gen",),
    "timing/logprob_s": ("timing_s/old_log_prob", "timing_s/ref"),
    "timing/update_s": ("timing_s/update_actor",),
}
LAST_VALIDATIONS = 3  # the paper's final number: the mean of the last three validations (third-party notes)
TRAIN_MARKER = "timing_s/step"  # present in every training step's line, absent from validation-only lines


def read_sitting(path: Path) -> list[tuple[int, dict]]:
    """``(step, metrics)`` per line of one sitting's file; ``ValueError`` naming a damaged line, or
    the file when it is not UTF-8 text."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad_line = data[: err.start].count(b"\n") + 1
        raise ValueError(
            f"{path}:{bad_line}: not UTF-8 text (byte {data[err.start]:#04x}); not a verl metrics file"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] and not text.endswith("\n"):
        lines = lines[:-1]  # the last line torn by a kill: the step it held was not finished on disk
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            records.append((int(record["step"]), dict(record["data"])))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}:{number}: not a verl metrics line: {line[:80]!r}") from None
    return records


def merged_steps(cell_dir: Path) -> dict[int, dict]:
    """Every step's metrics over the cell's sittings (later sittings win per key)."""
    steps: dict[int, dict] = {}
    for path in sitting_files(cell_dir):
        for step, data in read_sitting(path):
            steps.setdefault(step, {}).update(data)
    return dict(sorted(steps.items()))


def validation_do_sample(cell_dir: Path) -> bool:
    """``actor_rollout_ref.rollout.val_kwargs.do_sample`` of the cell's last composed config (hydra's
    copy in ``hydra/.hydra/config.yaml``); verl's default False when there is none."""
    try:
        config = yaml.safe_load((cell_dir / "hydra" / ".hydra" / "config.yaml").read_text())
        return bool(config["actor_rollout_ref"]["rollout"]["val_kwargs"]["do_sample"])
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return False


def evaluation_record(step: int, data: dict, do_sample: bool) -> dict:
    """The step's validation as ``eval/<mode>/acc_<level>`` values and ``eval/<mode>/acc`` (their mean);
    empty when the step has no validation of :data:`ACCURACY_VARIABLE`."""
    levels: dict[str, dict[int, float]] = {}
    for key, value in data.items():
        match = _VALIDATION.match(key)
        if match and match.group("variable") == ACCURACY_VARIABLE and _finite(value):
            mode = "sample" if do_sample or int(match.group("samples")) > 1 else "greedy"
            levels.setdefault(mode, {})[int(match.group("level"))] = float(value)
    record: dict = {}
    for mode, values in levels.items():
        record |= {f"eval/{mode}/acc_{level}": value for level, value in sorted(values.items())}
        record[f"eval/{mode}/acc"] = math.fsum(values.values()) / len(values)
    return {"step": step, **record} if record else {}


def train_record(step: int, data: dict) -> dict:
    """The step's training metrics under the local grid's names (:data:`TRAIN_KEYS`), verl's kept beside."""
    record = {"step": step, **data}
    for ours, theirs in TRAIN_KEYS.items():
        if all(_finite(data.get(key)) for key in theirs):
            record[ours] = math.fsum(float(data[key]) for key in theirs)
    return record


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def unusable_reason(status: str, evaluations: list[dict], train: list[dict]) -> str | None:
    """Why a cell's logs give no final accuracy (None when they do): its STATUS when not completed, else
    the validation that is missing."""
    if line_status(status) is not RunStatus.COMPLETED:
        return status
    if not evaluations:
        return (
            f"completed, but its logs hold no validation of `{ACCURACY_VARIABLE}` per data source "
            f"(val-aux/<source>/{ACCURACY_VARIABLE}/mean@N)"
        )
    last_step = train[-1]["step"] if train else -1
    if evaluations[-1]["step"] != last_step:
        return (
            f"completed, but its last validation is at step {evaluations[-1]['step']}, not at its last training "
            f"step {last_step} (trainer.test_freq -1, or validation failed at the end)"
        )
    return None


def read_verl_cell(cell_dir: Path, cell: VerlCell) -> CellResult:
    """One cell as found on disk. ``complete``: STATUS completed, with a validation at its last step;
    otherwise its ``status`` says why not."""
    status = cell_status(cell_dir)
    try:
        steps = merged_steps(cell_dir)
    except ValueError as err:
        return CellResult(cell, f"damaged: {err}")
    do_sample = validation_do_sample(cell_dir)
    evaluations = [record for step, data in steps.items() if (record := evaluation_record(step, data, do_sample))]
    train = [train_record(step, data) for step, data in steps.items() if TRAIN_MARKER in data]
    why = unusable_reason(status, evaluations, train)
    first, last = (evaluations[0], evaluations[-1]) if evaluations else ({}, {})
    return CellResult(cell, why or status, why is None, first, last, train, evaluations)


def cell_model_path(cell_dir: Path) -> str | None:
    """The model a cell trained: its launch record's ``MODEL_PATH``, else its composed config's."""
    record = read_record(cell_dir) or {}
    if isinstance(record.get("MODEL_PATH"), str):
        return record["MODEL_PATH"]
    try:
        config = yaml.safe_load((cell_dir / "hydra" / ".hydra" / "config.yaml").read_text())
        return str(config["actor_rollout_ref"]["model"]["path"])
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None


def model_problems(grid_dir: Path, cells: list[VerlCell]) -> dict[str, str]:
    """Cell name -> why its model is not its row's: a model path that cells of another model trained too
    (one MODEL_PATH for every model), or another model than the cell's in its launch record."""
    paths = {cell.name: cell_model_path(grid_dir / "cells" / cell.name) for cell in cells}
    models_of: dict[str, set[str]] = {}
    for cell in cells:
        if paths[cell.name] is not None:
            models_of.setdefault(str(paths[cell.name]), set()).add(cell.model)
    problems = {}
    for cell in cells:
        recorded = (read_record(grid_dir / "cells" / cell.name) or {}).get("MODEL", cell.model)
        path = paths[cell.name]
        others = sorted(models_of.get(str(path), set()) - {cell.model})
        if recorded != cell.model:
            problems[cell.name] = f"its launch record names model {recorded}, not {cell.model}"
        elif others:
            problems[cell.name] = (
                f"it trained {path}, as the {', '.join(others)} cells did: one model path for two models "
                f"(set MODEL_PATH_{cell.model.upper()} for the {cell.model} cells)"
            )
    return problems


def collect_verl(grid_dir: Path, cells: list[VerlCell], every_cell: list[VerlCell] | None = None) -> list[CellResult]:
    """The cells' results; a completed cell whose model is not its row's (checked over ``every_cell``,
    the whole grid's) is unusable, with why."""
    problems = model_problems(grid_dir, every_cell or cells)
    results = []
    for cell in cells:
        result = read_verl_cell(grid_dir / "cells" / cell.name, cell)
        if result.complete and cell.name in problems:
            result = replace(result, status=f"completed, but {problems[cell.name]}", complete=False)
        results.append(result)
    return results


def last_validations_mean(result: CellResult, count: int = LAST_VALIDATIONS) -> CellResult:
    """``result`` with its final accuracy the mean of its last ``count`` validations after step 0 (the
    paper's reading, per third-party notes); unusable, with why, when it has fewer."""
    if not result.complete:
        return result
    after_start = [record for record in result.evals if int(record["step"]) > 0][-count:]
    keys = set(result.last_eval) - {"step"}
    if len(after_start) < count or any(set(record) - {"step"} != keys for record in after_start):
        steps = ", ".join(str(record["step"]) for record in after_start) or "none"
        return replace(
            result,
            status=f"completed, but fewer than {count} alike validations after step 0 (steps {steps})",
            complete=False,
        )
    mean = {key: math.fsum(float(record[key]) for record in after_start) / count for key in sorted(keys)}
    return replace(result, last_eval={"step": result.last_eval["step"], **mean})
