#!/usr/bin/env bash
# AR-Lopti K&K "AR" script: Advantage Reweighting (alpha * p_old + 1 - alpha) * A, single pass.
# alpha: 0.2 for GRPO (train_kklogic_AR_4x80GB.sh, reweight_k 0.2 / tau 0.8); 0.1 for
# REINFORCE++ (paper Table 7). Override with ALPHA=...
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [[ -z "${METHOD:-}" ]]; then
  METHOD="$(preset_of ar)"
  if [[ "$ESTIMATOR" == "grpo" ]]; then ALPHA="${ALPHA:-0.2}"; fi  # the preset's 0.3 is Figure 4's (AR with Lopti)
fi
run_method ar sync ${ALPHA:+"+$POLICY_LOSS.overrides.ar.alpha=$ALPHA"} "$@"
