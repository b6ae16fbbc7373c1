"""tokenbalance inside verl 0.9.1, without forking it (docs/verl.md: the table and the launch commands).

Registered by :mod:`.plugin` at ``import verl``: the policy loss ``tokenbalance`` (a preset or your rule +
overrides, resolved as in our trainer: :class:`.config.TokenBalancePolicyLossConfig`); the advantage estimators
``tokenbalance_{grpo,dr_grpo,rloo,reinforce_pp}``; the trainers ``tokenbalance_sync`` (verl's sync trainer),
``tokenbalance_lopti`` (one actor update per pass) and ``tokenbalance_nthr`` (NTHR's hidden states), each
stopping on request with a checkpoint (:mod:`.stop`); the K&K reward. The maths is :mod:`tokenbalance.algorithms`;
this package translates verl's tensors and config, and checks the installed verl on import.
"""

from tokenbalance.integrations.versions import require_host

VERL_VERSION = require_host("verl")
