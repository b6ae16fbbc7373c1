"""Peak resident memory of the log-prob and update path at a large vocabulary, with the output
layer's log-softmax computed whole or in chunks of positions (``optim.logit_chunk_tokens``), and
with or without activation checkpointing (``optim.activation_checkpointing``).

Each setting runs in a fresh process (``ru_maxrss`` is a high-water mark): a Qwen2-shaped policy
(default hidden 128, 4 layers; ``--hidden``, ``--layers``, ``--intermediate``) with a
``--vocab``-entry vocabulary (random weights), in train mode, one batch of
``--rows`` rows x ``--response-tokens`` response tokens, and on it the trainer's no-gradient
log-prob forward, then the update's forward with gradient, its GRPO loss and backward, and one
AdamW step: the tensors a step's log-prob and update phases hold. Reports the resident memory
after set-up, the peak over the path, their difference, and the path's seconds.

    .venv/bin/python benchmarks/logit_memory.py --vocab 151936 --chunks 0 1024
    .venv/bin/python benchmarks/logit_memory.py --vocab 49152 --hidden 576 --layers 30 --intermediate 1536 \
        --heads 9 --kv-heads 3 --rows 8 --response-tokens 128 --chunks 128 --checkpointing off on  # SmolLM2-135M
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch

from _common import markdown_table


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def child(args: argparse.Namespace, chunk: int, checkpointing: bool) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
    from tokenbalance.algorithms.presets import get_method
    from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences
    from tokenbalance.trainer.precision import ForwardSettings
    from tokenbalance.trainer.update import UpdateSettings, update_forward
    from tokenbalance.types import UpdatePass

    vocab, rows, prompt_tokens, response_tokens = args.vocab, args.rows, args.prompt_tokens, args.response_tokens
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        tie_word_embeddings=True,
    )
    policy = Qwen2ForCausalLM(config).train()  # the update's mode (checkpointing acts only in training)
    if checkpointing:  # as optim.activation_checkpointing does
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    prompt = torch.randint(0, vocab, (rows, prompt_tokens))
    response = torch.randint(0, vocab, (rows, response_tokens))
    packed = pack_sequences(prompt, torch.ones_like(prompt), response, torch.ones_like(response))
    settings = ForwardSettings(chunk_tokens=chunk)
    method = get_method("grpo")
    mask_BT = torch.ones(rows, response_tokens, dtype=torch.bool)
    advantages_BT = torch.randn(rows, 1).expand(rows, response_tokens).contiguous()
    update_pass = UpdatePass("all", advantages_BT, mask_BT, mask_BT, mask_BT)
    before = resident_mb()
    start = time.perf_counter()
    old = batched_response_logprobs(policy, packed, temperature=1.0, micro_batch=rows, forward_settings=settings)
    update = UpdateSettings(
        temperature=1.0,
        mini_batch_rows=rows,
        micro_batch_rows=rows,
        grad_clip=1.0,
        token_mean_scope="mini_batch",
        forward_settings=settings,
    )
    current = update_forward(policy, packed, method, update)
    out = pass_loss(
        method,
        update_pass,
        current.logp_BT,
        old.logp_BT,
        old.logp_BT,  # the KL's reference: the old policy
        current.entropy_BT,
        normaliser=pass_normaliser(method, update_pass),
    )
    out.loss.backward()
    optimizer.step()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    return {"before_mb": before, "peak_mb": peak, "seconds": seconds, "loss": float(out.loss.detach())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--response-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024], help="0 = whole (today's path)")
    parser.add_argument("--checkpointing", nargs="+", choices=("off", "on"), default=["off"])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # CHUNK off|on
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args, int(args.child[0]), args.child[1] == "on")))
        return
    rows = []
    shape = ["--vocab", str(args.vocab), "--rows", str(args.rows), "--prompt-tokens", str(args.prompt_tokens)]
    shape += ["--response-tokens", str(args.response_tokens), "--hidden", str(args.hidden)]
    shape += ["--layers", str(args.layers), "--intermediate", str(args.intermediate)]
    shape += ["--heads", str(args.heads), "--kv-heads", str(args.kv_heads)]
    for chunk, checkpointing in [(chunk, on) for chunk in args.chunks for on in args.checkpointing]:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", str(chunk), checkpointing, *shape]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(f"chunk {chunk}, activation checkpointing {checkpointing}: {result}", flush=True)
        rows.append(
            [
                str(chunk or "whole"),
                checkpointing,
                f"{result['before_mb']:.0f}",
                f"{result['peak_mb']:.0f}",
                f"{result['peak_mb'] - result['before_mb']:.0f}",
                f"{result['seconds']:.2f}",
                f"{result['loss']:.6f}",
            ]
        )
    print(
        markdown_table(
            [
                "logit chunk (positions)",
                "activation checkpointing",
                "RSS after set-up (MiB)",
                "peak RSS (MiB)",
                "path's peak - set-up",
                "s",
                "loss",
            ],
            rows,
        )
    )
    logits_mb = args.rows * args.response_tokens * args.vocab * 4 / 2**20
    print(
        f"\nQwen2-shaped, hidden {args.hidden}, {args.layers} layers, MLP {args.intermediate}, heads "
        f"{args.heads} / {args.kv_heads}, vocabulary {args.vocab}, {args.rows} rows x {args.prompt_tokens} prompt + {args.response_tokens} "
        f"response tokens; one float32 [B, T, V] tensor is {logits_mb:.0f} MiB; {torch.get_num_threads()} thread(s)"
    )


if __name__ == "__main__":
    main()
