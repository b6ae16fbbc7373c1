#!/usr/bin/env bash
# AR-Lopti K&K "AR-Lopti" script: AR then Lopti's two passes.
# GRPO: alpha 0.3 (reweight_k 0.3 / tau 0.7), eta 0.5 (train_kklogic_AR-Lopti_4x80GB.sh);
# REINFORCE++: alpha 0.1, eta 0.5 (paper Table 7). Override with ALPHA=... ETA=...
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [[ "$ESTIMATOR" == "grpo" ]]; then ALPHA="${ALPHA:-0.3}"; else ALPHA="${ALPHA:-0.1}"; fi
ETA="${ETA:-0.5}"
run_preset ar_lopti "$POLICY_LOSS.loss_mode=tokenbalance_ar" "+$POLICY_LOSS.ar_alpha=$ALPHA" \
  "+$POLICY_LOSS.lopti_eta=$ETA" trainer.v1.trainer_mode=tokenbalance_lopti "$@"
