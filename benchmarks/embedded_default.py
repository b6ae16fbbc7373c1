"""Measure the embedded default (`tokenbalance train` with no arguments) end to end, per seed.

Each seed runs the whole default from an empty cache (tokenizer, SFT warm start, RL, the
evaluations), one seed after the other, timed on the wall clock. The before/after held-out
accuracies (the first and last evaluation in each run's metrics.jsonl), the gains and the peak
resident memory of the training process (run_state.json) are written as a markdown table to
OUT_DIR/results.md and printed.

    .venv/bin/python benchmarks/embedded_default.py --seeds 0 1 2 --out-dir runs/embedded-default

Only `--seed`, `--run-dir`, `--no-progress` and the cache directory (`model.cache_dir`, a fresh
temporary folder per seed) are passed; everything else is the default of src/tokenbalance/config.py,
unless `--set SECTION.FIELD=VALUE` options are given (passed on to every seed's `train`; for
measuring candidate settings, e.g. `--set data.eval_set=validation`).

The gain of each metric is given with its 95% confidence interval over the seeds (a t interval
of the per-seed gains after - before; each seed's before and after are the same puzzles).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from tokenbalance.ablate.stats import mean_ci
from tokenbalance.commands.train import add_set_option

MODES = ("greedy", "sample")


def run_seed(seed: int, out_dir: Path, overrides: list[str]) -> dict:
    """One end-to-end `tokenbalance train` from an empty cache; returns wall time and evaluations."""
    run_dir = out_dir / f"seed{seed}"
    with tempfile.TemporaryDirectory(prefix="tokenbalance-cache-") as cache:
        command = [
            sys.executable,
            "-m",
            "tokenbalance.cli",
            "train",
            "--seed",
            str(seed),
            "--no-progress",
            "--run-dir",
            str(run_dir),
            "--set",
            f"model.cache_dir={cache}",
            *[arg for item in overrides for arg in ("--set", item)],
        ]
        print("$ " + " ".join(command), flush=True)
        started = time.perf_counter()
        with open(out_dir / f"seed{seed}.log", "w") as log:
            subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - started
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    peak_rss_mb = json.loads((run_dir / "run_state.json").read_text())["peak_rss_mb"]
    return {
        "seed": seed,
        "wall_s": wall,
        "peak_rss_mb": peak_rss_mb,
        "before": evals[0],
        "after": evals[-1],
        "rl_steps": evals[-1]["step"],
    }


def metric_keys(result: dict) -> list[str]:
    """eval/<mode>/acc_<difficulty> for every difficulty, then the mean over difficulties eval/<mode>/acc."""
    keys = []
    for mode in MODES:
        per_level = sorted(k for k in result["before"] if k.startswith(f"eval/{mode}/acc_"))
        keys += per_level + ([f"eval/{mode}/acc"] if len(per_level) > 1 else [])
    return keys


def label(key: str) -> str:
    _, mode, name = key.split("/")
    return f"{mode}, {name.removeprefix('acc_')} people" if name.startswith("acc_") else f"{mode}, mean"


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def markdown(results: list[dict]) -> str:
    seeds = [r["seed"] for r in results]
    lines = [
        "| held-out accuracy | before (mean) | after (mean) | gain (mean) | gain 95% CI | "
        + " | ".join(f"gain seed {s}" for s in seeds)
        + " |",
        "|---|---:|---:|---:|---|" + "---:|" * len(seeds),
    ]
    for key in metric_keys(results[0]):
        before = [r["before"][key] for r in results]
        after = [r["after"][key] for r in results]
        gains = [a - b for a, b in zip(after, before)]
        gain = mean_ci(gains)
        interval = f"[{gain.low:+.3f}, {gain.high:+.3f}]" if gain.n >= 2 else "n/a (one seed)"
        lines.append(
            f"| {label(key)} | {mean(before):.3f} | {mean(after):.3f} | {mean(gains):+.3f} | {interval} | "
            + " | ".join(f"{g:+.3f}" for g in gains)
            + " |"
        )
    keys = metric_keys(results[0])
    lines += [
        "",
        "| seed | RL steps | wall time (s) | peak RSS (MiB) | " + " | ".join(label(k) for k in keys) + " |",
        "|---:|---:|---:|---:|" + "---|" * len(keys),
    ]
    for r in results:
        cells = [f"{r['before'][k]:.3f} -> {r['after'][k]:.3f}" for k in keys]
        lines.append(
            f"| {r['seed']} | {r['rl_steps']} | {r['wall_s']:.0f} | {r['peak_rss_mb']:.0f} | "
            + " | ".join(cells)
            + " |"
        )
    walls = [r["wall_s"] for r in results]
    lines.append(
        f"\nwall time per run: mean {mean(walls):.0f} s, max {max(walls):.0f} s "
        f"({os.cpu_count()} CPUs, {platform.machine()}, torch {version('torch')}, Python {platform.python_version()})"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out-dir", type=Path, default=Path("runs/embedded-default"))
    add_set_option(
        parser, "passed on to every seed's `tokenbalance train` (default: none, the embedded default itself)"
    )
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, args.out_dir, args.overrides))
        print(f"seed {seed}: {results[-1]['wall_s']:.0f} s", flush=True)
        (args.out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    table = markdown(results)
    (args.out_dir / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
