"""The ``tokenbalance`` command line: one module per sub-command under :mod:`tokenbalance.commands`.

Each exposes ``add_parser(subparsers)``, which registers its arguments and sets ``func``; heavy imports happen inside
``func``, so importing the CLI stays cheap. The commands: README.md."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from tokenbalance import __version__
from tokenbalance.commands import COMMAND_MODULES
from tokenbalance.threads import prepare_process


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


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it stops as Ctrl-C does (a run is marked interrupted, temporary
    files are removed) instead of dying mid-write."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated("terminated (SIGTERM)")


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit status: 0 done, 2 bad input or environment (one line on stderr naming the cause, no
    traceback), 1 an output could not be written (full disk, lost mount), 130 Ctrl-C, 143 SIGTERM (one line saying
    where the work stopped; ``train`` prints its ``--resume`` command)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "uses_torch", True):  # before torch loads: its OpenMP runtime reads the policy once
        prepare_process()  # (a 0.2 s load sample, spared to the commands that compute nothing with torch)
    _quiet_transformers()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        return int(args.func(args) or 0)
    except ValueError as err:
        # Bad input (a wrong name, an out-of-range value, a malformed file) is reported as one line naming the cause;
        # programming errors keep their traceback.
        print(f"tokenbalance {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the environment: a full disk, a read-only or lost mount
        where = f": {err.filename}" if err.filename else ""
        print(f"tokenbalance {args.command}: error: {err.strerror or err}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        print(f"\ntokenbalance {args.command}: {str(err) or 'interrupted'}", file=sys.stderr)
        return 143 if isinstance(err, _Terminated) or "SIGTERM" in str(err) else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
