"""Run a grid cell by cell, resumably, into ``OUT/`` (``grid.json``, ``grid_log.jsonl``, ``configs/``,
``cells/<cell>/`` each a normal ``train`` run, ``logs/``, ``start_evals/`` the step-0 evaluations its cells share):
each cell in a child process by default, a killed grid continues (:func:`tokenbalance.run.plan.cell_action`), the run
lock keeps a second grid out. docs/ablate.md ("How a grid runs")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tokenbalance.ablate.cells import base_config, cell_config, start_policy
from tokenbalance.ablate.grid import Cell, GridPlan
from tokenbalance.ablate.progress import GridProgress, StepRates
from tokenbalance.config import RunConfig, load_config, replace_sections, save_config
from tokenbalance.outputs import check_files_replaceable, record_written
from tokenbalance.run import records as cell_records
from tokenbalance.run.fingerprints import source_commit
from tokenbalance.run.lock import RunLock
from tokenbalance.run.plan import Action, CellAction, cell_action
from tokenbalance.run.state import RUN_STATE_FILE, RunStatus, last_logged_step, run_status
from tokenbalance.threads import available_cpus

ISOLATIONS = ("subprocess", "inprocess")
# Every name the grid writes in OUT (recorded in OUT's manifest, tokenbalance/outputs.py, as it writes them): anything
# else there is the user's and is never replaced; a name here that exists in OUT but is not in the manifest is refused
# before any work.
RUN_FILES = ("grid.json", "grid_log.jsonl", "configs", "cells", "logs", "start_evals")
REPORT_FILES = (
    "results.md",
    "accuracy.csv",
    "cells.csv",
    "step_cost.csv",
    "reward_curves.png",
    "figure1_buckets.json",
    "figure1_buckets.png",
)
GRID_FILES = (*RUN_FILES, *REPORT_FILES, "verl")


def adopt_earlier_grid(out_dir: Path) -> list[str]:
    """A grid written before the manifest existed: when ``OUT/grid.json`` is one of ours (the plan's keys) and ``OUT``
    has no manifest yet, record the grid's names found there, so that the grid continues; returns them (empty when
    there was nothing to adopt)."""
    from tokenbalance.outputs import MANIFEST

    if (out_dir / MANIFEST).exists():
        return []
    try:
        plan = json.loads((out_dir / "grid.json").read_text())
    except (OSError, ValueError):
        return []
    if not (isinstance(plan, dict) and {"preset", "rows", "seeds", "steps"} <= set(plan)):
        return []
    found = [name for name in GRID_FILES if (out_dir / name).exists()]
    record_written(out_dir, found)
    return found


@dataclass
class GridOutcome:
    """What one sitting did: ``ran`` (cell -> final status), ``skipped`` (already complete)."""

    ran: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        return [name for name, status in self.ran.items() if status != RunStatus.COMPLETED]


def cell_dir(out_dir: Path, cell: Cell) -> Path:
    return out_dir / "cells" / cell.name


def append_log(out_dir: Path, record: dict) -> None:
    with open(out_dir / "grid_log.jsonl", "a") as out:
        out.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}) + "\n")


def read_log(out_dir: Path) -> list[dict]:
    path = out_dir / "grid_log.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def train_command(action: Action, config_file: Path, run_dir: Path, steps: int) -> list[str]:
    """The ``tokenbalance train`` command line of a cell run."""
    head = [sys.executable, "-m", "tokenbalance.cli", "train"]
    if action.continues:
        return [*head, "--resume", str(run_dir), "--steps", str(steps), "--no-progress"]
    return [*head, "--config", str(config_file), "--run-dir", str(run_dir), "--no-progress"]


def child_environment() -> dict[str, str]:
    """This process's environment with this tokenbalance's source first on PYTHONPATH, so the cells run the same code
    as the grid (also from a source checkout)."""
    import tokenbalance

    source = str(Path(tokenbalance.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH", "")) if p)
    return env


def end_with_parent() -> None:
    """In the child before it runs (Linux): the kernel sends it SIGTERM when the grid's process dies, however it dies
    (SIGKILL included), so no cell trains on as an orphan; the cell then stops as on Ctrl-C, resumable. Elsewhere a
    no-op (the grid's Ctrl-C and SIGTERM still end the cell)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class CellProcess:
    """A cell's ``tokenbalance train`` in a child process (ended with the grid's process: :func:`end_with_parent`),
    its console output appended to ``log_path``."""

    def __init__(self, command: list[str], log_path: Path, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._log = open(log_path, "a")  # noqa: SIM115 - closed in poll() / stop()
        self._log.write(f"$ {' '.join(command)}\n")
        self._log.flush()
        self._proc = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=child_environment(), preexec_fn=end_with_parent
        )

    def poll(self) -> str | None:
        """None while it runs; then its status (``completed``, or ``failed (exit N, status S)``)."""
        code = self._proc.poll()
        if code is None:
            return None
        self._log.close()
        status = run_status(self.run_dir)
        if code == 0 and status is RunStatus.COMPLETED:
            return RunStatus.COMPLETED.value
        return f"failed (exit {code}, status {status})"

    def stop(self) -> None:
        """SIGTERM (the cell stops as on Ctrl-C, resumable), then SIGKILL after 30 s."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._log.close()


def run_cell_inprocess(config: RunConfig, action: Action, log_path: Path, run_dir: Path) -> str:
    from tokenbalance.trainer.runner import run_training

    with open(log_path, "a") as log:

        def write(*parts) -> None:
            log.write(" ".join(map(str, parts)) + "\n")
            log.flush()

        try:
            if action.continues:
                resumed = replace_sections(
                    load_config(run_dir / "config.yaml"),
                    train={"steps": config.train.steps},
                    output={"progress": False},
                )
                run_training(resumed, run_dir=run_dir, resume=True, log=write)
            else:
                run_training(config, run_dir=run_dir, log=write)
        except Exception as err:  # one failed cell does not stop the grid
            write(f"cell failed: {type(err).__name__}: {err}")
            return f"failed ({type(err).__name__}: {err})"
    status = run_status(run_dir)
    return RunStatus.COMPLETED.value if status is RunStatus.COMPLETED else f"failed (status {status})"


def write_plan(out_dir: Path, plan: GridPlan) -> None:
    summary = {
        "preset": plan.preset.name,
        "rows": [{"key": m.key, "label": m.label, "preset": m.preset, "baseline": m.baseline} for m in plan.methods],
        "seeds": list(plan.seeds),
        "steps": plan.steps,
        "preset_overrides": list(plan.preset.overrides),
        "start_seed": plan.preset.start_seed,
        "start_policies": plan.preset.start_policies,
        "overrides": list(plan.overrides),
    }
    (out_dir / "grid.json").write_text(json.dumps(summary, indent=1) + "\n")


def planned_configs(plan: GridPlan, base: RunConfig, out_dir: Path) -> dict[str, RunConfig]:
    """Each cell's config, with the start policy of its seed (its path; built later if needed)."""
    from tokenbalance.run.setup import embedded_key

    configs = {}
    for cell in plan.cells:
        if base.model.path is not None:
            policy = base.model.path
        else:
            seeded = replace_sections(base, train={"seed": plan.preset.policy_seed(cell.seed)})
            policy = str((Path(base.model.cache_dir) / embedded_key(seeded)).resolve())
        configs[cell.name] = cell_config(
            base,
            cell,
            steps=plan.steps,
            policy=policy,
            run_dir=cell_dir(out_dir, cell),
            start_evals=out_dir / "start_evals",
        )
    return configs


def default_jobs(base: RunConfig, isolation: str) -> int:
    """Cells at once by default: one per CPU, each with one thread, on a CPU (on 2 CPUs measured faster than one cell
    with both threads: docs/results.md "Speed"); one on a GPU, in process, or when ``train.threads`` asks for more
    than one thread per cell."""
    from tokenbalance.run.checks import resolve_device

    if isolation == "inprocess" or resolve_device(base.train.device).type != "cpu" or base.train.threads > 1:
        return 1
    return available_cpus()


def run_grid(
    plan: GridPlan,
    out_dir: Path,
    *,
    config_path: str | None = None,
    model: str | None = None,
    device: str | None = None,
    isolation: str = "subprocess",
    jobs: int | None = None,
    records: Path | None = None,
    run_cells: bool = True,
    progress: bool = True,
    poll_s: float = 2.0,
    log=print,
) -> GridOutcome:
    """Run every unfinished cell of ``plan`` into ``out_dir`` (module docstring), ``jobs`` cells at once (each child
    process then gets ``train.threads`` = CPUs // jobs unless ``--set`` gave one; None: :func:`default_jobs`). With
    ``records``, completed cells are kept there and restored from there (:mod:`tokenbalance.run.records`).
    ``run_cells=False`` stops after that: the finished cells restored, none run (``--report-only --records``)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"--isolation: unknown value {isolation!r}; valid: {', '.join(ISOLATIONS)}")
    from tokenbalance.run.setup import check_settings, prepare

    out_dir = Path(out_dir).resolve()
    if plan.preset.model is not None and model is None:
        raise ValueError(f"--preset {plan.preset.name}: give its start policy with --model DIR: {plan.preset.model}")
    base = base_config(plan, config_path=config_path, model=model, device=device)
    # the checks before work; its task and SFT pairs serve every seed's start policy. Restoring records runs nothing,
    # so the settings are checked but the start policy need not be on this machine: a record names it by its folder
    setup = prepare(base) if run_cells else None
    if setup is None:
        check_settings(base)
    jobs = default_jobs(base, isolation) if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"--jobs: must be >= 1, got {jobs}")
    if jobs > 1 and isolation == "inprocess":
        raise ValueError(f"--jobs {jobs}: must be 1 with --isolation inprocess (one process runs one cell)")
    cell_base = base
    if jobs > 1 and not base.train.threads:  # the cells share the CPUs
        cell_base = replace_sections(base, train={"threads": max(1, available_cpus() // jobs)})
    configs = planned_configs(plan, cell_base, out_dir)
    outcome = GridOutcome()
    out_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(out_dir):
        # every cell is checked before anything is written: a refused sitting changes nothing
        actions = {cell.name: cell_action(cell_dir(out_dir, cell), configs[cell.name]) for cell in plan.cells}
        restored = []
        if records is not None:
            check_files_replaceable(records, [c.name for c in plan.cells], "--records")
            cell_records.check_no_conflict(records, {c.name: configs[c.name] for c in plan.cells})
            restored = [
                c.name
                for c in plan.cells
                if actions[c.name].action is Action.START
                and cell_records.record_matches(records / c.name, configs[c.name])
            ]
            actions |= {name: CellAction(Action.DONE, plan.steps) for name in restored}
        check_files_replaceable(out_dir, RUN_FILES, "--out")
        record_written(out_dir, RUN_FILES)
        for sub in ("configs", "cells", "logs", "start_evals"):
            (out_dir / sub).mkdir(exist_ok=True)
        write_plan(out_dir, plan)
        for cell in plan.cells:
            save_config(configs[cell.name], out_dir / "configs" / f"{cell.name}.yaml")
        for name in restored:  # finished on another machine: its records, no checkpoint
            assert records is not None
            cell_records.restore(records / name, out_dir / "cells" / name)
        outcome.skipped = [name for name, (action, _) in actions.items() if action is Action.DONE]
        append_log(
            out_dir,
            {
                "event": "sitting",
                "pid": os.getpid(),
                "isolation": isolation,
                "commit": source_commit(),
                "skipped": outcome.skipped,
                **({"restored": restored} if restored else {}),
                **({} if run_cells else {"runs_cells": False}),
            },
        )
        if restored:
            log(f"restored {len(restored)} finished cell(s) from {records}: {', '.join(restored)}")
        if records is not None:  # cells finished before records were kept: kept now
            for name in outcome.skipped:
                if name not in restored and not (records / name / RUN_STATE_FILE).is_file():
                    note = cell_records.keep(out_dir / "cells" / name, records, name)
                    if note:
                        log(note)
        if not run_cells:
            return outcome
        rates = StepRates()
        for record in read_log(out_dir):
            if record.get("event") == "cell" and record.get("status") == RunStatus.COMPLETED:
                rates.add(record["row"], record["wall_s"], record["to_step"] - record["from_step"])
        pending = [c for c in plan.cells if actions[c.name].action is not Action.DONE]
        work = {c.name: (c.method.key, plan.steps - actions[c.name][1]) for c in pending}
        first_of_seed: dict[int, Cell] = {}
        for cell in pending:
            first_of_seed.setdefault(plan.preset.policy_seed(cell.seed), cell)
        for seed, cell in first_of_seed.items():  # the one-time SFT builds, before the progress display
            built = start_policy(base, seed, log=log, progress=progress, setup=setup)
            if built != configs[cell.name].model.path:
                raise RuntimeError(f"seed {seed}: start policy {built}, planned {configs[cell.name].model.path}")
        with GridProgress(len(plan.cells), done=len(outcome.skipped), enabled=progress, log=log) as display:
            queue: list[Cell] = list(pending)
            running: dict[str, tuple[Cell, CellProcess]] = {}
            starts: dict[str, tuple[Action, int, float]] = {}  # cell -> (action, from step, start time)

            def seconds_left() -> float | None:
                total = rates.seconds_left(list(work.values()))
                return None if total is None else total / jobs

            def finish(cell: Cell, status: str) -> None:
                action, from_step, started = starts[cell.name]
                wall = time.perf_counter() - started
                work.pop(cell.name)
                rates.forget_running(cell.name)
                if status == RunStatus.COMPLETED:
                    rates.add(cell.method.key, wall, plan.steps - from_step)
                    if records is not None:
                        note = cell_records.keep(cell_dir(out_dir, cell), records, cell.name)
                        if note:
                            log(note)
                append_log(
                    out_dir,
                    {
                        "event": "cell",
                        "cell": cell.name,
                        "row": cell.method.key,
                        "seed": cell.seed,
                        "action": action,
                        "from_step": from_step,
                        "to_step": plan.steps,
                        "status": status,
                        "wall_s": wall,
                        "jobs": jobs,
                    },
                )
                outcome.ran[cell.name] = status
                display.cell_finished(cell.name, status, wall, seconds_left())

            try:
                while queue or running:
                    while queue and len(running) < jobs:
                        cell = queue.pop(0)
                        action, from_step = actions[cell.name]
                        run_dir = cell_dir(out_dir, cell)
                        starts[cell.name] = (action, from_step, time.perf_counter())
                        display.cell_started(cell.name, action, from_step, plan.steps, seconds_left())
                        log_path = out_dir / "logs" / f"{cell.name}.log"
                        if isolation == "inprocess":  # jobs is 1: runs to its end here
                            finish(cell, run_cell_inprocess(configs[cell.name], action, log_path, run_dir))
                            continue
                        command = train_command(action, out_dir / "configs" / f"{cell.name}.yaml", run_dir, plan.steps)
                        running[cell.name] = (cell, CellProcess(command, log_path, run_dir))
                    if not running:
                        continue
                    time.sleep(poll_s)
                    for name, (cell, process) in list(running.items()):
                        status = process.poll()
                        if status is None:
                            step = last_logged_step(process.run_dir)
                            work[name] = (cell.method.key, plan.steps - step)
                            _, from_step, started = starts[name]
                            rates.note_running(name, cell.method.key, time.perf_counter() - started, step - from_step)
                            display.cell_step(name, step, plan.steps, seconds_left())
                        else:
                            del running[name]
                            finish(cell, status)
            except BaseException:
                for _, process in running.values():  # Ctrl-C / SIGTERM: every running cell stops, resumable
                    process.stop()
                raise
    return outcome
