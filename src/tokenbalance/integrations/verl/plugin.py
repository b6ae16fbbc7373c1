"""verl plugin entry point: importing this module registers tokenbalance into verl.

pyproject's ``verl.plugins`` entry point makes ``import verl`` import it in every process; our
launcher (:mod:`.main`) imports it directly so that its errors are shown. It checks what it uses of
verl and TransferQueue (:mod:`.host_api`), registers the policy loss, the advantage estimators and,
when verl's v1 trainer imports, the ``tokenbalance_sync`` / ``tokenbalance_lopti`` /
``tokenbalance_nthr`` trainers, and installs :func:`.compat.guard_trl_value_head`. The registered names: docs/verl.md, "What is registered".
"""

from __future__ import annotations

from importlib import metadata

from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    register_adv_est,
    register_policy_loss,
)

from tokenbalance.integrations.verl import VERL_VERSION, compat, lopti, nthr_trainer, stop, validation
from tokenbalance.integrations.verl.advantages import ESTIMATOR_FUNCTIONS
from tokenbalance.integrations.verl.host_api import CORE_API, TRAINER_API, check_host_api
from tokenbalance.integrations.verl.losses import policy_loss
from tokenbalance.integrations.verl.names import POLICY_LOSS_NAMES
from tokenbalance.integrations.versions import HostVersionError, require_host


def check_trainer_hosts() -> None:
    """TransferQueue's version and what the trainers use of verl's v1 trainer and TransferQueue
    (:mod:`.host_api`); an ``ImportError`` other than :class:`HostVersionError`: a dependency missing."""
    require_host("TransferQueue")
    check_host_api(TRAINER_API, f"verl {VERL_VERSION} / TransferQueue {metadata.version('TransferQueue')}")


def register_all() -> None:
    """Register every loss, estimator and our three trainers; guard verl's TRL check (idempotent)."""
    check_host_api(CORE_API, f"verl {VERL_VERSION}")
    compat.guard_trl_value_head()
    for name in POLICY_LOSS_NAMES:
        if name not in POLICY_LOSS_REGISTRY:
            register_policy_loss(name)(policy_loss)  # the method is policy_loss.method's
    for name, function in ESTIMATOR_FUNCTIONS.items():
        if ADV_ESTIMATOR_REGISTRY.get(name) is not function:
            register_adv_est(name)(function)
    try:
        check_trainer_hosts()
        stop.build_sync_trainer()
        lopti.build_lopti_trainer()
        nthr_trainer.build_nthr_trainer()
        validation.TRAINER_IMPORT_ERROR = None
    except HostVersionError:
        raise  # installed, but not what we tested: one line naming it, at import
    except ImportError as error:  # v1 trainer deps (TransferQueue, cachetools, fastapi, uvicorn) missing
        validation.TRAINER_IMPORT_ERROR = f"{type(error).__name__}: {error}"


register_all()
