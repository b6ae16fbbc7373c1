"""The step-count control's pre-registered analysis (docs/preregistration/step-count-control.md), applied as written:
the contrasts C1-C3 on sampled accuracy at step 100, each a paired difference over the start-policy means of both
conditions pooled (8 clusters, 7 df), Holm-corrected at a family-wise 5%, and the decision rule read off them.

Pure functions over :class:`~tokenbalance.ablate.results.CellResult` lists; ``scripts/step_control_report.py`` reads
the committed records and writes the report."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.ablate.grid import STEP_CONTROL_METHODS, grid_method, grid_preset, make_plan
from tokenbalance.ablate.report import fmt, fmt_difference
from tokenbalance.ablate.results import CellResult, per_seed, read_cell, row_pairs
from tokenbalance.ablate.stats import (
    Estimate,
    cluster_means,
    detectable_at_upper_spread,
    detectable_difference,
    holm_adjusted,
    mean_ci,
    paired_difference,
    t_test_p,
)

SEEDS = tuple(range(8, 16))
STEPS = 100
PRIMARY_KEY = "eval/sample/acc"
ENTROPY_KEY = "loss/entropy"
ENTROPY_STEPS = range(91, 101)
FAMILY_ALPHA = 0.05


@dataclass(frozen=True)
class Contrast:
    name: str
    row: str
    baseline: str
    question: str


PRIMARY = (
    Contrast("C1", "grpo_2step", "grpo", "does a second step alone move accuracy?"),
    Contrast("C2", "lopti", "grpo_2step", "does the probability split add to the second step?"),
    Contrast("C3", "ar_lopti", "grpo_2step", "the same, for + AR + Lopti"),
)
SECONDARY = (
    Contrast("S1", "ar_lopti", "grpo", "does the earlier + AR + Lopti effect replicate?"),
    Contrast("S2", "lopti", "grpo", "and + Lopti's?"),
)


@dataclass(frozen=True)
class Condition:
    """One condition's cells and the start policy (cluster) of each seed."""

    name: str
    results: list[CellResult]
    cluster_of: Callable[[int], int]


def load_condition(name: str, records: Path) -> Condition:
    """The cells of condition ``name`` (``arith-steps`` or ``arith-steps-wording``) as kept in ``records`` (one folder
    per cell, as ``ablate --records`` keeps them)."""
    plan = make_plan(grid_preset(name), methods=list(STEP_CONTROL_METHODS), seeds=list(SEEDS), steps=STEPS)
    return Condition(name, [read_cell(records / c.name, c, plan.steps) for c in plan.cells], plan.preset.policy_seed)


def final_accuracy(key: str) -> Callable[[list[CellResult], str], dict[int, float]]:
    """Per seed, ``key`` at the row's final evaluation (complete cells only)."""
    return lambda results, row: per_seed(results, row, key)


def late_mean(key: str, steps: range) -> Callable[[list[CellResult], str], dict[int, float]]:
    """Per seed, the mean of the train metric ``key`` over ``steps`` (complete cells with all of them logged)."""

    def values(results: list[CellResult], row: str) -> dict[int, float]:
        out = {}
        for r in results:
            if r.complete and r.cell.method.key == row:
                found = {s: v for s, v in zip(*r.series(key), strict=True) if s in steps}
                if len(found) == len(steps):
                    out[r.cell.seed] = math.fsum(found.values()) / len(found)
        return out

    return values


@dataclass(frozen=True)
class ContrastResult:
    contrast: Contrast
    pooled: Estimate  # over the start-policy means of every condition
    per_condition: Mapping[str, Estimate]  # over that condition's start-policy means
    per_seed: Mapping[str, Estimate]  # over that condition's seeds
    dropped: tuple[str, ...]  # "condition seed s: why"
    p: float
    holm_p: float = math.nan

    @property
    def significant(self) -> bool:
        return self.holm_p <= FAMILY_ALPHA


def contrast_result(
    conditions: list[Condition], contrast: Contrast, values: Callable, pairing: str = "fingerprint"
) -> ContrastResult:
    """``contrast`` paired by seed within each condition (only cells whose fingerprints pair), averaged per start
    policy, and pooled over the conditions' start-policy means."""
    pooled, per_condition, seeds, dropped = [], {}, {}, []
    for condition in conditions:
        pairs = row_pairs(condition.results, contrast.row, contrast.baseline, pairing)
        dropped += [f"{condition.name} seed {seed}: {why}" for seed, why in pairs.dropped]
        mine = {s: v for s, v in values(condition.results, contrast.row).items() if s in pairs.seeds}
        base = values(condition.results, contrast.baseline)
        means = cluster_means(mine, base, condition.cluster_of)
        pooled += means
        per_condition[condition.name] = mean_ci(means)
        seeds[condition.name] = paired_difference(mine, base)
    estimate = mean_ci(pooled)
    return ContrastResult(contrast, estimate, per_condition, seeds, tuple(dropped), t_test_p(estimate))


def with_holm(results: list[ContrastResult]) -> list[ContrastResult]:
    """The same results with Holm-adjusted p over exactly these contrasts (one family)."""
    adjusted = holm_adjusted([r.p for r in results])
    return [dataclasses.replace(r, holm_p=a) for r, a in zip(results, adjusted, strict=True)]


def decision(primary: list[ContrastResult]) -> str:
    """The pre-registered decision rule on C1-C3 (Holm-adjusted); a significant negative contrast counts toward neither
    explanation, and a combination the rule does not name is said to be one."""
    by_name = {r.contrast.name: r for r in primary}
    if set(by_name) != {c.name for c in PRIMARY}:
        raise ValueError(f"the rule needs C1, C2 and C3; got {sorted(by_name)}")
    positive = {name: r.significant and r.pooled.mean > 0 for name, r in by_name.items()}
    step, split = positive["C1"], positive["C2"] or positive["C3"]
    if step and split:
        return "both contribute"
    if step:
        return "the effect is the second step"
    if split and not by_name["C1"].significant:
        return "it is the split"
    if not any(r.significant for r in primary):
        return "not attributable at this design's power"
    harms = ", ".join(name for name, r in by_name.items() if r.significant and r.pooled.mean < 0)
    return f"none of the pre-registered outcomes: significant harm in {harms}" + (" with a split gain" if split else "")


def detectable(estimate: Estimate) -> tuple[float, float]:
    """The true difference these clusters detect with 80% power (two-sided 5%) at the observed spread and at the
    upper end of its 95% interval."""
    return detectable_difference(estimate), detectable_at_upper_spread(estimate)


def with_df(e: Estimate, digits: int = 3) -> str:
    """An interval with its degrees of freedom beside it."""
    return f"{fmt_difference(e, digits)} (df {e.n - 1})" if e.n >= 2 else fmt_difference(e, digits)


def contrast_table(results: list[ContrastResult], conditions: list[Condition], holm: bool) -> list[str]:
    names = [c.name for c in conditions]
    lines = [
        "| Contrast | pooled over start policies | p | "
        + ("Holm p | " if holm else "")
        + " | ".join(f"{n}: start policies | {n}: seeds" for n in names)
        + " | detectable (observed sd / upper sd) |",
        "|---|---|---|" + ("---|" if holm else "") + "---|---|" * len(names) + "---|",
    ]
    for r in results:
        c = r.contrast
        low_sd, high_sd = detectable(r.pooled)
        cells = [f"{with_df(r.per_condition[n])} | {with_df(r.per_seed[n])}" for n in names]
        lines.append(
            f"| {c.name}: {grid_method(c.row).label} - {grid_method(c.baseline).label} | {with_df(r.pooled)} | "
            f"{fmt(r.p)} | "
            + (f"{fmt(r.holm_p)} | " if holm else "")
            + " | ".join(cells)
            + f" | {fmt(low_sd)} / {fmt(high_sd)} |"
        )
    return lines


def report_markdown(conditions: list[Condition], pairing: str = "fingerprint") -> str:
    """The pre-registered report: completeness first; C1-C3 with Holm p and the decision (withheld until every cell is
    complete); the secondary contrasts and outcomes, reported with no decision resting on them."""
    cells = [r for c in conditions for r in c.results]
    missing = [f"{c.name}/{r.cell.name} ({r.status})" for c in conditions for r in c.results if not r.complete]
    primary = with_holm([contrast_result(conditions, c, final_accuracy(PRIMARY_KEY), pairing) for c in PRIMARY])
    dropped = sorted({d for r in primary for d in r.dropped})
    lines = [
        "# The step-count control: the pre-registered analysis",
        "",
        "Design and decision rule: docs/preregistration/step-count-control.md (committed before the first cell). "
        f"Cells complete: {len(cells) - len(missing)} of {len(cells)}; pairing: `{pairing}`.",
        "",
    ]
    if missing:
        lines += ["**Partial: no decision is read from this report.** Not complete: " + ", ".join(missing) + ".", ""]
    if dropped:
        lines += ["Pairs dropped (their start policy's mean rests on its other seed): " + "; ".join(dropped) + ".", ""]
    lines += [
        f"## Primary: sampled accuracy (`{PRIMARY_KEY}`, T = 1) at step {STEPS}",
        "",
        "Each difference is paired by seed, averaged over the 2 seeds of a start policy, and its interval (95% t) is "
        "over those start-policy means (df beside each); p is the two-sided t test of the pooled means, Holm p its "
        f"Holm adjustment over C1-C3 (significant at <= {FAMILY_ALPHA}). The detectable difference is the true one "
        "these start policies would show with 80% power, at the observed spread and at the upper end of its interval.",
        "",
        *contrast_table(primary, conditions, holm=True),
        "",
        f"**Decision: {decision(primary)}.**" if not missing else "Decision: withheld until every cell is complete.",
        "",
        "## Secondary (no decision rests on these)",
        "",
    ]
    secondary = (
        (f"Sampled accuracy at step {STEPS}", final_accuracy(PRIMARY_KEY), SECONDARY),
        (f"Greedy accuracy at step {STEPS}", final_accuracy("eval/greedy/acc"), PRIMARY + SECONDARY),
        (
            f"Entropy (`{ENTROPY_KEY}`, mean over steps {ENTROPY_STEPS[0]}-{ENTROPY_STEPS[-1]})",
            late_mean(ENTROPY_KEY, ENTROPY_STEPS),
            PRIMARY + SECONDARY,
        ),
    )
    for title, values, contrasts in secondary:
        results = [contrast_result(conditions, c, values, pairing) for c in contrasts]
        lines += [f"{title}:", "", *contrast_table(results, conditions, holm=False), ""]
    return "\n".join(lines)
