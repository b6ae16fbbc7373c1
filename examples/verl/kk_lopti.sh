#!/usr/bin/env bash
# AR-Lopti K&K "Lopti" script: two update passes per RL step, tokens with p_old < eta first.
# eta: 0.4 for GRPO (train_kklogic_Lopti_4x80GB.sh, seperate_prob 0.4); 0.5 for REINFORCE++
# (paper Table 7). Override with ETA=... Runs verl's sync trainer with one update per pass.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [[ "$ESTIMATOR" == "grpo" ]]; then ETA="${ETA:-0.4}"; else ETA="${ETA:-0.5}"; fi
run_preset lopti "$POLICY_LOSS.loss_mode=tokenbalance_grpo" "+$POLICY_LOSS.lopti_eta=$ETA" \
  trainer.v1.trainer_mode=tokenbalance_lopti "$@"
