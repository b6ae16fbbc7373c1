"""The module verl imports in every process through ``VERL_USE_EXTERNAL_MODULES``.

``verl/__init__`` imports the modules listed in that variable (comma-separated) before any of its
trainer or worker modules, in the driver and in every Ray worker that inherits the job's
environment. Importing this module registers the ``cpu`` platform (:mod:`.platform`), applies the
runtime patches (:mod:`.patches`) and registers the ``hf_cpu`` rollout. The rollout module is
named, not imported, here: a Ray worker that unpickles one of its classes imports it first, and
it imports verl, which imports this hook.
"""

from verl.workers.rollout.base import _ROLLOUT_REGISTRY
from verl.workers.rollout.replica import RolloutReplicaRegistry

from tests.integrations.verl_cpu import patches, platform  # noqa: F401  (the platform registers on import)

ROLLOUT_NAME = "hf_cpu"
ROLLOUT_MODULE = "tests.integrations.verl_cpu.rollout"


def _replica_class():
    from tests.integrations.verl_cpu.rollout import HFRolloutReplica

    return HFRolloutReplica


patches.apply_all()
_ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{ROLLOUT_MODULE}.HFRolloutAdapter"
RolloutReplicaRegistry.register(ROLLOUT_NAME, _replica_class)
