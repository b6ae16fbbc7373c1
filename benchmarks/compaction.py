"""The fast engine with and without compaction (finished rows leave the batch), on one policy
directory and held-out K&K prompts, one thread: wall time of each and whether every token,
log-prob and mask is identical.

    .venv/bin/python benchmarks/compaction.py --model runs/testbed/cot34/sft --repeats 3

Cases: an RL step of the reasoning testbed (8 prompts x 8 samples, T = 1), 32 distinct prompts
sampled and greedy (an evaluation's layout), and a truncated distribution (top-k 20, top-p 0.9).
"""

from __future__ import annotations

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import interleaved_medians, testbed_policy_and_prompts
from tokenbalance.rollout import FastEngine, SamplingParams

FIELDS = ("response_ids_BT", "response_mask_BT", "sampler_logp_BT", "finished_B")


def main() -> None:
    args, policy, tokenizer, prompts = testbed_policy_and_prompts(__doc__.split("\n\n")[0])
    cases = {
        "RL step, 8 prompts x 8, T = 1": dict(prompts=prompts[:8], n=8, temperature=1.0),
        "32 prompts, T = 1": dict(prompts=prompts, n=1, temperature=1.0),
        "32 prompts, greedy": dict(prompts=prompts, n=1, temperature=0.0),
        "8 prompts x 8, top-k 20, top-p 0.9": dict(prompts=prompts[:8], n=8, temperature=1.0, top_k=20, top_p=0.9),
    }
    print("| case | mean response tokens | full batch (s) | compacted (s) | speed-up | identical |")
    print("|---|---:|---:|---:|---:|---|")
    for label, case in cases.items():
        kwargs = dict(case)
        chosen = kwargs.pop("prompts")

        def generate(compact: bool, chosen=chosen, kwargs=kwargs):
            engine = FastEngine(policy, tokenizer, compact=compact)
            sampling = {k: v for k, v in kwargs.items() if k != "n"}
            return engine.generate(chosen, SamplingParams(args.max_new_tokens, seed=3, **sampling), n=kwargs["n"])

        seconds, outputs = interleaved_medians(
            {"full": lambda: generate(False), "compacted": lambda: generate(True)}, args.repeats, warmup=0
        )
        full, compacted = outputs["full"], outputs["compacted"]
        same = all(torch.equal(getattr(full, f), getattr(compacted, f)) for f in FIELDS)
        length = float(full.response_mask_BT.sum(1).double().mean())
        print(
            f"| {label} | {length:.0f} | {seconds['full']:.2f} | {seconds['compacted']:.2f} | "
            f"{seconds['full'] / seconds['compacted']:.2f}x | {same} |"
        )


if __name__ == "__main__":
    main()
