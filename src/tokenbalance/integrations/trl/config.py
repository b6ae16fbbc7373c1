"""Map a :class:`~tokenbalance.algorithms.methods.Method` onto TRL's ``GRPOConfig``, or refuse it.

The subclass computes the loss with our functions, so most of TRL's loss fields are not read by it;
they must still agree with the method (:func:`method_fields`; the table is in docs/trl.md), so that a
config never says one thing while the trainer does another, and so that TRL computes what our loss
needs (reference log-probs for a KL term, the generation-time log-probs Lopti's second pass reads).
The method is resolved as every runner's (:func:`~tokenbalance.algorithms.presets.resolve_method`);
one TRL cannot run is refused with the reason (:func:`unsupported_reason`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.presets import resolve_method
from tokenbalance.checks import check_range
from tokenbalance.integrations.trl.optimiser import optimiser_fields

ESTIMATOR_SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none"}
AGG_MODE_LOSS_TYPES = {
    "token-mean": ("dapo", "bnpo"),
    "seq-mean-token-mean": ("grpo",),
    "seq-mean-token-sum-norm": ("dr_grpo",),
}
GLOBAL_TOKEN_MEAN_LOSS_TYPE = "dapo"


def pass_count(method: Method) -> int:
    """Optimizer passes per batch: 2 for Lopti, 1 otherwise (``Method.pass_names``)."""
    return len(method.pass_names)


def unsupported_reason(method: Method) -> str | None:
    """Why the TRL subclass cannot run ``method`` (None when it can)."""
    name = method.name
    if method.advantage.estimator not in ESTIMATOR_SCALE_REWARDS:
        return (
            f"method {name!r} uses advantage.estimator={method.advantage.estimator!r}; on TRL the advantages "
            f"come from GRPOTrainer (group-normalised rewards), which matches only "
            f"{sorted(ESTIMATOR_SCALE_REWARDS)}; run REINFORCE++ / RLOO methods on our trainer or verl"
        )
    if method.kl.placement == "reward" and method.kl.coef > 0:
        return (
            f"method {name!r} puts the KL in the reward (kl.placement='reward'); TRL has no KL-in-reward "
            "step; use kl.placement='loss' or our trainer"
        )
    if method.policy_agg_mode != method.loss_agg_mode:
        return (
            f"method {name!r} aggregates the policy term with {method.policy_agg_mode!r} and the KL / entropy "
            f"with {method.loss_agg_mode!r}; TRL has one loss_type, so both must be the same"
        )
    if method.loss_agg_mode not in AGG_MODE_LOSS_TYPES:
        return (
            f"method {name!r} uses loss_agg_mode={method.loss_agg_mode!r}, which has no TRL loss_type; "
            f"supported: {sorted(AGG_MODE_LOSS_TYPES)}"
        )
    if method.lopti is not None:
        if method.lopti.threshold_mode != "prob":
            return (
                f"method {name!r} uses lopti.threshold_mode={method.lopti.threshold_mode!r}: the quantile "
                "threshold is a statistic of the whole batch, while the TRL subclass splits each "
                "micro-batch on its own; use threshold_mode='prob'"
            )
        if method.lopti.renormalize_per_stage:
            return (
                f"method {name!r} sets lopti.renormalize_per_stage: that needs each stage's token count over "
                "the whole optimizer step, which TRL does not provide; use our trainer"
            )
    if method.dynamic_sampling.enabled:
        return (
            f"method {name!r} enables DAPO dynamic sampling (dynamic_sampling.enabled): TRL's GRPOTrainer trains "
            "on every generated group and cannot sample more prompts to replace the all-equal ones; set "
            "dynamic_sampling.enabled=False, or run it on our trainer or on verl (algorithm.filter_groups)"
        )
    rule = method.token_rule
    if rule is not None and "correct" in rule.needs:
        return (
            f"method {name!r}: token rule {rule.label} needs correct_B, which the TRL subclass does not know "
            "(TRL gives the loss rewards, not a correctness flag); run it on our trainer"
        )
    if method.nthr is not None and method.lopti is not None:
        return (
            f"method {name!r} combines NTHR and Lopti: NTHR reads the old policy's hidden states from the "
            "training forward, which is the old policy only in the first of Lopti's two passes"
        )
    return None


def method_fields(method: Method, *, iterations_per_pass: int = 1, loss_type: str | None = None) -> dict[str, object]:
    """The ``GRPOConfig`` fields ``method`` fixes (see the module table).

    ``loss_type`` picks between the TRL loss types valid for the method's aggregation mode
    (default: the first, ``"dapo"`` for token-mean).
    """
    reason = unsupported_reason(method)
    if reason:
        raise ValueError(reason)
    check_range("iterations_per_pass", iterations_per_pass, 1, integer=True)
    loss_types = AGG_MODE_LOSS_TYPES[method.loss_agg_mode]
    if loss_type is None:
        loss_type = loss_types[0]
    elif loss_type not in loss_types:
        raise ValueError(
            f"loss_type={loss_type!r} does not aggregate like method {method.name!r} "
            f"({method.loss_agg_mode}); valid: {list(loss_types)}"
        )
    kl_loss = method.kl.placement == "loss" and method.kl.coef > 0
    return {
        "scale_rewards": ESTIMATOR_SCALE_REWARDS[method.advantage.estimator],
        "multi_objective_aggregation": "sum_then_normalize",
        "loss_type": loss_type,
        "epsilon": method.clip.eps_low,
        "epsilon_high": method.clip.eps_high,
        "delta": None,
        "importance_sampling_level": "token",
        "beta": float(method.kl.coef) if kl_loss else 0.0,
        "use_bias_correction_kl": False,
        "num_iterations": pass_count(method) * iterations_per_pass,
        "top_entropy_quantile": 1.0,
        "entropy_coef": 0.0,
        "use_adaptive_entropy": False,
        "off_policy_mask_threshold": None,
    }


def grpo_config_for_method(
    method: Method | str,
    *,
    method_overrides: Mapping[str, Any] | None = None,
    iterations_per_pass: int = 1,
    optimiser: str = "paper",
    **config,
):
    """A ``trl.GRPOConfig`` with ``method``'s fields set and ``config`` for everything else.

    ``method``: a :class:`Method`, a preset (``tokenbalance list-methods``) or a token rule (its name,
    ``MODULE:RULE`` or ``FILE.py:RULE``), with ``method_overrides`` (``{"lopti.eta": 0.4}``) applied:
    :func:`~tokenbalance.algorithms.presets.resolve_method`, as every runner. ``config`` may repeat
    a method field only with the same value (``loss_type`` may pick ``"bnpo"`` for token-mean); a
    conflicting value raises ``ValueError`` naming the field. ``optimiser="paper"`` (default) starts
    from the optimiser of the method's paper (constant LR, weight decay 0.01, ...:
    :mod:`.optimiser`), ``"trl"`` from TRL's defaults; a field in ``config`` wins either way.
    """
    from trl import GRPOConfig

    method = resolve_method(method, method_overrides)
    defaults = optimiser_fields(method, optimiser)
    fields = method_fields(method, iterations_per_pass=iterations_per_pass, loss_type=config.pop("loss_type", None))
    for key, value in config.items():
        if key in fields and value != fields[key]:
            raise ValueError(
                f"GRPOConfig.{key}={value!r} conflicts with method {method.name!r}, which needs "
                f"{key}={fields[key]!r} (see docs/trl.md)"
            )
    args = GRPOConfig(**{**defaults, **config, **fields})
    check_config(method, args)
    setattr(args, METHOD_ATTRIBUTE, method)  # the method travels with the config (config_method)
    return args


# The attribute of a GRPOConfig built by grpo_config_for_method that holds its Method: not a GRPOConfig
# field, so TRL neither reads nor saves it.
METHOD_ATTRIBUTE = "tokenbalance_method"


def config_method(args) -> Method | None:
    """The method ``args`` was built for by :func:`grpo_config_for_method` (None for a config built
    otherwise)."""
    method = getattr(args, METHOD_ATTRIBUTE, None)
    return method if isinstance(method, Method) else None


def trainer_method(method: Method | str | None, args, overrides: Mapping[str, Any] | None = None) -> Method:
    """The method a trainer runs: the one ``args`` was built for, unless ``method`` names it too (the
    same method) or another (refused: AR, TR-GRPO or NTHR share GRPO's config fields, so a config
    built for one would otherwise train another silently); ``grpo`` for a config built otherwise.
    ``overrides`` (``{"lopti.eta": 0.4}``) then apply, as ``train.method_overrides`` in our trainer
    (:func:`~tokenbalance.algorithms.presets.resolve_method`)."""
    built_for = config_method(args)
    if method is None:
        chosen = built_for or resolve_method("grpo")
    else:
        chosen = resolve_method(method)
        if built_for is not None and built_for != chosen:
            raise ValueError(
                f"method={chosen.name!r}, but args was built for method {built_for.name!r} by "
                "grpo_config_for_method; leave method= out (the config carries its method) or build the "
                "config for this one"
            )
    return resolve_method(chosen, overrides, key_prefix="method_overrides.")


def _mismatch(field: str, actual, expected, method: Method, why: str) -> ValueError:
    return ValueError(
        f"GRPOConfig.{field}={actual!r} does not fit method {method.name!r}: {why}; expected "
        f"{expected!r} (build the config with tokenbalance.integrations.trl.grpo_config_for_method)"
    )


def check_config(method: Method, args) -> None:
    """Raise ``ValueError`` naming the first ``GRPOConfig`` field that contradicts ``method``."""
    reason = unsupported_reason(method)
    if reason:
        raise ValueError(reason)
    expected = method_fields(method)
    why = {
        "scale_rewards": f"advantage.estimator={method.advantage.estimator!r}",
        "multi_objective_aggregation": "our advantages are of the weighted reward sum",
        "epsilon": "clip.eps_low",
        "epsilon_high": "clip.eps_high",
        "delta": "our dual clip is clip.dual_clip_c; TRL's delta is a different two-sided clip",
        "importance_sampling_level": "our surrogate is token-level",
        "beta": f"kl.coef={method.kl.coef} with placement {method.kl.placement!r} (TRL computes reference "
        "log-probs only when beta != 0)",
        "use_bias_correction_kl": "our KL term is not importance-weighted",
        "top_entropy_quantile": "the entropy mask is a TRL loss feature our loss does not implement",
        "entropy_coef": "the entropy term is the method's entropy_coeff, applied by our loss",
        "use_adaptive_entropy": "the entropy term is the method's entropy_coeff, applied by our loss",
        "off_policy_mask_threshold": "off-policy sequence masking is a TRL loss feature our loss does not implement",
    }
    for field, reason_text in why.items():
        actual = getattr(args, field)
        if field == "epsilon_high" and actual is None:
            actual = args.epsilon
        if actual != expected[field]:
            raise _mismatch(field, actual, expected[field], method, reason_text)
    loss_types = AGG_MODE_LOSS_TYPES[method.loss_agg_mode]
    if args.loss_type not in loss_types:
        raise _mismatch(
            "loss_type",
            args.loss_type,
            loss_types[0],
            method,
            f"loss_agg_mode={method.loss_agg_mode!r} maps to {list(loss_types)}",
        )
    if method.loss_agg_mode == "seq-mean-token-sum-norm" and method.max_response_len not in (
        None,
        args.max_completion_length,
    ):
        raise _mismatch(
            "max_completion_length",
            args.max_completion_length,
            method.max_response_len,
            method,
            "TRL's dr_grpo divides by max_completion_length, our max_response_len must equal it",
        )
    passes = pass_count(method)
    if args.num_iterations % passes:
        raise _mismatch(
            "num_iterations",
            args.num_iterations,
            passes,
            method,
            f"the method runs {passes} optimizer passes per batch, one TRL iteration each, so "
            "num_iterations must be a multiple of it",
        )
    if passes > 1 and args.steps_per_generation % args.gradient_accumulation_steps:
        raise _mismatch(
            "steps_per_generation",
            args.steps_per_generation,
            args.gradient_accumulation_steps,
            method,
            "each Lopti pass must be whole optimizer steps, so steps_per_generation must be a "
            "multiple of gradient_accumulation_steps",
        )
    if method.nthr is not None:
        if args.num_iterations != 1:
            raise _mismatch(
                "num_iterations",
                args.num_iterations,
                1,
                method,
                "NTHR reads the old policy's hidden states from the training forward, which is the "
                "old policy only in the first iteration",
            )
        if args.steps_per_generation != 1:
            raise _mismatch(
                "steps_per_generation",
                args.steps_per_generation,
                1,
                method,
                "NTHR scores whole prompt groups in one training forward; TRL shuffles and splits a "
                "generation batch over steps_per_generation micro-batches, breaking the groups",
            )
        if args.per_device_train_batch_size % args.num_generations:
            raise _mismatch(
                "per_device_train_batch_size",
                args.per_device_train_batch_size,
                f"a multiple of num_generations={args.num_generations}",
                method,
                "NTHR needs every prompt group on one process",
            )
