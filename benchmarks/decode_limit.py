"""The fast engine against the arithmetic limit at the reasoning testbed's shapes, one thread.

The limit is the time the generation's necessary arithmetic would take at the machine's measured
matrix-multiply rate (a 512 x 512 float32 product at one thread, the reference the update's FLOP
rate uses in benchmarks/update_cost.py): every linear layer (the output layer included) once per
distinct prompt token and once per generated token, and attention's two products (q.k and p.v) over
each generated token's context. A second limit uses the rate of the model's own linear layers on a full decode batch (rows x hidden
products, far below the square product's rate at this model's size): what is left above it is
overhead (attention, sampling, Python), not small matrices. A third, the memory limit, is the time
to read what a decode must read at the least (every weight once per step, each prompt's keys and
values once per step for its group, each row's own keys and values at each of its tokens) at the
bandwidth of a large copy: decoding at these shapes reads far more bytes per FLOP than a matrix
product, so this is the bound that can bind. Only the tokens a row really generates count (up to and including its
EOS): the work spent on rows that have finished, on padding, sampling and bookkeeping is what the
engine loses to the limit.

    .venv/bin/python benchmarks/decode_limit.py --model runs/testbed/cot34/sft --repeats 3

Cases: an RL step of the testbed (8 prompts x 8, T = 1) and an evaluation's layout (32 distinct
prompts, greedy), 440 new tokens allowed. After the table, one more call of each case runs under
torch's profiler and the operators taking the most time are listed with their shares: whether the
time goes to the products or to everything between them.
"""

from __future__ import annotations

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import (
    interleaved_medians,
    machine_line,
    markdown_table,
    matmul_flops_per_s,
    profile_shares,
    testbed_policy_and_prompts,
)
from tokenbalance.rollout import FastEngine, SamplingParams


def linear_flops_per_token(model: torch.nn.Module) -> int:
    """2 x the multiply-adds of every linear layer (the output layer included) for one token."""
    return sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def attention_flops(config, context: int) -> int:
    """q.k and p.v for one query over ``context`` positions, every layer and head."""
    return 2 * 2 * config.num_hidden_layers * config.num_attention_heads * head_dim(config) * context


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


def necessary_bytes(model, prompts: list[list[int]], n: int, lengths_B: torch.Tensor) -> int:
    """The memory a decode must read at the least: every weight once per decode step, each group's
    prompt keys and values once per step while any of its rows decodes, and each row's own response
    keys and values at each of its tokens (float32)."""
    config = model.config
    kv_per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim(config) * 4
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    total = int(lengths_B.max()) * weights
    for group, prompt in enumerate(prompts):
        group_lengths = lengths_B[group * n : (group + 1) * n]
        total += int(group_lengths.max()) * len(prompt) * kv_per_position
        total += sum(length * (length - 1) // 2 for length in group_lengths.tolist()) * kv_per_position
    return total


def copy_bytes_per_s(megabytes: int = 256, repeats: int = 10) -> float:
    """Memory bandwidth of a large float32 copy at one thread (bytes read plus written, per second)."""
    source = torch.randn(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    seconds, _ = interleaved_medians({"copy": lambda: target.copy_(source)}, repeats, warmup=2)
    return 2 * source.numel() * 4 / seconds["copy"]


def decode_shape_rate(model: torch.nn.Module, rows: int, repeats: int = 50) -> float:
    """FLOP/s of the model's own linear layers applied to ``rows`` vectors, one layer after another
    (what a decode step of ``rows`` rows multiplies, without attention or anything between)."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(rows, m.in_features) for m in layers]

    def products():
        with torch.no_grad():
            for layer, x in zip(layers, inputs):
                torch.nn.functional.linear(x, layer.weight)

    seconds, _ = interleaved_medians({"linear": products}, repeats, warmup=3)
    return rows * linear_flops_per_token(model) / seconds["linear"]


def main() -> None:
    args, policy, tokenizer, prompts = testbed_policy_and_prompts(__doc__.split("\n\n")[0])
    cases = {
        "RL step, 8 prompts x 8, T = 1": dict(prompts=prompts[:8], n=8, temperature=1.0),
        "evaluation, 32 prompts, greedy": dict(prompts=prompts, n=1, temperature=0.0),
    }
    rate = matmul_flops_per_s(512)
    bandwidth = copy_bytes_per_s()
    rows = []
    shape_rates = {}
    per_step = {}
    calls = {}
    for label, case in cases.items():
        kwargs = dict(case)
        chosen = kwargs.pop("prompts")
        engine = FastEngine(policy, tokenizer)

        def generate(engine=engine, chosen=chosen, kwargs=kwargs):
            sampling = {k: v for k, v in kwargs.items() if k != "n"}
            return engine.generate(chosen, SamplingParams(args.max_new_tokens, seed=3, **sampling), n=kwargs["n"])

        calls[label] = generate
        seconds, outputs = interleaved_medians({label: generate}, args.repeats, warmup=1)
        out = outputs[label]
        lengths_B = out.response_mask_BT.sum(1)
        flops = necessary_flops(policy, chosen, kwargs["n"], lengths_B)
        limit = flops / rate
        batch_rows = len(chosen) * kwargs["n"]
        shape_rates[batch_rows] = shape_rate = decode_shape_rate(policy, batch_rows)
        shape_limit = flops / shape_rate
        memory_limit = necessary_bytes(policy, chosen, kwargs["n"], lengths_B) / bandwidth
        per_step[label] = seconds[label] / int(lengths_B.max())
        rows.append(
            [
                label,
                f"{int(lengths_B.sum()):,}",
                f"{flops / 1e9:.1f}",
                f"{seconds[label]:.2f}",
                f"{limit:.2f}",
                f"{limit / seconds[label]:.0%}",
                f"{shape_limit:.2f}",
                f"{shape_limit / seconds[label]:.0%}",
                f"{memory_limit:.2f}",
                f"{memory_limit / seconds[label]:.0%}",
            ]
        )
    header = [
        "case",
        "generated tokens",
        "necessary GFLOP",
        "engine (s)",
        "limit (s)",
        "engine at % of limit",
        "limit at the decode shapes' rate (s)",
        "engine at % of it",
        "memory limit (s)",
        "engine at % of it",
    ]
    print(markdown_table(header, rows))
    print(f"\nmatmul rate (512 x 512 float32, one thread, same run): {rate / 1e9:.1f} GFLOP/s")
    for label, seconds_per_step in per_step.items():
        print(f"{label}: {seconds_per_step * 1e3:.1f} ms per decode step (engine time / longest response)")
    print(f"memory bandwidth (a 256 MiB float32 copy, one thread, same run): {bandwidth / 1e9:.1f} GB/s")
    for batch_rows, shape_rate in shape_rates.items():
        print(
            f"the model's linear layers on {batch_rows} rows at a time (a full decode batch): {shape_rate / 1e9:.1f} GFLOP/s"
        )
    for label, generate in calls.items():
        print()
        print(profile_shares(generate, label))
    print(machine_line())


if __name__ == "__main__":
    main()
