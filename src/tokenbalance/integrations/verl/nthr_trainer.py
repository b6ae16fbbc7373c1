"""NTHR on verl: verl's synchronous v1 trainer with NTHR's weights applied to the advantages.

``trainer.v1.trainer_mode=tokenbalance_nthr`` registers a ``tokenbalance_sync`` subclass overriding
three methods, each calling verl's own: ``_init_resource_pool_mgr`` (our actor worker,
:mod:`.nthr_worker`), ``_compute_old_log_prob`` (asks that forward for the hidden states) and
``_compute_advantage`` (then :func:`.nthr.nthr_advantages` on the whole batch, stored in place of
verl's advantages). The hidden states stay out of later fetches; it stops on request
(:mod:`.stop`). How it works, what it relies on, settings and cost: docs/verl.md, "NTHR on verl".
"""

from __future__ import annotations

from tokenbalance.integrations.verl.batch_meta import with_extra_info, without_field
from tokenbalance.integrations.verl.names import NTHR_HIDDEN_FIELD, NTHR_HIDDEN_KEY, NTHR_TRAINER

TIMER = "tokenbalance_nthr"  # verl logs timing_s/<name>
METRIC_PREFIX = "tokenbalance/"


def output_layer_of(outputs: list):
    """The one output layer among the workers' answers (global rank 0's)."""
    layers = [layer for layer in outputs if layer is not None]
    if len(layers) != 1:
        raise RuntimeError(f"NTHR: expected the output layer from one worker, got {len(layers)}")
    return layers[0]


def build_nthr_trainer():
    """Define and register the ``tokenbalance_nthr`` trainer (imports verl's v1 trainer)."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
    from verl.utils.debug import marked_timer

    from tokenbalance.integrations.verl.nthr import BATCH_FIELDS, nthr_advantages
    from tokenbalance.integrations.verl.nthr_worker import use_nthr_worker
    from tokenbalance.integrations.verl.stop import build_sync_trainer
    from tokenbalance.integrations.verl.validation import nthr_launch_settings, validate_launch

    if NTHR_TRAINER in TRAINER_REGISTRY:
        return TRAINER_REGISTRY[NTHR_TRAINER]

    class TokenBalanceNTHRTrainer(build_sync_trainer()):  # type: ignore[misc]
        """``tokenbalance_sync`` (verl's sync trainer, its choices and the stop on request: :mod:`.stop`); NTHR
        weights the advantages before the update (module docstring)."""

        def _init_resource_pool_mgr(self):
            super()._init_resource_pool_mgr()
            use_nthr_worker(self.role_worker_mapping)

        def _setup(self):
            validate_launch(self.config)
            self.nthr_settings = nthr_launch_settings(self.config)
            super()._setup()

        def _compute_old_log_prob(self, batch, metrics):
            batch = super()._compute_old_log_prob(with_extra_info(batch, **{NTHR_HIDDEN_KEY: True}), metrics)
            return without_field(batch, NTHR_HIDDEN_FIELD)

        def _compute_advantage(self, batch, metrics):
            batch = super()._compute_advantage(batch, metrics)
            with marked_timer(TIMER, self.timing_raw):
                data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=BATCH_FIELDS)
                head = output_layer_of(self.actor_rollout_wg.nthr_output_layer())
                temperature = float(self.config.actor_rollout_ref.rollout.temperature)
                advantages, nthr_metrics = nthr_advantages(data, head, self.nthr_settings, temperature)
                batch = tq.kv_batch_put(
                    keys=batch.keys,
                    partition_id=batch.partition_id,
                    fields=TensorDict({"advantages": advantages}, batch_size=len(batch)),
                )
            metrics.update({METRIC_PREFIX + key: value for key, value in nthr_metrics.items()})
            return without_field(batch, NTHR_HIDDEN_FIELD)

    return register_trainer(NTHR_TRAINER)(TokenBalanceNTHRTrainer)
