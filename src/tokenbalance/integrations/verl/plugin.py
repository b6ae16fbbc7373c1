"""verl plugin entry point: importing this module registers tokenbalance into verl.

pyproject declares it under ``[project.entry-points."verl.plugins"]``, so ``import verl``
imports it in every process (driver, trainer, workers). verl swallows a plugin's import error
(logged at DEBUG only); our launcher (:mod:`.main`) imports this module directly so that an
error (e.g. an unsupported verl version) is shown.

Registers (names in :mod:`.names`, table in docs/verl.md):

* the policy loss ``tokenbalance`` (and its deprecated names) -> :func:`.losses.policy_loss`;
* advantage estimators ``tokenbalance_{grpo,dr_grpo,rloo,reinforce_pp}`` -> :mod:`.advantages`;
* the trainers ``tokenbalance_lopti`` (:mod:`.lopti`) and ``tokenbalance_nthr``
  (:mod:`.nthr_trainer`), when verl's v1 trainer can be imported.

It also installs :func:`.compat.guard_trl_value_head`, without which verl 0.9.1 cannot build a
model in an environment that has TRL 1.16 (our ``trl`` extra) installed.
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    register_adv_est,
    register_policy_loss,
)

from tokenbalance.integrations.verl import compat, lopti, nthr_trainer, validation
from tokenbalance.integrations.verl.advantages import ESTIMATOR_FUNCTIONS
from tokenbalance.integrations.verl.losses import policy_loss
from tokenbalance.integrations.verl.names import POLICY_LOSS_NAMES


def register_all() -> None:
    """Register every loss, estimator and our two trainers; guard verl's TRL check (idempotent)."""
    compat.guard_trl_value_head()
    for name in POLICY_LOSS_NAMES:
        if name not in POLICY_LOSS_REGISTRY:
            register_policy_loss(name)(policy_loss)  # the method is policy_loss.method's
    for name, function in ESTIMATOR_FUNCTIONS.items():
        if ADV_ESTIMATOR_REGISTRY.get(name) is not function:
            register_adv_est(name)(function)
    try:
        lopti.build_lopti_trainer()
        nthr_trainer.build_nthr_trainer()
        validation.TRAINER_IMPORT_ERROR = None
    except ImportError as error:  # v1 trainer deps (TransferQueue, cachetools, fastapi, uvicorn) missing
        validation.TRAINER_IMPORT_ERROR = f"{type(error).__name__}: {error}"


register_all()
