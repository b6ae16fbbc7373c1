"""``tokenbalance gen-data``: write task data files (the options marked kk: / arith: are that task's).

    tokenbalance gen-data kk --people 3 --split test --out kk3_test.parquet       # Logic-RL 3ppl/test
    tokenbalance gen-data kk --people 3-7 --split test --per-level-source --out data/{n}ppl/test_new.parquet
    tokenbalance gen-data arith --level 2 --split train --count 1000 --out arith_l2_train.parquet

An existing file is replaced only with ``--force`` and only if gen-data wrote it; progress goes to
stderr, one line per file written to stdout. Every option and the files' schemas: docs/tasks.md."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path

from tokenbalance.commands.train import nonempty
from tokenbalance.outputs import check_writable_dir
from tokenbalance.tasks import TASK_NAMES, get_task

PROGRESS_THRESHOLD = 2000  # puzzles drawn from the streams (skipped ones included)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gen-data",
        help="generate task data files (Knights & Knaves Logic-RL parquet, arithmetic)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("task", choices=TASK_NAMES, help="which task's data to write (the registered tasks)")
    parser.add_argument(
        "--split",
        required=True,
        choices=("train", "test"),
        help="kk: train = global indices 100..999, test = 1000..1099 (n = 2: 100..299 / 0..99)",
    )
    parser.add_argument(
        "--out",
        required=True,
        type=nonempty,
        help="output .parquet path; with a --people range and no --merge it must contain {n}",
    )
    parser.add_argument("--people", default=None, help="kk: number of people, N or A-B (2..8; default 3)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="kk: with a --people range, write one file with the levels concatenated in ascending n",
    )
    parser.add_argument(
        "--template",
        default=None,
        help="prompt template: kk: qwen-instruct (default), qwen-base, plain; "
        "arith: raw (default), plain, qwen-instruct",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="rows per level (kk default: the published split size; arith default 1000 train / 100 test)",
    )
    parser.add_argument(
        "--start-index",
        type=int,
        default=None,
        help="first global index (kk default: 100 train / 1000 test; arith default 0)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="kk: sampler seed, formatter seeds are seed + index (default 1234); arith: default 0",
    )
    parser.add_argument(
        "--data-source",
        default=None,
        help="data_source column; {n} is replaced by the level (kk default kk_logic, arith default arith)",
    )
    parser.add_argument(
        "--per-level-source",
        action="store_true",
        help="kk: data_source kk_logic{n} per level, as AR-Lopti's test_new files",
    )
    parser.add_argument("--level", type=int, default=None, help="arith: difficulty level 1..5 (default 2)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace --out files an earlier gen-data wrote (never a file it did not write)",
    )
    parser.set_defaults(func=run, uses_torch=False)  # no threading policy to choose (cli.main)


@contextmanager
def _progress(total: int, description: str, quiet: bool):
    """A rich progress bar on stderr, yielding the callable that advances it by one; ``None`` (no
    display) for small jobs and --quiet. The tasks' ``write_data`` get it as ``progress``."""
    if quiet or total <= PROGRESS_THRESHOLD:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=False) as progress:
        task_id = progress.add_task(description, total=total)
        yield lambda: progress.advance(task_id)


def run(args: argparse.Namespace) -> int:
    if not args.out.endswith(".parquet"):
        raise ValueError(f"--out must be a .parquet path, got {args.out!r}")
    check_writable_dir(
        Path(args.out).parent, "--out", shown=args.out
    )  # each file is checked again before it is written
    task = get_task(args.task)
    task.write_data(args, progress=lambda total, description: _progress(total, description, args.quiet), log=print)
    return 0
