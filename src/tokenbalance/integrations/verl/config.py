"""The policy-loss config verl instantiates for our loss, and the Method it names.

``actor_rollout_ref.actor.policy_loss._target_`` pointed at :class:`TokenBalancePolicyLossConfig`
carries a method to every worker as our trainer's config does: a preset (or your token rule) and
dotted overrides, resolved by :func:`~tokenbalance.algorithms.presets.resolve_method`; what verl has
a key for stays verl's (:data:`~tokenbalance.integrations.verl_names.VERL_OWNED`). The keys, the
deprecated spellings and the normaliser scope: docs/verl.md, "The method: a preset and overrides".
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from verl.workers.config import PolicyLossConfig

from tokenbalance.algorithms.methods import KLConfig, Method
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.presets import resolve_method
from tokenbalance.algorithms.surrogate import ClipConfig
from tokenbalance.checks import check_choice
from tokenbalance.integrations.verl.names import (
    LEGACY_FIELDS,
    LEGACY_POLICY_LOSSES,
    LOPTI_TRAINER,
    NTHR_UNSUPPORTED,
    POLICY_LOSS,
    POLICY_LOSS_KEY,
    POLICY_LOSS_NAMES,
    TOKEN_MEAN_SCOPE_KEY,
    TOKEN_MEAN_SCOPES,
    VERL_OWNED,
)
from tokenbalance.integrations.verl_rules import CALCULATE_ENTROPY, verl_method_problem, verl_rule_problem

VERL_LOG_RATIO_CLAMP = 20.0  # verl 0.9's clamp on log(pi/pi_old) and inside low_var_kl
OVERRIDES_KEY = f"{POLICY_LOSS_KEY}.overrides"
METHOD_KEY = f"{POLICY_LOSS_KEY}.method"
_ACTOR = "actor_rollout_ref.actor."
_LEGACY_STAGES = tuple(dict.fromkeys(stage for stages in LEGACY_POLICY_LOSSES.values() for stage in stages))


@dataclasses.dataclass
class _MethodChoice(PolicyLossConfig):
    loss_mode: str = POLICY_LOSS
    method: str | None = None
    overrides: dict[str, Any] | None = None
    token_mean_scope: str = TOKEN_MEAN_SCOPES[0]


def _check(self) -> None:
    method_from_policy_loss(self)  # every name and value checked when verl builds the config
    token_mean_scope(self)


def token_mean_scope(policy_loss) -> str:
    """The loss normaliser's scope the ``policy_loss`` section names (:data:`TOKEN_MEAN_SCOPES`)."""
    scope = policy_loss.get("token_mean_scope", None) or TOKEN_MEAN_SCOPES[0]
    check_choice(TOKEN_MEAN_SCOPE_KEY, scope, TOKEN_MEAN_SCOPES)
    return scope


TokenBalancePolicyLossConfig: type = dataclasses.make_dataclass(
    "TokenBalancePolicyLossConfig",
    [(name, Any, dataclasses.field(default=None)) for name in LEGACY_FIELDS],
    bases=(_MethodChoice,),
    namespace={
        "__module__": __name__,
        "__post_init__": _check,
        "__doc__": "verl's ``policy_loss`` config naming a tokenbalance method: ``method`` (a preset or "
        "``MODULE:RULE``; None: grpo) and ``overrides`` (dotted keys, ``{ar.alpha: 0.2}``). The flat "
        "fields (``ar_alpha``, ``lopti_eta``, ... :data:`LEGACY_FIELDS`) are the deprecated spelling of "
        "overrides. ``token_mean_scope``: the loss normaliser, ``mini_batch`` (verl's) or ``micro_batch`` "
        "(the AR-Lopti fork's).",
    },
)


def check_loss_mode(loss_mode: str) -> None:
    """Reject NTHR and unknown ``tokenbalance*`` names with the reason."""
    if "nthr" in str(loss_mode).lower():
        raise ValueError(f"{POLICY_LOSS_KEY}.loss_mode={loss_mode!r}: {NTHR_UNSUPPORTED}")
    if str(loss_mode).startswith("tokenbalance") and loss_mode not in POLICY_LOSS_NAMES:
        raise ValueError(
            f"{POLICY_LOSS_KEY}.loss_mode: unknown tokenbalance loss {loss_mode!r}; valid: {POLICY_LOSS} "
            f"(deprecated: {', '.join(LEGACY_POLICY_LOSSES)})"
        )


def flat_overrides(overrides: Mapping | None) -> dict[str, Any]:
    """Hydra's nesting of dotted keys undone: ``{ar: {alpha: 0.2}}`` -> ``{"ar.alpha": 0.2}`` (an
    empty mapping, ``ar={}``, stays: the stage on with its defaults)."""
    flat: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and value:
            flat.update({f"{key}.{sub}": item for sub, item in flat_overrides(value).items()})
        else:
            flat[str(key)] = {} if isinstance(value, Mapping) else value
    return flat


@dataclasses.dataclass(frozen=True)
class MethodRequest:
    """What ``resolve_method`` gets for a ``policy_loss`` section: the name, the overrides in order
    and, for each override, the key the user wrote (``key_names``; others are ``overrides.<key>``)."""

    name: str
    overrides: dict[str, Any]
    key_names: dict[str, str]

    def label(self, key: str) -> str:
        return self.key_names.get(key, f"{OVERRIDES_KEY}.{key}")


def method_request(policy_loss) -> MethodRequest:
    """The method a ``policy_loss`` section names; a deprecated loss name or flat field becomes the
    overrides it stands for (a ``FutureWarning`` shows the new spelling)."""
    loss_mode = str(policy_loss.get("loss_mode", POLICY_LOSS))
    check_loss_mode(loss_mode)
    name = policy_loss.get("method", None)
    overrides = flat_overrides(policy_loss.get("overrides", None))
    legacy = {key: policy_loss.get(flat, None) for flat, key in LEGACY_FIELDS.items()}
    legacy = {key: value for key, value in legacy.items() if value is not None}
    stages = LEGACY_POLICY_LOSSES.get(loss_mode)
    if stages is None and not legacy:
        return MethodRequest(name or "grpo", overrides, {})
    request: dict[str, Any] = {
        stage: {} for stage in stages or () if not any(k.startswith(f"{stage}.") for k in legacy)
    }
    request.update(legacy)
    if stages is not None:  # the stages the old name leaves off (their fields are checked first)
        request.update({stage: None for stage in _LEGACY_STAGES if stage not in stages})
    shown = {key: value for key, value in request.items() if value is not None or name is not None}
    old_form = [f"loss_mode={loss_mode}"] if stages is not None else []
    old_form += [f"{flat}={policy_loss.get(flat)}" for flat, key in LEGACY_FIELDS.items() if key in legacy]
    new_form = " ".join(f"+{OVERRIDES_KEY}.{key}={_shown(value)}" for key, value in shown.items())
    warnings.warn(
        f"{POLICY_LOSS_KEY}: {', '.join(old_form)} is the deprecated spelling of {POLICY_LOSS_KEY}.loss_mode="
        f"{POLICY_LOSS} +{METHOD_KEY}={name or 'grpo'} {new_form}".rstrip(),
        FutureWarning,
        stacklevel=3,
    )
    names = {key: f"{POLICY_LOSS_KEY}.{flat}" for flat, key in LEGACY_FIELDS.items() if key in legacy}
    return MethodRequest(name or "grpo", {**request, **overrides}, names)


def _shown(value: Any) -> str:
    return "null" if value is None else "{}" if value == {} else str(value)


def method_from_policy_loss(policy_loss) -> Method:
    """The :class:`Method` a ``policy_loss`` section names, every override checked against its field
    (errors name the key as written); a setting verl holds (:data:`VERL_OWNED`) is refused."""
    request = method_request(policy_loss)
    for key in request.overrides:
        owner = VERL_OWNED.get(str(key).partition(".")[0])
        if owner is not None:
            raise ValueError(f"{request.label(key)}: verl holds this setting in its own key; set {owner}")
    method = resolve_method(
        request.name,
        request.overrides,
        setting=METHOD_KEY,
        key_prefix=f"{OVERRIDES_KEY}.",
        key_names=request.key_names,
    )
    rule = method.token_rule
    if rule is not None:
        problem = verl_rule_problem(rule, lopti_trainer=True)  # the entropy: checked with the trainer known
        if problem:
            raise ValueError(f"{rule_key(policy_loss)}={rule.spec or rule.name!r}: {problem}")
    return method


def rule_key(policy_loss) -> str:
    """The key that named the method's token rule."""
    request = method_request(policy_loss)
    return request.label("token_rule") if "token_rule" in request.overrides else METHOD_KEY


def single_pass_problem(policy_loss, method: Method) -> str | None:
    """Why ``method`` needs the Lopti trainer (its two passes), naming the key that asked for them."""
    if method.lopti is None:
        return None
    request = method_request(policy_loss)
    key = next((key for key in request.overrides if str(key).startswith("lopti")), None)
    what = f"{request.label(key)} is set" if key else f"{METHOD_KEY}={request.name!r} runs Lopti's two passes"
    return f"{what} but the update runs a single pass: select the Lopti trainer with trainer.v1.trainer_mode={LOPTI_TRAINER}"


def lopti_config(policy_loss) -> LoptiConfig:
    """The Lopti trainer's schedule: the method's Lopti settings, else Lopti's defaults."""
    return method_from_policy_loss(policy_loss).lopti or LoptiConfig()


def rule_entropy_problem(rule, actor, *, lopti_trainer: bool) -> str | None:
    """Why the loss cannot give ``rule`` the entropy it needs (None when it can, or needs none):
    only the ``tokenbalance_lopti`` trainer's loss gets it, when verl computes it. ``actor``: verl's
    ``ActorConfig`` or the ``actor_rollout_ref.actor`` section of the launch config."""
    if rule is None or "entropy" not in rule.needs:
        return None
    problem = verl_rule_problem(rule, lopti_trainer=lopti_trainer)
    computed = bool(actor.get("calculate_entropy", False)) or float(actor.get("entropy_coeff", 0.0) or 0.0) != 0
    if problem is None and not computed:
        problem = f"token rule {rule.label} needs the entropy, which verl computes only with {CALCULATE_ENTROPY}=True"
    return problem


def _verl_stage(config_type, section: str, values: dict[str, Any], verl_names: dict[str, str]):
    """``config_type(**values)``; an error names the verl key the value came from."""
    try:
        return config_type(**values)
    except ValueError as error:
        text = str(error)
        for ours, theirs in verl_names.items():
            if text.startswith(f"{section}.{ours}:"):
                raise ValueError(theirs + text[len(section) + len(ours) + 1 :]) from None
        raise ValueError(f"{section} ({', '.join(verl_names.values())}): {text}") from None


_CLIP_NAMES = {
    "eps_low": _ACTOR + "clip_ratio_low",
    "eps_high": _ACTOR + "clip_ratio_high",
    "dual_clip_c": _ACTOR + "clip_ratio_c",
    "log_ratio_clamp": "(verl's fixed clamp)",
}
_KL_NAMES = {
    "coef": _ACTOR + "kl_loss_coef",
    "estimator": _ACTOR + "kl_loss_type",
    "log_ratio_clamp": "(verl's fixed clamp)",
    "placement": _ACTOR + "use_kl_loss",
}


def method_from_actor_config(actor_config, *, with_regularisers: bool, with_lopti: bool = False) -> Method:
    """The tokenbalance :class:`Method` a verl ``ActorConfig`` runs: the ``policy_loss`` section's
    method with verl's own settings (:data:`VERL_OWNED`) in place of the method's.

    Args:
        actor_config: verl ``ActorConfig`` (or a mapping with its keys).
        with_regularisers: include the KL loss and entropy terms (the Lopti loss computes them
            itself, masked per pass); ``False`` for the registered policy loss, whose KL and
            entropy terms verl's ``ppo_loss`` adds.
        with_lopti: the Lopti trainer's loss: Lopti's passes (the method's settings, or its defaults).
    """
    policy_loss = actor_config.policy_loss
    method = method_from_policy_loss(policy_loss)
    problem = None if with_lopti else single_pass_problem(policy_loss, method)
    problem = problem or verl_method_problem(method, lopti_trainer=with_lopti)
    if problem:
        raise ValueError(problem)
    problem = rule_entropy_problem(method.token_rule, actor_config, lopti_trainer=with_lopti)
    if problem:
        raise ValueError(f"{rule_key(policy_loss)}: {problem}")
    clip_ratio = actor_config.get("clip_ratio", 0.2)
    low = actor_config.get("clip_ratio_low", None)
    high = actor_config.get("clip_ratio_high", None)
    clip_values = {
        "eps_low": clip_ratio if low is None else low,
        "eps_high": clip_ratio if high is None else high,
        "dual_clip_c": actor_config.get("clip_ratio_c", 3.0),
        "log_ratio_clamp": VERL_LOG_RATIO_CLAMP,
    }
    clip = _verl_stage(ClipConfig, "clip", clip_values, _CLIP_NAMES)
    use_kl = with_regularisers and bool(actor_config.get("use_kl_loss", False))
    kl_values = {
        "coef": float(actor_config.get("kl_loss_coef", 0.0)),
        "estimator": actor_config.get("kl_loss_type", "low_var_kl"),
        "log_ratio_clamp": VERL_LOG_RATIO_CLAMP,
        "placement": "loss" if use_kl else "none",
    }
    kl = _verl_stage(KLConfig, "kl", kl_values, _KL_NAMES)
    try:
        return method.replace(
            clip=clip,
            kl=kl,
            entropy_coeff=float(actor_config.get("entropy_coeff", 0.0)) if with_regularisers else 0.0,
            loss_agg_mode=actor_config.get("loss_agg_mode", "token-mean"),
            policy_loss_agg_mode=None,
            max_response_len=actor_config.get("loss_scale_factor", None),
            nthr=None,  # the tokenbalance_nthr trainer weights the advantages before the loss
            lopti=(method.lopti or LoptiConfig()) if with_lopti else None,
        )
    except ValueError as error:
        raise ValueError(
            f"{_ACTOR}{error} (the tokenbalance losses support the modes of docs/methods.md §2.7)"
        ) from None
