#!/usr/bin/env bash
# GRPO (or REINFORCE++) + NTHR (Deng et al. 2025, arXiv 2505.18830) with the shared K&K settings of
# common.sh. Not an AR-Lopti script (NTHR's paper trains on math): the same base as the other presets,
# so the rows compare. The tokenbalance_nthr trainer weights the advantages once per step from the old
# policy's last-layer hidden states, which it takes from verl's FSDP2 engine (docs/verl.md, "NTHR on
# verl"); NTHR's settings are the paper's (beta 1, eta 2|0.5-p|, the correct responses as anchors:
# K&K reward 3), changed with +trainer.v1.tokenbalance_nthr.<key>=... appended to the command line.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_preset nthr "$POLICY_LOSS.loss_mode=tokenbalance_grpo" trainer.v1.trainer_mode=tokenbalance_nthr \
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 "$@"
