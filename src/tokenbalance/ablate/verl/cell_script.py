"""The shell code of one sitting of a verl grid cell, written once per grid as ``OUT/verl/run_cell.sh``.

Each ``cells/<cell>/run.sh`` (:mod:`.scripts`) sets the cell's ``CELL``, ``SEED``, ``MODEL``, ``CELL_DIR``
and ``LAUNCH`` and sources it; the comment at the top of :data:`SITTING_SCRIPT` says what a sitting
does. The shell runs the launch (process group, signals, train.log); the cell's lock, STATUS and
sittings are :mod:`tokenbalance.run.cell`'s, which the script runs at the start and the end.
"""

from tokenbalance.ablate.verl.cost import KEEP_CHECKPOINTS
from tokenbalance.integrations.verl_names import STOP_FILE_ENV
from tokenbalance.run.cell import STOP_FILE

# DRY_RUN read the same way by every script that reads it (the driver, a cell's sitting, common.sh,
# the launcher): 1/true/yes/on a dry run, unset/empty/0/false/no/off not; anything else is refused
# before any work (a typo must not start a real sitting on a GPU node).
DRY_RUN_CHECK = r"""DRY_RUN_WORD="$(printf '%s' "${DRY_RUN:-}" | tr '[:upper:]' '[:lower:]')"
case "$DRY_RUN_WORD" in
  ""|0|false|no|off) DRY_RUN=0 ;;
  1|true|yes|on) DRY_RUN=1 ;;
  *)
    echo "DRY_RUN must be 1/true/yes (a dry run) or 0/false/no/unset (a real sitting), got '$DRY_RUN'; nothing started" >&2
    exit 2
    ;;
esac
export DRY_RUN"""

SITTING_SCRIPT = r"""# tokenbalance ablate --runner verl: one sitting of one cell. Sourced by cells/<cell>/run.sh, which sets
# CELL, SEED, MODEL, MODEL_HUB_NAME, CELL_DIR and LAUNCH (the command that runs the row's method); its
# arguments are extra hydra overrides for this sitting (after the cell's checkpoint directory, so that
# trainer.default_local_dir=... moves it; before the cell's seed, name and directories, which win).
#
# A sitting (its state kept by `python -m tokenbalance.run.cell`, the local trainer's lock and statuses):
# a completed cell is skipped; otherwise the cell's launch is checked (the model path from MODEL_PATH_3B /
# MODEL_PATH_7B, else the hub name; no override of a key the cell sets; what decides its numbers as its
# earlier sittings had it, launch.json), the cell's lock is taken (flock on .lock, held by this shell and the
# launch, so a launch that outlives a killed run.sh still keeps a second sitting out), STATUS says
# "running: ...", the checkpoints older than the kept ones are removed, LAUNCH runs with verl's file logger
# writing metrics.sitting-<k>.jsonl (k = the newest sitting's number + 1: verl's logger opens its file with
# mode "wb", so each sitting needs its own file) and verl resumes from the newest checkpoint
# (trainer.resume_mode=auto) in checkpoints/ (or CHECKPOINT_ROOT/<cell>). At the end STATUS says
# "completed: ..." or "failed at step N: ...", N being the step after the last one any sitting logged.
# SIGTERM, SIGINT and SIGHUP (Slurm's time limit, scancel, Ctrl-C) stop the launch's whole process group,
# mark the cell failed and end this script by the same signal; run the cell again to resume it (the steps
# since the last checkpoint are lost). To stop it without losing a completed step: `touch $CELL_DIR/@STOP_FILE@`
# (on the node; slurm_array.sh does it before the time limit): at the next step's beginning the trainer
# (tokenbalance_sync, _lopti or _nthr) saves the completed step unless it is already the newest checkpoint,
# writes what it did into the file and ends; STATUS "failed at step N: stopped on request (@STOP_FILE@):
# checkpoint global_step_M saved ...". The launch finds the file through @STOP_ENV@ (passed to Ray's
# workers as the metrics file is); each sitting removes an earlier sitting's request after begin. DRY_RUN=1
# (or true, yes): the same checks, then compose and validate the cell's config through the launcher,
# change nothing here; a DRY_RUN that is not a yes/no value is refused before anything.
set -uo pipefail
@DRY_RUN_CHECK@
LOGGER="${LOGGER:-[console,file]}"
IDENTITY=("trainer.experiment_name=$CELL" "data.seed=$SEED" "actor_rollout_ref.rollout.seed=$SEED")
RESUME=("trainer.resume_mode=auto" "trainer.logger=$LOGGER")

if [[ ! -f examples/verl/common.sh ]]; then
  echo "== $CELL: run from the tokenbalance repository root (examples/verl/common.sh is not in $PWD)" >&2
  exit 2
fi
CHECKPOINTS="$CELL_DIR/checkpoints"
if [[ -n "${CHECKPOINT_ROOT:-}" ]]; then CHECKPOINTS="${CHECKPOINT_ROOT%/}/$CELL"; fi
CELL_ARGS=("$CELL_DIR" "$CELL" --model "$MODEL" --hub-name "$MODEL_HUB_NAME" --checkpoints "$CHECKPOINTS" --keep "${KEEP_CHECKPOINTS:-@KEEP@}")
for word in "${LAUNCH[@]}"; do CELL_ARGS+=("--launch=$word"); done
if [[ "$DRY_RUN" == "1" ]]; then
  MODEL_PATH="$(python -m tokenbalance.run.cell check "${CELL_ARGS[@]}" -- "$@")" || exit $?
  export MODEL_PATH
  "${LAUNCH[@]}" "trainer.default_local_dir=$CHECKPOINTS" "$@" "${IDENTITY[@]}" "${RESUME[@]}"
  exit $?
fi
# begin: skips a completed cell (prints nothing), refuses a launch it cannot resume or a directory hydra
# cannot parse (exit 2) or a cell another process holds (exit 75), takes the lock on fd 9, writes STATUS;
# prints the metrics file and the model path. Its messages go to fd 3, this script's stdout.
exec 9>> "$CELL_DIR/.lock" 3>&1
BEGUN="$(python -m tokenbalance.run.cell begin "${CELL_ARGS[@]}" --pid $$ --lock-fd 9 --say-fd 3 -- "$@")"
BEGIN=$?
if ((BEGIN != 0)); then exit "$BEGIN"; fi
if [[ -z "$BEGUN" ]]; then exit 0; fi
{ IFS= read -r METRICS; IFS= read -r MODEL_PATH; } <<< "$BEGUN"
export MODEL_PATH

# the console goes to the terminal and to train.log; the launch runs in its own process group
# (setsid), so that a stop reaches the launcher, Ray and the workers
exec 8> >(tee -a "$CELL_DIR/train.log")
TEE=$!
export @STOP_ENV@="$CELL_DIR/@STOP_FILE@"
VERL_FILE_LOGGER_PATH="$METRICS" setsid "${LAUNCH[@]}" "trainer.default_local_dir=$CHECKPOINTS" "$@" \
  "${IDENTITY[@]}" "${RESUME[@]}" "hydra.run.dir=$CELL_DIR/hydra" \
  "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$METRICS" \
  "++ray_kwargs.ray_init.runtime_env.env_vars.@STOP_ENV@=$@STOP_ENV@" \
  < /dev/null >&8 2>&8 8>&- 3>&- &
CHILD=$!
STOP_SIGNAL=""
stop() {
  STOP_SIGNAL="$1"
  kill -TERM -- "-$CHILD" 2> /dev/null || kill -TERM "$CHILD" 2> /dev/null
}
trap 'stop INT' INT
trap 'stop TERM' TERM
trap 'stop HUP' HUP
wait "$CHILD"
RC=$?
if [[ -n "$STOP_SIGNAL" ]]; then wait "$CHILD" 2> /dev/null; fi  # the launch's own end after the stop
exec 8>&-
wait "$TEE" 2> /dev/null  # train.log complete

# end: STATUS completed (exit 0, not stopped) or failed at the step after the last one logged
python -m tokenbalance.run.cell end "$CELL_DIR" "$CELL" --metrics "$METRICS" --exit "$RC" --signal "$STOP_SIGNAL"
if ((RC == 0)) && [[ -z "$STOP_SIGNAL" ]]; then exit 0; fi
if [[ -n "$STOP_SIGNAL" ]]; then
  trap - "$STOP_SIGNAL"
  kill -s "$STOP_SIGNAL" $$
fi
exit "$RC"
""".replace("@DRY_RUN_CHECK@", DRY_RUN_CHECK).replace("@KEEP@", str(KEEP_CHECKPOINTS))
SITTING_SCRIPT = SITTING_SCRIPT.replace("@STOP_FILE@", STOP_FILE).replace("@STOP_ENV@", STOP_FILE_ENV)
