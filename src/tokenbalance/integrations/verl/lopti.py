"""Lopti on verl: verl's synchronous v1 trainer with the actor update run once per pass.

``trainer.v1.trainer_mode=tokenbalance_lopti`` registers a ``tokenbalance_sync`` subclass (so it stops on
request: :mod:`.stop`) whose ``_setup`` installs :func:`.losses.lopti_ppo_loss` as the actor's loss (verl's
``set_loss_fn``) and whose ``_update_actor`` runs verl's own update once per pass (:func:`run_update_passes`),
each on a copy of the batch handle naming the pass; the stored batch is never modified. Without verl's v1
trainer it is not registered (:data:`.validation.TRAINER_IMPORT_ERROR`). docs/verl.md, "Lopti on verl".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenbalance.algorithms.passes import lopti_pass_names
from tokenbalance.integrations.verl.batch_meta import with_extra_info
from tokenbalance.integrations.verl.names import LOPTI_TRAINER, UPDATE_PASS_KEY

__all__ = ["lopti_pass_names", "with_update_pass", "merge_pass_metrics"]


def with_update_pass(batch, pass_name: str):
    """A shallow copy of verl's batch handle whose ``extra_info`` names the pass (``batch`` untouched)."""
    return with_extra_info(batch, **{UPDATE_PASS_KEY: pass_name})


def merge_pass_metrics(per_pass: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per-pass metrics under ``<key>/<pass>``, plus the loss keys summed over passes.

    Each pass's ``actor/pg_loss`` is a partial sum over its tokens with the full denominator, so
    the sum is the single-pass loss's counterpart; other keys are averaged over passes (as the
    reference merges float metrics), e.g. ``actor/grad_norm``.
    """
    merged: dict[str, Any] = {}
    keys = {key for metrics in per_pass.values() for key in metrics}
    for key in sorted(keys):
        values = [metrics[key] for metrics in per_pass.values() if key in metrics]
        for name, metrics in per_pass.items():
            if key in metrics:
                merged[f"{key}/{name}"] = metrics[key]
        numeric = [float(value) for value in values if isinstance(value, (int, float))]
        if len(numeric) == len(values):
            total = sum(numeric)
            merged[key] = total if key.endswith("_loss") or "/loss/" in key else total / len(numeric)
    return merged


def run_update_passes(update_once: Callable[[Any], dict[str, Any]], batch, pass_names: list[str]) -> dict[str, Any]:
    """Run ``update_once`` (a complete actor update) once per pass, in order; merged metrics.

    ``update_once(pass_batch) -> metrics`` is verl's ``PPOTrainer._update_actor`` in the trainer
    (and a small mini-batch loop in the tests).
    """
    per_pass = {name: update_once(with_update_pass(batch, name)) for name in pass_names}
    return merge_pass_metrics(per_pass)


def build_lopti_trainer():
    """Define and register the ``tokenbalance_lopti`` trainer (imports verl's v1 trainer)."""
    from functools import partial

    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
    from verl.utils.config import omega_conf_to_dataclass

    from tokenbalance.integrations.verl.config import lopti_config
    from tokenbalance.integrations.verl.losses import lopti_ppo_loss
    from tokenbalance.integrations.verl.stop import build_sync_trainer
    from tokenbalance.integrations.verl.validation import validate_launch

    if LOPTI_TRAINER in TRAINER_REGISTRY:
        return TRAINER_REGISTRY[LOPTI_TRAINER]

    class TokenBalanceLoptiTrainer(build_sync_trainer()):  # type: ignore[misc]
        """``tokenbalance_sync`` (verl's sync trainer, its choices and the stop on request: :mod:`.stop`); the
        actor update runs once per Lopti pass (module docstring)."""

        def _setup(self):
            validate_launch(self.config)
            super()._setup()
            actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
            self.lopti_pass_names = list(lopti_pass_names(lopti_config(actor_config.policy_loss)))
            self.actor_rollout_wg.set_loss_fn(partial(lopti_ppo_loss, config=actor_config))

        def _update_actor(self, batch, metrics):
            verl_update = super()._update_actor

            def update_once(pass_batch):
                pass_metrics: dict[str, Any] = {}
                verl_update(pass_batch, metrics=pass_metrics)
                return pass_metrics

            metrics.update(run_update_passes(update_once, batch, self.lopti_pass_names))
            return batch

    return register_trainer(LOPTI_TRAINER)(TokenBalanceLoptiTrainer)
