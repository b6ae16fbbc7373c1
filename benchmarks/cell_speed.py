"""A grid cell's wall time, this tree against another tokenbalance source tree, paired, and every
logged value compared bit for bit.

Each pair runs the same ``tokenbalance train`` command once with each source tree (``PYTHONPATH``
first, as the grid's child processes do), one after the other, alternating which goes first; the
ratio baseline / this tree is taken pair by pair and its median reported, with the per-step parts
(``timing/*`` in metrics.jsonl, mean over steps) and the evaluations' share. Then every value both
runs logged, except wall-clock figures, must be equal: the speed-up may not change a number.

    git archive <commit> | tar -x -C /tmp/tb-base          # the baseline tree
    .venv/bin/python benchmarks/cell_speed.py --baseline /tmp/tb-base/src --cell kk-tiny --method ar --steps 150
    .venv/bin/python benchmarks/cell_speed.py --baseline /tmp/tb-base/src --cell testbed --steps 20 \\
        --model runs/testbed/cot34/sft

``--this-set KEY=VALUE`` (repeatable) gives this tree's run settings the baseline lacks (e.g.
``optim.group_by_length=true``): the two runs then differ by float rounding, which RL amplifies
over the steps, so instead of equality the first step's logged values are compared (largest
relative difference) and the evaluations are shown side by side.

Cells: ``kk-tiny`` is what ``tokenbalance ablate --preset kk-tiny`` runs for a row (the embedded
policy, cached; evaluation before and after; one thread, the grid's default); ``testbed`` is the
reasoning testbed's GRPO cell (a chain-of-thought policy directory, 3- and 4-people puzzles,
responses of about 240 tokens, 440 allowed, 100 validation puzzles every 20 steps). Both run
with ``train.threads=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLOCK_KEYS = ("timing/", "throughput/", "peak_")
PRESETS = {  # the grid's rows (src/tokenbalance/ablate/grid.py)
    "grpo": "arlopti_kk_fig4_grpo",
    "ar": "arlopti_kk_fig4_ar",
    "lopti": "arlopti_kk_fig4_lopti",
    "ar_lopti": "arlopti_kk_fig4_ar_lopti",
}


def cell_args(cell: str, method: str, steps: int, model: str | None) -> list[str]:
    preset = PRESETS.get(method, method)
    common = ["--seed", "0", "--steps", str(steps), "--method", preset, "--no-progress", "--set", "train.threads=1"]
    if cell == "kk-tiny":
        return [*common, "--set", "train.eval_every=0"]
    if model is None:
        raise SystemExit("--cell testbed needs --model (the chain-of-thought SFT policy directory)")
    sets = [
        "data.eval_set=validation",
        "data.train_difficulties=[3,4]",
        "data.eval_difficulties=[3,4]",
        "data.eval_count=100",
        "rollout.max_new_tokens=440",
        "rollout.prompts_per_step=8",
        "train.eval_every=20",
    ]
    return [*common, "--model", model, *[a for s in sets for a in ("--set", s)]]


def run(source: str, args: list[str], run_dir: Path) -> float:
    env = dict(os.environ, PYTHONPATH=source)
    command = [sys.executable, "-m", "tokenbalance.cli", "train", *args, "--run-dir", str(run_dir)]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def logged_values(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not any(k.startswith(p) for p in CLOCK_KEYS)} for r in records(run_dir)]


def step_parts(run_dir: Path) -> dict[str, float]:
    train = [r for r in records(run_dir) if r["kind"] == "train"]
    keys = sorted({k for r in train for k in r if k.startswith("timing/")})
    return {k: statistics.mean(r[k] for r in train) for k in keys}


def compare_rounding(baseline: Path, this: Path) -> None:
    """Settings that change only float rounding: the first step's values, and the evaluations."""
    runs = {"baseline": logged_values(baseline), "this tree": logged_values(this)}
    first = [next(r for r in values if r["kind"] == "train") for values in runs.values()]

    def relative(key: str) -> float:
        return abs(first[0][key] - first[1][key]) / max(abs(first[0][key]), 1e-12)

    worst = max((k for k in first[0] if isinstance(first[0][k], float) and k in first[1]), key=relative)
    print(
        f"first step: largest relative difference {relative(worst):.1e} "
        f"({worst}: {first[0][worst]!r} vs {first[1][worst]!r})"
    )
    for label, values in runs.items():
        evals = [r for r in values if r["kind"] == "eval"]
        print(
            f"  {label} evaluations: "
            + "; ".join(
                f"step {r['step']}: " + ", ".join(f"{k.split('/', 1)[1]} {v:.3f}" for k, v in r.items() if "/acc" in k)
                for r in evals
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the baseline's source folder (holds tokenbalance/)")
    parser.add_argument("--cell", choices=("kk-tiny", "testbed"), default="kk-tiny")
    parser.add_argument("--method", default="ar", help="a grid row (grpo, ar, lopti, ar_lopti) or a method preset")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--model", help="the testbed's policy directory")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--this-set", action="append", default=[], metavar="KEY=VALUE", help="this tree only")
    args = parser.parse_args()
    this = str(Path(__file__).resolve().parent.parent / "src")
    sources = {"baseline": str(Path(args.baseline).resolve()), "this tree": this}
    command = cell_args(args.cell, args.method, args.steps, args.model)
    commands = {"baseline": command, "this tree": [*command, *[a for s in args.this_set for a in ("--set", s)]]}
    print(f"# {platform.node()} {os.cpu_count()} CPUs, python {platform.python_version()}, load {os.getloadavg()}")
    print("# tokenbalance train " + " ".join(command))
    if args.this_set:
        print("# this tree adds: " + " ".join(f"--set {s}" for s in args.this_set))
    walls: dict[str, list[float]] = {label: [] for label in sources}
    ratios, identical = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = list(sources) if pair % 2 == 0 else list(reversed(sources))
            dirs = {}
            for label in order:
                dirs[label] = Path(tmp) / f"{pair}-{label.replace(' ', '_')}"
                walls[label].append(run(sources[label], commands[label], dirs[label]))
                print(f"pair {pair} {label}: {walls[label][-1]:.1f} s  steps {step_parts(dirs[label])}", flush=True)
            ratios.append(walls["baseline"][-1] / walls["this tree"][-1])
            if args.this_set:
                compare_rounding(dirs["baseline"], dirs["this tree"])
            same = logged_values(dirs["baseline"]) == logged_values(dirs["this tree"])
            identical &= same
            print(f"pair {pair}: baseline / this tree = {ratios[-1]:.3f}; every logged value identical: {same}")
    print(
        f"\n| cell | baseline (s) | this tree (s) | paired ratio | logged values identical |\n|---|---:|---:|---:|---|\n"
        f"| {args.cell} {args.method} {args.steps} steps | {statistics.median(walls['baseline']):.1f} | "
        f"{statistics.median(walls['this tree']):.1f} | **{statistics.median(ratios):.2f}x** "
        f"({', '.join(f'{r:.2f}' for r in ratios)}) | {identical} |"
    )
    if not identical and not args.this_set:
        raise SystemExit("the logged values differ")


if __name__ == "__main__":
    main()
