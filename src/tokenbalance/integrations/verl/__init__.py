"""tokenbalance inside verl 0.9.x, without forking it.

What is registered (by :mod:`.plugin`, which verl imports through our ``verl.plugins`` entry
point at ``import verl``; docs/verl.md has the full table and the launch commands):

* policy losses ``tokenbalance_grpo``, ``tokenbalance_ar``, ``tokenbalance_tr_grpo`` and
  ``tokenbalance_ar_tr_grpo`` (``actor_rollout_ref.actor.policy_loss.loss_mode``), configured
  by :class:`.config.TokenBalancePolicyLossConfig` (``policy_loss._target_``);
* advantage estimators ``tokenbalance_grpo``, ``tokenbalance_dr_grpo``, ``tokenbalance_rloo``
  and ``tokenbalance_reinforce_pp`` (``algorithm.adv_estimator``);
* the trainer ``tokenbalance_lopti`` (``trainer.v1.trainer_mode``): verl's synchronous trainer
  with the actor update run once per Lopti pass;
* the K&K reward ``pkg://tokenbalance.integrations.verl.reward`` (``compute_score``).

NTHR is not available on verl (it needs the old policy's hidden states, which verl's workers
do not return); asking for it fails at launch with that reason (:mod:`.validation`).

The maths is :mod:`tokenbalance.algorithms`; this package only translates verl's tensors and
config into those calls. The installed verl is checked here, on import, against the range our
tests cover.
"""

from tokenbalance.integrations.versions import require_host

VERL_VERSION = require_host("verl")
