"""The verl grid as files a cluster runs: ``OUT/verl/run_grid.sh`` (every cell in turn on one node),
``slurm_array.sh`` (one array task per line of ``cells.txt``, requeued near its time limit), ``run_cell.sh`` (one sitting,
:mod:`.cell_script`) and ``cells/<cell>/run.sh`` (its row, model, seed and launch); a cell's STATUS,
lock and sittings are :mod:`tokenbalance.run.cell`'s. Every embedded value is shell-quoted data. Writing
again never touches what the cells wrote, refuses a cell that ran another launch and never replaces a
script the user edited (:data:`DIGESTS`). docs/ablate.md "The grid at paper scale".
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from pathlib import Path

from tokenbalance.ablate.grid import GridMethod
from tokenbalance.ablate.verl.cell_script import DRY_RUN_CHECK, SITTING_SCRIPT
from tokenbalance.ablate.verl.cost import SAVE_FREQ, SLURM_MAX_HOURS, CellCost
from tokenbalance.ablate.verl.grid import VERL_MODEL_NAMES, VerlCell
from tokenbalance.outputs import write_text_atomic
from tokenbalance.run.cell import STATUS_FILE, STOP_FILE, has_run
from tokenbalance.run.cell_launch import file_digest
from tokenbalance.run.state import NOT_STARTED

DIGESTS = ".tokenbalance-scripts.json"  # script name (relative to the grid directory) -> sha256 as written
STOP_LEAD_S = 900  # the least lead: Slurm signals a task this long (or longer) before its time limit
STOP_MARGIN_S = 120  # of the lead, kept for a SIGTERM after the grace, the cell's STATUS and the requeue
SLURM_SIGNAL_MAX_S = 65535  # sbatch --signal's largest lead


def comment_safe(text: str) -> str:
    """``text`` for a ``#`` comment line of a script: line breaks shown as ``\\n`` (a newline in a
    path would otherwise end the comment and run the rest as shell code)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def fill(template: str, **values: str) -> str:
    """``template`` with each ``@NAME@`` replaced by ``values[NAME]``, in one pass (a value is never
    searched for placeholders itself); bash keeps its own ``${...}``."""
    return re.sub(r"@([A-Z_]+)@", lambda match: values[match.group(1)], template)


def launch_line(cell: VerlCell) -> str:
    """The cell's ``LAUNCH=(...)`` array: ``env MODEL=.. ESTIMATOR=.. METHOD=.. TRAINER=.. bash SCRIPT [overrides]``."""
    env = [f"{key}={value}" for key, value in (("MODEL", cell.model), *cell.launch.env)]
    words = ["env", *env, "bash", cell.launch.script, *cell.launch.overrides]
    return "LAUNCH=(" + " ".join(shlex.quote(word) for word in words) + ")"


CELL_TEMPLATE = """#!/usr/bin/env bash
# tokenbalance verl grid, cell @NAME_COMMENT@: row @ROW@, model @MODEL@, seed @SEED@.
# From the repository root:
#   bash @SCRIPT@                   # one sitting; run it again to resume from the cell's last checkpoint
#   DRY_RUN=1 bash @SCRIPT@         # compose and validate the cell's config (printed); change nothing
#   bash @SCRIPT@ key=value ...     # extra hydra overrides for this sitting
#   MODEL_PATH_@MODEL_UPPER@=/models/... bash @SCRIPT@   # a local copy of the model (default: the hub's @HUB_COMMENT@)
# The launch: this row's method preset on verl (examples/verl/kk_method.sh; common.sh holds the shared
# AR-Lopti K&K settings, each with its source: data, 64 prompts x 8, lengths, lr, clipping, KL, rollout,
# 5 epochs), then the seed (data.seed, rollout.seed) and this directory
# (checkpoints/, hydra/, metrics.sitting-<k>.jsonl, train.log; STATUS says where the cell is).
CELL=@NAME@
SEED=@SEED@
MODEL=@MODEL_WORD@
MODEL_HUB_NAME=@HUB@
@LAUNCH@
CELL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$CELL_DIR/../../run_cell.sh"
"""


def cell_script(cell: VerlCell, script_path: str) -> str:
    return fill(
        CELL_TEMPLATE,
        NAME_COMMENT=comment_safe(cell.name),
        ROW=comment_safe(f"{cell.method.label} ({cell.method.preset})"),
        MODEL=comment_safe(cell.model),
        SEED=str(int(cell.seed)),
        SCRIPT=comment_safe(shlex.quote(script_path)),
        NAME=shlex.quote(cell.name),
        MODEL_WORD=shlex.quote(cell.model),
        MODEL_UPPER=comment_safe(cell.model.upper()),
        HUB=shlex.quote(VERL_MODEL_NAMES[cell.model]),
        HUB_COMMENT=comment_safe(VERL_MODEL_NAMES[cell.model]),
        LAUNCH=launch_line(cell),
    )


DRIVER_TEMPLATE = """#!/usr/bin/env bash
# tokenbalance ablate --runner verl: grid @PRESET@ at paper scale (AR-Lopti K&K setting, verl), on one node.
# Written by: @COMMAND@
@SUMMARY@
#
# On a GPU node (1 x 4 x 80 GB per cell, as the AR-Lopti scripts), from the repository root:
#   pip install -e '.[verl]' && pip install 'verl[vllm]'
#   bash examples/verl/prepare_kk_data.sh data/kk
#   DRY_RUN=1 bash @SCRIPT@      # compose and validate every cell's config; changes nothing (1, true, yes)
#   bash @SCRIPT@ [key=value...] # run every cell not completed, in turn (extra hydra overrides for every cell)
# A failed cell does not stop the grid: the others run, the failed ones are listed at the end (exit
# status 1), and running this script again resumes them from their last checkpoint. One job per cell on
# a cluster: slurm_array.sh beside this script. Environment: MODEL_PATH_3B / MODEL_PATH_7B (each model's
# local copy; default the hub's), CHECKPOINT_ROOT (cell C's checkpoints in CHECKPOINT_ROOT/C instead of
# cells/C/checkpoints), LOGGER (default [console,file]) and those of examples/verl/common.sh (DATA_DIR,
# N_GPUS, OFFLOAD, VALIDATION). A resume whose launch, model path, DATA_DIR, N_GPUS, VALIDATION, extra
# overrides or scripts differ from the cell's earlier sittings is refused, naming what changed. Each
# cell: cells/<cell>/run.sh, STATUS, launch.json, metrics.sitting-<k>.jsonl. The table from the cells'
# verl logs: the command above with --report-only.
set -uo pipefail
@DRY_RUN_CHECK@
GRID_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mapfile -t CELLS < "$GRID_DIR/cells.txt"
FAILED=()
for cell in "${CELLS[@]}"; do
  bash "$GRID_DIR/cells/$cell/run.sh" "$@" < /dev/null || FAILED+=("$cell")
done
echo "== grid: each cell's STATUS"
for cell in "${CELLS[@]}"; do
  printf '%s: %s\\n' "$cell" "$(python -m tokenbalance.run.cell status "$GRID_DIR/cells/$cell")"
done
if ((${#FAILED[@]})); then
  echo "failed cells (run this script again to resume them): ${FAILED[*]}" >&2
  exit 1
fi
"""


SLURM_TEMPLATE = """#!/usr/bin/env bash
#SBATCH --job-name=tokenbalance-verl
#SBATCH --array=0-@LAST_TASK@
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --exclusive
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=32
#SBATCH --time=@HOURS@:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@@STOP_LEAD_S@
# tokenbalance ablate --runner verl: grid @PRESET@, one Slurm array task per cell (task i runs line i + 1
# of cells.txt: cells/<cell>/run.sh). Written by: @COMMAND@
@SUMMARY@
#
# Submit from the repository root (a task runs there: examples/verl/ and DATA_DIR are found from it):
#   sbatch @SCRIPT@                   # every cell; a completed cell exits at once, so submitting again
#                                     # after failures resumes exactly the unfinished ones
#   sbatch --array=2,5 @SCRIPT@       # only these tasks (line number - 1 in cells.txt)
#   sbatch --array=0-@LAST_TASK@%4 @SCRIPT@   # at most 4 cells at once
#   sbatch --export=ALL,MODEL_PATH_3B=/models/Qwen2.5-3B-Instruct,MODEL_PATH_7B=/models/Qwen2.5-7B-Instruct-1M @SCRIPT@
# Adapt to your cluster before submitting:
#   * add #SBATCH --partition=... / --account=... / --qos=... as your site requires;
#   * --gres=gpu:4 is one node of 4 GPUs per cell (the AR-Lopti scripts) and --exclusive keeps other jobs off
#     it; write your site's GPU request (e.g. --gpus-per-node=4) and export N_GPUS if it is not 4;
#   * --cpus-per-task and --mem: the node's share your site gives 4 GPUs;
#   * --time: @TIME_WHY@. @STOP_LEAD_S@ s before the limit Slurm
#     sends this script USR1 (--signal; the lead is the slowest cell's estimated worst-case stop, its step in
#     progress with that step's save and validation, the requested save and the exit, plus @STOP_MARGIN_S@ s, at
#     least @STOP_LEAST_S@ s: ablate/verl/cost.py): the task asks its cell to stop (touch cells/<cell>/@STOP_FILE@):
#     the trainer finishes the step in progress, saves it at the next step's beginning and ends (STATUS
#     "failed at step N: stopped on request (@STOP_FILE@): checkpoint global_step_M saved ..."), so no completed
#     step is lost. A sitting still running STOP_GRACE_S (default @STOP_GRACE_S@) s after the request is stopped
#     as before (SIGTERM to its process group; STATUS "failed at step N: stopped by SIGTERM ..."; the steps since
#     its last checkpoint, every @SAVE_FREQ@ steps, are lost). Then the task requeues itself (scontrol requeue;
#     --requeue) and resumes from the cell's last checkpoint, at most MAX_REQUEUES (default @MAX_REQUEUES@) times;
#   * the environment: jobs inherit the submitting shell's by default; otherwise activate it below
#     (module load ... / source .venv/bin/activate); CHECKPOINT_ROOT=/scratch/... puts the checkpoints there;
#   * the grid directory: @GRID_WHERE@; a grid moved elsewhere: sbatch --export=ALL,GRID_DIR=/new/path @SCRIPT@.
# Extra arguments are hydra overrides for every cell (sbatch @SCRIPT@ trainer.n_gpus_per_node=8).
set -uo pipefail
DEFAULT_GRID_DIR=@GRID_DIR@
WRITTEN_GRID_DIR=@WRITTEN_GRID_DIR@
USER_GRID_DIR="${GRID_DIR:-}"
GRID_DIR="${GRID_DIR:-$DEFAULT_GRID_DIR}"
cd "${SLURM_SUBMIT_DIR:-.}" || exit 2
TASK="${SLURM_ARRAY_TASK_ID:?submit this script with sbatch (each array task runs one cell); on one node use run_grid.sh}"
if [[ -z "$USER_GRID_DIR" && ! -f "$GRID_DIR/cells.txt" && -f "$WRITTEN_GRID_DIR/cells.txt" ]]; then
  GRID_DIR="$WRITTEN_GRID_DIR"
fi
if [[ ! -f "$GRID_DIR/cells.txt" ]]; then
  echo "array task $TASK: no grid in $GRID_DIR (no cells.txt there, from $PWD): submit from the directory the grid was written from, or name it: sbatch --export=ALL,GRID_DIR=/path/to/verl ..." >&2
  exit 2
fi
CELL="$(sed -n "$((TASK + 1))p" "$GRID_DIR/cells.txt")"
if [[ -z "$CELL" ]]; then
  echo "array task $TASK: no line $((TASK + 1)) in $GRID_DIR/cells.txt" >&2
  exit 2
fi
# USR1 (the time limit is near): ask the cell's trainer to stop at its next step with a checkpoint (the
# sitting ends by itself), and SIGTERM the sitting if it still runs STOP_GRACE_S later (a timer in its own
# process group, ended with the sitting)
STOPPED=""
GRACE_TIMER=""
SITTING=""  # set before the trap, so that a USR1 before the sitting starts finds it (set -u)
stop_for_requeue() {
  if [[ -n "$STOPPED" ]]; then return; fi
  STOPPED=1
  touch "$GRID_DIR/cells/$CELL/@STOP_FILE@"
  setsid bash -c 'sleep "$1"; kill -TERM "$2" 2> /dev/null' grace "${STOP_GRACE_S:-@STOP_GRACE_S@}" "$SITTING" &
  GRACE_TIMER=$!
}
trap stop_for_requeue USR1
bash "$GRID_DIR/cells/$CELL/run.sh" "$@" &
SITTING=$!
wait "$SITTING"
RC=$?
while kill -0 "$SITTING" 2> /dev/null; do wait "$SITTING"; RC=$?; done  # a trapped signal ends wait early
if [[ -n "$GRACE_TIMER" ]]; then kill -- "-$GRACE_TIMER" 2> /dev/null; fi
if [[ -n "$STOPPED" ]]; then
  RESTARTS="${SLURM_RESTART_COUNT:-0}"
  if ((RESTARTS >= ${MAX_REQUEUES:-@MAX_REQUEUES@})); then
    echo "== $CELL: stopped before the time limit after $RESTARTS requeues (MAX_REQUEUES); submit again to resume it" >&2
  elif scontrol requeue "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}_$TASK"; then
    echo "== $CELL: stopped before the time limit; requeued (restart $((RESTARTS + 1))): it resumes from its last checkpoint"
  fi
fi
exit "$RC"
"""


def slurm_hours(longest_cell_hours: float) -> tuple[int, str]:
    """The array's ``--time`` in hours and why: 1.5 x the longest cell's estimate, at most :data:`SLURM_MAX_HOURS`."""
    wanted = max(1, math.ceil(1.5 * longest_cell_hours))
    if wanted <= SLURM_MAX_HOURS:
        return wanted, f"1.5 x the longest cell's estimated {longest_cell_hours:.0f} h on 4 GPUs"
    return SLURM_MAX_HOURS, (
        f"{SLURM_MAX_HOURS} h, a common partition limit (the longest cell is estimated at "
        f"{longest_cell_hours:.0f} h on 4 GPUs: it runs over several submissions)"
    )


def stop_lead_s(cells: list[VerlCell]) -> int:
    """How long before the time limit Slurm signals a task (``--signal=B:USR1@<this>``): the slowest cell's
    worst-case stop (:attr:`.cost.CellCost.stop_seconds`: the step in progress, its save and validation, the
    requested save, the exit) plus :data:`STOP_MARGIN_S`, in whole minutes, at least :data:`STOP_LEAD_S`
    and at most :data:`SLURM_SIGNAL_MAX_S`."""
    worst = max((CellCost(cell.model, cell.launch.update_passes).stop_seconds for cell in cells), default=0.0)
    return min(SLURM_SIGNAL_MAX_S, max(STOP_LEAD_S, 60 * math.ceil((worst + STOP_MARGIN_S) / 60)))


def max_requeues(longest_cell_hours: float, job_hours: int) -> int:
    """Twice the jobs the longest cell is estimated to need, at least 3: a cell that makes no progress
    between requeues stops requeueing."""
    return max(3, 2 * math.ceil(longest_cell_hours / job_hours))


def movable_path(grid_dir: Path) -> tuple[str, str]:
    """How the Slurm script names the grid: relative to the directory it was written from when below it
    (the repository root, which is where tasks run: the grid moves with it), else absolute; and why."""
    relative = os.path.relpath(grid_dir)
    if not relative.startswith(os.pardir) and not os.path.isabs(relative):
        return relative, (
            f"{relative} from the directory tasks are submitted from (as it was written: it moves with that "
            f"directory), else {grid_dir}"
        )
    return str(grid_dir), f"{grid_dir} (written outside the directory it was written from)"


def summary_comment(lines: list[str]) -> str:
    return "\n".join(f"# {comment_safe(line)}" for line in lines)


def launch_of(script_text: str) -> str | None:
    """The ``LAUNCH=(...)`` line of a cell script (None if it has none)."""
    return next((line for line in script_text.splitlines() if line.startswith("LAUNCH=(")), None)


def check_relaunch(grid_dir: Path, cells: list[VerlCell]) -> None:
    """``ValueError`` naming the first cell that has run with another launch than the one planned now."""
    for cell in cells:
        cell_dir = grid_dir / "cells" / cell.name
        script = cell_dir / "run.sh"
        if script.is_file() and has_run(cell_dir) and launch_of(script.read_text()) != launch_line(cell):
            raise ValueError(
                f"--out: cell {cell.name} has run with another launch ({launch_of(script.read_text())}; planned now: "
                f"{launch_line(cell)}): its metrics would mix two experiments. Use another --out, or remove "
                f"{cell_dir} yourself"
            )


def written_digests(grid_dir: Path) -> dict[str, str]:
    """The digests of the scripts the grid wrote (:data:`DIGESTS`); empty when there is no record."""
    try:
        digests = json.loads((grid_dir / DIGESTS).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in digests.items() if isinstance(v, str)} if isinstance(digests, dict) else {}


def check_unedited(grid_dir: Path, names: list[str]) -> None:
    """``ValueError`` naming the first of the scripts ``names`` (relative to ``grid_dir``) that exists
    but is not as the grid wrote it: edited by the user, or never written by the grid. A grid written
    before digests were kept has no record and is adopted as it is."""
    digests = written_digests(grid_dir)
    if not digests:
        return
    for name in names:
        path = grid_dir / name
        if path.exists() and (not path.is_file() or digests.get(name) != file_digest(path)):
            raise ValueError(
                f"--out: {path} was edited after the grid wrote it (or not written by it); it is never replaced. "
                "Move it away (carry your edits into the one written then), or write the grid into another --out"
            )


def write_verl_grid(
    grid_dir: Path,
    preset: str,
    cells: list[VerlCell],
    unsupported: list[tuple[GridMethod, str]],
    *,
    summary: list[str],
    longest_cell_hours: float,
    command: str,
) -> list[Path]:
    """Write the grid's scripts into ``grid_dir`` (checked first: a refused grid writes nothing);
    returns the driver and the Slurm script. ``summary``: comment lines for the drivers' headers."""
    check_relaunch(grid_dir, cells)
    driver, slurm = grid_dir / "run_grid.sh", grid_dir / "slurm_array.sh"
    scripts = ["run_grid.sh", "slurm_array.sh", "run_cell.sh", "cells.txt", *(f"cells/{c.name}/run.sh" for c in cells)]
    check_unedited(grid_dir, scripts)
    earlier = written_digests(grid_dir) or {  # a grid written before digests were kept: its scripts adopted
        str(p.relative_to(grid_dir)): file_digest(p) for p in grid_dir.glob("cells/*/run.sh") if p.is_file()
    }
    not_on_verl = [f"not on verl: {row.label} ({row.preset}): {why}" for row, why in unsupported]
    header = summary_comment([*summary, *not_on_verl])
    hours, why = slurm_hours(longest_cell_hours)
    lead = stop_lead_s(cells)
    grid_word, grid_where = movable_path(grid_dir)
    common = {"PRESET": comment_safe(repr(preset)), "COMMAND": comment_safe(command), "SUMMARY": header}
    (grid_dir / "cells").mkdir(parents=True, exist_ok=True)
    for cell in cells:
        cell_dir = grid_dir / "cells" / cell.name
        cell_dir.mkdir(exist_ok=True)
        _write_script(cell_dir / "run.sh", cell_script(cell, str(cell_dir / "run.sh")))
        if not (cell_dir / STATUS_FILE).exists():
            (cell_dir / STATUS_FILE).write_text(NOT_STARTED + "\n")
    _write_script(grid_dir / "run_cell.sh", SITTING_SCRIPT)
    write_text_atomic(grid_dir / "cells.txt", "".join(f"{cell.name}\n" for cell in cells))
    _write_script(
        driver,
        fill(DRIVER_TEMPLATE, **common, SCRIPT=comment_safe(shlex.quote(str(driver))), DRY_RUN_CHECK=DRY_RUN_CHECK),
    )
    slurm_text = fill(
        SLURM_TEMPLATE,
        **common,
        LAST_TASK=str(len(cells) - 1),
        HOURS=str(hours),
        TIME_WHY=comment_safe(why),
        SCRIPT=comment_safe(shlex.quote(str(slurm))),
        STOP_LEAD_S=str(lead),
        STOP_LEAST_S=str(STOP_LEAD_S),
        STOP_MARGIN_S=str(STOP_MARGIN_S),
        STOP_GRACE_S=str(lead - STOP_MARGIN_S),
        STOP_FILE=STOP_FILE,
        SAVE_FREQ=str(SAVE_FREQ),
        MAX_REQUEUES=str(max_requeues(longest_cell_hours, hours)),
        GRID_DIR=shlex.quote(grid_word),
        GRID_WHERE=comment_safe(grid_where),
        WRITTEN_GRID_DIR=shlex.quote(str(grid_dir)),
    )
    _write_script(slurm, slurm_text)
    digests = earlier | {name: file_digest(grid_dir / name) for name in scripts}
    write_text_atomic(grid_dir / DIGESTS, json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return [driver, slurm]


def _write_script(path: Path, text: str) -> None:
    write_text_atomic(path, text)
    path.chmod(path.stat().st_mode | 0o111)
