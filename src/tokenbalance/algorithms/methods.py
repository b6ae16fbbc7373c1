"""Methods: a named composition of the stages, and the presets that cite their sources.

A :class:`Method` is a frozen bundle of small hyper-parameter objects:

    advantage estimator -> [NTHR weights] -> [AR weights] -> [token rule, stage "passes"]
    -> update passes (single, Lopti or the rule's split)
    -> per pass: clipped surrogate [x TR-GRPO weights] [x token rule, stage "loss"] + KL + entropy
    -> aggregation

A token rule is your own stage (:mod:`~tokenbalance.algorithms.token_rules`): registered under a
name, it is a method (:func:`get_method`), also by ``MODULE:RULE`` / ``FILE.py:RULE``, which imports
your module first.

:func:`build_update_passes` runs the first four stages once per RL step (they depend only on the
rollout); :func:`tokenbalance.algorithms.loss.pass_loss` runs the last ones per micro-batch.

Every preset shares the GRPO base of the AR-Lopti K&K scripts (docs/methods.md §7) so that
methods differ only in their token-level stage, and cites the paper section for each of its own
hyper-parameters. ``tokenbalance list-methods`` prints them.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field

import torch

from tokenbalance.algorithms._checks import check_choice, check_range, check_shape
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
    SINGLE_PASS_NAME,
    LoptiConfig,
    lopti_pass_names,
    lopti_passes,
    single_pass,
    split_passes,
)
from tokenbalance.algorithms.registry import Registry, did_you_mean
from tokenbalance.algorithms.surrogate import KL_ESTIMATORS, ClipConfig, kl_penalty
from tokenbalance.algorithms.token_rules import TOKEN_RULES, TokenRule, rule_of, weight_metrics
from tokenbalance.algorithms.weights import ARConfig, TRGRPOConfig, advantage_reweight, scale_negative_advantages
from tokenbalance.checks import check_type
from tokenbalance.types import UpdatePass
from tokenbalance.user_code import is_spec, load_function, normalized_spec

KL_PLACEMENTS = ("loss", "reward", "none")


@dataclass(frozen=True)
class AdvantageConfig:
    """Advantage estimator and its options.

    Attributes:
        estimator: ``grpo``, ``dr_grpo`` (mean-only), ``rloo`` or ``reinforce_pp``.
        eps: GRPO's std epsilon (1e-6, reference).
        gamma: REINFORCE++ discount (1.0, reference).
        singleton: what a group of size 1 gets: ``"reference"`` (A = s) or ``"zero"``.
    """

    estimator: str = "grpo"
    eps: float = 1e-6
    gamma: float = 1.0
    singleton: str = "reference"

    def __post_init__(self) -> None:
        check_choice("advantage.estimator", self.estimator, ADVANTAGE_ESTIMATOR_NAMES)
        check_range("advantage.eps", self.eps, 0.0, float("inf"))
        check_range("advantage.gamma", self.gamma, 0.0, 1.0)
        check_choice("advantage.singleton", self.singleton, SINGLETON_RULES)


@dataclass(frozen=True)
class KLConfig:
    """Where the KL to the reference policy enters, and how it is estimated.

    Attributes:
        coef: coefficient (K&K reference 0.001).
        estimator: ``k1``/``kl``, ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl`` (+ ``k1+``/``k3+``
            straight-through). K&K reference: k3.
        log_ratio_clamp: k3's inner clamp C (5 in the AR-Lopti reference, 20 upstream verl).
        placement: ``"loss"`` (a KL loss term, the K&K scripts), ``"reward"`` (subtract
            coef * KL(old, ref) from the token rewards before the advantage, verl's
            ``apply_kl_penalty``) or ``"none"``.
    """

    coef: float = 0.001
    estimator: str = "k3"
    log_ratio_clamp: float = 5.0
    placement: str = "loss"

    def __post_init__(self) -> None:
        check_range("kl.coef", self.coef, 0.0, float("inf"))
        check_choice("kl.estimator", self.estimator, KL_ESTIMATORS)
        check_range("kl.log_ratio_clamp", self.log_ratio_clamp, 0.0, float("inf"), low_open=True)
        check_choice("kl.placement", self.placement, KL_PLACEMENTS)

    @property
    def active(self) -> bool:
        return self.placement != "none" and self.coef > 0


@dataclass(frozen=True)
class Method:
    """A complete RL objective: estimator, token weights, update schedule and loss.

    Attributes:
        name: preset or user label.
        advantage, clip, kl: the stage configurations.
        entropy_coeff: entropy bonus coefficient (0.0 in the reference: logged only).
        loss_agg_mode: aggregation of the KL and entropy terms (and of the policy term unless
            ``policy_loss_agg_mode`` is set).
        policy_loss_agg_mode: aggregation of the policy term; ``None`` = ``loss_agg_mode``.
            The AR-Lopti reference always uses ``"token-mean"`` here, whatever its config says.
        max_response_len: the constant C of ``seq-mean-token-sum-norm`` (None = padded length).
        ar, tr_grpo, nthr, lopti: the token-level stages; ``None`` switches a stage off.
        token_rule: your own token-level stage (:class:`~tokenbalance.algorithms.token_rules.TokenRule`,
            docs/methods.md §10); ``None`` (the presets) runs none of it.
        dynamic_sampling: DAPO dynamic sampling (:mod:`~tokenbalance.algorithms.filtering`), a
            rollout-loop option the runner reads; off by default.
        recommended_temperature: the sampling temperature the preset's paper used. A rollout
            setting, not part of the objective: nothing here applies it; runners and users set
            their rollout temperature from it (``list-methods`` prints it). ``None``: no advice.
        description: one line for ``list-methods``.
        citations: (hyper-parameter, source) pairs.
    """

    name: str = "custom"
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    clip: ClipConfig = field(default_factory=ClipConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    entropy_coeff: float = 0.0
    loss_agg_mode: str = "token-mean"
    policy_loss_agg_mode: str | None = None
    max_response_len: int | None = None
    ar: ARConfig | None = None
    tr_grpo: TRGRPOConfig | None = None
    nthr: NTHRConfig | None = None
    lopti: LoptiConfig | None = None
    token_rule: TokenRule | None = None
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    recommended_temperature: float | None = None
    description: str = ""
    citations: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check_range("entropy_coeff", self.entropy_coeff, -float("inf"), float("inf"), low_open=True, high_open=True)
        if not isinstance(self.dynamic_sampling, DynamicSamplingConfig):
            raise ValueError(
                f"dynamic_sampling: expected a DynamicSamplingConfig, got {type(self.dynamic_sampling).__name__}"
            )
        if self.recommended_temperature is not None:
            check_range("recommended_temperature", self.recommended_temperature, 0.0, float("inf"), low_open=True)
        check_choice("loss_agg_mode", self.loss_agg_mode, AGG_MODES)
        if self.policy_loss_agg_mode is not None:
            check_choice("policy_loss_agg_mode", self.policy_loss_agg_mode, AGG_MODES)
        if self.max_response_len is not None:
            check_range("max_response_len", self.max_response_len, 1, float("inf"))
        rule = self.token_rule
        if rule is not None and not isinstance(rule, TokenRule):
            raise ValueError(f"token_rule: expected a registered TokenRule, got {type(rule).__name__}")
        if rule is not None and rule.output == "split" and self.lopti is not None:
            raise ValueError(
                f"token_rule: {rule.label} splits the tokens into two passes and so does Lopti; switch one off"
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
        """The update passes of every step, in execution order (``("all",)``, Lopti's two or a token
        rule's split): a static property of the method, so runners size their schedules without running it."""
        if self.lopti is not None:
            return lopti_pass_names(self.lopti)
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
        hidden_BTD: [B, T, D] last-layer hidden states (after the final norm) at the positions
            that predict ``tokens_BT``.
        unembed_VD: [V, D] the ``lm_head`` weight.
        temperature: the log-prob temperature used for ``old_logp_BT``.
        unembed_bias_V: [V] ``lm_head`` bias, if the model has one.
        correct_B: [B] bool, which responses are correct: NTHR's anchors under
            ``nthr.positives="correct"`` (the default). Leave it None to let
            :func:`build_update_passes` derive it from its ``scores_B`` (:func:`nthr_correct`);
            :func:`passes_from_advantages` has no rewards and needs it given.
        max_reward: the task's maximum reward (K&K 3, math 1): a response is correct when its
            reward equals it, unless ``nthr.correct_threshold`` states a threshold.
    """

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
        """From the old policy's output layer ``head`` (``get_output_embeddings()``) and last-layer
        hidden states; float64 stays float64, anything else is computed in float32. Every runner
        builds them here (our trainer, ``tokenbalance diagnose``, the TRL subclass)."""
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
        method: the :class:`Method`.
        scores_B: [B] outcome rewards.
        group_ids_B: [B] int64 group (prompt instance) ids.
        response_mask_BT: [B, T] valid response tokens (EOS included).
        old_logp_BT: [B, T] rollout-policy log-probs at the log-prob temperature (no gradient).
        ref_logp_BT: [B, T] reference log-probs (needed for the KL-in-reward placement).
        nthr_inputs: hidden states etc. (needed when ``method.nthr`` is set). Without
            ``correct_B``, NTHR's correct responses are derived from ``scores_B`` and
            ``nthr_inputs.max_reward`` (or ``nthr.correct_threshold``).
        correct_B: [B] bool, which responses are correct (what a token rule that needs
            ``correct`` reads).

    Returns:
        The passes to run in order, and ``adv/*`` (before token weights), ``adv_weighted/*``,
        ``nthr/*``, ``token_rule/*`` and ``lopti/*`` metrics.
    """
    mask_BT = response_mask_BT.bool()
    check_shape("old_logp_BT", old_logp_BT, tuple(mask_BT.shape))
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
    """The token-level stages on given advantages: NTHR weights, AR weights, a token rule's
    ``passes`` stage, then the pass schedule.

    :func:`build_update_passes` calls it after our estimator; the verl and TRL integrations call
    it on the advantages their host computed.

    Args:
        method: the :class:`Method` (its ``advantage`` stage is not used here).
        advantages_BT: [B, T] advantages, 0 outside the mask (no gradient).
        response_mask_BT: [B, T] valid response tokens.
        old_logp_BT: [B, T] rollout-policy log-probs at the log-prob temperature (no gradient).
        group_ids_B: [B] int64 group ids (needed by NTHR).
        nthr_inputs: hidden states etc. (needed by NTHR; with ``correct_B`` for its default
            ``positives="correct"``).
        correct_B: [B] bool, which responses are correct (read by a token rule that needs it).

    Returns:
        The passes in order and the ``adv/*``, ``adv_weighted/*``, ``nthr/*``, ``token_rule/*``,
        ``lopti/*`` metrics.
    """
    mask_BT = response_mask_BT.bool()
    check_shape("advantages_BT", advantages_BT, tuple(mask_BT.shape))
    check_shape("old_logp_BT", old_logp_BT, tuple(mask_BT.shape))
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
    elif split_BT is not None and rule is not None:
        passes = split_passes(advantages_BT, mask_BT, split_BT, rule.pass_names)
    else:
        passes = single_pass(advantages_BT, mask_BT)
    return passes, metrics


# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------

_AR_LOPTI = "Yang et al. 2025, arXiv 2505.12929"
_BASE_CITATIONS = (
    ("clip.eps_low=0.20, eps_high=0.24, dual_clip_c=10", f"{_AR_LOPTI}, K&K scripts (docs/methods.md §7)"),
    ("kl: k3, coef 0.001, inner clamp 5, as a loss", f"{_AR_LOPTI}, K&K scripts (docs/methods.md §7)"),
    ("loss_agg_mode=token-mean, entropy_coeff=0", f"{_AR_LOPTI}, K&K scripts (docs/methods.md §2.7, §2.6)"),
    ("clip.log_ratio_clamp=20", "upstream verl safety clamp; absent in the AR-Lopti fork (docs/methods.md §2.4)"),
)


def _base(name: str, estimator: str, description: str, citations=(), **stages) -> Method:
    advantage_source = (
        (
            "advantage=grpo, eps=1e-6, unbiased std",
            "DeepSeekMath arXiv 2402.03300; verl reference (docs/methods.md §2.2)",
        )
        if estimator == "grpo"
        else (
            "advantage=reinforce_pp, gamma=1, batch whitening",
            "Hu, arXiv 2501.03262; verl reference (docs/methods.md §2.3)",
        )
    )
    return Method(
        name=name,
        advantage=AdvantageConfig(estimator=estimator),
        clip=ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=10.0),
        kl=KLConfig(coef=0.001, estimator="k3", log_ratio_clamp=5.0, placement="loss"),
        description=description,
        citations=(advantage_source, *citations, *_BASE_CITATIONS),
        **stages,
    )


METHOD_PRESETS: Registry = Registry("method")


def _add(method: Method) -> None:
    METHOD_PRESETS.add(method.name, method)


def _token_level_presets(prefix: str, estimator: str, alpha: float, alpha_source: str) -> None:
    base_name = "GRPO" if estimator == "grpo" else "REINFORCE++"
    ar_cite = (f"ar.alpha={alpha}", alpha_source)
    eta_cite = ("lopti.eta=0.5", f"{_AR_LOPTI}, Figure 4 / Tables 1, 7 (the Lopti-only script uses 0.4)")
    _add(_base(f"{prefix}ar", estimator, f"{base_name} + Advantage Reweighting", (ar_cite,), ar=ARConfig(alpha=alpha)))
    _add(
        _base(
            f"{prefix}lopti",
            estimator,
            f"{base_name} + Low-Probability Token Isolation",
            (eta_cite,),
            lopti=LoptiConfig(eta=0.5),
        )
    )
    _add(
        _base(
            f"{prefix}ar_lopti",
            estimator,
            f"{base_name} + Advantage Reweighting + Lopti",
            (ar_cite, eta_cite),
            ar=ARConfig(alpha=alpha),
            lopti=LoptiConfig(eta=0.5),
        )
    )
    _add(
        _base(
            f"{prefix}tr_grpo",
            estimator,
            f"{base_name} + a TR-GRPO-like probability weight (loss multiplier); UNVERIFIED: the weight "
            "shape and constants come from no primary source (no paper text or code was reachable)",
            (
                (
                    "tr_grpo: sigmoid_shift, alpha 2, tau 9, mu 0.25, L 1, U 1.4",
                    "arXiv 2511.00066 via third-party constants, UNVERIFIED (docs/methods.md §5)",
                ),
            ),
            tr_grpo=TRGRPOConfig(),
        )
    )
    _add(
        _base(
            f"{prefix}nthr",
            estimator,
            f"{base_name} + Negative Token Hidden Reward",
            (("nthr.beta=1, eta=2|0.5-p|", "Deng et al. 2025, arXiv 2505.18830, §7.3 (docs/methods.md §6)"),),
            nthr=NTHRConfig(beta=1.0, eta="2|0.5-p|"),
        )
    )


_add(_base("grpo", "grpo", "GRPO baseline (AR-Lopti K&K settings)"))
_add(_base("reinforce_pp", "reinforce_pp", "REINFORCE++ baseline (KL as a loss, as the released scripts)"))
_token_level_presets("", "grpo", 0.3, f"{_AR_LOPTI}, Figure 4 caption (the AR-only script uses 0.2)")
_add(
    _base(
        "tr_grpo_literal",
        "grpo",
        "GRPO + a TR-GRPO-like weight placed as the reviews describe the paper (w*r inside the clip, "
        "weighted KL); UNVERIFIED: the weight shape and constants come from no primary source",
        (
            (
                "tr_grpo: ratio_in_clip + weight_kl",
                "arXiv 2511.00066 Eq. 9 as described by OpenReview reviewer 4 (docs/methods.md §5)",
            ),
            (
                "tr_grpo: sigmoid_shift, alpha 2, tau 9, mu 0.25, L 1, U 1.4",
                "third-party constants, UNVERIFIED (docs/methods.md §5)",
            ),
        ),
        tr_grpo=TRGRPOConfig(placement="ratio_in_clip", weight_kl=True),
    )
)
_token_level_presets("reinforce_pp_", "reinforce_pp", 0.1, f"{_AR_LOPTI}, Table 7 (REINFORCE++)")


# ---------------------------------------------------------------------------------------------
# Paper-faithful presets: <paper>_<task>_<table>_<method>, one per row of a published table
# (docs/methods.md §3 and §6). The presets above share one base; these follow each paper's runs.
# ---------------------------------------------------------------------------------------------

_KK_TEMPERATURE = ("recommended_temperature=0.7 (rollout)", f"{_AR_LOPTI}, K&K scripts train_kklogic_*.sh")
_LOPTI_ETA = (
    "lopti.eta=0.5",
    f"{_AR_LOPTI}, Figure 4 / Tables 1, 7 (the Lopti-only K&K script uses 0.4)",
)


def _ar_lopti_paper(name: str, estimator: str, what: str, where: str, alpha: float | None, lopti: bool, extra=()):
    """One row of an AR-Lopti table: the K&K-script base, AR with ``alpha`` and / or Lopti eta 0.5."""
    citations = list(extra)
    stages: dict[str, ARConfig | LoptiConfig] = {}
    if alpha is not None:
        citations.append((f"ar.alpha={alpha}", f"{_AR_LOPTI}, {where}"))
        stages["ar"] = ARConfig(alpha=alpha)
    if lopti:
        citations.append(_LOPTI_ETA)
        stages["lopti"] = LoptiConfig(eta=0.5)
    return _base(name, estimator, f"AR-Lopti paper, {where}: {what}", tuple(citations), **stages)


def _ar_lopti_paper_presets() -> None:
    kk, math_base = "K&K Figure 4", "math Table 1"
    kk_extra = (_KK_TEMPERATURE,)
    math_extra = (
        (
            "base (clip, KL, aggregation) = the K&K scripts'",
            f"{_AR_LOPTI}: no math training script was released [derived]",
        ),
    )
    rows = [
        ("arlopti_kk_fig4_grpo", "grpo", "GRPO", kk, None, False, kk_extra, 0.7),
        (
            "arlopti_kk_fig4_ar",
            "grpo",
            "GRPO + Reweight (alpha 0.3; the AR-only script: 0.2)",
            kk,
            0.3,
            False,
            kk_extra,
            0.7,
        ),
        ("arlopti_kk_fig4_lopti", "grpo", "GRPO + Lopti", kk, None, True, kk_extra, 0.7),
        ("arlopti_kk_fig4_ar_lopti", "grpo", "GRPO + Reweight + Lopti", kk, 0.3, True, kk_extra, 0.7),
        ("arlopti_kk_tab7_reinforce_pp", "reinforce_pp", "REINFORCE++", "K&K Table 7", None, False, kk_extra, 0.7),
        (
            "arlopti_kk_tab7_reinforce_pp_ar_lopti",
            "reinforce_pp",
            "REINFORCE++ + Reweight + Lopti",
            "K&K Table 7",
            0.1,
            True,
            kk_extra,
            0.7,
        ),
        (
            "arlopti_math_tab1_grpo",
            "grpo",
            "GRPO (Qwen2.5-7B, DSR-Uniform / ORZ)",
            math_base,
            None,
            False,
            math_extra,
            None,
        ),
        ("arlopti_math_tab1_ar", "grpo", "GRPO + Reweight", math_base, 0.1, False, math_extra, None),
        ("arlopti_math_tab1_lopti", "grpo", "GRPO + Lopti", math_base, None, True, math_extra, None),
        ("arlopti_math_tab1_ar_lopti", "grpo", "GRPO + Reweight + Lopti", math_base, 0.1, True, math_extra, None),
    ]
    for name, estimator, what, where, alpha, lopti, extra, temperature in rows:
        method = _ar_lopti_paper(name, estimator, what, where, alpha, lopti, extra)
        _add(method.replace(recommended_temperature=temperature))


_NTHR_PAPER = "Deng et al. 2025, arXiv 2505.18830"
_NTHR_RUN_CITATIONS = (
    (
        "clip.eps_low=eps_high=0.2, kl.coef=1e-4, DAPO dynamic sampling on, 8 rollouts, temperature 1.0",
        f"{_NTHR_PAPER}, training details, common to all runs",
    ),
    (
        "clip.dual_clip_c=3, kl: k3 as a loss with clamp 20, token-mean, entropy 0",
        "not stated by the paper: verl's defaults (clip_ratio_c, low_var_kl) and DAPO's token-mean [derived]",
    ),
    (
        "dynamic_sampling: reward metric, target = prompts per step, 9 extra rounds",
        "DAPO arXiv 2503.14476 §3.2; verl's DAPO recipes, max_num_gen_batches=10 (docs/methods.md §9)",
    ),
)


def _nthr_paper(name: str, description: str, citations, temperature: float, **stages) -> Method:
    """A run of the NTHR paper: clip 0.2, k3 KL 1e-4, dynamic sampling on (docs/methods.md §6)."""
    return Method(
        name=name,
        advantage=AdvantageConfig(estimator="grpo"),
        clip=ClipConfig(eps_low=0.2, eps_high=0.2, dual_clip_c=3.0),
        kl=KLConfig(coef=1e-4, estimator="k3", log_ratio_clamp=20.0, placement="loss"),
        dynamic_sampling=DynamicSamplingConfig(enabled=True),
        recommended_temperature=temperature,
        description=f"NTHR paper, {description}",
        citations=(
            ("advantage=grpo, eps=1e-6", "DeepSeekMath arXiv 2402.03300 (docs/methods.md §2.2)"),
            *citations,
            *_NTHR_RUN_CITATIONS,
        ),
        **stages,
    )


def _nthr_paper_presets() -> None:
    main_nthr = ("nthr.beta=1, eta=2|0.5-p|, positives=correct", f"{_NTHR_PAPER}, §7.3 (docs/methods.md §6)")
    r1_nthr = ("nthr.beta=0, eta=2|0.5-p|", f"{_NTHR_PAPER}, appendix, DeepSeek-R1-Distill-Qwen-1.5B run")
    r1_temperature = (
        "recommended_temperature=0.6 (rollout)",
        f"{_NTHR_PAPER}, appendix, R1-distill run; UNVERIFIED here (the common training details say 1.0)",
    )
    _add(_nthr_paper("nthr_math_tab2_grpo", "math Table 2: GRPO (MATH / DeepScaleR)", (), 1.0))
    _add(
        _nthr_paper(
            "nthr_math_tab2_nthr",
            "math Table 2: GRPO + NTHR (MATH / DeepScaleR)",
            (main_nthr,),
            1.0,
            nthr=NTHRConfig(beta=1.0, eta="2|0.5-p|"),
        )
    )
    _add(_nthr_paper("nthr_r1distill_tab7_grpo", "DeepSeek-R1-Distill-Qwen-1.5B Table 7: GRPO", (r1_temperature,), 0.6))
    _add(
        _nthr_paper(
            "nthr_r1distill_tab7_nthr",
            "DeepSeek-R1-Distill-Qwen-1.5B Table 7: GRPO + NTHR (beta 0)",
            (r1_nthr, r1_temperature),
            0.6,
            nthr=NTHRConfig(beta=0.0, eta="2|0.5-p|"),
        )
    )


_ar_lopti_paper_presets()
_nthr_paper_presets()


RULE_EXAMPLE = "mypkg.rules:high_entropy"


def load_token_rule(name: str, setting: str = "method") -> TokenRule:
    """The token rule registered as ``name``, or named by ``MODULE:RULE`` / ``FILE.py:RULE`` (the
    module is imported first, which registers it; the rule then carries that spec, a ``FILE.py``
    made absolute, so that other processes import it too). One ``ValueError`` line naming
    ``setting`` otherwise."""
    if is_spec(name):
        rule = rule_of(load_function(name, setting, RULE_EXAMPLE), f"{setting}={name!r}")
        return dataclasses.replace(rule, spec=normalized_spec(name, setting, RULE_EXAMPLE))
    if name not in TOKEN_RULES:
        registered = TOKEN_RULES.names()
        known = (
            f"registered in this process: {', '.join(sorted(registered))}{did_you_mean(name, registered)}"
            if registered
            else "none is registered in this process"
        )
        raise ValueError(
            f"{setting}={name!r}: no token rule of that name ({known}); name it by its file or module, "
            f"FILE.py:RULE or MODULE:RULE (e.g. {RULE_EXAMPLE}), which imports and registers it (docs/methods.md §10)"
        )
    return TOKEN_RULES.get(name)


def rule_method(rule: TokenRule) -> Method:
    """The method of a token rule: the ``grpo`` preset with the rule, named after it (change the
    rest with :func:`apply_method_overrides`, e.g. ``{"ar.alpha": 0.3}``)."""
    if rule.name in METHOD_PRESETS:
        raise ValueError(f"token rule {rule.label}: {rule.name!r} is a method preset's name; choose another name")
    doc = (inspect.getdoc(rule.function) or "").strip().splitlines()
    base = get_method("grpo")
    return base.replace(
        name=rule.name,
        token_rule=rule,
        description=f"GRPO + token rule {rule.name}: {doc[0] if doc else rule.label}",
        citations=(("token_rule", rule.spec or rule.label), *base.citations),
    )


def get_method(name: str, setting: str = "method") -> Method:
    """The preset called ``name``; or the method of a token rule (:func:`rule_method`) registered
    as ``name`` or named ``MODULE:RULE`` / ``FILE.py:RULE``. ValueError listing the valid names
    (or naming ``setting`` and what failed to load) otherwise."""
    if isinstance(name, str) and name not in METHOD_PRESETS and (is_spec(name) or name in TOKEN_RULES):
        return rule_method(load_token_rule(name, setting))
    return METHOD_PRESETS.get(name)


def _stage_summary(method: Method) -> list[str]:
    lines = [
        f"advantage: {method.advantage.estimator} (eps={method.advantage.eps}, gamma={method.advantage.gamma})",
        f"clip: eps_low={method.clip.eps_low}, eps_high={method.clip.eps_high}, "
        f"dual_clip_c={method.clip.dual_clip_c}, importance_sampling={method.clip.importance_sampling}",
        f"kl: {method.kl.estimator} x {method.kl.coef} as {method.kl.placement} (clamp {method.kl.log_ratio_clamp})",
        f"aggregation: {method.loss_agg_mode} (policy: {method.policy_agg_mode}), entropy_coeff={method.entropy_coeff}",
    ]
    for stage in ("ar", "tr_grpo", "nthr", "lopti"):
        config = getattr(method, stage)
        if config is not None:
            values = ", ".join(f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config))
            lines.append(f"{stage}: {values}")
    rule = method.token_rule
    if rule is not None:
        needs = f", needs {', '.join(rule.needs)}" if rule.needs else ""
        lines.append(f"token_rule: {rule.label}, stage {rule.stage}, output {rule.output}{needs}")
    sampling = method.dynamic_sampling
    if sampling.enabled:
        values = ", ".join(f"{f.name}={getattr(sampling, f.name)!r}" for f in dataclasses.fields(sampling))
        lines.append(f"dynamic_sampling: {values}")
    else:
        lines.append("dynamic_sampling: off")
    if method.recommended_temperature is not None:
        lines.append(f"recommended rollout temperature: {method.recommended_temperature} (a rollout setting)")
    return lines


def describe_presets(name: str | None = None) -> str:
    """Human-readable listing of one method or all of them (used by ``tokenbalance list-methods``):
    the presets, then the token rules registered in this process; ``name`` may be ``MODULE:RULE``."""
    methods = [get_method(name)] if name else [get_method(n) for n in METHOD_PRESETS.names()]
    if not name:
        methods += [rule_method(TOKEN_RULES.get(n)) for n in TOKEN_RULES.names() if n not in METHOD_PRESETS]
    blocks = []
    for method in methods:
        lines = [f"{method.name}: {method.description}"]
        lines += [f"    {line}" for line in _stage_summary(method)]
        lines += [f"    source: {what}: {where}" for what, where in method.citations]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


_STAGE_TYPES = {"ar": ARConfig, "tr_grpo": TRGRPOConfig, "nthr": NTHRConfig, "lopti": LoptiConfig}
_NESTED_TYPES = {
    "advantage": AdvantageConfig,
    "clip": ClipConfig,
    "kl": KLConfig,
    "dynamic_sampling": DynamicSamplingConfig,
    **_STAGE_TYPES,
}
METHOD_NESTED_TYPES = _NESTED_TYPES  # the Method fields that are sections of hyper-parameters


def apply_method_overrides(method: Method, overrides: dict) -> Method:
    """A copy of ``method`` with dotted overrides applied, e.g. ``{"lopti.eta": 0.4, "ar": None}``.

    ``"stage": None`` switches a token-level stage off; setting a field of a stage that is off
    switches it on with its defaults first (``{"ar.alpha": 0.2}`` on ``grpo`` gives GRPO + AR);
    ``{"dynamic_sampling.enabled": True}`` turns DAPO dynamic sampling on; ``{"token_rule":
    "rules.py:high_entropy"}`` adds a token rule (:func:`load_token_rule`) to any method.
    Unknown names raise ``ValueError`` listing the valid ones.
    """
    top_level = {f.name for f in dataclasses.fields(Method)}
    for key, value in (overrides or {}).items():
        section, _, name = str(key).partition(".")
        if not name:
            if section not in top_level:
                hint = did_you_mean(section, top_level)
                raise ValueError(f"method.{key}: unknown field; valid: {', '.join(sorted(top_level))}{hint}")
            if section in _NESTED_TYPES and isinstance(value, dict):
                value = _NESTED_TYPES[section](**value)
            if section == "token_rule" and isinstance(value, str):  # a rule's name or MODULE:RULE
                value = load_token_rule(value, f"method.{key}")
            method = dataclasses.replace(method, **{section: value})
            check_type(f"method.{key}", value, typing.get_type_hints(Method)[section])
            continue
        if section not in _NESTED_TYPES:
            hint = did_you_mean(section, _NESTED_TYPES)
            raise ValueError(f"method.{key}: unknown section {section!r}; valid: {', '.join(_NESTED_TYPES)}{hint}")
        current = getattr(method, section) or _NESTED_TYPES[section]()
        fields = {f.name for f in dataclasses.fields(current)}
        if name not in fields:
            hint = did_you_mean(name, fields)
            raise ValueError(f"method.{key}: unknown field {name!r}; valid: {', '.join(sorted(fields))}{hint}")
        method = dataclasses.replace(method, **{section: dataclasses.replace(current, **{name: value})})
        check_type(f"method.{key}", value, typing.get_type_hints(type(current))[name])  # after the range checks
    return method
