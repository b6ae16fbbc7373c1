#!/usr/bin/env bash
# AR-Lopti K&K "AR-Lopti" script: AR then Lopti's two passes.
# GRPO: alpha 0.3 (reweight_k 0.3 / tau 0.7), eta 0.5 (train_kklogic_AR-Lopti_4x80GB.sh);
# REINFORCE++: alpha 0.1, eta 0.5 (paper Table 7): the presets ar_lopti / reinforce_pp_ar_lopti.
# Override with ALPHA=... ETA=...
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
METHOD="${METHOD:-$(preset_of ar_lopti)}"
run_method ar_lopti lopti ${ALPHA:+"+$POLICY_LOSS.overrides.ar.alpha=$ALPHA"} \
  ${ETA:+"+$POLICY_LOSS.overrides.lopti.eta=$ETA"} "$@"
