"""``tokenbalance list-methods``: print the method presets with their hyper-parameters; ``NAME`` may be a token rule,
``MODULE:RULE`` or ``FILE.py:RULE`` (docs/methods.md §10), which is imported first."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("list-methods", help="list the method presets and their hyper-parameters")
    parser.add_argument(
        "name", nargs="?", help="show only this preset, or your token rule: MODULE:RULE or FILE.py:RULE"
    )
    parser.set_defaults(func=run, uses_torch=False)  # no threading policy to choose (cli.main)


def run(args: argparse.Namespace) -> int:
    from tokenbalance.algorithms.describe import describe_presets

    print(describe_presets(args.name))
    return 0
