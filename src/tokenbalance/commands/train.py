"""``tokenbalance train``: the RL loop (docs in tokenbalance.trainer.loop).

With no arguments it builds (or reuses) the embedded tiny policy and runs AR + Lopti on K&K.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML run config (see --help-config for every option)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one option, e.g. --set rollout.group_size=4 (repeatable)",
    )
    parser.add_argument("--model", help="local Hugging Face model directory (default: the embedded tiny policy)")
    parser.add_argument("--device", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--help-config", action="store_true", help="list every config option with its default")


def printed_config_help(args: argparse.Namespace) -> bool:
    """Print every config option and return True when ``--help-config`` was given."""
    if not args.help_config:
        return False
    from tokenbalance.config import describe_options

    print("\n".join(describe_options()))
    return True


def config_from_args(args: argparse.Namespace):
    from tokenbalance.config import RunConfig, apply_overrides, load_config

    config = load_config(args.config) if args.config else RunConfig()
    shorthand = []
    for flag, key in (
        ("model", "model.path"),
        ("device", "train.device"),
        ("seed", "train.seed"),
        ("method", "train.method"),
        ("steps", "train.steps"),
        ("run_dir", "output.run_dir"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            shorthand.append(f"{key}={value}")
    config = apply_overrides(config, shorthand + args.overrides)
    if args.no_progress:
        config.output.progress = False
    return config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="RL training (default: the embedded tiny K&K run)")
    add_config_arguments(parser)
    parser.add_argument("--method", help="method preset (tokenbalance list-methods)")
    parser.add_argument("--steps", type=int, help="RL steps")
    parser.add_argument("--run-dir", help="run directory (default runs/<method>-<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.trainer.runner import run_training

    if args.resume:
        config = config_from_args(args) if args.no_progress else None
        run_training(config, run_dir=Path(args.resume), resume=True)
        return 0
    run_training(config_from_args(args))
    return 0
