"""``tokenbalance sft``: the supervised warm start, saved as a Hugging Face directory.

Without ``--model`` it trains the embedded tokenizer and tiny model from scratch; with it, it
fine-tunes that local model. The result is what ``tokenbalance train --model DIR`` starts from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenbalance.commands.train import add_config_arguments, config_from_args, printed_config_help


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("sft", help="supervised warm start on generated K&K solutions")
    add_config_arguments(parser)
    parser.add_argument("--out", required=True, help="output directory (Hugging Face format)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.models import load_policy, save_policy
    from tokenbalance.trainer.embedded import build_embedded_policy
    from tokenbalance.trainer.runner import resolve_device
    from tokenbalance.trainer.sft import run_sft, sft_pairs

    config = config_from_args(args)
    device = resolve_device(config.train.device)
    out = Path(args.out)
    if config.model.path is None:
        summary = build_embedded_policy(config, out, device=device, progress=config.output.progress)
    else:
        model, tokenizer = load_policy(config.model.path, device=device)
        losses = run_sft(
            model,
            tokenizer,
            sft_pairs(config.data, config.sft),
            config.sft,
            seed=config.train.seed,
            max_prompt_tokens=config.data.max_prompt_tokens,
            device=device,
            progress=config.output.progress,
        )
        save_policy(model, tokenizer, out)
        summary = {"sft_final_loss": sum(losses[-20:]) / len(losses[-20:])}
    print(f"saved the SFT policy to {out} (final loss {summary['sft_final_loss']:.4f})")
    return 0
