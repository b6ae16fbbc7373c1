"""``tokenbalance list-methods``: print the method presets with their hyper-parameters."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("list-methods", help="list the method presets and their hyper-parameters")
    parser.add_argument("name", nargs="?", help="show only this preset")
    parser.set_defaults(func=run, uses_torch=False)  # no threading policy to choose (cli.main)


def run(args: argparse.Namespace) -> int:
    from tokenbalance.algorithms.methods import describe_presets

    print(describe_presets(args.name))
    return 0
