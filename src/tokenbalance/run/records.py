"""A finished run kept as a small record (``ablate --records DIR``: ``DIR/<cell>/``, :data:`RECORD_FILES`, the
metrics gzip-compressed, no checkpoint), restored into a new cell whose planned config and steps it completed
(compared as a resume compares, :func:`~tokenbalance.run.resume.changed_setting`); another experiment's record is
never replaced. Records of older versions, with a plain ``metrics.jsonl``, are read and restored alike.
docs/ablate.md "Across machines"."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

from tokenbalance.config import RunConfig, load_config
from tokenbalance.diagnostics.sinks import (
    METRICS_FILE,
    METRICS_RECORD,
    compressed_metrics,
    metrics_path,
    read_metrics_text,
)
from tokenbalance.outputs import check_files_replaceable, record_written, write_text_atomic
from tokenbalance.run.fingerprints import FINGERPRINTS_FILE
from tokenbalance.run.resume import changed_setting
from tokenbalance.run.state import CONFIG_FILE, EVAL_OUTCOMES, RUN_STATE_FILE, RunDirState, has_final_eval

COPIED_FILES = (CONFIG_FILE, RUN_STATE_FILE)  # copied as they are; the metrics are compressed (METRICS_RECORD)
RECORD_FILES = (CONFIG_FILE, METRICS_RECORD, RUN_STATE_FILE)  # what keep writes
OPTIONAL_RECORD_FILES = (EVAL_OUTCOMES, FINGERPRINTS_FILE)  # kept when the cell wrote them (older code did not)


def record_difference(record_dir: Path, planned: RunConfig) -> tuple[str, object, object] | None:
    """The first setting of the record's ``config.yaml`` that differs from ``planned`` (as :func:`changed_setting`),
    machine paths of the embedded policy aside; None when they agree."""
    saved = copy.deepcopy(load_config(record_dir / CONFIG_FILE))
    if saved.model.path and planned.model.path and Path(saved.model.path).name == Path(planned.model.path).name:
        saved.model.path, saved.model.cache_dir = planned.model.path, planned.model.cache_dir
    return changed_setting(saved, planned)


def record_matches(record_dir: Path, planned: RunConfig) -> bool:
    """Whether ``record_dir`` holds a cell that completed ``planned``'s steps with ``planned``'s config (machine paths
    of the embedded policy aside); False when any file is missing."""
    if not all((record_dir / name).is_file() for name in COPIED_FILES) or not metrics_path(record_dir).is_file():
        return False
    state = RunDirState.read(record_dir)
    if not (state.completed and state.state_step == planned.train.steps):
        return False
    if not has_final_eval(record_dir, planned.train.steps):
        return False
    return record_difference(record_dir, planned) is None


def record_conflict(record_dir: Path, planned: RunConfig) -> str | None:
    """Why this grid must not replace the record in ``record_dir`` when its cell finishes: a record of another config
    (another grid sharing the directory), or of more steps than planned; None when there is no record or it is this
    experiment's (same config, as many steps or fewer)."""
    if not (record_dir / CONFIG_FILE).is_file():
        return None
    try:
        changed = record_difference(record_dir, planned)
    except (OSError, ValueError) as err:
        return f"{record_dir / CONFIG_FILE} cannot be read ({err})"
    if changed is not None:
        key, before, after = changed
        return f"{record_dir} is the record of another config ({key}: {before!r} there, {after!r} in this grid)"
    state = RunDirState.read(record_dir)
    if state.completed and state.state_step > planned.train.steps:
        return f"{record_dir} is the record of {state.state_step} steps, more than the {planned.train.steps} planned"
    return None


def check_no_conflict(records_dir: Path, planned: dict[str, RunConfig]) -> None:
    """``ValueError`` naming the first record in ``records_dir`` a grid of the cells ``planned`` (cell name -> config)
    could replace with another experiment's numbers (:func:`record_conflict`)."""
    conflicts = [why for cell, config in planned.items() if (why := record_conflict(records_dir / cell, config))]
    if conflicts:
        more = f" (and {len(conflicts) - 1} more cell(s))" if len(conflicts) > 1 else ""
        raise ValueError(
            f"--records {records_dir}: {conflicts[0]}{more}; a grid never replaces the records of another "
            "experiment. Use another --records directory for this grid"
        )


def restore(record_dir: Path, run_dir: Path) -> None:
    """Copy the record into the (new or empty) cell directory ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (*COPIED_FILES, *OPTIONAL_RECORD_FILES):
        if name in COPIED_FILES or (record_dir / name).is_file():
            shutil.copyfile(record_dir / name, run_dir / name)
    (run_dir / METRICS_FILE).write_text(read_metrics_text(metrics_path(record_dir)))


def keep(run_dir: Path, records_dir: Path, cell: str) -> str | None:
    """Copy the completed cell in ``run_dir`` to ``records_dir/cell``, its metrics compressed (each file replaced
    atomically; an older record's plain ``metrics.jsonl`` of this experiment is then removed); returns None, or a note
    when a record of another experiment appeared there meanwhile (another grid sharing the directory): that record is
    kept and this one is not written."""
    conflict = record_conflict(records_dir / cell, load_config(run_dir / CONFIG_FILE))
    if conflict:
        return f"--records: {conflict}; it is kept and this cell's record is not written there"
    check_files_replaceable(records_dir, [cell], "--records")
    records_dir.mkdir(parents=True, exist_ok=True)
    record_written(records_dir, [cell])
    target = records_dir / cell
    target.mkdir(exist_ok=True)
    for name in (CONFIG_FILE, *OPTIONAL_RECORD_FILES):
        if name == CONFIG_FILE or (run_dir / name).is_file():
            write_text_atomic(target / name, (run_dir / name).read_text())
    write_text_atomic(target / METRICS_RECORD, compressed_metrics((run_dir / METRICS_FILE).read_text()))
    (target / METRICS_FILE).unlink(missing_ok=True)  # this experiment's older, uncompressed copy
    write_text_atomic(target / RUN_STATE_FILE, (run_dir / RUN_STATE_FILE).read_text())  # last: the record is whole
    return None
