"""``tokenbalance sft``: the supervised warm start, saved as a Hugging Face directory.

Without ``--model`` it trains the embedded tokenizer and tiny model from scratch; with it, it fine-tunes that local
model. The targets are the generated task's (K&K, arith), or with ``--data --eval-data --reward --target-column`` the
target column of your rows. The result is what ``tokenbalance train --model DIR`` starts from."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenbalance.commands.train import add_config_arguments, config_from_args, nonempty, printed_config_help


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    summary = "supervised warm start on generated solutions (K&K, arith) or on your rows' --target-column"
    parser = subparsers.add_parser("sft", help=summary, description=summary + " (docs/tasks.md)")
    add_config_arguments(parser)
    parser.add_argument(
        "--out",
        required=True,
        type=nonempty,
        help="output directory (Hugging Face format): a new or empty directory, or with --force one an earlier "
        "`tokenbalance sft` wrote",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an SFT policy an earlier `tokenbalance sft` wrote to --out (never a directory holding "
        "other files)",
    )
    parser.set_defaults(func=run)


def check_out_dir(out: Path, *, force: bool) -> None:
    """``ValueError`` unless the SFT policy may be written to ``out``: a new or empty directory, or (with ``force``)
    one holding only the files an earlier ``tokenbalance sft`` recorded writing."""
    from tokenbalance.outputs import check_output_dir
    from tokenbalance.trainer.embedded import sft_written_files

    ours = sft_written_files(out) if out.is_dir() else set()
    check_output_dir(out, "--out", force=force, ours=ours, writer="`tokenbalance sft`", what="an SFT policy")


def run(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.checks import check_choice
    from tokenbalance.config import absolute_paths
    from tokenbalance.models import check_policy_dir, load_policy
    from tokenbalance.run.examples import check_sft_target, sft_pairs, task_for
    from tokenbalance.trainer.embedded import build_embedded_policy, sft_and_save, sft_checkpoint_dir
    from tokenbalance.trainer.runner import compute_device

    config = absolute_paths(config_from_args(args))
    if config.model.autocast != "off":
        raise ValueError(
            f"model.autocast={config.model.autocast}: the SFT computes in float32 (autocast applies to RL runs, "
            "evaluations and diagnostics); leave it off here"
        )
    out = Path(args.out)
    check_out_dir(out, force=args.force)  # before any work: nothing of the user's is ever replaced
    task = task_for(config.data)
    check_choice("data.template", config.data.template, task.templates)
    check_sft_target(task, config.sft)
    device = compute_device(config)
    if config.model.path is not None:
        check_policy_dir(config.model.path)
    checkpoints = sft_checkpoint_dir(out) if config.sft.save_every else None  # a stopped SFT continues
    if config.model.path is None:
        summary = build_embedded_policy(
            config, out, device=device, progress=config.output.progress, checkpoint_dir=checkpoints, task=task
        )
    else:
        model, tokenizer = load_policy(config.model.path, device=device)  # checked above
        summary = sft_and_save(
            config,
            model,
            tokenizer,
            out,
            device=device,
            progress=config.output.progress,
            checkpoint_dir=checkpoints,
            pairs=sft_pairs(config.data, config.sft, task),
        )
    print(f"saved the SFT policy to {out} (final loss {summary['sft_final_loss']:.4f})")
    return 0
