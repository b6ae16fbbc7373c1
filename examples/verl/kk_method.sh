#!/usr/bin/env bash
# Any method on verl with the shared AR-Lopti K&K settings of common.sh (the verl grid's cells run this):
#   METHOD=arlopti_kk_fig4_ar_lopti TRAINER=lopti bash examples/verl/kk_method.sh [overrides...]
# METHOD: a preset (tokenbalance list-methods) or your token rule, MODULE:RULE or FILE.py:RULE; its
# hyper-parameters change with +actor_rollout_ref.actor.policy_loss.overrides.<stage>.<field>=...
# TRAINER: what its passes need: sync (one pass, verl's own trainer; the default), lopti (Lopti's two
# passes) or nthr (NTHR's hidden states). The launcher refuses a method its trainer cannot run.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
METHOD="${METHOD:?set METHOD to a method preset (tokenbalance list-methods) or MODULE:RULE}"
NAME="${METHOD##*[:/]}"
run_method "${NAME%.py}" "${TRAINER:-sync}" "$@"
