"""What the plugin uses of verl and TransferQueue beyond their public API, checked at import.

Our trainers override private methods of verl's ``PPOTrainerSync`` and call engine, worker and
TransferQueue functions by keyword. A release that renames one, or adds a required parameter,
would fail mid-run; :func:`check_host_api` fails at import instead, one line per change (docs/verl.md,
"Version safety"). A module that cannot be imported at all is the missing-dependency case
(:mod:`.plugin` then skips the trainers); only a module that imports without the name is a change.
"""

from __future__ import annotations

import importlib
import inspect
import os

from tokenbalance.integrations.versions import SKIP_HOST_CHECK, HostVersionError

_SYNC = "verl.trainer.ppo.v1.trainer_sync:PPOTrainerSync"
_WORKER = "verl.workers.engine_workers:ActorRolloutRefWorker"

# "module:attribute.path" -> the leading parameters we call it with (None: only its existence)
CORE_API: dict[str, tuple[str, ...] | None] = {
    "verl.trainer.ppo.core_algos:POLICY_LOSS_REGISTRY": None,
    "verl.trainer.ppo.core_algos:ADV_ESTIMATOR_REGISTRY": None,
    "verl.trainer.ppo.core_algos:register_policy_loss": ("name",),
    "verl.trainer.ppo.core_algos:register_adv_est": ("name_or_enum",),
    "verl.workers.config:PolicyLossConfig": None,
    "verl.utils.import_utils:is_trl_available": (),
    "verl.workers.utils.losses:ppo_loss": ("config", "model_output", "data", "dp_group"),
    "verl.workers.utils.padding:no_padding_2_padding": ("tensor", "data"),
    "verl.workers.utils.padding:response_from_nested": ("tensor", "response_mask"),
    "verl.utils.tensordict_utils:get_non_tensor_data": ("data", "key", "default"),
    "verl.utils.tensordict_utils:assign_non_tensor": ("tensor_dict",),
    "verl.utils.tensordict_utils:pop": ("tensordict", "key", "default"),
    "verl.utils.metric:AggregationType.SUM": None,
    "verl.utils.metric:AggregationType.MEAN": None,
    "verl.utils.metric:Metric": ("aggregation", "value"),
}
TRAINER_API: dict[str, tuple[str, ...] | None] = {
    "verl.trainer.ppo.v1.trainer_base:TRAINER_REGISTRY": None,
    "verl.trainer.ppo.v1.trainer_base:register_trainer": ("name",),
    f"{_SYNC}._setup": ("self",),
    f"{_SYNC}._update_actor": ("self", "batch", "metrics"),
    f"{_SYNC}._init_resource_pool_mgr": ("self",),
    f"{_SYNC}._compute_old_log_prob": ("self", "batch", "metrics"),
    f"{_SYNC}._compute_advantage": ("self", "batch", "metrics"),
    # the stop on request (.stop); it also sets the instance attribute global_steps around the save and
    # reads config.trainer.default_local_dir, which no import can check (tests/integrations/test_verl_stop.py)
    f"{_SYNC}.on_step_begin": ("self",),
    f"{_SYNC}._save_checkpoint": ("self",),
    "verl.checkpoint_engine.base:CheckpointEngineManager.sleep_replicas": ("self",),
    f"{_WORKER}.compute_log_prob": ("self", "data"),
    f"{_WORKER}.set_loss_fn": ("self", "loss_fn"),
    "verl.single_controller.base.decorator:Dispatch.ONE_TO_ALL": None,
    "verl.single_controller.base.decorator:make_nd_compute_dataproto_dispatch_fn": ("mesh_name",),
    "verl.single_controller.base.decorator:register": ("dispatch_mode",),
    "verl.trainer.ppo.utils:Role.ActorRolloutRef": None,
    "verl.utils.debug:marked_timer": ("name", "timing_raw"),
    "verl.utils.config:omega_conf_to_dataclass": ("config",),
    "transfer_queue:kv_batch_get": ("keys", "partition_id", "select_fields"),
    "transfer_queue:kv_batch_put": ("keys", "partition_id", "fields"),
    "transfer_queue:KVBatchMeta.__init__": ("self", "keys", "tags", "partition_id", "fields", "extra_info"),
}


def _parameters_problem(target, expected: tuple[str, ...]) -> str | None:
    """Why ``target`` cannot be called as we call it: a parameter renamed or moved, or a new one
    without a default (None when it can)."""
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None  # a builtin without a signature: existence is all we can check
    names = tuple(p.name for p in parameters)
    if names[: len(expected)] != expected:
        return f"parameters ({', '.join(names)}), tested with ({', '.join(expected)})"
    required = [
        p.name
        for p in parameters[len(expected) :]
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        return f"new required parameter(s) {', '.join(required)}"
    return None


def api_changes(api: dict[str, tuple[str, ...] | None]) -> list[str]:
    """One line per entry of ``api`` that is missing or has changed; an unimportable module raises
    its ``ImportError`` (a missing dependency, not a change)."""
    changes = []
    for entry, expected in api.items():
        module_name, _, path = entry.partition(":")
        target: object = importlib.import_module(module_name)
        for part in path.split("."):
            target = getattr(target, part, None)
            if target is None:
                break
        if target is None:
            changes.append(f"{module_name}.{path} is missing")
            continue
        problem = None if expected is None else _parameters_problem(target, expected)
        if problem:
            changes.append(f"{module_name}.{path}: {problem}")
    return changes


def check_host_api(api: dict[str, tuple[str, ...] | None], versions: str) -> None:
    """Raise :class:`HostVersionError` naming every change of ``api`` (``versions``: the installed
    hosts, for the message); ``TOKENBALANCE_SKIP_HOST_CHECK=1`` skips it, as the version check."""
    if os.environ.get(SKIP_HOST_CHECK) == "1":
        return
    changes = api_changes(api)
    if changes:
        raise HostVersionError(
            f"{versions} changed what the tokenbalance verl plugin uses: {'; '.join(changes)} "
            "(tested with verl 0.9.1, TransferQueue 0.1.11: pip install 'tokenbalance[verl]')"
        )
