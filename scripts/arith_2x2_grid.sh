#!/usr/bin/env bash
# The arithmetic 2 x 2 grid (docs/results.md, the decision-token testbed): the presets arith-clean,
# arith-wording, arith-decisions and arith-decisions-wording, in two lanes of one cell at a time (one
# thread each, so the two lanes share two CPUs). It goes start policy by start policy: for p = 0..3,
# each condition builds its SFT policy p and runs at once the 12 cells that start from it (seeds p and
# p + 4, 6 rows each), so that a start policy, which lives in the cache of the machine that built it,
# is never built twice when the grid moves to a new machine between sittings.
#
# Resumable: run it again with the same OUT and RECORDS; finished cells are skipped, or restored
# from RECORDS on a new machine, and a started cell resumes from its last checkpoint. Each sitting
# appends to OUT/<preset>/grid_log.jsonl with the commit of the code it ran.
#
# METHODS runs only those rows (comma-separated keys), LANE_A and LANE_B only those conditions, so
# that a sitting can finish the grid's main comparison first; the full grid later skips those cells.
# SEED_BASE (default 0) shifts the seeds: start policy p runs seeds SEED_BASE + p and SEED_BASE + p + 4
# (the step-count control, docs/preregistration/step-count-control.md, runs seeds 8-15: SEED_BASE=8).
#
#   bash scripts/arith_2x2_grid.sh                      # OUT=runs/arith-2x2, RECORDS=docs/results/arith-2x2
#   TOKENBALANCE=".venv/bin/tokenbalance" OUT=/scratch/a2x2 bash scripts/arith_2x2_grid.sh
#   METHODS=grpo,ar_lopti LANE_A=arith-decisions LANE_B=arith-decisions-wording bash scripts/arith_2x2_grid.sh
#   SEED_BASE=8 LANE_A=arith-steps LANE_B=arith-steps-wording bash scripts/arith_2x2_grid.sh
set -euo pipefail
OUT=${OUT:-runs/arith-2x2}
RECORDS=${RECORDS:-docs/results/arith-2x2}
TOKENBALANCE=${TOKENBALANCE:-tokenbalance}
METHODS=${METHODS:-}
SEED_BASE=${SEED_BASE:-0}
LANE_A=${LANE_A:-arith-decisions arith-wording}
LANE_B=${LANE_B:-arith-decisions-wording arith-clean}
mkdir -p "$OUT"

lane() {
    local policy preset seeds
    for policy in 0 1 2 3; do
        for preset in "$@"; do
            seeds="$((SEED_BASE + policy)),$((SEED_BASE + policy + 4))"
            echo "$(date -u +%FT%TZ) $preset start policy $policy (seeds $seeds)"
            # a sitting that leaves failed cells does not stop the lane; the next run of this script resumes them
            $TOKENBALANCE ablate --preset "$preset" --seeds "$seeds" ${METHODS:+--methods "$METHODS"} --jobs 1 --set train.threads=1 \
                --no-figure --no-progress --out "$OUT/$preset" --records "$RECORDS/$preset/records" ||
                echo "sitting of $preset ended with $?"
        done
    done
}

# shellcheck disable=SC2086 # a lane is a list of presets
lane $LANE_A >>"$OUT/lane-a.log" 2>&1 &
# shellcheck disable=SC2086
lane $LANE_B >>"$OUT/lane-b.log" 2>&1 &
wait
echo "$(date -u +%FT%TZ) both lanes done" >>"$OUT/lane-a.log"
