"""One measurement of benchmarks/contention.py, in its own process (the threading environment is read
once, when torch loads): ``--policy tokenbalance`` chooses it as the CLI does, ``--policy torch``
leaves torch's defaults (and, for ``step``, no thread adapter). Prints a JSON line as each timed
repeat ends (its wall-clock start, seconds and torch's thread count after it), then one with the
median seconds of the repeats."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable

from tokenbalance.threads import prepare_process


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policy", choices=("tokenbalance", "torch"), required=True)
    parser.add_argument("--work", choices=("step", "rollout", "product"), required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="with --policy tokenbalance: train.threads (0 = all)")
    args = parser.parse_args()
    chosen = prepare_process() if args.policy == "tokenbalance" else {}
    import torch  # after the policy: OpenMP reads it when torch loads

    from tokenbalance.threads import use_threads

    threads = use_threads(args.threads) if args.policy == "tokenbalance" else torch.get_num_threads()
    work: Callable[[int], object]
    if args.work == "product":  # the loop: the tiny model's shapes, 64 x 128 by 128 x 512
        a, b = torch.randn(64, 128), torch.randn(128, 512)

        def products(_: int) -> None:
            for _ in range(200):
                a @ b

        work = products
    else:
        from _rl_batch import embedded_batch
        from tokenbalance.trainer.loop import rl_step, rollout

        parts = embedded_batch().parts
        if args.policy == "torch":  # torch's defaults: a fixed count, whatever the load
            parts.runtime = dataclasses.replace(parts.runtime, threads=None)
        work = (lambda s: rl_step(parts, s)) if args.work == "step" else (lambda s: rollout(parts, s))
    work(0)  # warm-up
    seconds, steps = [], []
    for step in range(1, args.repeats + 1):
        wall, start = time.time(), time.perf_counter()
        work(step)
        seconds.append(time.perf_counter() - start)
        steps.append({"start": wall, "seconds": seconds[-1], "threads": torch.get_num_threads()})
        print(json.dumps(steps[-1]), flush=True)
        sys.stdout.flush()
    print(json.dumps({"median_s": statistics.median(seconds), "threads": threads, "chosen": chosen, "steps": steps}))


if __name__ == "__main__":
    main()
