"""Methods as text: ``tokenbalance list-methods`` and the ``method.*`` lines of ``--help-config``.

Every hyper-parameter's help is its field's own ``metadata["help"]`` (declared with
:func:`~tokenbalance.algorithms._checks.param` next to its default), so the two listings and the code never disagree
(docs/methods.md)."""

from __future__ import annotations

import dataclasses

from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.presets import METHOD_PRESETS, METHOD_SECTIONS, OPTIONAL_STAGES, get_method, rule_method
from tokenbalance.algorithms.token_rules import TOKEN_RULES

HIDDEN_FIELDS = ("name", "description", "citations")  # labels, not hyper-parameters


def field_help(cls: type) -> dict[str, str]:
    """``{field: help}`` of the dataclass ``cls``, from each field's ``metadata["help"]``."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def method_options(method: Method, prefix: str = "method.") -> list[str]:
    """One line per hyper-parameter of ``method``: ``method.section.field = value  # help``; a
    stage that is off shows its defaults."""
    lines = []
    top_help = field_help(Method)
    for f in dataclasses.fields(Method):
        if f.name in HIDDEN_FIELDS:
            continue
        value = getattr(method, f.name)
        section_type = METHOD_SECTIONS.get(f.name)
        if section_type is None:
            lines.append(f"{prefix}{f.name} = {value!r}  # {top_help[f.name]}")
            continue
        state = "" if value is not None else "  [stage off; setting a field switches it on]"
        stage = value if value is not None else section_type()
        helps = field_help(section_type)
        for sub in dataclasses.fields(stage):
            lines.append(f"{prefix}{f.name}.{sub.name} = {getattr(stage, sub.name)!r}  # {helps[sub.name]}{state}")
    return lines


def _values(config) -> str:
    return ", ".join(f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config))


def stage_summary(method: Method) -> list[str]:
    """The lines ``list-methods`` prints under a method's name."""
    lines = [
        f"advantage: {method.advantage.estimator} (eps={method.advantage.eps}, gamma={method.advantage.gamma})",
        f"clip: eps_low={method.clip.eps_low}, eps_high={method.clip.eps_high}, "
        f"dual_clip_c={method.clip.dual_clip_c}, importance_sampling={method.clip.importance_sampling}",
        f"kl: {method.kl.estimator} x {method.kl.coef} as {method.kl.placement} (clamp {method.kl.log_ratio_clamp})",
        f"aggregation: {method.loss_agg_mode} (policy: {method.policy_agg_mode}), entropy_coeff={method.entropy_coeff}",
    ]
    lines += [f"{stage}: {_values(getattr(method, stage))}" for stage in OPTIONAL_STAGES if getattr(method, stage)]
    rule = method.token_rule
    if rule is not None:
        needs = f", needs {', '.join(rule.needs)}" if rule.needs else ""
        lines.append(f"token_rule: {rule.label}, stage {rule.stage}, output {rule.output}{needs}")
    sampling = method.dynamic_sampling
    lines.append(f"dynamic_sampling: {_values(sampling)}" if sampling.enabled else "dynamic_sampling: off")
    if method.recommended_temperature is not None:
        lines.append(f"recommended rollout temperature: {method.recommended_temperature} (a rollout setting)")
    return lines


def describe_presets(name: str | None = None) -> str:
    """Human-readable listing of one method or all of them (used by ``tokenbalance list-methods``): the presets, then
    the token rules registered in this process; ``name`` may be ``MODULE:RULE``."""
    methods = [get_method(name)] if name else [get_method(n) for n in METHOD_PRESETS.names()]
    if not name:
        methods += [rule_method(TOKEN_RULES.get(n)) for n in TOKEN_RULES.names() if n not in METHOD_PRESETS]
    blocks = []
    for method in methods:
        lines = [f"{method.name}: {method.description}"]
        lines += [f"    {line}" for line in stage_summary(method)]
        lines += [f"    source: {what}: {where}" for what, where in method.citations]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
