#!/usr/bin/env bash
# GRPO (or REINFORCE++) + NTHR (Deng et al. 2025, arXiv 2505.18830) with the shared K&K settings of
# common.sh. Not an AR-Lopti script (NTHR's paper trains on math): the same base as the other presets,
# so the rows compare. The tokenbalance_nthr trainer weights the advantages once per step from the old
# policy's last-layer hidden states, which it takes from verl's FSDP2 engine (docs/verl.md, "NTHR on
# verl"); NTHR's settings are the preset's, the paper's (beta 1, eta 2|0.5-p|, the correct responses as
# anchors: K&K reward 3), changed with +actor_rollout_ref.actor.policy_loss.overrides.nthr.<key>=...
# (or the trainer's +trainer.v1.tokenbalance_nthr.<key>=..., e.g. max_reward) appended to the command line.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
METHOD="${METHOD:-$(preset_of nthr)}"
run_method nthr nthr "$@"
