#!/usr/bin/env bash
# AR-Lopti K&K baseline (train_kklogic_baseline_4x80GB.sh): GRPO (or REINFORCE++) with our
# clipped surrogate and no token weights. Settings: common.sh; docs/verl.md.
#   MODEL=3b bash examples/verl/kk_baseline.sh            ESTIMATOR=reinforce_pp ... for REINFORCE++
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
METHOD="${METHOD:-$(preset_of grpo)}"
run_method baseline sync "$@"
