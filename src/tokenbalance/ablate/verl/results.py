"""Read a verl grid's cells back as the local grid's results: each cell's STATUS
(:mod:`tokenbalance.run.cell`) and its verl metrics, merged by step over its sittings (a later
sitting's value wins, a torn last line is left out, any other bad line named). Validation keys
``val-core|val-aux/<source ending in its level>/<variable>/mean@<N>`` of :data:`ACCURACY_VARIABLE`
become ``eval/<mode>/acc_<level>`` records (``sample`` when the cell's composed config samples or
N > 1, else ``greedy``). docs/ablate.md "The grid at paper scale".
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import yaml

from tokenbalance.ablate.results import CellResult
from tokenbalance.ablate.verl.grid import VerlCell
from tokenbalance.run.cell import cell_status, line_status, sitting_files
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


def read_verl_cell(cell_dir: Path, cell: VerlCell) -> CellResult:
    """One cell as found on disk. ``complete``: STATUS completed, with a validation at its last step."""
    status = cell_status(cell_dir)
    try:
        steps = merged_steps(cell_dir)
    except ValueError as err:
        return CellResult(cell, f"damaged: {err}")
    do_sample = validation_do_sample(cell_dir)
    evaluations = [record for step, data in steps.items() if (record := evaluation_record(step, data, do_sample))]
    train = [train_record(step, data) for step, data in steps.items() if TRAIN_MARKER in data]
    last = evaluations[-1] if evaluations else {}
    last_step = train[-1]["step"] if train else -1
    complete = line_status(status) is RunStatus.COMPLETED and bool(last) and last["step"] == last_step
    return CellResult(cell, status, complete, evaluations[0] if evaluations else {}, last, train, evaluations)


def collect_verl(grid_dir: Path, cells: list[VerlCell]) -> list[CellResult]:
    return [read_verl_cell(grid_dir / "cells" / cell.name, cell) for cell in cells]
