"""The RL step on a shared machine: tokenbalance's threading policy against torch's defaults, alone
and beside a competing job started before, with or after the run, as ratios measured in one run.

Each measurement is a fresh process (OpenMP reads its wait policy once, when torch loads) running
benchmarks/_contention_child.py on the embedded default (the SFT-warmed tiny policy, 16 prompts x
8 responses): ``--work step`` times ``rl_step`` (rollout, log-probs, the AR + Lopti update),
``rollout`` the sampling alone, ``product`` a loop of 200 products at the tiny model's shapes. Both
policies start with every CPU; tokenbalance's then adapts the count between phases
(``train.threads=0``, tokenbalance/threads.py), torch's keeps it.

The competitor (``--competitor torch``, the default) is a real torch job: a loop of 256 x 256
matrix products with torch's default threads and wait policy, as a second run or a test suite
would be; ``python`` is a loop that holds one core. It starts ``before`` the run (ready, then
``--lead-s`` seconds before the run starts, so the start-up sample sees it), ``with`` it (both
launched at once: the start-up sample does not see it) or ``after`` it (once the run's first timed
repeat has ended). A repeat counts as beside the competitor when it started after the competitor
had loaded torch. Conditions run round-robin, ``--rounds`` times; the table gives medians over all
counted repeats and their ratios to the same policy alone (and to torch's defaults alone).

    .venv/bin/python benchmarks/contention.py --rounds 2 --repeats 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import markdown_table
from tokenbalance.threads import AUTO_ENV

HERE = Path(__file__).resolve().parent
POLICIES = ("tokenbalance", "torch")
STARTS = ("alone", "before", "with", "after")
OURS = ("MKL_DYNAMIC", "OMP_WAIT_POLICY", AUTO_ENV)
COMPETITORS = {
    "torch": "import torch\na, b = torch.randn(256, 256), torch.randn(256, 256)\nprint('ready', flush=True)\n"
    "while True:\n    a @ b",
    "python": "print('ready', flush=True)\nwhile True: pass",
}


def clean_env() -> dict[str, str]:
    """The environment without the variables tokenbalance's policy sets (each process decides)."""
    return {k: v for k, v in os.environ.items() if k not in OURS}


def start_competitor(kind: str) -> tuple[subprocess.Popen, float]:
    """The competitor, once it is ready (torch loaded): the process and the wall-clock time."""
    process = subprocess.Popen(
        [sys.executable, "-c", COMPETITORS[kind]], env=clean_env(), stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    process.stdout.readline()
    return process, time.time()


def measure(policy: str, work: str, start: str, repeats: int, competitor_kind: str, lead_s: float) -> dict:
    """One child run; returns its repeats' seconds counted for ``start`` and what it chose."""
    competitor, ready = None, float("inf")
    command = [sys.executable, str(HERE / "_contention_child.py"), "--policy", policy, "--work", work]
    command += ["--repeats", str(repeats)]
    try:
        if start == "before":
            competitor, ready = start_competitor(competitor_kind)
            time.sleep(lead_s)
        child = subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE, text=True)
        if start == "with":
            competitor, ready = start_competitor(competitor_kind)
        assert child.stdout is not None
        lines = []
        for line in child.stdout:
            lines.append(json.loads(line))
            if start == "after" and competitor is None and "start" in lines[-1]:
                competitor, ready = start_competitor(competitor_kind)
        if child.wait() != 0:
            raise RuntimeError(f"{' '.join(command)} failed")
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    final = lines[-1]
    counted = [s for s in final["steps"] if start == "alone" or s["start"] >= ready]
    return {
        "seconds": [s["seconds"] for s in counted],
        "threads": [s["threads"] for s in counted],
        "chosen": final["chosen"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=6, help="timed repeats inside each measurement")
    parser.add_argument("--work", default="step", choices=("step", "rollout", "product"))
    parser.add_argument("--competitor", default="torch", choices=tuple(COMPETITORS))
    parser.add_argument("--lead-s", type=float, default=3.0, help="'before': how long the competitor runs first")
    parser.add_argument("--starts", nargs="+", default=list(STARTS), choices=STARTS)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    args = parser.parse_args()
    policies = args.policies
    starts = ["alone", *[s for s in args.starts if s != "alone"]]
    seconds: dict[tuple[str, str], list[float]] = {}
    threads: dict[tuple[str, str], list[int]] = {}
    wait_policy: dict[tuple[str, str], str] = {}
    for round_ in range(args.rounds):
        for start in starts:
            for policy in policies:
                result = measure(policy, args.work, start, args.repeats, args.competitor, args.lead_s)
                seconds.setdefault((start, policy), []).extend(result["seconds"])
                threads.setdefault((start, policy), []).extend(result["threads"])
                wait_policy[(start, policy)] = result["chosen"].get("OMP_WAIT_POLICY") or "default"
                print(
                    f"round {round_ + 1} {start:>6} {policy:>12}: "
                    f"{' '.join(f'{s:.2f}' for s in result['seconds'])} s, threads {result['threads']}",
                    flush=True,
                )
    medians = {key: statistics.median(values) if values else float("nan") for key, values in seconds.items()}
    torch_alone = medians.get(("alone", "torch"), float("nan"))
    rows = []
    for policy in policies:
        alone = medians[("alone", policy)]
        row = [policy, f"{alone:.2f}", f"{alone / torch_alone:.3f}"]
        for start in starts[1:]:
            ratio, against_torch = medians[(start, policy)] / alone, medians[(start, policy)] / torch_alone
            counted = len(seconds[(start, policy)])
            used = sorted(set(threads[(start, policy)]))
            row.append(
                f"{ratio:.2f}x ({against_torch:.2f}x; n={counted}; threads {used}; {wait_policy[(start, policy)]})"
            )
        rows.append(row)
    print()
    print(
        markdown_table(
            ["policy", "alone (s)", "alone / torch alone", *[f"competitor started {s} the run" for s in starts[1:]]],
            rows,
        )
    )
    print(
        f"\n{os.cpu_count()} CPUs; work {args.work}; competitor {args.competitor}; medians over {args.rounds} rounds "
        f"of the repeats counted (n); each cell: beside / the same policy alone (beside / torch's defaults alone; "
        "the thread counts seen after the counted repeats; the wait policy chosen at start)"
    )


if __name__ == "__main__":
    main()
