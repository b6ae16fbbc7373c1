#!/usr/bin/env bash
# AR-Lopti K&K "Lopti" script: two update passes per RL step, tokens with p_old < eta first.
# eta: 0.4 for GRPO (train_kklogic_Lopti_4x80GB.sh, seperate_prob 0.4); 0.5 for REINFORCE++
# (paper Table 7). Override with ETA=... Runs verl's sync trainer with one update per pass.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [[ -z "${METHOD:-}" ]]; then
  METHOD="$(preset_of lopti)"
  if [[ "$ESTIMATOR" == "grpo" ]]; then ETA="${ETA:-0.4}"; fi  # the preset's 0.5 is Figure 4's
fi
run_method lopti lopti ${ETA:+"+$POLICY_LOSS.overrides.lopti.eta=$ETA"} "$@"
