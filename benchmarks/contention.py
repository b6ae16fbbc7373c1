"""The RL step and the rollout on a shared machine: tokenbalance's threading policy against torch's
defaults, alone and beside one competing busy process, as ratios measured in one run.

Each measurement is a fresh process (OpenMP reads its wait policy once, when torch loads) running
benchmarks/_contention_child.py on the embedded default (the SFT-warmed tiny policy, 16 prompts x
8 responses): ``step`` times ``rl_step`` (rollout, log-probs, the AR + Lopti update), ``rollout``
the sampling alone, ``product`` the issue's loop of 200 products at the tiny model's shapes. Both
policies use every CPU (2 threads here). The competitor is a Python loop that keeps one core busy
for the whole measurement. Conditions run round-robin, ``--rounds`` times, so a slow spell of the
machine hits every condition alike; the table gives ratios of medians over rounds, and for the
quiet case also the median of the per-round ratios (printed per round above the table).

    .venv/bin/python benchmarks/contention.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _common import markdown_table
from tokenbalance.threads import AUTO_ENV

HERE = Path(__file__).resolve().parent
POLICIES = ("tokenbalance", "torch")
LOADS = ("alone", "beside a busy process")
OURS = ("MKL_DYNAMIC", "OMP_WAIT_POLICY", AUTO_ENV)


def measure(policy: str, work: str, load: str, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load != "alone" else None
    try:
        out = subprocess.run(
            [sys.executable, str(HERE / "_contention_child.py"), "--policy", policy, "--work", work]
            + ["--repeats", str(repeats)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=4, help="timed repeats inside each measurement")
    parser.add_argument("--work", nargs="+", default=["step", "rollout", "product"])
    parser.add_argument(
        "--quiet-only", action="store_true", help="only the quiet machine (many rounds resolve a few percent)"
    )
    args = parser.parse_args()
    loads = LOADS[:1] if args.quiet_only else LOADS
    seconds: dict[tuple, list[float]] = {}
    chosen: dict[tuple, dict] = {}
    chosen_all: dict[tuple, list[dict]] = {}
    for _ in range(args.rounds):
        for work in args.work:
            for load in loads:
                for policy in POLICIES:
                    result = measure(policy, work, load, args.repeats)
                    seconds.setdefault((work, load, policy), []).append(result["median_s"])
                    chosen[(work, load, policy)] = result["chosen"]
                    if policy == "tokenbalance":
                        chosen_all.setdefault((work, load), []).append(result["chosen"])
    rows = []
    for work in args.work:
        quiet_ratios = [
            a / b for a, b in zip(seconds[(work, LOADS[0], "tokenbalance")], seconds[(work, LOADS[0], "torch")])
        ]
        passive = sum(c.get("OMP_WAIT_POLICY") == "PASSIVE" for c in chosen_all[(work, LOADS[0])])
        print(
            f"{work}: policy / defaults alone, per round: {' '.join(f'{r:.3f}' for r in quiet_ratios)} "
            f"(the policy chose PASSIVE alone in {passive} of {args.rounds} rounds)"
        )
        if args.quiet_only:
            continue
        quiet = {p: statistics.median(seconds[(work, LOADS[0], p)]) for p in POLICIES}
        busy = {p: statistics.median(seconds[(work, LOADS[1], p)]) for p in POLICIES}
        policy_busy = chosen[(work, LOADS[1], "tokenbalance")].get("OMP_WAIT_POLICY") or "default"
        rows.append(
            [
                work,
                f"{quiet['torch']:.3f}",
                f"{quiet['tokenbalance'] / quiet['torch']:.3f} (paired: {statistics.median(quiet_ratios):.3f})",
                f"{busy['torch'] / quiet['torch']:.2f}x",
                f"{busy['tokenbalance'] / quiet['torch']:.2f}x ({policy_busy})",
                f"{busy['torch'] / busy['tokenbalance']:.2f}x",
            ]
        )
    if args.quiet_only:
        return
    print(
        markdown_table(
            [
                "work",
                "torch defaults alone (s)",
                "policy / defaults, alone",
                "defaults beside a busy process (slowdown)",
                "policy beside a busy process (slowdown, wait policy)",
                "policy speed-up beside a busy process",
            ],
            rows,
        )
    )
    print(
        f"\n{os.cpu_count()} CPUs; ratios of medians over {args.rounds} rounds ({args.repeats} timed repeats each; "
        "'paired': the median over rounds of the ratio within a round); slowdowns against torch's defaults alone"
    )


if __name__ == "__main__":
    main()
