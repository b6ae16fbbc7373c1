"""Runs set side by side from their records: the training reward over their first steps, every evaluation's
accuracy, and each run's per-puzzle outcomes against the first run's (exact McNemar), for comparisons that are not a
grid of methods (docs/results.md compares float32 with bfloat16 autocast this way).

    python scripts/compare_runs.py FIRST OTHER... [--labels A,B,...] [--steps N]

Each of FIRST and OTHER is a run directory, a kept record (``ablate --records``), or the JSON file of
``tokenbalance eval --responses``: one evaluation, at the step of the checkpoint it evaluated (0 for a policy that is
not a run's checkpoint). Outcomes pair only where two evaluations scored the same puzzles in the same order (the
``examples`` digest of ``eval_outcomes.jsonl``)."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from tokenbalance.ablate.stats import paired_outcomes
from tokenbalance.commands.evaluate import WRITTEN_BY
from tokenbalance.diagnostics.plots import Run, load_run
from tokenbalance.run.checkpoints import step_of
from tokenbalance.trainer.evaluate import outcome_lines, read_outcomes

Outcomes = dict[tuple[int, str], dict]


def evaluation_file(path: Path) -> tuple[Run, Outcomes]:
    """An ``eval --responses`` file as a run with one evaluation and no training."""
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not readable as JSON ({err})") from None
    if not isinstance(document, dict) or document.get("written_by") != WRITTEN_BY:
        raise ValueError(f"{path}: not a file of `{WRITTEN_BY} --responses`")
    steps = [step_of(Path(part)) for part in Path(document["model"]).parts if re.fullmatch(r"step_\d+", part)]
    step = steps[-1] if steps else 0
    run = Run(name=path.stem, path=path, eval=[{"step": step, **document["metrics"]}])
    return run, {(line["step"], line["mode"]): line for line in outcome_lines(step, document["responses"])}


def load(argument: str) -> tuple[Run, Outcomes]:
    path = Path(argument)
    if path.suffix == ".json":
        return evaluation_file(path)
    return load_run(path), read_outcomes(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="+", metavar="RUN", help="run directories, kept records or eval --responses files"
    )
    parser.add_argument("--labels", help="comma-separated names, one per RUN (default: method and seed, or file name)")
    parser.add_argument("--steps", type=int, default=0, help="average the training reward over steps 1..N (0: all)")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else None
    if labels is not None and len(labels) != len(args.runs):
        print(f"compare_runs: --labels: {len(labels)} label(s) for {len(args.runs)} run(s)", file=sys.stderr)
        return 2
    try:
        loaded = [load(argument) for argument in args.runs]
    except ValueError as err:
        print(f"compare_runs: {err}", file=sys.stderr)
        return 2
    for (run, _), label in zip(loaded, labels or []):
        run.name = label
    steps = f"1-{args.steps}" if args.steps else "all"
    print(f"| run | train steps | reward/mean, steps {steps} | reward/acc | evaluations: step greedy / sampled |")
    print("|---|---:|---:|---:|---|")
    for run, _ in loaded:
        if args.steps:
            run.train = [r for r in run.train if int(r["step"]) <= args.steps]
        evals = ", ".join(
            f"{int(e['step'])}: {e.get('eval/greedy/acc', math.nan):.2f} / {e.get('eval/sample/acc', math.nan):.2f}"
            for e in run.eval
        )
        means = f"{run.mean('reward/mean'):+.3f} | {run.mean('reward/acc'):.3f}" if run.train else "- | -"
        print(f"| {run.name} | {len(run.train)} | {means} | {evals} |")
    (base, base_outcomes), others = loaded[0], loaded[1:]
    print(f"\nAgainst {base.name}, per puzzle (right only in the run / right only in {base.name}, exact McNemar p):")
    for run, outcomes in others:
        for (step, mode), theirs in sorted(outcomes.items()):
            ours = base_outcomes.get((step, mode))
            if ours is None or ours["examples"] != theirs["examples"]:
                continue
            pair = paired_outcomes(ours["correct"], theirs["correct"])
            print(f"- {run.name}, step {step} {mode}: {pair.gained} / {pair.lost}, p = {pair.p_value:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
