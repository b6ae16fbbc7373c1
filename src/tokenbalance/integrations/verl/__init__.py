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
* the trainer ``tokenbalance_nthr``: verl's synchronous trainer whose old-log-prob forward also
  returns the response tokens' last-layer hidden states (:mod:`.nthr_worker`), from which NTHR
  weights the advantages before the update (:mod:`.nthr_trainer`, :mod:`.nthr`);
* the K&K reward ``pkg://tokenbalance.integrations.verl.reward`` (``compute_score``).

NTHR as a loss mode or an advantage estimator, or its trainer where it cannot get the hidden
states (not FSDP2, Ulysses, rollout-correction bypass), fails at launch with the reason
(:mod:`.validation`).

The maths is :mod:`tokenbalance.algorithms`; this package only translates verl's tensors and
config into those calls. The installed verl is checked here, on import, against the range our
tests cover.
"""

from tokenbalance.integrations.versions import require_host

VERL_VERSION = require_host("verl")
