#!/usr/bin/env bash
# AR-Lopti K&K "AR" script: Advantage Reweighting (alpha * p_old + 1 - alpha) * A, single pass.
# alpha: 0.2 for GRPO (train_kklogic_AR_4x80GB.sh, reweight_k 0.2 / tau 0.8); 0.1 for
# REINFORCE++ (paper Table 7). Override with ALPHA=...
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [[ "$ESTIMATOR" == "grpo" ]]; then ALPHA="${ALPHA:-0.2}"; else ALPHA="${ALPHA:-0.1}"; fi
run_preset ar "$POLICY_LOSS.loss_mode=tokenbalance_ar" "+$POLICY_LOSS.ar_alpha=$ALPHA" "$@"
