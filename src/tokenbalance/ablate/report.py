"""The grid's tables (``results.md``, ``accuracy.csv``, ``cells.csv``, ``step_cost.csv``): held-out accuracy in the
paper's layout, paired differences (:mod:`.stats`), per-step cost; a :class:`ReportSource` reads the local cells or a
verl grid's logs (:mod:`tokenbalance.ablate.verl.report`). docs/ablate.md ("Outputs")."""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenbalance.ablate.grid import GridMethod, GridPlan
from tokenbalance.ablate.results import (
    MODES,
    CellResult,
    accuracy_columns,
    paired_cell_outcomes,
    per_seed,
    row_pairs,
    start_per_seed,
)
from tokenbalance.ablate.runner import read_log
from tokenbalance.ablate.stats import (
    Estimate,
    cluster_difference,
    detectable_at_lower_spread,
    detectable_at_upper_spread,
    detectable_difference,
    holm_adjusted,
    mean_ci,
    paired_difference,
    relative_change,
    t_test_p,
)
from tokenbalance.config import load_config
from tokenbalance.tasks import DEFAULT_TASK, get_task

START_ROW = GridMethod("start", "start policy (step 0)", "-")
MODE_TITLES = {"greedy": "greedy decoding", "sample": "one sample at temperature 1.0"}
COST_KEYS = ("timing/step_s", "timing/rollout_s", "timing/logprob_s", "timing/update_s")
LOCAL_ACCURACY_NOTE = (
    "Accuracy is a cell's last held-out evaluation (its `metrics.jsonl`, `kind: eval`, after the final RL "
    "step); the start-policy row is the step-0 evaluation."
)
STATISTICS_NOTE = (
    "Each entry is the mean over seeds ± the "
    "half-width of its 95% confidence interval (t distribution with n - 1 degrees of freedom, sample "
    "standard deviation). Δ is the mean over seeds of the per-seed difference from the baseline row "
    "(GRPO, or REINFORCE++ for its family; for a baseline row itself, the start policy: what RL did), paired "
    "by seed over the seeds whose two cells are a pair (the pairing line above: the same start policy, "
    "prompt order and evaluation puzzles), with the 95% t interval of those differences; relative is Δ / the baseline's mean over the same seeds (the paper's ↑x%). The "
    "detectable Δ is the true paired difference these seeds would show to be nonzero (two-sided 5%) with "
    "80% probability, given the observed spread of the differences: (t_0.975 + t_0.80, n - 1 degrees of "
    "freedom) × sd / √n; a smaller effect may exist unseen. Beside it, the same with sd at the lower and upper "
    "ends of its 95% interval, sd × √((n - 1) / χ²_0.975, n - 1) and sd × √((n - 1) / χ²_0.025, n - 1), since "
    "few seeds estimate the spread loosely. Seeds that share a start policy are not independent replicates of "
    "it, so beside the per-seed interval stands the interval over start-policy means (each start policy's mean "
    "paired difference, t with start policies - 1 degrees of freedom; none with one start policy). p is the "
    "two-sided paired t test of the per-seed Avg difference; Holm p corrects it across the table's contrasts "
    "(every row against its comparison row, the baseline rows against the start policy excluded) at a "
    "family-wise 5%. df is written beside every interval."
)
PAIRING_NOTES = {
    "fingerprint": "by fingerprint: two cells of a seed are paired only when their `fingerprints.json` name the same "
    'start policy, prompt order and evaluation set (docs/ablate.md, "Pairing by fingerprint")',
    "step0": "by fingerprint, and where a record has none (older code) by its step-0 evaluation: two cells pair when "
    "every `eval/*` value of their step-0 evaluations agrees (weaker evidence than a fingerprint; `--pairing step0`)",
    "launch": "by seed: the grid's scripts launch every cell of a seed from the same model and data (its cells "
    "write no fingerprints)",
}


def local_cost_note(jobs: list[int]) -> str:
    """The cost table's note: how many cells ran at once (``jobs``, from grid_log.jsonl; none: all restored)."""
    if jobs:
        count = " or ".join(map(str, jobs)) if jobs != [1] else "one"
        where = f"cells ran {count} at a time on this machine (`grid_log.jsonl`)"
    else:
        where = "the cells were restored from records and ran elsewhere, how many at a time not known here"
    return (
        "Seconds per RL step from each cell's `timing/*` records (mean over its steps, then mean ± 95% CI "
        f"over seeds); {where}, so a busy machine inflates them all."
    )


@dataclass(frozen=True)
class ReportSource:
    """What a report says about where its numbers come from: ``summary`` lines (after the cell count), the
    ``accuracy_note`` (which record is a cell's accuracy), the ``cost_note``, the decoding ``modes`` it has tables for
    and their titles, the ``pairing`` rule (:data:`~tokenbalance.ablate.results.PAIRING_RULES`). :func:`local_source` is the local grid's."""

    summary: tuple[str, ...]
    accuracy_note: str = LOCAL_ACCURACY_NOTE
    cost_note: str = local_cost_note([1])
    modes: tuple[str, ...] = MODES
    mode_titles: Mapping[str, str] = field(default_factory=lambda: dict(MODE_TITLES))
    pairing: str = "fingerprint"  # results.PAIRING_RULES: how two cells of a seed are found to be a pair


def multiplicity_note(plan: GridPlan) -> str:
    """With several rows each compared with its baseline, one interval may exclude zero by chance: the chance that at
    least one of k independent 95% intervals does when no method has any effect."""
    k = sum(1 for m in plan.methods if m.baseline is not None and plan.row(m.baseline) is not None)
    if k < 2:
        return ""
    return (
        f" The table compares {k} rows with their baseline: if no method had any effect, at least one of "
        f"{k} independent 95% intervals would still exclude zero with probability 1 - 0.95^{k} = "
        f"{1 - 0.95**k:.0%} (these share the baseline's cells, so they are not independent, but the order "
        "holds), so a single interval that only just excludes zero is weak evidence on its own."
    )


def column_label(key: str, difficulty_label: Callable[[int], str]) -> str:
    name = key.rsplit("/", 1)[1]
    return difficulty_label(int(name.removeprefix("acc_"))) if name.startswith("acc_") else "Avg"


def fmt(value: float, digits: int = 3, sign: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _fmt_with_spread(e: Estimate, digits: int, sign: bool, spread: str) -> str:
    """``e``'s mean then ``spread`` (its interval, written as the caller wants), or what one seed or none gives."""
    if e.n == 0:
        return "–"
    return f"{fmt(e.mean, digits, sign)} {'(1 seed)' if e.n == 1 else spread}"


def fmt_estimate(e: Estimate, digits: int = 3) -> str:
    return _fmt_with_spread(e, digits, False, f"± {fmt(e.half_width, digits)}")


def fmt_difference(e: Estimate, digits: int = 3) -> str:
    return _fmt_with_spread(e, digits, True, f"[{fmt(e.low, digits, True)}, {fmt(e.high, digits, True)}]")


def fmt_relative(fraction: float) -> str:
    if not math.isfinite(fraction):
        return "–"
    arrow = "↑" if fraction >= 0 else "↓"
    return f"{arrow}{abs(fraction) * 100:.1f}%"


def accuracy_rows(plan: GridPlan, results: list[CellResult], mode: str, pairing: str = "fingerprint") -> list[dict]:
    """One dict per (row, column): the estimate over seeds and the paired difference from its baseline, over the seeds
    whose cells are a pair (:func:`~tokenbalance.ablate.results.row_pairs`; ``dropped``: the others, with why), per
    seed and over start-policy means (``cluster_difference``); the Avg columns' ``p`` and ``holm_p``."""
    rows: list[dict[str, Any]] = []
    for column in accuracy_columns(results, mode):
        start = start_per_seed(results, column)
        rows.append({"row": START_ROW, "column": column, "values": start, "estimate": mean_ci(list(start.values()))})
        for method in plan.methods:
            values = per_seed(results, method.key, column)
            entry: dict[str, Any] = {
                "row": method,
                "column": column,
                "values": values,
                "estimate": mean_ci(list(values.values())),
            }
            if method.baseline is None:  # a baseline row: what RL did to the start policy (the same cell)
                base: dict[int, float] | None = start
                paired = values
            elif plan.row(method.baseline):
                base = per_seed(results, method.baseline, column)
                pairs = row_pairs(results, method.key, method.baseline, pairing)
                paired = {seed: values[seed] for seed in pairs.seeds if seed in values}
                entry["dropped"] = pairs.dropped
            else:
                base = None
            if base is not None:
                entry["baseline"] = method.baseline or START_ROW.key
                entry["difference"] = paired_difference(paired, base)
                entry["cluster_difference"] = cluster_difference(paired, base, plan.preset.policy_seed)
                entry["relative"] = relative_change(paired, base)
                entry["p"] = t_test_p(entry["difference"])
            rows.append(entry)
    avg = [e for e in rows if e["column"] == f"eval/{mode}/acc" and e.get("baseline") not in (None, START_ROW.key)]
    for entry, adjusted in zip(avg, holm_adjusted([e["p"] for e in avg])):
        entry["holm_p"] = adjusted
    return rows


def compared_row(plan: GridPlan, key: str) -> GridMethod | None:
    """The row a difference is taken against: a grid row, or the start policy (for a baseline row)."""
    return START_ROW if key == START_ROW.key else plan.row(key)


def _seeds(values: dict[int, float]) -> str:
    return " ".join(str(s) for s in sorted(values))


def write_accuracy_csv(
    path: Path, plan: GridPlan, results: list[CellResult], modes: tuple[str, ...] = MODES, pairing: str = "fingerprint"
) -> None:
    fields = [
        "mode",
        "row",
        "label",
        "column",
        "n",
        "mean",
        "sd",
        "ci_low",
        "ci_high",
        "seeds",
        "baseline",
        "diff_n",
        "diff_mean",
        "diff_sd",
        "diff_ci_low",
        "diff_ci_high",
        "diff_detectable_80",
        "diff_detectable_80_lower_sd",
        "diff_detectable_80_upper_sd",
        "relative_change",
        "diff_df",
        "policy_diff_n",
        "policy_diff_mean",
        "policy_diff_ci_low",
        "policy_diff_ci_high",
        "policy_diff_df",
        "diff_p",
        "diff_holm_p",
        "dropped_pairs",
    ]
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=fields)
        writer.writeheader()
        for mode in modes:
            for entry in accuracy_rows(plan, results, mode, pairing):
                e: Estimate = entry["estimate"]
                line = {
                    "mode": mode,
                    "row": entry["row"].key,
                    "label": entry["row"].label,
                    "column": entry["column"],
                    "n": e.n,
                    "mean": repr(e.mean),
                    "sd": repr(e.sd),
                    "ci_low": repr(e.low),
                    "ci_high": repr(e.high),
                    "seeds": _seeds(entry["values"]),
                }
                if "difference" in entry:
                    d: Estimate = entry["difference"]
                    line |= {
                        "baseline": entry["baseline"],
                        "diff_n": d.n,
                        "diff_mean": repr(d.mean),
                        "diff_sd": repr(d.sd),
                        "diff_ci_low": repr(d.low),
                        "diff_ci_high": repr(d.high),
                        "diff_detectable_80": repr(detectable_difference(d)),
                        "diff_detectable_80_lower_sd": repr(detectable_at_lower_spread(d)),
                        "diff_detectable_80_upper_sd": repr(detectable_at_upper_spread(d)),
                        "relative_change": repr(entry["relative"]),
                        "diff_df": d.n - 1 if d.n else "",
                        "policy_diff_n": (c := entry["cluster_difference"]).n,
                        "policy_diff_mean": repr(c.mean),
                        "policy_diff_ci_low": repr(c.low),
                        "policy_diff_ci_high": repr(c.high),
                        "policy_diff_df": c.n - 1 if c.n else "",
                        "diff_p": repr(entry["p"]),
                        "diff_holm_p": repr(entry["holm_p"]) if "holm_p" in entry else "",
                        "dropped_pairs": " ".join(f"{seed}" for seed, _ in entry.get("dropped", ())),
                    }
                writer.writerow(line)


def write_cells_csv(path: Path, results: list[CellResult]) -> None:
    keys = sorted({k for r in results for k in r.last_eval if k.startswith("eval/") and "/acc" in k})
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            ["cell", "row", "seed", "status", "complete", "last_eval_step", *keys, *[f"start:{k}" for k in keys]]
        )
        for r in results:
            writer.writerow(
                [r.cell.name, r.cell.method.key, r.cell.seed, r.status, r.complete, r.last_eval.get("step", "")]
                + [repr(r.last_eval[k]) if k in r.last_eval else "" for k in keys]
                + [repr(r.first_eval[k]) if k in r.first_eval else "" for k in keys]
            )


@dataclass
class CostRow:
    """A row's seconds per RL step by phase (:data:`COST_KEYS`: mean over a cell's steps, then the estimate over
    seeds), its RL steps counted, and its step time over its baseline's."""

    row: GridMethod
    steps: int
    phases: dict[str, Estimate]
    ratio: float = math.nan


def cost_rows(plan: GridPlan, results: list[CellResult]) -> list[CostRow]:
    rows = []
    for method in plan.methods:
        cells = [r for r in results if r.complete and r.cell.method.key == method.key]
        phases = {key: mean_ci([r.mean_of(key) for r in cells if math.isfinite(r.mean_of(key))]) for key in COST_KEYS}
        rows.append(CostRow(method, sum(len(r.series("timing/step_s")[1]) for r in cells), phases))
    by_key = {entry.row.key: entry for entry in rows}
    for entry in rows:
        base = by_key.get(entry.row.baseline or "")
        reference = base.phases["timing/step_s"].mean if base else math.nan
        if math.isfinite(reference) and reference > 0:
            entry.ratio = entry.phases["timing/step_s"].mean / reference
    return rows


def write_cost_csv(path: Path, rows: list[CostRow]) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            [
                "row",
                "label",
                "cells",
                "steps",
                *[f"{k}_mean" for k in COST_KEYS],
                "step_s_ci_low",
                "step_s_ci_high",
                "ratio_to_baseline",
            ]
        )
        for entry in rows:
            step = entry.phases["timing/step_s"]
            writer.writerow(
                [entry.row.key, entry.row.label, step.n, entry.steps]
                + [repr(entry.phases[k].mean) for k in COST_KEYS]
                + [repr(step.low), repr(step.high), repr(entry.ratio)]
            )


def accuracy_markdown(
    plan: GridPlan,
    results: list[CellResult],
    mode: str,
    difficulty_label: Callable[[int], str],
    title: str | None = None,
    pairing: str = "fingerprint",
) -> list[str]:
    entries = accuracy_rows(plan, results, mode, pairing)
    columns = accuracy_columns(results, mode)
    table: dict[str, dict[str, dict]] = {}
    for entry in entries:
        table.setdefault(entry["row"].key, {})[entry["column"]] = entry
    avg = f"eval/{mode}/acc"
    labels = [column_label(c, difficulty_label) for c in columns]
    lines = [
        f"| Method | {' | '.join(labels)} | Δ Avg vs baseline [95% CI] | relative | seeds |",
        "|---|" + "---|" * (len(labels) + 3),
    ]
    for cells in table.values():
        row = cells[avg]["row"]
        diff = cells[avg].get("difference")
        baseline = compared_row(plan, cells[avg].get("baseline", "")) if diff is not None else None
        lines.append(
            f"| {row.label} | "
            + " | ".join(fmt_estimate(cells[c]["estimate"]) for c in columns)
            + f" | {fmt_difference(diff) + ' vs ' + baseline.label if diff is not None and baseline else ''}"
            + f" | {fmt_relative(cells[avg].get('relative', math.nan)) if diff is not None else ''}"
            + f" | {cells[avg]['estimate'].n} |"
        )
    lines += ["", f"Paired differences from the baseline row per column ({title or MODE_TITLES[mode]}):", ""]
    lines += [
        f"| Method | vs | {' | '.join(labels)} | Avg over start policies | p | Holm p "
        "| detectable Avg Δ (80% power) | at the lower / upper bound of the spread |",
        "|---|---|" + "---|" * (len(labels) + 5),
    ]
    for cells in table.values():
        if "difference" not in cells[avg]:
            continue
        entry = cells[avg]
        baseline = compared_row(plan, entry["baseline"])
        difference = entry["difference"]
        lines.append(
            f"| {entry['row'].label} | {baseline.label if baseline else ''} | "
            + " | ".join(fmt_difference_df(cells[c]["difference"]) for c in columns)
            + f" | {fmt_difference_df(entry['cluster_difference'])}"
            + f" | {fmt(entry['p'])} | {fmt(entry.get('holm_p', math.nan))}"
            + f" | {fmt(detectable_difference(difference))}"
            + f" | {fmt(detectable_at_lower_spread(difference))} / {fmt(detectable_at_upper_spread(difference))} |"
        )
    return lines


def fmt_difference_df(e: Estimate, digits: int = 3) -> str:
    """A difference with its interval and the interval's degrees of freedom."""
    return fmt_difference(e, digits) + (f" (df {e.n - 1})" if e.n >= 2 else "")


def pairing_summary(plan: GridPlan, results: list[CellResult], pairing: str) -> str:
    """The report's line on pairing: the rule, and per row the seeds dropped from its differences, with why."""
    dropped = []
    for method in plan.methods:
        if method.baseline is None or plan.row(method.baseline) is None:
            continue
        pairs = row_pairs(results, method.key, method.baseline, pairing)
        if pairs.dropped:
            base = plan.row(method.baseline)
            seeds = "; ".join(f"seed {seed}: {why}" for seed, why in pairs.dropped)
            dropped.append(f"{method.label} vs {base.label if base else method.baseline}: {seeds}")
    tail = ("; pairs dropped from the differences: " + " | ".join(dropped)) if dropped else "; no pair was dropped"
    return f"- pairing: {PAIRING_NOTES[pairing]}{tail}"


def outcomes_markdown(
    plan: GridPlan, results: list[CellResult], mode: str, title: str, pairing: str = "fingerprint"
) -> list[str]:
    """Example by example, where the cells wrote their outcomes: per seed the examples the row got right and its
    comparison did not (gained) and the reverse (lost), with the exact McNemar p."""
    rows = paired_cell_outcomes(results, plan, mode, pairing)
    if not rows:
        return []
    labels = {m.key: m.label for m in plan.methods} | {"start": "start policy (step 0)"}
    lines = [
        "",
        f"Example by example ({title}, final evaluation): gained / lost, the held-out examples right only "
        "in the row's cell / only in its comparison's (same seed, same examples), and the exact two-sided "
        "McNemar p of that split.",
        "",
        "| Method | vs | " + " | ".join(f"seed {seed}" for seed in plan.seeds) + " | all seeds |",
        "|---|---|" + "---|" * (len(plan.seeds) + 1),
    ]
    for key, compared, per_seed_outcomes in rows:
        cells = [
            f"{o.gained} / {o.lost} (p = {o.p_value:.3g})" if (o := per_seed_outcomes.get(seed)) else "–"
            for seed in plan.seeds
        ]
        gained = sum(o.gained for o in per_seed_outcomes.values())
        lost = sum(o.lost for o in per_seed_outcomes.values())
        lines.append(f"| {labels[key]} | {labels[compared]} | " + " | ".join(cells) + f" | {gained} / {lost} |")
    return lines


def cost_markdown(rows: list[CostRow]) -> list[str]:
    lines = [
        "| Method | step s | rollout s | log-prob s | update s | step × baseline | cells | steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in rows:
        p = entry.phases
        lines.append(
            f"| {entry.row.label} | {fmt_estimate(p['timing/step_s'], 3)} | {fmt(p['timing/rollout_s'].mean)} | "
            f"{fmt(p['timing/logprob_s'].mean)} | {fmt(p['timing/update_s'].mean)} | {fmt(entry.ratio, 2)} | "
            f"{p['timing/step_s'].n} | {entry.steps} |"
        )
    return lines


def provenance(command: str | None) -> list[str]:
    import torch

    import tokenbalance

    source = Path(tokenbalance.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return [
        f"- command: `{command}`" if command else "- command: (library call)",
        f"- report written: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; commit {commit}; tokenbalance {tokenbalance.__version__}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}",
    ]


def cell_runs(log: list[dict], results: list[CellResult]) -> list[dict]:
    """The grid log's records of the runs of these cells."""
    names = {r.cell.name for r in results}
    return [r for r in log if r.get("event") == "cell" and r.get("cell") in names]


def cell_time_summary(log: list[dict], results: list[CellResult]) -> str:
    runs = [r for r in cell_runs(log, results) if "wall_s" in r]
    total = sum(float(r["wall_s"]) for r in runs)
    sittings = sum(1 for r in log if r.get("event") == "sitting")
    restored = sorted({name for r in log if r.get("event") == "sitting" for name in r.get("restored", [])})
    elsewhere = f"; {len(restored)} cell(s) restored from records ran elsewhere, not counted" if restored else ""
    return (
        f"- cell wall time: {total / 60:.1f} min over {len(runs)} cell run(s) in {sittings} sitting(s) "
        f"(grid_log.jsonl; start-policy SFT builds not included{elsewhere})"
    )


def sft_note(policy: Path) -> str:
    """What a start policy's ``tokenbalance_sft.json`` says of its SFT: the build time of an embedded policy, the final
    loss of one ``tokenbalance sft`` wrote (no build time); empty without a readable summary."""
    try:
        summary = json.loads((policy / "tokenbalance_sft.json").read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(summary, dict):
        return ""
    if isinstance(summary.get("sft_seconds"), (int, float)):
        return f", SFT built in {summary['sft_seconds']:.0f} s"
    if isinstance(summary.get("sft_final_loss"), (int, float)):
        return f", SFT final loss {summary['sft_final_loss']:.3f}"
    return ""


def start_policy_summary(out_dir: Path, plan: GridPlan) -> str:
    """Each seed's start policy (seeds sharing one, a preset's ``start_seed``, listed together) and what its SFT
    summary says (:func:`sft_note`: an embedded one's one-time build time)."""
    seeds_of: dict[Path, list[int]] = {}
    for seed in plan.seeds:
        config_file = out_dir / "configs" / f"{next(c for c in plan.cells if c.seed == seed).name}.yaml"
        if config_file.is_file():
            seeds_of.setdefault(Path(load_config(config_file).model.path or ""), []).append(seed)
    parts = []
    for policy, seeds in seeds_of.items():
        parts.append(
            f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: `{policy.name}`{sft_note(policy)}"
        )
    return "- start policies: " + ("; ".join(parts) or "not built yet")


def local_source(
    out_dir: Path, plan: GridPlan, results: list[CellResult], pairing: str = "fingerprint"
) -> ReportSource:
    """The local grid's: its cells' wall time (grid_log.jsonl), start policies, and how many cells ran at once
    (``jobs``; runs logged before the grid recorded it ran one at a time)."""
    log = read_log(out_dir)
    jobs = sorted({int(r.get("jobs", 1)) for r in cell_runs(log, results)})
    return ReportSource(
        (cell_time_summary(log, results), start_policy_summary(out_dir, plan)),
        cost_note=local_cost_note(jobs),
        pairing=pairing,
    )


def write_report(
    plan: GridPlan,
    results: list[CellResult],
    out_dir: Path,
    *,
    command: str | None = None,
    difficulty_label: Callable[[int], str] | None = None,
    figures: tuple[str, ...] = (),
    source: ReportSource | None = None,
) -> Path:
    """Write results.md, accuracy.csv, cells.csv and step_cost.csv; returns results.md's path. ``source``: where the
    numbers come from (default: the local grid in ``out_dir``); ``difficulty_label``: the task's name of a difficulty
    column (``Task.difficulty_label``; default: the default task's, K&K's, which the verl grid runs)."""
    out_dir = Path(out_dir)
    difficulty_label = difficulty_label or get_task(DEFAULT_TASK).difficulty_label
    source = source or local_source(out_dir, plan, results)
    write_accuracy_csv(out_dir / "accuracy.csv", plan, results, source.modes, source.pairing)
    write_cells_csv(out_dir / "cells.csv", results)
    costs = cost_rows(plan, results)
    write_cost_csv(out_dir / "step_cost.csv", costs)
    complete = [r for r in results if r.complete]
    missing = [f"{r.cell.name} ({r.status})" for r in results if not r.complete]
    lines = [
        f"# tokenbalance ablate: grid `{plan.preset.name}`",
        "",
        f"{plan.preset.description}.",
        "",
        *provenance(command),
        f"- rows: {', '.join(f'{m.label} (`{m.preset}`)' for m in plan.methods)}",
        f"- seeds: {', '.join(map(str, plan.seeds))}; RL steps per cell: {plan.steps}; overrides: "
        + (", ".join(f"`{o}`" for o in (*plan.preset.overrides, *plan.overrides)) or "none"),
        f"- cells complete: {len(complete)} of {len(results)}"
        + (f"; not complete: {', '.join(missing)}" if missing else ""),
        *source.summary,
        pairing_summary(plan, results, source.pairing),
        "",
        f"{source.accuracy_note} {STATISTICS_NOTE}{multiplicity_note(plan)}",
    ]
    for mode in source.modes:
        title = source.mode_titles[mode]
        lines += ["", f"## Held-out accuracy, {title}", ""]
        lines += accuracy_markdown(plan, results, mode, difficulty_label, title, source.pairing)
        lines += outcomes_markdown(plan, results, mode, title, source.pairing)
    lines += [
        "",
        "## Cost per RL step",
        "",
        source.cost_note,
        "",
        *cost_markdown(costs),
    ]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    path = out_dir / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path
