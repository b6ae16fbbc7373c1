"""A method: a named composition of the stages (the presets are rows of :mod:`.presets`).

    advantage estimator -> [NTHR weights] -> [AR weights] -> [token rule, stage "passes"]
    -> update passes (single, Lopti, the step-count control's random halves or the rule's split)
    -> per pass: clipped surrogate [x TR-GRPO weights] [x token rule, stage "loss"] + KL + entropy

:func:`build_update_passes` runs the stages up to the passes once per RL step;
:func:`tokenbalance.algorithms.loss.pass_loss` runs the rest per micro-batch (docs/methods.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import param
from tokenbalance.algorithms.advantages import (
    ADVANTAGE_ESTIMATOR_NAMES,
    OUTCOME_ESTIMATORS,
    SINGLETON_RULES,
    kl_in_reward,
    outcome_token_rewards,
    reinforce_pp_advantages,
)
from tokenbalance.algorithms.aggregate import AGG_MODES
from tokenbalance.algorithms.filtering import DynamicSamplingConfig
from tokenbalance.algorithms.nthr import NTHRConfig, nthr_correct, nthr_token_weights
from tokenbalance.algorithms.passes import (
    RANDOM_SPLIT_PASS_NAMES,
    SINGLE_PASS_NAME,
    LoptiConfig,
    RandomSplitConfig,
    lopti_pass_names,
    lopti_passes,
    random_split_passes,
    single_pass,
    split_passes,
)
from tokenbalance.algorithms.surrogate import KL_ESTIMATORS, ClipConfig, kl_penalty
from tokenbalance.algorithms.token_rules import TokenRule, weight_metrics
from tokenbalance.algorithms.weights import ARConfig, TRGRPOConfig, advantage_reweight, scale_negative_advantages
from tokenbalance.types import UpdatePass

KL_PLACEMENTS = ("loss", "reward", "none")


@dataclass(frozen=True)
class AdvantageConfig:
    """Advantage estimator and its options."""

    estimator: str = param("grpo", "``grpo``, ``dr_grpo`` (mean-only), ``rloo`` or ``reinforce_pp``.")
    eps: float = param(1e-6, "GRPO's std epsilon (1e-6, reference).")
    gamma: float = param(1.0, "REINFORCE++ discount (1.0, reference).")
    singleton: str = param("reference", 'what a group of size 1 gets: ``"reference"`` (A = s) or ``"zero"``.')

    def __post_init__(self) -> None:
        check.choice("advantage.estimator", self.estimator, ADVANTAGE_ESTIMATOR_NAMES)
        check.in_range("advantage.eps", self.eps, 0.0, float("inf"))
        check.in_range("advantage.gamma", self.gamma, 0.0, 1.0)
        check.choice("advantage.singleton", self.singleton, SINGLETON_RULES)


@dataclass(frozen=True)
class KLConfig:
    """Where the KL to the reference policy enters, and how it is estimated."""

    coef: float = param(0.001, "coefficient (K&K reference 0.001).")
    estimator: str = param(
        "k3",
        "``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl`` (+ ``k1+``/``k3+`` "
        "straight-through). K&K reference: k3.",
    )
    log_ratio_clamp: float = param(5.0, "k3's inner clamp C (5 in the AR-Lopti reference, 20 upstream verl).")
    placement: str = param(
        "loss",
        '``"loss"`` (a KL loss term, the K&K scripts), ``"reward"`` (subtract coef * KL(old, ref) from '
        'the token rewards before the advantage, verl\'s ``apply_kl_penalty``) or ``"none"``.',
    )

    def __post_init__(self) -> None:
        check.in_range("kl.coef", self.coef, 0.0, float("inf"))
        check.choice("kl.estimator", self.estimator, KL_ESTIMATORS)
        check.in_range("kl.log_ratio_clamp", self.log_ratio_clamp, 0.0, float("inf"), low_open=True)
        check.choice("kl.placement", self.placement, KL_PLACEMENTS)

    @property
    def active(self) -> bool:
        return self.placement != "none" and self.coef > 0


@dataclass(frozen=True)
class Method:
    """A complete RL objective: estimator, token weights, update schedule and loss."""

    name: str = param("custom", "preset or user label.")
    advantage: AdvantageConfig = param(help="the advantage estimator.", default_factory=AdvantageConfig)
    clip: ClipConfig = param(help="the clipped surrogate.", default_factory=ClipConfig)
    kl: KLConfig = param(help="the KL to the reference policy.", default_factory=KLConfig)
    entropy_coeff: float = param(0.0, "entropy bonus coefficient (0.0 in the reference: logged only).")
    loss_agg_mode: str = param(
        "token-mean",
        "aggregation of the KL and entropy terms (and of the policy term unless ``policy_loss_agg_mode`` is set).",
    )
    policy_loss_agg_mode: str | None = param(
        None,
        "aggregation of the policy term; ``None`` = ``loss_agg_mode``. The AR-Lopti reference always "
        'uses ``"token-mean"`` here, whatever its config says.',
    )
    max_response_len: int | None = param(None, "the constant C of ``seq-mean-token-sum-norm`` (None = padded length).")
    ar: ARConfig | None = param(None, "Advantage Reweighting (docs/methods.md §3); ``None``: off.")
    tr_grpo: TRGRPOConfig | None = param(None, "the TR-GRPO probability weight (docs/methods.md §5); ``None``: off.")
    nthr: NTHRConfig | None = param(None, "NTHR negative-token weights (docs/methods.md §6); ``None``: off.")
    lopti: LoptiConfig | None = param(None, "Lopti's two update passes (docs/methods.md §4); ``None``: one pass.")
    random_split: RandomSplitConfig | None = param(
        None,
        "the step-count control: two update passes over randomly halved tokens (docs/methods.md §4.1); ``None``: off.",
    )
    token_rule: TokenRule | None = param(
        None,
        "your own token-level stage (:class:`~tokenbalance.algorithms.token_rules.TokenRule`, "
        "docs/methods.md §10); ``None`` (the presets) runs none of it.",
    )
    dynamic_sampling: DynamicSamplingConfig = param(
        help="DAPO dynamic sampling (:mod:`~tokenbalance.algorithms.filtering`), a rollout-loop option the "
        "runner reads; off by default.",
        default_factory=DynamicSamplingConfig,
    )
    recommended_temperature: float | None = param(
        None,
        "the sampling temperature the preset's paper used. A rollout setting, not part of the objective: "
        "nothing here applies it; runners and users set their rollout temperature from it "
        "(``list-methods`` prints it). ``None``: no advice.",
    )
    description: str = param("", "one line for ``list-methods``.")
    citations: tuple[tuple[str, str], ...] = param((), "(hyper-parameter, source) pairs.")

    def __post_init__(self) -> None:
        check.in_range("entropy_coeff", self.entropy_coeff, -float("inf"), float("inf"), low_open=True, high_open=True)
        if not isinstance(self.dynamic_sampling, DynamicSamplingConfig):
            raise ValueError(
                f"dynamic_sampling: expected a DynamicSamplingConfig, got {type(self.dynamic_sampling).__name__}"
            )
        if self.recommended_temperature is not None:
            check.in_range("recommended_temperature", self.recommended_temperature, 0.0, float("inf"), low_open=True)
        check.choice("loss_agg_mode", self.loss_agg_mode, AGG_MODES)
        if self.policy_loss_agg_mode is not None:
            check.choice("policy_loss_agg_mode", self.policy_loss_agg_mode, AGG_MODES)
        if self.max_response_len is not None:
            check.in_range("max_response_len", self.max_response_len, 1, float("inf"))
        rule = self.token_rule
        if rule is not None and not isinstance(rule, TokenRule):
            raise ValueError(f"token_rule: expected a registered TokenRule, got {type(rule).__name__}")
        if rule is not None and rule.output == "split" and self.lopti is not None:
            raise ValueError(
                f"token_rule: {rule.label} splits the tokens into two passes and so does Lopti; switch one off"
            )
        if self.random_split is not None and self.lopti is not None:
            raise ValueError("random_split: the step-count control replaces Lopti's split; switch one off")
        if self.random_split is not None and rule is not None and rule.output == "split":
            raise ValueError(
                f"random_split: token_rule {rule.label} splits the tokens into two passes too; switch one off"
            )

    @property
    def policy_agg_mode(self) -> str:
        return self.policy_loss_agg_mode or self.loss_agg_mode

    @property
    def needs_ref_logp(self) -> bool:
        """Whether the runner must compute reference-policy log-probs."""
        return self.kl.active

    @property
    def pass_names(self) -> tuple[str, ...]:
        """The update passes of every step, in execution order (``("all",)``, Lopti's two or a token rule's split): a
        static property of the method, so runners size their schedules without running it."""
        if self.lopti is not None:
            return lopti_pass_names(self.lopti)
        if self.random_split is not None:
            return RANDOM_SPLIT_PASS_NAMES
        if self.token_rule is not None and self.token_rule.output == "split":
            return self.token_rule.pass_names
        return (SINGLE_PASS_NAME,)

    @property
    def needs_hidden_states(self) -> bool:
        """Whether the old log-prob pass must return last-layer hidden states (NTHR)."""
        return self.nthr is not None

    def replace(self, **changes) -> Method:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class NTHRInputs:
    """What NTHR needs from the old policy's forward pass (all without gradient).

    Attributes:
        tokens_BT: [B, T] int64 sampled response tokens.
        hidden_BTD: [B, T, D] last-layer hidden states (after the final norm) predicting ``tokens_BT``.
        unembed_VD / unembed_bias_V: the ``lm_head`` weight [V, D] and bias [V] (if any).
        temperature: the log-prob temperature of ``old_logp_BT``.
        correct_B: [B] bool, NTHR's anchors under ``nthr.positives="correct"``; None: :func:`build_update_passes`
            derives it from ``scores_B`` (:func:`nthr_correct`); :func:`passes_from_advantages` needs it given.
        max_reward: the task's maximum reward (correct = equal to it, unless ``nthr.correct_threshold``)."""

    tokens_BT: torch.Tensor
    hidden_BTD: torch.Tensor
    unembed_VD: torch.Tensor
    temperature: float = 1.0
    unembed_bias_V: torch.Tensor | None = None
    correct_B: torch.Tensor | None = None
    max_reward: float | None = None

    @classmethod
    def from_output_layer(
        cls,
        head: torch.nn.Linear,
        tokens_BT: torch.Tensor,
        hidden_BTD: torch.Tensor,
        temperature: float,
        *,
        correct_B: torch.Tensor | None = None,
        max_reward: float | None = None,
    ) -> NTHRInputs:
        """From the old policy's output layer ``head`` and last-layer hidden states (float64 stays float64, else
        float32); every runner builds them here."""
        dtype = torch.float64 if hidden_BTD.dtype == torch.float64 else torch.float32
        bias = getattr(head, "bias", None)
        return cls(
            tokens_BT=tokens_BT,
            hidden_BTD=hidden_BTD.detach().to(dtype),
            unembed_VD=head.weight.detach().to(dtype),
            temperature=temperature,
            unembed_bias_V=None if bias is None else bias.detach().to(dtype),
            correct_B=correct_B,
            max_reward=max_reward,
        )


def _masked_stats(values_BT: torch.Tensor, mask_BT: torch.Tensor, prefix: str) -> dict[str, float]:
    values = values_BT[mask_BT].double()
    if not values.numel():
        return {f"{prefix}/mean": 0.0, f"{prefix}/abs_mean": 0.0, f"{prefix}/pos_frac": 0.0}
    return {
        f"{prefix}/mean": float(values.mean().item()),
        f"{prefix}/abs_mean": float(values.abs().mean().item()),
        f"{prefix}/pos_frac": float((values > 0).double().mean().item()),
    }


def compute_advantages(
    method: Method,
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    old_logp_BT: torch.Tensor | None = None,
    ref_logp_BT: torch.Tensor | None = None,
) -> torch.Tensor:
    """The method's advantage estimator, with the KL-in-reward penalty when configured ([B, T])."""
    config = method.advantage
    mask_BT = response_mask_BT.bool()
    token_rewards_BT = outcome_token_rewards(scores_B, mask_BT)
    if method.kl.placement == "reward" and method.kl.coef > 0:
        if old_logp_BT is None or ref_logp_BT is None:
            raise ValueError("old_logp_BT / ref_logp_BT: both required for the KL-in-reward penalty")
        kl_BT = kl_penalty(
            old_logp_BT, ref_logp_BT, mask_BT, method.kl.estimator, log_ratio_clamp=method.kl.log_ratio_clamp
        )
        token_rewards_BT = kl_in_reward(token_rewards_BT, kl_BT, mask_BT, method.kl.coef)
    if config.estimator == "reinforce_pp":
        return reinforce_pp_advantages(token_rewards_BT, mask_BT, gamma=config.gamma)
    estimator = OUTCOME_ESTIMATORS.get(config.estimator)
    options: dict[str, object] = {"singleton": config.singleton}
    if config.estimator == "grpo":
        options["eps"] = config.eps
    return estimator(token_rewards_BT.sum(dim=1), group_ids_B, mask_BT, **options)


def build_update_passes(
    method: Method,
    scores_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    response_mask_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None = None,
    nthr_inputs: NTHRInputs | None = None,
    correct_B: torch.Tensor | None = None,
) -> tuple[list[UpdatePass], dict[str, float]]:
    """Advantages, old-policy token weights and the pass schedule for one RL batch.

    Args:
        scores_B: [B] outcome rewards; group_ids_B: [B] int64 group (prompt instance) ids.
        response_mask_BT: [B, T] valid response tokens (EOS included).
        old_logp_BT: [B, T] rollout-policy log-probs at the log-prob temperature (no gradient).
        ref_logp_BT: [B, T] reference log-probs (for the KL-in-reward placement).
        nthr_inputs: needed when ``method.nthr`` is set; without ``correct_B``, correctness comes from ``scores_B``
            and ``max_reward`` (or ``nthr.correct_threshold``).
        correct_B: [B] bool, read by a token rule that needs ``correct``.

    Returns:
        The passes in order, and ``adv/*`` (before token weights), ``adv_weighted/*``, ``nthr/*``, ``token_rule/*``
        and ``lopti/*`` metrics."""
    mask_BT = response_mask_BT.bool()
    check.shape("old_logp_BT", old_logp_BT, tuple(mask_BT.shape))
    advantages_BT = compute_advantages(method, scores_B, group_ids_B, mask_BT, old_logp_BT, ref_logp_BT)
    nthr = method.nthr
    if nthr is not None and nthr_inputs is not None and nthr_inputs.correct_B is None and nthr.positives == "correct":
        nthr_correct_B = nthr_correct(scores_B, nthr, nthr_inputs.max_reward)
        nthr_inputs = dataclasses.replace(nthr_inputs, correct_B=nthr_correct_B)
    return passes_from_advantages(method, advantages_BT, mask_BT, old_logp_BT, group_ids_B, nthr_inputs, correct_B)


def passes_from_advantages(
    method: Method,
    advantages_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    group_ids_B: torch.Tensor | None = None,
    nthr_inputs: NTHRInputs | None = None,
    correct_B: torch.Tensor | None = None,
) -> tuple[list[UpdatePass], dict[str, float]]:
    """The token-level stages on given advantages (NTHR, AR, a token rule's ``passes`` stage, the pass schedule): what
    :func:`build_update_passes` runs after the estimator, and the verl / TRL integrations on their host's advantages.
    Arguments and result as :func:`build_update_passes` (``method.advantage`` unused), with ``advantages_BT`` [B, T]
    (0 outside the mask, no gradient) in place of the scores."""
    mask_BT = response_mask_BT.bool()
    check.shape("advantages_BT", advantages_BT, tuple(mask_BT.shape))
    check.shape("old_logp_BT", old_logp_BT, tuple(mask_BT.shape))
    metrics = _masked_stats(advantages_BT, mask_BT, "adv")
    if method.nthr is not None:
        if nthr_inputs is None:
            raise ValueError(f"nthr_inputs: required by method {method.name!r} (NTHR needs hidden states)")
        if group_ids_B is None:
            raise ValueError(f"group_ids_B: required by method {method.name!r} (NTHR compares within groups)")
        weights_BT, nthr_metrics = nthr_token_weights(
            advantages_BT,
            mask_BT,
            group_ids_B,
            nthr_inputs.tokens_BT,
            old_logp_BT,
            nthr_inputs.hidden_BTD,
            nthr_inputs.unembed_VD,
            method.nthr,
            temperature=nthr_inputs.temperature,
            unembed_bias_V=nthr_inputs.unembed_bias_V,
            correct_B=nthr_inputs.correct_B,
        )
        advantages_BT = advantages_BT * weights_BT.to(advantages_BT.dtype)
        metrics.update(nthr_metrics)
    if method.ar is not None:
        if method.ar.prob_source == "old":
            advantages_BT = advantage_reweight(advantages_BT, old_logp_BT, mask_BT, method.ar)
        else:  # current_detached: pass_loss applies alpha * pi + tau; the sign factor goes here
            advantages_BT = scale_negative_advantages(advantages_BT, mask_BT, method.ar.neg_adv_weight)
    rule = method.token_rule
    split_BT = None
    if rule is not None and rule.stage == "passes":
        inputs = rule.inputs(old_logp_BT, advantages_BT, mask_BT, group_ids_B=group_ids_B, correct_B=correct_B)
        if rule.output == "split":
            split_BT = rule(inputs)
            metrics["token_rule/first_frac"] = float(split_BT.sum().item()) / max(float(mask_BT.sum().item()), 1.0)
        else:
            weights_BT = rule(inputs)
            advantages_BT = advantages_BT * weights_BT
            metrics.update(weight_metrics(weights_BT, mask_BT))
    metrics.update(_masked_stats(advantages_BT, mask_BT, "adv_weighted"))

    if method.lopti is not None:
        passes, lopti_metrics = lopti_passes(advantages_BT, old_logp_BT, mask_BT, method.lopti)
        metrics.update(lopti_metrics)
    elif method.random_split is not None:
        passes, split_metrics = random_split_passes(advantages_BT, old_logp_BT, mask_BT, method.random_split)
        metrics.update(split_metrics)
    elif split_BT is not None and rule is not None:
        passes = split_passes(advantages_BT, mask_BT, split_BT, rule.pass_names)
    else:
        passes = single_pass(advantages_BT, mask_BT)
    return passes, metrics
