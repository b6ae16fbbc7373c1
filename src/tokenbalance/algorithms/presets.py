"""The method presets, one row each citing its source, and the one way every runner gets a Method.

:func:`resolve_method` turns a preset name (or a token rule, ``MODULE:RULE`` / ``FILE.py:RULE``) and dotted overrides
(``{"lopti.eta": 0.4}``) into a :class:`~.methods.Method` for every runner. Base presets share the AR-Lopti K&K GRPO
base and differ only in their token-level stage; paper rows follow each paper (docs/methods.md §3, §6, §7)."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Mapping
from typing import Any

from tokenbalance.algorithms.filtering import DynamicSamplingConfig
from tokenbalance.algorithms.methods import AdvantageConfig, KLConfig, Method
from tokenbalance.algorithms.nthr import NTHRConfig
from tokenbalance.algorithms.passes import LoptiConfig, RandomSplitConfig
from tokenbalance.algorithms.registry import Registry, did_you_mean
from tokenbalance.algorithms.surrogate import ClipConfig
from tokenbalance.algorithms.token_rules import TOKEN_RULES, TokenRule, rule_of
from tokenbalance.algorithms.weights import ARConfig, TRGRPOConfig
from tokenbalance.checks import check_type
from tokenbalance.user_code import is_spec, load_function, normalized_spec

# --------------------------------------------------------------------------------------------- Sources
# ---------------------------------------------------------------------------------------------

_AR_LOPTI = "Yang et al. 2025, arXiv 2505.12929"
_NTHR_PAPER = "Deng et al. 2025, arXiv 2505.18830"
_KK_SCRIPTS = f"{_AR_LOPTI}, K&K scripts (docs/methods.md §7)"
_BASE_CITATIONS = (
    ("clip.eps_low=0.20, eps_high=0.24, dual_clip_c=10", _KK_SCRIPTS),
    ("kl: k3, coef 0.001, inner clamp 5, as a loss", _KK_SCRIPTS),
    ("loss_agg_mode=token-mean, entropy_coeff=0", f"{_AR_LOPTI}, K&K scripts (docs/methods.md §2.7, §2.6)"),
    ("clip.log_ratio_clamp=20", "upstream verl safety clamp; absent in the AR-Lopti fork (docs/methods.md §2.4)"),
)
_ESTIMATOR_CITATIONS = {
    "grpo": (
        "advantage=grpo, eps=1e-6, unbiased std",
        "DeepSeekMath arXiv 2402.03300; verl reference (docs/methods.md §2.2)",
    ),
    "reinforce_pp": (
        "advantage=reinforce_pp, gamma=1, batch whitening",
        "Hu, arXiv 2501.03262; verl reference (docs/methods.md §2.3)",
    ),
}
_GRPO_AR = ("ar.alpha=0.3", f"{_AR_LOPTI}, Figure 4 caption (the AR-only script uses 0.2)")
_RPP_AR = ("ar.alpha=0.1", f"{_AR_LOPTI}, Table 7 (REINFORCE++)")
_ETA = ("lopti.eta=0.5", f"{_AR_LOPTI}, Figure 4 / Tables 1, 7 (the Lopti-only script uses 0.4)")
_PAPER_ETA = ("lopti.eta=0.5", f"{_AR_LOPTI}, Figure 4 / Tables 1, 7 (the Lopti-only K&K script uses 0.4)")
_TR_GRPO_CONSTANTS = "tr_grpo: sigmoid_shift, alpha 2, tau 9, mu 0.25, L 1, U 1.4"
_TR_GRPO = (_TR_GRPO_CONSTANTS, "arXiv 2511.00066 via third-party constants, UNVERIFIED (docs/methods.md §5)")
_TR_GRPO_LITERAL = (
    (
        "tr_grpo: ratio_in_clip + weight_kl",
        "arXiv 2511.00066 Eq. 9 as described by OpenReview reviewer 4 (docs/methods.md §5)",
    ),
    (_TR_GRPO_CONSTANTS, "third-party constants, UNVERIFIED (docs/methods.md §5)"),
)
_TR_GRPO_WHAT = (
    " + a TR-GRPO-like probability weight (loss multiplier); UNVERIFIED: the weight shape and constants come "
    "from no primary source (of the paper's text only its abstracts were readable, and no code)"
)
_NTHR = ("nthr.beta=1, eta=2|0.5-p|", f"{_NTHR_PAPER}, §7.3 (docs/methods.md §6)")
_TWO_STEP = (
    "random_split.fraction=0.5",
    "not a paper's method: the step-count control for Lopti's second optimizer step (docs/methods.md §4.1)",
)
_TWO_STEP_WHAT = ", two optimizer steps per batch over randomly halved tokens (the step-count control of Lopti)"
_KK_TEMPERATURE = ("recommended_temperature=0.7 (rollout)", f"{_AR_LOPTI}, K&K scripts train_kklogic_*.sh")
_MATH_BASE = (
    "base (clip, KL, aggregation) = the K&K scripts'",
    f"{_AR_LOPTI}: no math training script was released [derived]",
)
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
_NTHR_MAIN = ("nthr.beta=1, eta=2|0.5-p|, positives=correct", f"{_NTHR_PAPER}, §7.3 (docs/methods.md §6)")
_NTHR_R1 = ("nthr.beta=0, eta=2|0.5-p|", f"{_NTHR_PAPER}, appendix, DeepSeek-R1-Distill-Qwen-1.5B run")
_R1_TEMPERATURE = (
    "recommended_temperature=0.6 (rollout)",
    f"{_NTHR_PAPER}, appendix, R1-distill run; UNVERIFIED here (the common training details say 1.0)",
)

# --------------------------------------------------------------------------------------------- Row builders: the two
# bases the rows share ---------------------------------------------------------------------------------------------


def kk(name: str, estimator: str, description: str, citations=(), temperature: float | None = None, **stages) -> Method:
    """A row on the AR-Lopti K&K-script base: clip 0.2 / 0.24, dual clip 10, k3 KL 0.001 (clamp 5) as a loss,
    token-mean; its own token-level ``stages``."""
    return Method(
        name=name,
        advantage=AdvantageConfig(estimator=estimator),
        clip=ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=10.0),
        kl=KLConfig(coef=0.001, estimator="k3", log_ratio_clamp=5.0, placement="loss"),
        recommended_temperature=temperature,
        description=description,
        citations=(_ESTIMATOR_CITATIONS[estimator], *citations, *_BASE_CITATIONS),
        **stages,
    )


def arlopti(name: str, estimator: str, what: str, where: str, alpha: float | None, lopti: bool, extra, temperature):
    """A row of an AR-Lopti table: the K&K-script base, AR with ``alpha`` and / or Lopti eta 0.5."""
    citations = list(extra)
    stages: dict[str, ARConfig | LoptiConfig] = {}
    if alpha is not None:
        citations.append((f"ar.alpha={alpha}", f"{_AR_LOPTI}, {where}"))
        stages["ar"] = ARConfig(alpha=alpha)
    if lopti:
        citations.append(_PAPER_ETA)
        stages["lopti"] = LoptiConfig(eta=0.5)
    return kk(name, estimator, f"AR-Lopti paper, {where}: {what}", tuple(citations), temperature, **stages)


def nthr_run(name: str, description: str, citations, temperature: float, **stages) -> Method:
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


# --------------------------------------------------------------------------------------------- The table
# (list-methods prints it in this order)
# ---------------------------------------------------------------------------------------------

_AR3, _AR1, _ETA5 = ARConfig(alpha=0.3), ARConfig(alpha=0.1), LoptiConfig(eta=0.5)
_NTHR_CONFIG = NTHRConfig(beta=1.0, eta="2|0.5-p|")
_KK, _TAB7, _MATH = "K&K Figure 4", "K&K Table 7", "math Table 1"
_KK_EXTRA, _MATH_EXTRA = (_KK_TEMPERATURE,), (_MATH_BASE,)
_G, _R = "GRPO", "REINFORCE++"

PRESET_ROWS: tuple[Method, ...] = (
    # the shared K&K base: GRPO / REINFORCE++ and each token-level stage on it
    kk("grpo", "grpo", "GRPO baseline (AR-Lopti K&K settings)"),
    kk("reinforce_pp", "reinforce_pp", "REINFORCE++ baseline (KL as a loss, as the released scripts)"),
    kk("ar", "grpo", f"{_G} + Advantage Reweighting", (_GRPO_AR,), ar=_AR3),
    kk("lopti", "grpo", f"{_G} + Low-Probability Token Isolation", (_ETA,), lopti=_ETA5),
    kk("ar_lopti", "grpo", f"{_G} + Advantage Reweighting + Lopti", (_GRPO_AR, _ETA), ar=_AR3, lopti=_ETA5),
    kk("grpo_two_step", "grpo", _G + _TWO_STEP_WHAT, (_TWO_STEP,), random_split=RandomSplitConfig()),
    kk("tr_grpo", "grpo", _G + _TR_GRPO_WHAT, (_TR_GRPO,), tr_grpo=TRGRPOConfig()),
    kk("nthr", "grpo", f"{_G} + Negative Token Hidden Reward", (_NTHR,), nthr=_NTHR_CONFIG),
    kk(
        "tr_grpo_literal",
        "grpo",
        "GRPO + a TR-GRPO-like weight placed as the reviews describe the paper (w*r inside the clip, "
        "weighted KL); UNVERIFIED: the weight shape and constants come from no primary source",
        _TR_GRPO_LITERAL,
        tr_grpo=TRGRPOConfig(placement="ratio_in_clip", weight_kl=True),
    ),
    kk("reinforce_pp_ar", "reinforce_pp", f"{_R} + Advantage Reweighting", (_RPP_AR,), ar=_AR1),
    kk("reinforce_pp_lopti", "reinforce_pp", f"{_R} + Low-Probability Token Isolation", (_ETA,), lopti=_ETA5),
    kk(
        "reinforce_pp_ar_lopti",
        "reinforce_pp",
        f"{_R} + Advantage Reweighting + Lopti",
        (_RPP_AR, _ETA),
        ar=_AR1,
        lopti=_ETA5,
    ),
    kk("reinforce_pp_tr_grpo", "reinforce_pp", _R + _TR_GRPO_WHAT, (_TR_GRPO,), tr_grpo=TRGRPOConfig()),
    kk("reinforce_pp_nthr", "reinforce_pp", f"{_R} + Negative Token Hidden Reward", (_NTHR,), nthr=_NTHR_CONFIG),
    # the AR-Lopti paper's tables, row by row: name, estimator, what, where, AR alpha, Lopti, sources, temperature
    arlopti("arlopti_kk_fig4_grpo", "grpo", "GRPO", _KK, None, False, _KK_EXTRA, 0.7),
    arlopti(
        "arlopti_kk_fig4_ar",
        "grpo",
        "GRPO + Reweight (alpha 0.3; the AR-only script: 0.2)",
        _KK,
        0.3,
        False,
        _KK_EXTRA,
        0.7,
    ),
    arlopti("arlopti_kk_fig4_lopti", "grpo", "GRPO + Lopti", _KK, None, True, _KK_EXTRA, 0.7),
    arlopti("arlopti_kk_fig4_ar_lopti", "grpo", "GRPO + Reweight + Lopti", _KK, 0.3, True, _KK_EXTRA, 0.7),
    kk(
        "arlopti_kk_fig4_grpo_two_step",
        "grpo",
        f"AR-Lopti paper, {_KK}: GRPO{_TWO_STEP_WHAT}",
        (*_KK_EXTRA, _TWO_STEP),
        0.7,
        random_split=RandomSplitConfig(),
    ),
    arlopti("arlopti_kk_tab7_reinforce_pp", "reinforce_pp", "REINFORCE++", _TAB7, None, False, _KK_EXTRA, 0.7),
    arlopti(
        "arlopti_kk_tab7_reinforce_pp_ar_lopti",
        "reinforce_pp",
        "REINFORCE++ + Reweight + Lopti",
        _TAB7,
        0.1,
        True,
        _KK_EXTRA,
        0.7,
    ),
    arlopti(
        "arlopti_math_tab1_grpo", "grpo", "GRPO (Qwen2.5-7B, DSR-Uniform / ORZ)", _MATH, None, False, _MATH_EXTRA, None
    ),
    arlopti("arlopti_math_tab1_ar", "grpo", "GRPO + Reweight", _MATH, 0.1, False, _MATH_EXTRA, None),
    arlopti("arlopti_math_tab1_lopti", "grpo", "GRPO + Lopti", _MATH, None, True, _MATH_EXTRA, None),
    arlopti("arlopti_math_tab1_ar_lopti", "grpo", "GRPO + Reweight + Lopti", _MATH, 0.1, True, _MATH_EXTRA, None),
    # the NTHR paper's runs (its own base: clip 0.2, k3 KL 1e-4, DAPO dynamic sampling)
    nthr_run("nthr_math_tab2_grpo", "math Table 2: GRPO (MATH / DeepScaleR)", (), 1.0),
    nthr_run(
        "nthr_math_tab2_nthr", "math Table 2: GRPO + NTHR (MATH / DeepScaleR)", (_NTHR_MAIN,), 1.0, nthr=_NTHR_CONFIG
    ),
    nthr_run("nthr_r1distill_tab7_grpo", "DeepSeek-R1-Distill-Qwen-1.5B Table 7: GRPO", (_R1_TEMPERATURE,), 0.6),
    nthr_run(
        "nthr_r1distill_tab7_nthr",
        "DeepSeek-R1-Distill-Qwen-1.5B Table 7: GRPO + NTHR (beta 0)",
        (_NTHR_R1, _R1_TEMPERATURE),
        0.6,
        nthr=NTHRConfig(beta=0.0, eta="2|0.5-p|"),
    ),
)

METHOD_PRESETS: Registry = Registry("method")
for _row in PRESET_ROWS:
    METHOD_PRESETS.add(_row.name, _row)

# --------------------------------------------------------------------------------------------- Names: a preset, or a
# token rule's method ---------------------------------------------------------------------------------------------

RULE_EXAMPLE = "mypkg.rules:high_entropy"


def load_token_rule(name: str, setting: str = "method") -> TokenRule:
    """The token rule registered as ``name``, or named by ``MODULE:RULE`` / ``FILE.py:RULE`` (the module is imported
    first, which registers it; the rule then carries that spec, a ``FILE.py`` made absolute, so that other processes
    import it too). One ``ValueError`` line naming ``setting`` otherwise."""
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
    """The method of a token rule: the ``grpo`` preset with the rule, named after it (change the rest with overrides,
    e.g. ``{"ar.alpha": 0.3}``)."""
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
    """The preset called ``name``; or the method of a token rule (:func:`rule_method`) registered as ``name`` or named
    ``MODULE:RULE`` / ``FILE.py:RULE``. ValueError listing the valid names (or naming ``setting`` and what failed to
    load) otherwise."""
    if isinstance(name, str) and name not in METHOD_PRESETS and (is_spec(name) or name in TOKEN_RULES):
        return rule_method(load_token_rule(name, setting))
    return METHOD_PRESETS.get(name)


# --------------------------------------------------------------------------------------------- Overrides: dotted keys
# checked against the stage fields
# ---------------------------------------------------------------------------------------------


def _section_type(annotation: Any) -> type | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate) and candidate is not TokenRule:
            return candidate
    return None


_METHOD_HINTS = typing.get_type_hints(Method)
METHOD_SECTIONS: dict[str, type] = {
    name: section for name, hint in _METHOD_HINTS.items() if (section := _section_type(hint)) is not None
}
"""The Method fields that are sections of hyper-parameters (``advantage``, ``clip``, ``ar``, ...)."""
OPTIONAL_STAGES = tuple(name for name in METHOD_SECTIONS if type(None) in typing.get_args(_METHOD_HINTS[name]))
"""The token-level stages ``None`` switches off (``ar``, ``tr_grpo``, ``nthr``, ``lopti``)."""


_TOP_LEVEL = tuple(f.name for f in dataclasses.fields(Method))


def override_type(key: str) -> Any:
    """The declared type of the Method field a dotted override ``key`` sets (``lopti.eta`` -> ``float``);
    ``ValueError`` naming the closest valid key when there is no such field."""
    section, _, name = str(key).partition(".")
    if not name:
        if section not in _TOP_LEVEL:
            hint = did_you_mean(section, _TOP_LEVEL)
            raise ValueError(f"method.{key}: unknown field; valid: {', '.join(sorted(_TOP_LEVEL))}{hint}")
        return _METHOD_HINTS[section]
    if section not in METHOD_SECTIONS:
        hint = did_you_mean(section, METHOD_SECTIONS)
        raise ValueError(f"method.{key}: unknown section {section!r}; valid: {', '.join(METHOD_SECTIONS)}{hint}")
    hints = typing.get_type_hints(METHOD_SECTIONS[section])
    if name not in hints:
        hint = did_you_mean(name, hints)
        raise ValueError(f"method.{key}: unknown field {name!r}; valid: {', '.join(sorted(hints))}{hint}")
    return hints[name]


def apply_method_overrides(method: Method, overrides: Mapping[str, Any] | None) -> Method:
    """A copy of ``method`` with dotted overrides applied in order, e.g. ``{"lopti.eta": 0.4, "ar": None}``.

    ``"stage": None`` switches a stage off; a field of a stage that is off switches it on with its defaults first
    (``{"ar.alpha": 0.2}`` on ``grpo``: GRPO + AR); ``{"token_rule": "rules.py:high_entropy"}`` adds a token rule
    (:func:`load_token_rule`). Unknown names raise ``ValueError`` naming the closest valid one."""
    for key, value in (overrides or {}).items():
        declared = override_type(key)
        section, _, name = str(key).partition(".")
        if not name:
            if section in METHOD_SECTIONS and isinstance(value, Mapping):
                value = METHOD_SECTIONS[section](**value)
            if section == "token_rule" and isinstance(value, str):  # a rule's name or MODULE:RULE
                value = load_token_rule(value, f"method.{key}")
            method = dataclasses.replace(method, **{section: value})
        else:
            current = getattr(method, section) or METHOD_SECTIONS[section]()
            method = dataclasses.replace(method, **{section: dataclasses.replace(current, **{name: value})})
        check_type(f"method.{key}", value, declared)  # after the field's own range and choice checks
    return method


def stored_override(key: str, value: Any) -> Any:
    """``value`` of the checked override ``key`` as plain YAML data (a saved config loads back equal): a stage as its
    fields, a token rule as its ``MODULE:RULE`` (``FILE.py`` made absolute) or name, a numeric string as a number."""
    declared = override_type(key)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, TokenRule):
            return value.spec or value.name
        return dataclasses.asdict(value)
    if isinstance(value, str) and key == "token_rule" and is_spec(value):
        return normalized_spec(value, "method.token_rule", RULE_EXAMPLE)
    if isinstance(value, str) and float in (declared, *typing.get_args(declared)):
        try:
            return float(value)
        except ValueError:
            return value  # the field's own check names it
    return value


def merged_overrides(overrides: Mapping[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``overrides`` with ``key`` set last (they apply in order); the earlier keys it replaces (the same key, or a
    stage's fields when the whole stage is set) are dropped."""
    key = str(key)
    kept = {k: v for k, v in overrides.items() if k != key and not str(k).startswith(f"{key}.")}
    return {**kept, key: stored_override(key, value)}


def normalized_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every override checked against its field and stored as :func:`merged_overrides` keeps it."""
    merged: dict[str, Any] = {}
    for key, value in overrides.items():
        merged = merged_overrides(merged, key, value)
    return merged


def _renamed(text: str, key: str, label: str, prefix: str) -> str:
    """An override's error with the key named as the user wrote it (``label``)."""
    for head in (f"method.{key}", key):
        if text.startswith(head) and text[len(head) : len(head) + 1] in (":", "="):
            return label + text[len(head) :]
    return prefix + text.removeprefix("method.")  # a check naming another field, e.g. "ar.tau: ..."


def resolve_method(
    method: Method | str,
    overrides: Mapping[str, Any] | None = None,
    *,
    setting: str = "method",
    key_prefix: str = "method.",
    key_names: Mapping[str, str] | None = None,
) -> Method:
    """The method a runner trains with: ``method`` (a preset, a token rule's name or spec, or a :class:`Method`) with
    the dotted ``overrides`` applied in order. A wrong name is one ``ValueError`` line naming ``setting``; a wrong
    override names its key as written: ``key_names[key]``, else ``key_prefix + key``."""
    if isinstance(method, Method):
        resolved = method
    elif isinstance(method, str):
        try:
            resolved = get_method(method, setting)
        except ValueError as err:
            message = str(err)
            raise ValueError(message if message.startswith(setting) else f"{setting}: {message}") from None
    else:
        raise ValueError(f"{setting}: expected a method preset's name or a Method, got {type(method).__name__}")
    for key, value in (overrides or {}).items():
        try:
            resolved = apply_method_overrides(resolved, {key: value})
        except (ValueError, TypeError) as err:
            label = (key_names or {}).get(key, f"{key_prefix}{key}")
            raise ValueError(_renamed(str(err), str(key), label, key_prefix)) from None
    return resolved


def as_overrides(method: Method) -> tuple[str, dict[str, Any]]:
    """``(name, overrides)`` that :func:`resolve_method` turns back into ``method``: its preset (or token rule's spec)
    and a dotted override per differing hyper-parameter (``{"lopti": {}}``: a stage on with its defaults). A method as
    text."""
    rule = method.token_rule
    if method.name in METHOD_PRESETS:
        name = method.name
    elif rule is not None and method.name == rule.name:
        name = rule.spec or rule.name
    else:
        raise ValueError(
            f"method {method.name!r}: neither a preset nor a token rule's method (tokenbalance list-methods)"
        )
    base = get_method(name)
    overrides: dict[str, Any] = {}
    for f in dataclasses.fields(Method):
        value, preset = getattr(method, f.name), getattr(base, f.name)
        if f.name in ("name", "description", "citations") or value == preset:
            continue
        if isinstance(value, TokenRule):
            overrides[f.name] = value.spec or value.name
        elif f.name in METHOD_SECTIONS and value is not None:
            start = preset if preset is not None else METHOD_SECTIONS[f.name]()
            changed = {
                f"{f.name}.{sub.name}": getattr(value, sub.name)
                for sub in dataclasses.fields(value)
                if getattr(value, sub.name) != getattr(start, sub.name)
            }
            overrides.update(changed or {f.name: {}})
        else:
            overrides[f.name] = value
    return name, overrides
