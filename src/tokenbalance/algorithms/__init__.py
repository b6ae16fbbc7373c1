"""Pure algorithm core: tensors and frozen hyper-parameter objects in, tensors and metrics out.

Imports only the standard library, numpy and torch (a test enforces it). One module per stage (docs/methods.md):
``advantages`` (§2.2-2.3), ``weights`` (AR, TR-GRPO: §3, §5), ``nthr`` (§6), ``filtering`` (DAPO dynamic sampling,
§9), ``passes`` (single pass, Lopti: §4), ``surrogate`` (clipped surrogate, KL, entropy: §2.4-2.6), ``aggregate``
(§2.7), ``loss`` (one pass on one micro-batch, §2.8), ``token_rules`` (your own token stage, §10), ``methods``
(composition, §7), ``presets`` (the preset table, and every runner's way from a name and overrides to a method)."""

from tokenbalance.algorithms.advantages import (
    dr_grpo_advantages,
    grpo_advantages,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)
from tokenbalance.algorithms.aggregate import AGG_MODES, aggregate, loss_normaliser
from tokenbalance.algorithms.filtering import DynamicSamplingConfig, informative_groups, informative_rows
from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.algorithms.methods import (
    AdvantageConfig,
    KLConfig,
    Method,
    NTHRInputs,
    build_update_passes,
    compute_advantages,
    passes_from_advantages,
)
from tokenbalance.algorithms.nthr import NTHRConfig, nthr_correct, nthr_token_weights
from tokenbalance.algorithms.passes import LoptiConfig, lopti_passes, single_pass
from tokenbalance.algorithms.presets import METHOD_PRESETS, get_method, load_token_rule, resolve_method
from tokenbalance.algorithms.surrogate import ClipConfig, clipped_surrogate, entropy_from_logits, kl_penalty
from tokenbalance.algorithms.token_rules import TOKEN_RULES, TokenInputs, TokenRule, register_token_rule
from tokenbalance.algorithms.weights import ARConfig, TRGRPOConfig, advantage_reweight, tr_grpo_token_weights

__all__ = [
    "AGG_MODES",
    "ARConfig",
    "AdvantageConfig",
    "ClipConfig",
    "DynamicSamplingConfig",
    "KLConfig",
    "LoptiConfig",
    "METHOD_PRESETS",
    "Method",
    "NTHRConfig",
    "NTHRInputs",
    "TOKEN_RULES",
    "TRGRPOConfig",
    "TokenInputs",
    "TokenRule",
    "advantage_reweight",
    "aggregate",
    "build_update_passes",
    "passes_from_advantages",
    "clipped_surrogate",
    "compute_advantages",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "get_method",
    "grpo_advantages",
    "informative_groups",
    "informative_rows",
    "kl_penalty",
    "load_token_rule",
    "loss_normaliser",
    "lopti_passes",
    "nthr_correct",
    "nthr_token_weights",
    "outcome_token_rewards",
    "pass_loss",
    "pass_normaliser",
    "register_token_rule",
    "reinforce_pp_advantages",
    "resolve_method",
    "rloo_advantages",
    "single_pass",
    "tr_grpo_token_weights",
]
