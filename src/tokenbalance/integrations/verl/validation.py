"""Launch-time checks of a verl config that uses tokenbalance (run before Ray starts).

:func:`validate_launch` is called by our launcher (:mod:`.main`) on the composed hydra config,
and again by the Lopti trainer. It rejects, with the reason and the key to change:

* NTHR as a loss mode or an estimator (it is the ``tokenbalance_nthr`` trainer), the NTHR trainer
  where it cannot get the hidden states (:func:`.nthr.check_nthr_launch`), ``trainer.v1.tokenbalance_nthr``
  settings without that trainer;
* unknown ``tokenbalance_*`` loss modes / estimators, and unknown ``policy_loss`` keys (listing
  the valid ones) or out-of-range values (naming the field);
* a token rule verl cannot feed (:mod:`tokenbalance.integrations.verl_rules`);
* ``lopti_*`` keys without the Lopti trainer, the Lopti trainer without a tokenbalance loss or
  without verl's v1 trainer (``trainer.use_v1``) or its undeclared dependencies (``TransferQueue``, ...).
"""

from __future__ import annotations

import dataclasses
from functools import partial

from tokenbalance.integrations.verl.names import (
    ADVANTAGE_ESTIMATORS,
    LOPTI_TRAINER,
    NTHR_TRAINER,
    NTHR_UNSUPPORTED,
    POLICY_LOSS_CONFIG_TARGET,
    POLICY_LOSS_NAMES,
)


def _select(config, dotted: str, default=None):
    node = config
    for part in dotted.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


def _reject_nthr(config) -> None:
    for key in ("actor_rollout_ref.actor.policy_loss.loss_mode", "algorithm.adv_estimator"):
        value = _select(config, key)
        if value is not None and "nthr" in str(value).lower():
            raise ValueError(f"{key}={value!r}: {NTHR_UNSUPPORTED}")


def nthr_launch_settings(config):
    """The ``tokenbalance_nthr`` trainer's settings, after its launch checks (:func:`.nthr.check_nthr_launch`)."""
    from tokenbalance.integrations.verl.nthr import check_nthr_launch

    return check_nthr_launch(partial(_select, config))


def _check_policy_loss_keys(policy_loss) -> None:
    from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig

    valid = {field.name for field in dataclasses.fields(TokenBalancePolicyLossConfig)}
    unknown = sorted(set(policy_loss) - valid)
    if unknown:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss: unknown key(s) {', '.join(unknown)}; "
            f"valid: {', '.join(sorted(valid))}"
        )


def policy_loss_config(config):
    """The ``policy_loss`` section as our config object (validates every field)."""
    from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig

    section = dict(_select(config, "actor_rollout_ref.actor.policy_loss", {}) or {})
    _check_policy_loss_keys(section)
    section.pop("_target_", None)
    section.pop("rollout_correction", None)
    return TokenBalancePolicyLossConfig(**section)


TRAINER_IMPORT_ERROR: str | None = None
"""Why verl's v1 trainer could not be imported (set by the plugin; then neither our Lopti trainer
nor the NTHR trainer is registered and a launch asking for one is refused); ``None`` once both are."""


def validate_launch(config) -> None:
    """Raise ``ValueError`` naming the key if ``config`` (verl's composed config) cannot run."""
    from tokenbalance.integrations.verl.config import lopti_fields_set, rule_entropy_problem, token_rule

    _reject_nthr(config)
    loss_mode = str(_select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"))
    ours = loss_mode.startswith("tokenbalance")
    target = _select(config, "actor_rollout_ref.actor.policy_loss._target_")
    if ours and target != POLICY_LOSS_CONFIG_TARGET:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss._target_={target!r}: the {loss_mode} loss reads its "
            f"hyper-parameters from {POLICY_LOSS_CONFIG_TARGET}; set _target_ to it"
        )
    policy_loss = policy_loss_config(config) if target == POLICY_LOSS_CONFIG_TARGET else None
    estimator = str(_select(config, "algorithm.adv_estimator", ""))
    if estimator.startswith("tokenbalance") and estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"algorithm.adv_estimator: unknown tokenbalance estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}"
        )

    trainer_mode = _select(config, "trainer.v1.trainer_mode")
    use_v1 = bool(_select(config, "trainer.use_v1", True))
    lopti_on = use_v1 and trainer_mode == LOPTI_TRAINER
    ours_on = use_v1 and trainer_mode in (LOPTI_TRAINER, NTHR_TRAINER)
    if trainer_mode in (LOPTI_TRAINER, NTHR_TRAINER) and not use_v1:
        raise ValueError(
            f"trainer.use_v1=False: the {trainer_mode} trainer is a verl v1 trainer; set trainer.use_v1=True"
        )
    if lopti_on and not ours:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}: the {LOPTI_TRAINER} trainer needs a "
            f"tokenbalance loss; valid: {', '.join(POLICY_LOSS_NAMES)}"
        )
    if ours_on and TRAINER_IMPORT_ERROR is not None:
        raise ValueError(
            f"trainer.v1.trainer_mode={trainer_mode}: verl's v1 trainer could not be imported "
            f"({TRAINER_IMPORT_ERROR}); install tokenbalance's verl extra (pip install -e '.[verl]': "
            "TransferQueue, cachetools, fastapi, uvicorn)"
        )
    if ours_on and trainer_mode == NTHR_TRAINER:
        nthr_launch_settings(config)
    elif _select(config, f"trainer.v1.{NTHR_TRAINER}") is not None:
        raise ValueError(
            f"trainer.v1.{NTHR_TRAINER} is set but the trainer is {trainer_mode!r}: select the NTHR trainer with "
            f"trainer.v1.trainer_mode={NTHR_TRAINER}"
        )
    if policy_loss is not None and not lopti_on and lopti_fields_set(policy_loss):
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.{lopti_fields_set(policy_loss)[0]} is set but the update runs "
            f"a single pass: select the Lopti trainer with trainer.v1.trainer_mode={LOPTI_TRAINER}"
        )
    rule = token_rule(policy_loss) if policy_loss is not None else None
    problem = rule_entropy_problem(rule, _select(config, "actor_rollout_ref.actor", {}), lopti_trainer=lopti_on)
    if problem:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.token_rule: {problem}")
