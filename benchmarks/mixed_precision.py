"""The RL step in float32 and under bfloat16 autocast (``model.autocast=bfloat16``, float32 master
weights), paired in one process: the same policy, batch shape and threads, the two precisions
alternating step by step for ``--rounds`` rounds, so a slow spell of the machine hits both alike.
Reports the median seconds of each phase (rollout, log-probs, update, the step) per precision and
their ratios, the median of the per-round step ratios, and the peak resident memory.
``--per-forward-casts`` adds a third contender: bfloat16 autocast with every forward converting the
weights again (``ForwardSettings.keep_weight_casts`` off, and a float32 reference policy), as before
``trainer.precision.weight_casts_kept`` (one conversion per optimizer step) and ``frozen_copy`` (a reference
stored in the compute type) existed. Under a KL term (every K&K preset) each contender runs its own reference:
float32 for float32 and the per-forward contender, stored in bfloat16 for bfloat16 autocast.

The policy trains as it goes (one AdamW step per step, at the config's lr), so the steps are
those of a real run; each precision draws the same prompts (the step index is the round's).

    .venv/bin/python benchmarks/mixed_precision.py --rounds 5                 # the embedded default
    .venv/bin/python benchmarks/mixed_precision.py --model /work/models/smollm2 --rounds 2 \\
        --set data.template=qwen-instruct --set rollout.prompts_per_step=2 --set rollout.group_size=8 \\
        --set rollout.max_new_tokens=64 --set optim.lr=1e-6 --set data.max_prompt_tokens=320
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import markdown_table
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import load_policy
from tokenbalance.threads import use_threads
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.embedded import ensure_embedded_policy
from tokenbalance.trainer.loop import peak_memory_mb, prepare_training, rl_step
from tokenbalance.trainer.precision import ForwardSettings, frozen_copy

PRECISIONS = {"float32": ForwardSettings(), "bfloat16 autocast": ForwardSettings(compute_dtype=torch.bfloat16)}
PER_FORWARD = "bfloat16, casts per forward"
PHASES = ("rollout", "logprob", "update", "step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a policy directory (default: the embedded tiny policy)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (fixed: the count is not adapted)")
    parser.add_argument("--set", action="append", default=[], help="config overrides, as tokenbalance train's")
    parser.add_argument(
        "--per-forward-casts", action="store_true", help="also time bfloat16 with the weights converted per forward"
    )
    args = parser.parse_args()
    config = apply_overrides(RunConfig(), [*args.set, f"train.threads={args.threads}", "output.progress=false"])
    use_threads(args.threads)
    device = torch.device("cpu")
    path = args.model or str(ensure_embedded_policy(config, device=device, progress=False, log=lambda *_: None))
    if args.model:
        config.model.path = args.model
    policy, tokenizer = load_policy(path, device=device)
    run_dir = Path(tempfile.mkdtemp(prefix="tokenbalance-bench-mixed-"))
    parts = prepare_training(config, run_dir, policy, tokenizer, device, DistContext(device=device))
    per_forward = ForwardSettings(compute_dtype=torch.bfloat16, keep_weight_casts=False)
    contenders = {**PRECISIONS, **({PER_FORWARD: per_forward} if args.per_forward_casts else {})}
    settings = {
        name: dataclasses.replace(parts.settings, forward_settings=forward) for name, forward in contenders.items()
    }
    stored = {
        name: forward.compute_dtype if forward.keep_weight_casts else None for name, forward in contenders.items()
    }
    references = {dtype: frozen_copy(policy, dtype) for dtype in set(stored.values())} if parts.state.reference else {}
    seconds: dict[tuple[str, str], list[float]] = {}
    step_ratios, cast_ratios = [], []
    for round_ in range(args.rounds + 1):  # round 0 warms both up
        step_s = {}
        for name in contenders:
            parts.settings = settings[name]
            parts.state.reference = references.get(stored[name])
            parts.state.data_position = round_ * parts.settings.prompts_per_step  # all draw the same prompts
            metrics = rl_step(parts, round_)
            step_s[name] = metrics["timing/step_s"]
            if round_:
                for phase in PHASES:
                    seconds.setdefault((name, phase), []).append(metrics.get(f"timing/{phase}_s", 0.0))
            print(
                f"round {round_}{' (warm-up)' if not round_ else ''} {name}: step {metrics['timing/step_s']:.2f} s "
                f"(rollout {metrics['timing/rollout_s']:.2f}, log-probs {metrics.get('timing/logprob_s', 0):.2f}, "
                f"update {metrics['timing/update_s']:.2f}), mean response {metrics['response/len_mean']:.0f} tokens, "
                f"reward {metrics['reward/mean']:.3f}",
                flush=True,
            )
        if round_:
            step_ratios.append(step_s["float32"] / step_s["bfloat16 autocast"])
            if PER_FORWARD in step_s:
                cast_ratios.append(step_s[PER_FORWARD] / step_s["bfloat16 autocast"])
    medians = {key: statistics.median(values) for key, values in seconds.items()}
    rows = [
        [
            phase,
            *(f"{medians[(name, phase)]:.3f}" for name in contenders),
            f"{medians[('float32', phase)] / max(medians[('bfloat16 autocast', phase)], 1e-9):.2f}x",
        ]
        for phase in PHASES
    ]
    print()
    print(markdown_table(["phase", *(f"{name} (s)" for name in contenders), "float32 / bfloat16"], rows))
    print(
        f"\n{path}; {args.threads} thread(s); medians over {args.rounds} rounds; paired step ratio (median of "
        f"per-round float32 / bfloat16): {statistics.median(step_ratios):.2f}x; "
        f"peak RSS {peak_memory_mb(device)['peak_rss_mb']:.0f} MiB"
    )
    if cast_ratios:
        print(f"paired step ratio, casts per forward / kept: {statistics.median(cast_ratios):.2f}x")


if __name__ == "__main__":
    main()
