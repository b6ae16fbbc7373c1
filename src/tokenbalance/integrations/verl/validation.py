"""Launch-time checks of a verl config that uses tokenbalance (run before Ray starts).

:func:`validate_launch` is called by our launcher (:mod:`.main`) on the composed hydra config and
again by our trainers. It rejects, naming the key to change: NTHR as a loss or an estimator, unknown
``tokenbalance*`` names and ``policy_loss`` keys, a wrong method or override, a method the chosen
trainer cannot run, a token rule verl cannot feed, and our trainers without verl's v1 trainer or its
undeclared dependencies. The full list: docs/verl.md, "The method" and "NTHR on verl".
:func:`verl_rejection` is verl's own ``validate_config``, which the launcher's dry run adds.
"""

from __future__ import annotations

import dataclasses
from functools import partial

from tokenbalance.integrations.verl.names import (
    ADVANTAGE_ESTIMATORS,
    LOPTI_TRAINER,
    NTHR_TRAINER,
    NTHR_UNSUPPORTED,
    POLICY_LOSS,
    POLICY_LOSS_CONFIG_TARGET,
    POLICY_LOSS_KEY,
    SYNC_TRAINER,
)

OUR_TRAINERS = (SYNC_TRAINER, LOPTI_TRAINER, NTHR_TRAINER)


def _select(config, dotted: str, default=None):
    node = config
    for part in dotted.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


def _reject_nthr(config) -> None:
    for key in (f"{POLICY_LOSS_KEY}.loss_mode", "algorithm.adv_estimator"):
        value = _select(config, key)
        if value is not None and "nthr" in str(value).lower():
            raise ValueError(f"{key}={value!r}: {NTHR_UNSUPPORTED}")


def _check_policy_loss_keys(policy_loss) -> None:
    from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig

    valid = {field.name for field in dataclasses.fields(TokenBalancePolicyLossConfig)}
    unknown = sorted(set(policy_loss) - valid)
    if unknown:
        raise ValueError(f"{POLICY_LOSS_KEY}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")


def policy_loss_config(config):
    """The ``policy_loss`` section as our config object (validates every key and the method), or
    None when its ``_target_`` is not ours."""
    from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig

    if _select(config, f"{POLICY_LOSS_KEY}._target_") != POLICY_LOSS_CONFIG_TARGET:
        return None
    section = dict(_select(config, POLICY_LOSS_KEY, {}) or {})
    _check_policy_loss_keys(section)
    section.pop("_target_", None)
    section.pop("rollout_correction", None)
    return TokenBalancePolicyLossConfig(**section)


def nthr_launch_settings(config):
    """The ``tokenbalance_nthr`` trainer's settings, after its launch checks (:func:`.nthr.check_nthr_launch`):
    the method's NTHR settings (or NTHR's defaults), then ``trainer.v1.tokenbalance_nthr.*``."""
    from tokenbalance.integrations.verl.config import method_from_policy_loss
    from tokenbalance.integrations.verl.nthr import check_nthr_launch

    policy_loss = policy_loss_config(config)
    base = method_from_policy_loss(policy_loss).nthr if policy_loss is not None else None
    return check_nthr_launch(partial(_select, config), base)


TRAINER_IMPORT_ERROR: str | None = None
"""Why verl's v1 trainer could not be imported (set by the plugin; then none of :data:`OUR_TRAINERS` is
registered and a launch asking for one is refused); ``None`` once they are."""


def _check_trainer(config, trainer_mode, ours: bool, loss_mode: str) -> None:
    use_v1 = bool(_select(config, "trainer.use_v1", True))
    if trainer_mode in OUR_TRAINERS and not use_v1:
        raise ValueError(
            f"trainer.use_v1=False: the {trainer_mode} trainer is a verl v1 trainer; set trainer.use_v1=True"
        )
    if trainer_mode == LOPTI_TRAINER and not ours:
        raise ValueError(
            f"{POLICY_LOSS_KEY}.loss_mode={loss_mode!r}: the {LOPTI_TRAINER} trainer needs a tokenbalance loss; "
            f"set {POLICY_LOSS_KEY}.loss_mode={POLICY_LOSS}"
        )
    if trainer_mode in OUR_TRAINERS and TRAINER_IMPORT_ERROR is not None:
        raise ValueError(
            f"trainer.v1.trainer_mode={trainer_mode}: verl's v1 trainer could not be imported "
            f"({TRAINER_IMPORT_ERROR}); install tokenbalance's verl extra (pip install -e '.[verl]': "
            "TransferQueue, cachetools, fastapi, uvicorn)"
        )
    if trainer_mode == NTHR_TRAINER:
        nthr_launch_settings(config)
    elif _select(config, f"trainer.v1.{NTHR_TRAINER}") is not None:
        raise ValueError(
            f"trainer.v1.{NTHR_TRAINER} is set but the trainer is {trainer_mode!r}: select the NTHR trainer with "
            f"trainer.v1.trainer_mode={NTHR_TRAINER}"
        )


def _check_method(config, policy_loss, trainer_mode, estimator: str) -> None:
    """The method of our ``policy_loss`` against the trainer and the estimator of this launch."""
    from tokenbalance.integrations.verl.config import (
        METHOD_KEY,
        method_from_policy_loss,
        rule_entropy_problem,
        rule_key,
        single_pass_problem,
    )
    from tokenbalance.integrations.verl_rules import verl_method_problem

    method = method_from_policy_loss(policy_loss)
    lopti_on = trainer_mode == LOPTI_TRAINER
    problem = None if lopti_on else single_pass_problem(policy_loss, method)
    if problem:
        raise ValueError(problem)
    if method.nthr is not None and trainer_mode != NTHR_TRAINER:
        raise ValueError(
            f"{METHOD_KEY}={policy_loss.get('method')!r} weights the advantages with NTHR, which only the "
            f"{NTHR_TRAINER} trainer can: select it with trainer.v1.trainer_mode={NTHR_TRAINER}"
        )
    problem = verl_method_problem(method, lopti_trainer=lopti_on)
    if problem:
        raise ValueError(f"{METHOD_KEY}: {problem}")
    wanted = method.advantage.estimator
    if policy_loss.get("method") is not None and ADVANTAGE_ESTIMATORS.get(estimator, wanted) != wanted:
        raise ValueError(
            f"algorithm.adv_estimator={estimator}: {METHOD_KEY}={policy_loss.get('method')!r} uses the "
            f"{wanted} advantages; set algorithm.adv_estimator=tokenbalance_{wanted}"
        )
    problem = rule_entropy_problem(
        method.token_rule, _select(config, "actor_rollout_ref.actor", {}), lopti_trainer=lopti_on
    )
    if problem:
        raise ValueError(f"{rule_key(policy_loss)}: {problem}")


def validate_launch(config) -> None:
    """Raise ``ValueError`` naming the key if ``config`` (verl's composed config) cannot run."""
    _reject_nthr(config)
    loss_mode = str(_select(config, f"{POLICY_LOSS_KEY}.loss_mode", "vanilla"))
    ours = loss_mode.startswith("tokenbalance")
    target = _select(config, f"{POLICY_LOSS_KEY}._target_")
    if ours and target != POLICY_LOSS_CONFIG_TARGET:
        raise ValueError(
            f"{POLICY_LOSS_KEY}._target_={target!r}: the {loss_mode} loss reads its "
            f"method from {POLICY_LOSS_CONFIG_TARGET}; set _target_ to it"
        )
    policy_loss = policy_loss_config(config)
    estimator = str(_select(config, "algorithm.adv_estimator", ""))
    if estimator.startswith("tokenbalance") and estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"algorithm.adv_estimator: unknown tokenbalance estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}"
        )
    use_v1 = bool(_select(config, "trainer.use_v1", True))
    trainer_mode = _select(config, "trainer.v1.trainer_mode") if use_v1 else None
    _check_trainer(config, _select(config, "trainer.v1.trainer_mode"), ours, loss_mode)
    if policy_loss is not None and not ours and (policy_loss.get("method") or policy_loss.get("overrides")):
        raise ValueError(
            f"{POLICY_LOSS_KEY}.loss_mode={loss_mode!r}: {POLICY_LOSS_KEY}.method and .overrides are run by our "
            f"loss only; set {POLICY_LOSS_KEY}.loss_mode={POLICY_LOSS}"
        )
    if policy_loss is not None:
        _check_method(config, policy_loss, trainer_mode, estimator)


VERL_REJECTS = "verl's validate_config rejects this config: {}; nothing launched"


def verl_rejection(config) -> str | None:
    """Why verl's own ``validate_config`` rejects ``config``, run as ``verl.trainer.main_ppo`` runs it
    before Ray starts (batch sizes against GPUs and mini-batches, micro-batch settings, the critic),
    in one line; None when it accepts it. Imports verl."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except (AssertionError, ValueError, TypeError) as err:
        return " ".join(str(err).split()) or type(err).__name__
    return None


def launch_method(config):
    """The :class:`~tokenbalance.algorithms.methods.Method` this launch runs (verl's own settings in
    place of the method's; NTHR's as the NTHR trainer takes them), or None when the loss is not ours."""
    from tokenbalance.integrations.verl.config import method_from_actor_config

    loss_mode = str(_select(config, f"{POLICY_LOSS_KEY}.loss_mode", "vanilla"))
    if policy_loss_config(config) is None or not loss_mode.startswith("tokenbalance"):
        return None
    trainer_mode = _select(config, "trainer.v1.trainer_mode")
    lopti = trainer_mode == LOPTI_TRAINER
    actor = _select(config, "actor_rollout_ref.actor")
    method = method_from_actor_config(actor, with_regularisers=True, with_lopti=lopti)  # verl's KL term too
    return method.replace(nthr=nthr_launch_settings(config).config) if trainer_mode == NTHR_TRAINER else method
