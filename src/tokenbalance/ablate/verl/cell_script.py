"""The shell code of one sitting of a verl grid cell, written once per grid as ``OUT/verl/run_cell.sh``.

Each ``cells/<cell>/run.sh`` (:mod:`.scripts`) sets the cell's ``CELL``, ``SEED``, ``CELL_DIR``
and ``LAUNCH`` and sources it; the comment at the top of :data:`SITTING_SCRIPT` says what a sitting
does. The STATUS lines it writes are read back by :mod:`.results`.
"""

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
# CELL, SEED, CELL_DIR and LAUNCH (the command that runs the row's method); its arguments
# are extra hydra overrides for this sitting (the cell's own settings below come after them and win).
#
# A sitting: a completed cell is skipped; otherwise the cell's lock is taken (flock: one sitting of a
# cell at a time, wherever it was started; the launcher holds it too, so a launch that outlives a
# killed run.sh still keeps a second sitting out), STATUS says "running: ...", LAUNCH runs with verl's file
# logger writing metrics.sitting-<k>.jsonl (k = the newest sitting's number + 1: verl's logger opens
# its file with mode "wb", so each sitting needs its own file) and verl resumes from the newest
# checkpoint in checkpoints/ (trainer.resume_mode=auto). At the end STATUS says "completed: ..." or
# "failed at step N: ...", N being the step after the last one any sitting logged. SIGTERM, SIGINT
# and SIGHUP (Slurm's time limit, scancel, Ctrl-C) stop the launch's whole process group, mark the
# cell failed and end this script by the same signal; run the cell again to resume it.
# DRY_RUN=1 (or true, yes): compose and validate the cell's config through the launcher, change nothing
# here; a DRY_RUN that is not a yes/no value is refused before anything.
set -uo pipefail
@DRY_RUN_CHECK@
LOGGER="${LOGGER:-[console,file]}"
STATUS_FILE="$CELL_DIR/STATUS"
IDENTITY=("trainer.experiment_name=$CELL" "data.seed=$SEED" "actor_rollout_ref.rollout.seed=$SEED")

now() { date '+%Y-%m-%dT%H:%M:%S%z'; }
write_status() { printf '%s\n' "$1" > "$STATUS_FILE.tmp" && mv -f "$STATUS_FILE.tmp" "$STATUS_FILE"; }
last_logged_step() {  # the highest step in any sitting's metrics (verl writes {"step":N,...} per line), else 0
  local step
  step="$(cat "$CELL_DIR"/metrics.sitting-*.jsonl 2>/dev/null | sed -n 's/^{"step":\([0-9][0-9]*\).*/\1/p' | sort -n | tail -n 1)"
  echo "${step:-0}"
}

if [[ ! -f examples/verl/common.sh ]]; then
  echo "== $CELL: run from the tokenbalance repository root (examples/verl/common.sh is not in $PWD)" >&2
  exit 2
fi
if [[ "$DRY_RUN" == "1" ]]; then
  "${LAUNCH[@]}" "$@" "${IDENTITY[@]}"
  exit $?
fi
STATE="$(head -n 1 "$STATUS_FILE" 2>/dev/null || true)"
if [[ "$STATE" == completed* ]]; then
  echo "== $CELL: $STATE (skipped)"
  exit 0
fi
# hydra parses the overrides below: a directory it would misread is refused before anything starts
if [[ ! "$CELL_DIR" =~ ^[A-Za-z0-9._/+@%:~-]+$ ]]; then
  echo "== $CELL: the cell directory's path has characters hydra cannot take in an override (only letters," \
    "digits and ._/+@%:~- are safe): move the grid directory and run it there" >&2
  exit 2
fi
if command -v flock > /dev/null; then
  exec 9>> "$CELL_DIR/.lock"
  if ! flock -n 9; then
    echo "== $CELL: another process runs this cell ($STATE); not started" >&2
    exit 75
  fi
fi
SITTING=1
for file in "$CELL_DIR"/metrics.sitting-*.jsonl; do
  number="${file##*/metrics.sitting-}"
  number="${number%.jsonl}"
  if [[ "$number" =~ ^[0-9]+$ ]] && ((10#$number >= SITTING)); then SITTING=$((10#$number + 1)); fi
done
METRICS="$CELL_DIR/metrics.sitting-$SITTING.jsonl"
write_status "running: sitting $SITTING on $HOSTNAME pid $$ since $(now)"
echo "== $CELL: sitting $SITTING (metrics: $METRICS)"

# the console goes to the terminal and to train.log; the launch runs in its own process group
# (setsid), so that a stop reaches the launcher, Ray and the workers
exec 8> >(tee -a "$CELL_DIR/train.log")
TEE=$!
VERL_FILE_LOGGER_PATH="$METRICS" setsid "${LAUNCH[@]}" "$@" "${IDENTITY[@]}" \
  "trainer.default_local_dir=$CELL_DIR/checkpoints" "trainer.resume_mode=auto" "trainer.logger=$LOGGER" \
  "hydra.run.dir=$CELL_DIR/hydra" "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$METRICS" \
  < /dev/null >&8 2>&8 8>&- &
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

if ((RC == 0)) && [[ -z "$STOP_SIGNAL" ]]; then
  write_status "completed: sitting $SITTING on $HOSTNAME at $(now)"
  echo "== $CELL: completed"
  exit 0
fi
LAST="$(last_logged_step)"
WHY="exit status $RC"
if [[ -n "$STOP_SIGNAL" ]]; then WHY="stopped by SIG$STOP_SIGNAL"; fi
write_status "failed at step $((LAST + 1)): $WHY in sitting $SITTING on $HOSTNAME at $(now); steps up to $LAST logged"
echo "== $CELL: $(head -n 1 "$STATUS_FILE")" >&2
if [[ -n "$STOP_SIGNAL" ]]; then
  trap - "$STOP_SIGNAL"
  kill -s "$STOP_SIGNAL" $$
fi
exit "$RC"
""".replace("@DRY_RUN_CHECK@", DRY_RUN_CHECK)
