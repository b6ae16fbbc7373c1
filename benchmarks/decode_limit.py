"""The fast engine against the arithmetic limit at the reasoning testbed's shapes, one thread.

The limit is the time the generation's necessary arithmetic would take at the machine's measured
matrix-multiply rate (a 512 x 512 float32 product at one thread, the reference the update's FLOP
rate uses in benchmarks/update_cost.py): every linear layer (the output layer included) once per
distinct prompt token and once per generated token, and attention's two products (q.k and p.v) over
each generated token's context. Only the tokens a row really generates count (up to and including its
EOS): the work spent on rows that have finished, on padding, sampling and bookkeeping is what the
engine loses to the limit.

    .venv/bin/python benchmarks/decode_limit.py --model runs/testbed/cot34/sft --repeats 3

Cases: an RL step of the testbed (8 prompts x 8, T = 1) and an evaluation's layout (32 distinct
prompts, greedy), 440 new tokens allowed.
"""

from __future__ import annotations

import argparse

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import interleaved_medians, machine_line, markdown_table, matmul_flops_per_s
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import load_policy
from tokenbalance.rollout.fast import FastEngine
from tokenbalance.trainer.data import eval_examples
from tokenbalance.trainer.scoring import encode_prompts


def linear_flops_per_token(model: torch.nn.Module) -> int:
    """2 x the multiply-adds of every linear layer (the output layer included) for one token."""
    return sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))


def attention_flops(config, context: int) -> int:
    """q.k and p.v for one query over ``context`` positions, every layer and head."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * context


def necessary_flops(model, prompts: list[list[int]], n: int, lengths_B: torch.Tensor) -> int:
    """Prefill of each distinct prompt once, then each row's generated tokens over their context."""
    per_token = linear_flops_per_token(model)
    total = 0
    for prompt in prompts:
        total += len(prompt) * per_token + sum(attention_flops(model.config, k + 1) for k in range(len(prompt)))
    for row, length in enumerate(lengths_B.tolist()):
        prompt_len = len(prompts[row // n])
        total += length * per_token + sum(attention_flops(model.config, prompt_len + k + 1) for k in range(length))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a policy directory (the testbed's SFT policy)")
    parser.add_argument("--max-new-tokens", type=int, default=440)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy, tokenizer = load_policy(args.model, device="cpu")
    config = apply_overrides(
        RunConfig(), ["data.eval_set=validation", "data.eval_difficulties=[3,4]", "data.eval_count=32"]
    )
    prompts = encode_prompts(tokenizer, eval_examples(config.data), config.data.max_prompt_tokens)
    cases = {
        "RL step, 8 prompts x 8, T = 1": dict(prompts=prompts[:8], n=8, temperature=1.0),
        "evaluation, 32 prompts, greedy": dict(prompts=prompts, n=1, temperature=0.0),
    }
    rate = matmul_flops_per_s(512)
    rows = []
    for label, case in cases.items():
        kwargs = dict(case)
        chosen = kwargs.pop("prompts")
        engine = FastEngine(policy, tokenizer)

        def generate(engine=engine, chosen=chosen, kwargs=kwargs):
            return engine.generate(chosen, max_new_tokens=args.max_new_tokens, seed=3, **kwargs)

        seconds, outputs = interleaved_medians({label: generate}, args.repeats, warmup=1)
        out = outputs[label]
        lengths_B = out.response_mask_BT.sum(1)
        flops = necessary_flops(policy, chosen, kwargs["n"], lengths_B)
        limit = flops / rate
        rows.append(
            [
                label,
                f"{int(lengths_B.sum()):,}",
                f"{flops / 1e9:.1f}",
                f"{seconds[label]:.2f}",
                f"{limit:.2f}",
                f"{limit / seconds[label]:.0%}",
            ]
        )
    header = ["case", "generated tokens", "necessary GFLOP", "engine (s)", "limit (s)", "engine at % of limit"]
    print(markdown_table(header, rows))
    print(f"\nmatmul rate (512 x 512 float32, one thread, same run): {rate / 1e9:.1f} GFLOP/s")
    print(machine_line())


if __name__ == "__main__":
    main()
