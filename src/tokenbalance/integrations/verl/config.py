"""The policy-loss config class verl instantiates for our losses, and its translation to a Method.

verl builds ``actor_rollout_ref.actor.policy_loss`` with hydra from its ``_target_``; pointing the
target at :class:`TokenBalancePolicyLossConfig` (a subclass of verl's ``PolicyLossConfig``) lets
the token-level hyper-parameters travel inside verl's own ``ActorConfig`` to every worker and
into the loss function's ``config`` argument. Add the fields with a leading ``+`` on the command
line (they are not in verl's YAML), e.g.::

    actor_rollout_ref.actor.policy_loss._target_=tokenbalance.integrations.verl.config.TokenBalancePolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=tokenbalance_ar
    +actor_rollout_ref.actor.policy_loss.ar_alpha=0.3

Everything that verl already has a key for is read from verl's keys, so there is one source of
truth: clip ratios (``clip_ratio_low/high``, dual clip ``clip_ratio_c``), ``loss_agg_mode``,
``loss_scale_factor``, ``entropy_coeff`` and the KL loss (``use_kl_loss``, ``kl_loss_type``,
``kl_loss_coef``). The log-ratio clamps are verl's (20 in the PPO ratio and in k3), not the
AR-Lopti fork's 5 (docs/methods.md §2.4-2.5). A wrong value fails when verl builds the config
(at launch, in the driver) with the verl field named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.workers.config import PolicyLossConfig

from tokenbalance.algorithms.methods import KLConfig, Method
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.presets import load_token_rule
from tokenbalance.algorithms.surrogate import ClipConfig
from tokenbalance.algorithms.weights import ARConfig, TRGRPOConfig
from tokenbalance.integrations.verl.names import (
    NTHR_UNSUPPORTED,
    POLICY_LOSS_NAMES,
    POLICY_LOSS_STAGES,
)
from tokenbalance.integrations.verl_rules import CALCULATE_ENTROPY, verl_rule_problem

VERL_LOG_RATIO_CLAMP = 20.0  # verl 0.9's clamp on log(pi/pi_old) and inside low_var_kl


def _renamed(error: ValueError, section: str, verl_names: dict[str, str]) -> ValueError:
    """Our configs name fields ``ar.alpha``; rewrite to the verl key the user wrote."""
    text = str(error)
    for ours, theirs in verl_names.items():
        if text.startswith(f"{section}.{ours}:"):
            return ValueError(theirs + text[len(section) + len(ours) + 1 :])
    return ValueError(f"{section} ({', '.join(verl_names.values())}): {text}")


def _build(config_type, section: str, values: dict[str, Any], verl_names: dict[str, str] | None = None):
    """``config_type(**values)`` without the ``None`` entries, errors naming the verl field.

    ``verl_names`` maps our field names to verl keys (default ``policy_loss.<section>_<name>``).
    """
    if verl_names is None:
        verl_names = {name: f"actor_rollout_ref.actor.policy_loss.{section}_{name}" for name in values}
    try:
        return config_type(**{key: value for key, value in values.items() if value is not None})
    except ValueError as error:
        raise _renamed(error, section, verl_names) from None


_ACTOR = "actor_rollout_ref.actor."
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


@dataclass
class TokenBalancePolicyLossConfig(PolicyLossConfig):
    """verl ``policy_loss`` config with tokenbalance's token-level hyper-parameters.

    ``loss_mode`` picks the stages (``tokenbalance_grpo``, ``tokenbalance_ar``,
    ``tokenbalance_tr_grpo``, ``tokenbalance_ar_tr_grpo``); Lopti is the update schedule of the
    ``tokenbalance_lopti`` trainer and reads the ``lopti_*`` fields. ``None`` means our default
    (docs/methods.md §3-5): the field's own help says which.

    Attributes:
        ar_alpha: AR slope alpha in [0, 1] (None: 0.3, paper Figure 4).
        ar_tau: AR intercept (None: 1 - alpha, the paper's form).
        ar_neg_adv_weight: factor on negative advantages after AR (1.0, every released script).
        ar_prob_source: ``old`` (paper) or ``current_detached``.
        tr_grpo_*: TR-GRPO weight (docs/methods.md §5; constants third-party, UNVERIFIED):
            shape, alpha, tau, mu, lower, upper, prob_source, placement. ``weight_kl`` is not
            offered: the KL term of the single-pass path is verl's own.
        lopti_eta: Lopti threshold in (0, 1) (None: 0.5, paper; the Lopti-only script uses 0.4).
        lopti_order: ``low_first`` (None) or ``high_first`` (ablation).
        lopti_strict_less: ``p < eta`` (None: True, the reference) or ``p <= eta``.
        token_rule: your token rule, ``MODULE:RULE`` or ``FILE.py:RULE`` (imported in every worker;
            docs/methods.md §10), on top of the loss mode's stages; None: none.
    """

    loss_mode: str = "tokenbalance_grpo"
    ar_alpha: float | None = None
    ar_tau: float | None = None
    ar_neg_adv_weight: float | None = None
    ar_prob_source: str | None = None
    tr_grpo_shape: str | None = None
    tr_grpo_alpha: float | None = None
    tr_grpo_tau: float | None = None
    tr_grpo_mu: float | None = None
    tr_grpo_lower: float | None = None
    tr_grpo_upper: float | None = None
    tr_grpo_prob_source: str | None = None
    tr_grpo_placement: str | None = None
    lopti_eta: float | None = None
    lopti_order: str | None = None
    lopti_strict_less: bool | None = None
    token_rule: str | None = None

    def __post_init__(self) -> None:
        check_loss_mode(self.loss_mode)
        token_stages(self)  # validates every field, naming it
        lopti_config(self)


def check_loss_mode(loss_mode: str) -> None:
    """Reject NTHR and unknown ``tokenbalance_*`` names with the reason."""
    if "nthr" in str(loss_mode).lower():
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}: {NTHR_UNSUPPORTED}")
    if str(loss_mode).startswith("tokenbalance") and loss_mode not in POLICY_LOSS_STAGES:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode: unknown tokenbalance loss {loss_mode!r}; "
            f"valid: {', '.join(POLICY_LOSS_NAMES)}"
        )


def _field(policy_loss, name: str):
    return getattr(policy_loss, name, None)


def token_rule(policy_loss):
    """The :class:`~tokenbalance.algorithms.token_rules.TokenRule` named by ``policy_loss.token_rule``
    (None when unset), refused with the reason when verl cannot give it what it reads."""
    name = _field(policy_loss, "token_rule")
    if name is None:
        return None
    setting = "actor_rollout_ref.actor.policy_loss.token_rule"
    rule = load_token_rule(name, setting)
    problem = verl_rule_problem(rule, lopti_trainer=True)  # the entropy is checked with the trainer known
    if problem:
        raise ValueError(f"{setting}={name!r}: {problem}")
    return rule


def token_stages(policy_loss) -> dict[str, Any]:
    """``{"ar": ARConfig | None, "tr_grpo": TRGRPOConfig | None, "token_rule": TokenRule | None}``
    for ``policy_loss.loss_mode`` and ``policy_loss.token_rule``.

    ``policy_loss`` is a :class:`TokenBalancePolicyLossConfig` (or verl's plain one: defaults).
    """
    loss_mode = policy_loss.loss_mode
    check_loss_mode(loss_mode)
    with_ar, with_tr = POLICY_LOSS_STAGES.get(loss_mode, (False, False))
    ar = _build(
        ARConfig,
        "ar",
        {
            "alpha": _field(policy_loss, "ar_alpha"),
            "tau": _field(policy_loss, "ar_tau"),
            "neg_adv_weight": _field(policy_loss, "ar_neg_adv_weight"),
            "prob_source": _field(policy_loss, "ar_prob_source"),
        },
    )
    tr_names = ("shape", "alpha", "tau", "mu", "lower", "upper", "prob_source", "placement")
    tr = _build(TRGRPOConfig, "tr_grpo", {name: _field(policy_loss, f"tr_grpo_{name}") for name in tr_names})
    return {"ar": ar if with_ar else None, "tr_grpo": tr if with_tr else None, "token_rule": token_rule(policy_loss)}


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


def lopti_config(policy_loss) -> LoptiConfig:
    """The Lopti schedule's config from the ``lopti_*`` fields (prob threshold mode only)."""
    return _build(
        LoptiConfig,
        "lopti",
        {
            "eta": _field(policy_loss, "lopti_eta"),
            "order": _field(policy_loss, "lopti_order"),
            "strict_less": _field(policy_loss, "lopti_strict_less"),
        },
    )


def lopti_fields_set(policy_loss) -> list[str]:
    """Names of the ``lopti_*`` fields given explicitly (they only act under the Lopti trainer)."""
    return [name for name in ("lopti_eta", "lopti_order", "lopti_strict_less") if _field(policy_loss, name) is not None]


def method_from_actor_config(actor_config, *, with_regularisers: bool, with_lopti: bool = False) -> Method:
    """The tokenbalance :class:`Method` equivalent to a verl ``ActorConfig``.

    Args:
        actor_config: verl ``ActorConfig`` (or a mapping with its keys).
        with_regularisers: include the KL loss and entropy terms (the Lopti loss computes them
            itself, masked per pass); ``False`` for the registered policy losses, whose KL and
            entropy terms verl's ``ppo_loss`` adds.
        with_lopti: attach the Lopti config (the Lopti trainer's loss).
    """
    policy_loss = actor_config.policy_loss
    clip_ratio = actor_config.get("clip_ratio", 0.2)
    low = actor_config.get("clip_ratio_low", None)
    high = actor_config.get("clip_ratio_high", None)
    clip = _build(
        ClipConfig,
        "clip",
        {
            "eps_low": clip_ratio if low is None else low,
            "eps_high": clip_ratio if high is None else high,
            "dual_clip_c": actor_config.get("clip_ratio_c", 3.0),
            "log_ratio_clamp": VERL_LOG_RATIO_CLAMP,
        },
        _CLIP_NAMES,
    )
    use_kl = with_regularisers and bool(actor_config.get("use_kl_loss", False))
    kl = _build(
        KLConfig,
        "kl",
        {
            "coef": float(actor_config.get("kl_loss_coef", 0.0)),
            "estimator": actor_config.get("kl_loss_type", "low_var_kl"),
            "log_ratio_clamp": VERL_LOG_RATIO_CLAMP,
            "placement": "loss" if use_kl else "none",
        },
        _KL_NAMES,
    )
    agg_mode = actor_config.get("loss_agg_mode", "token-mean")
    stages = token_stages(policy_loss)
    problem = rule_entropy_problem(stages["token_rule"], actor_config, lopti_trainer=with_lopti)
    if problem:
        raise ValueError(f"{_ACTOR}policy_loss.token_rule: {problem}")
    try:
        return Method(
            name=f"verl:{policy_loss.loss_mode}",
            clip=clip,
            kl=kl,
            entropy_coeff=float(actor_config.get("entropy_coeff", 0.0)) if with_regularisers else 0.0,
            loss_agg_mode=agg_mode,
            max_response_len=actor_config.get("loss_scale_factor", None),
            lopti=lopti_config(policy_loss) if with_lopti else None,
            **stages,
        )
    except ValueError as error:
        raise ValueError(
            f"{_ACTOR}{error} (the tokenbalance losses support the modes of docs/methods.md §2.7)"
        ) from None
