"""The ``tokenbalance`` command line.

Each sub-command lives in its own module under :mod:`tokenbalance.commands` and exposes
``add_parser(subparsers)`` (which registers its arguments and sets ``func``) so that importing
the CLI stays cheap: heavy imports happen inside ``func``.

    tokenbalance list-methods            # the method presets and their hyper-parameters
    tokenbalance gen-data kk --people 3 --split test --out kk3_test.parquet
"""

from __future__ import annotations

import argparse
import sys

from tokenbalance import __version__
from tokenbalance.commands import COMMAND_MODULES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenbalance",
        description="RL with verifiable rewards and token-level gradient balancing.",
    )
    parser.add_argument("--version", action="version", version=f"tokenbalance {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def _quiet_transformers() -> None:
    """Our own progress bars report long work; transformers' per-shard bars would interleave."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_transformers()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ValueError as err:
        # Bad input (a wrong name, an out-of-range value, a malformed file) is reported as one
        # line naming the cause; programming errors keep their traceback.
        print(f"tokenbalance {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
