"""Methods as text: ``tokenbalance list-methods``.

See docs/methods.md for what each stage does.
"""

from __future__ import annotations

import dataclasses

from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.presets import METHOD_PRESETS, OPTIONAL_STAGES, get_method, rule_method
from tokenbalance.algorithms.token_rules import TOKEN_RULES


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
    """Human-readable listing of one method or all of them (used by ``tokenbalance list-methods``):
    the presets, then the token rules registered in this process; ``name`` may be ``MODULE:RULE``."""
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
