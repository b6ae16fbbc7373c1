"""Two grid cells at once with one thread each, or one cell with every thread? Measured in one run.

Each contender runs RL steps of the embedded default (``benchmarks/_contention_child.py --work
step``, tokenbalance's threading policy) for ``--repeats`` steps: ``one cell, N threads`` is one
process with all N CPUs; ``N cells, 1 thread each`` is N such processes started together. The
figure is the grid's throughput, RL steps per second summed over the processes running, as the
median over ``--rounds`` rounds (contenders alternate within a round).

    .venv/bin/python benchmarks/grid_jobs.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from tokenbalance.threads import available_cpus

CHILD = Path(__file__).resolve().parent / "_contention_child.py"


def steps_per_s(processes: int, threads: int, repeats: int) -> float:
    command = [sys.executable, str(CHILD), "--policy", "tokenbalance", "--work", "step", "--repeats", str(repeats)]
    children = [
        subprocess.Popen(
            [*command, "--threads", str(threads)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for _ in range(processes)
    ]
    medians = [json.loads(child.communicate()[0].strip().splitlines()[-1])["median_s"] for child in children]
    return sum(1.0 / m for m in medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    cpus = available_cpus()
    contenders = {f"one cell, {cpus} threads": (1, cpus), f"{cpus} cells, 1 thread each": (cpus, 1)}
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (processes, threads) in contenders.items():
            rates[name].append(steps_per_s(processes, threads, args.repeats))
    one, many = (statistics.median(rates[name]) for name in contenders)
    for name in contenders:
        print(
            f"{name}: {statistics.median(rates[name]):.3f} RL steps/s (rounds: {' '.join(f'{r:.3f}' for r in rates[name])})"
        )
    print(f"{cpus} cells x 1 thread / one cell x {cpus} threads: {many / one:.2f}x the grid's throughput")


if __name__ == "__main__":
    main()
