"""The reference policy's log-probs under bfloat16 autocast, its linear layers stored in bfloat16 once
(``trainer.precision.frozen_copy``, what a run does) against float32 weights that autocast converts in
every forward (before it): both copies of one policy, the same packed batch, the same micro-batches,
alternating round by round. Reports the median seconds of each, their ratio, whether the log-probs
are the same bits, and the bytes each copy's parameters hold.

    .venv/bin/python benchmarks/reference_forward.py --rounds 3                   # the benchmark model
    .venv/bin/python benchmarks/reference_forward.py --model /work/runs/smollm2/warm --rounds 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import BENCH_MODEL, bench_tokenizer, interleaved_medians, machine_line, markdown_table
from tokenbalance.models import build_tiny_model, load_policy, save_policy
from tokenbalance.threads import use_threads
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences
from tokenbalance.trainer.precision import ForwardSettings, frozen_copy


def parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a policy directory (default: the 1.1M-parameter benchmark model)")
    parser.add_argument("--rows", type=int, default=16, help="sequences in the batch (a step's P x G)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    use_threads(args.threads)
    path = args.model
    if path is None:
        path = str(Path(tempfile.mkdtemp(prefix="tokenbalance-bench-reference-")) / "policy")
        tokenizer = bench_tokenizer()
        save_policy(build_tiny_model(BENCH_MODEL, tokenizer, seed=0), tokenizer, path)
    policy, _ = load_policy(path)
    generator = torch.Generator().manual_seed(0)
    vocab = policy.config.vocab_size
    prompt = torch.randint(3, vocab, (args.rows, args.prompt_tokens), generator=generator)
    response = torch.randint(3, vocab, (args.rows, args.response_tokens), generator=generator)
    packed = pack_sequences(prompt, torch.ones_like(prompt), response, torch.ones_like(response))
    settings = ForwardSettings(torch.bfloat16)
    copies = {
        "converted per forward": frozen_copy(policy, None),
        "stored in bfloat16": frozen_copy(policy, torch.bfloat16),
    }
    del policy

    def logprobs(model):
        return lambda: (
            batched_response_logprobs(
                model, packed, temperature=1.0, micro_batch=args.micro_batch, forward_settings=settings
            ).logp_BT
        )

    medians, results = interleaved_medians({name: logprobs(model) for name, model in copies.items()}, args.rounds)
    rows = [[name, f"{medians[name]:.3f}", f"{parameter_bytes(model) / 2**20:.3f}"] for name, model in copies.items()]
    print(markdown_table(["reference weights", "log-probs (s)", "parameters (MiB)"], rows))
    same = torch.equal(*results.values())
    print(
        f"\n{path}; {args.rows} rows x ({args.prompt_tokens} + {args.response_tokens}) tokens in micro-batches of "
        f"{args.micro_batch}; {args.threads} thread(s); medians over {args.rounds} rounds after a warm-up; "
        f"converted / stored: {medians['converted per forward'] / medians['stored in bfloat16']:.2f}x; "
        f"same bits: {'yes' if same else 'NO'}; {machine_line()}"
    )


if __name__ == "__main__":
    main()
