"""Where a new run may start (:func:`check_new_run_dir`: a new or empty directory, nothing touched otherwise;
:func:`undo_failed_start`) and a resume's repairs after a kill: interrupted writes' temporary files removed, a lost
``checkpoints/latest`` re-pointed. docs/reliability.md "Guarantees"."""

from __future__ import annotations

import shutil
from pathlib import Path

from tokenbalance.diagnostics.sinks import METRICS_FILE
from tokenbalance.outputs import check_writable_dir, write_text_atomic
from tokenbalance.run.checkpoints import LATEST, TEMP_PREFIX, resume_checkpoint, rl_store
from tokenbalance.run.fingerprints import FINGERPRINTS_FILE
from tokenbalance.run.state import CONFIG_FILE, NOT_A_RUN, RUN_STATE_FILE

RUN_FILES = (CONFIG_FILE, METRICS_FILE, RUN_STATE_FILE, "checkpoints")  # a run: the first and another
START_FILES = (CONFIG_FILE, FINGERPRINTS_FILE, "wandb", "tensorboard")  # what a new run writes before its first status


def check_new_run_dir(run_dir: Path) -> None:
    """``ValueError`` unless a new run may start in ``run_dir`` (module docstring)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--run-dir {run_dir}: is a file, not a directory; choose another --run-dir")
    if run_dir.is_dir():
        entries = sorted(e.name for e in run_dir.iterdir() if e.name not in NOT_A_RUN)
        if CONFIG_FILE in entries and any(name in RUN_FILES[1:] for name in entries):
            raise ValueError(
                f"{run_dir} already holds a run; pass --resume {run_dir} to continue it or choose another --run-dir"
            )
        if entries:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise ValueError(
                f"--run-dir {run_dir}: the directory exists and holds files tokenbalance did not write ({shown}); "
                "a run starts only in a new or empty directory (nothing is deleted or overwritten). Choose another "
                "--run-dir"
            )
    check_writable_dir(run_dir, "--run-dir")


def undo_failed_start(run_dir: Path) -> list[str]:
    """After a new run failed before writing its first status: remove what the start wrote (:data:`START_FILES`), so
    the same command is accepted again; returns the names removed. A run with a status or metrics is left (it
    resumes)."""
    if (run_dir / RUN_STATE_FILE).exists() or (run_dir / METRICS_FILE).exists():
        return []
    removed = []
    for name in START_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def clean_interrupted_writes(run_dir: Path) -> list[str]:
    """Remove the temporary files and half-written checkpoint folders an interrupted process left in ``run_dir`` (only
    names tokenbalance's own atomic writes use: ``.config.yaml.*``, ``.run_state.json.*``, ``.fingerprints.json.*``,
    ``checkpoints/.step_*``,
    ``checkpoints/.latest.*``); returns what was removed."""
    removed = []
    candidates = [
        path for name in (CONFIG_FILE, RUN_STATE_FILE, FINGERPRINTS_FILE) for path in run_dir.glob(f".{name}.*")
    ]
    checkpoints = rl_store(run_dir).root
    if checkpoints.is_dir():
        candidates += [*checkpoints.glob(f"{TEMP_PREFIX}*"), *checkpoints.glob(f".{LATEST}.*")]
    for path in sorted(candidates):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path.relative_to(run_dir)))
    return removed


def recover_latest(run_dir: Path) -> str | None:
    """Point ``checkpoints/latest`` at the newest complete checkpoint when it is missing or names one that is not
    complete; returns a note saying so (None when nothing changed). ``ValueError`` when ``step_*`` folders exist but
    none is complete (a resume would start over on top of them)."""
    store = rl_store(run_dir)
    if not store.root.is_dir():
        return None
    pointer = store.root / LATEST
    named = pointer.read_text().strip() if pointer.is_file() else None
    newest = resume_checkpoint(run_dir)
    if newest is not None and newest.name == named:  # latest names a complete checkpoint
        return None
    if newest is None:
        steps = store.steps()
        if steps:
            raise ValueError(
                f"{store.root}: no complete checkpoint among {', '.join(p.name for p in steps)} (each needs "
                f"{store.layout()}); a resume would start over at step 0 on top of them. Move them out of "
                f"{store.root} to start the run over"
            )
        return None
    write_text_atomic(pointer, newest.name + "\n")
    why = "was missing" if named is None else f"named {named!r}, which is not a complete checkpoint"
    return f"{pointer} {why}; continuing from {newest.name}, the newest complete checkpoint"
