"""``tokenbalance gen-data``: write task data files.

    tokenbalance gen-data kk --people 3 --split test --out kk3_test.parquet       # Logic-RL 3ppl/test
    tokenbalance gen-data kk --people 3-7 --split train --merge --out merge_34567ppl/train.parquet
    tokenbalance gen-data kk --people 3-7 --split test --per-level-source --out data/{n}ppl/test_new.parquet
    tokenbalance gen-data arith --level 2 --split train --count 1000 --out arith_l2_train.parquet

K&K files have exactly the Logic-RL schema and, with the defaults, the published rows. Progress
goes to stderr (for more than 2,000 puzzles drawn); stdout gets one line per file written.
"""

from __future__ import annotations

import argparse
import re

PROGRESS_THRESHOLD = 2000  # puzzles drawn from the streams (skipped ones included)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gen-data",
        help="generate task data files (Knights & Knaves Logic-RL parquet, arithmetic)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("task", choices=("kk", "arith"), help="which task's data to write")
    parser.add_argument(
        "--split",
        required=True,
        choices=("train", "test"),
        help="kk: train = global indices 100..999, test = 1000..1099 (n = 2: 100..299 / 0..99)",
    )
    parser.add_argument(
        "--out", required=True, help="output .parquet path; with a --people range and no --merge it must contain {n}"
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
    parser.set_defaults(func=run)


def parse_people(text: str) -> list[int]:
    """``"3"`` -> [3]; ``"3-7"`` -> [3, 4, 5, 6, 7]; each in 2..8."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise ValueError(f"--people must be N or A-B with people in 2..8, got {text!r}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else low
    if not (2 <= low <= 8 and 2 <= high <= 8) or low > high:
        raise ValueError(f"--people must be in 2..8 (A <= B for a range), got {text!r}")
    return list(range(low, high + 1))


def _progress(total: int, quiet: bool):
    """A rich progress bar on stderr, or a no-op for small jobs and --quiet."""
    from contextlib import nullcontext

    if quiet or total <= PROGRESS_THRESHOLD:
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import Progress

    return Progress(console=Console(stderr=True), transient=False)


def _run_kk(args: argparse.Namespace) -> int:
    from tokenbalance.tasks.kk.generator import DEFAULT_SEED
    from tokenbalance.tasks.kk.io import write_logic_rl_parquet
    from tokenbalance.tasks.kk.records import (
        DEFAULT_DATA_SOURCE,
        PER_LEVEL_DATA_SOURCE,
        default_slice,
        generate_rows,
    )
    from tokenbalance.tasks.kk.templates import DEFAULT_TEMPLATE, get_template

    if args.level is not None:
        raise ValueError("--level applies to arith only; kk takes --people")
    people = args.people or "3"
    levels = parse_people(people)
    template = args.template or DEFAULT_TEMPLATE
    get_template(template)
    if args.per_level_source and args.data_source is not None:
        raise ValueError("give either --data-source or --per-level-source, not both")
    data_source = PER_LEVEL_DATA_SOURCE if args.per_level_source else (args.data_source or DEFAULT_DATA_SOURCE)
    if len(levels) > 1 and not args.merge and "{n}" not in args.out:
        raise ValueError(
            f"--people {people} gives one file per level: put {{n}} in --out "
            "(e.g. data/{n}ppl/train.parquet) or pass --merge"
        )
    slices = {}
    for n in levels:
        start, count = default_slice(n, args.split)
        slices[n] = (
            start if args.start_index is None else args.start_index,
            count if args.count is None else args.count,
        )
    total_draws = sum(start + count for start, count in slices.values())
    seed = DEFAULT_SEED if args.seed is None else args.seed
    merged: list[dict] = []
    with _progress(total_draws, args.quiet) as progress:
        task_id = progress.add_task("kk puzzles", total=total_draws) if progress else None
        advance = (lambda: progress.advance(task_id)) if progress else None
        for n in levels:
            start, count = slices[n]
            rows = generate_rows(
                n,
                args.split,
                start_index=start,
                count=count,
                seed=seed,
                template=template,
                data_source=data_source,
                on_progress=advance,
            )
            if args.merge:
                merged.extend(rows)
            else:
                path = write_logic_rl_parquet(rows, args.out.replace("{n}", str(n)))
                print(
                    f"wrote {len(rows)} rows ({n} people, {args.split}, indices {start}..{start + count - 1}) to {path}"
                )
    if args.merge:
        path = write_logic_rl_parquet(merged, args.out)
        print(f"wrote {len(merged)} rows ({people} people, {args.split}, merged) to {path}")
    return 0


def _run_arith(args: argparse.Namespace) -> int:
    from tokenbalance.tasks.arith import DEFAULT_SEED, arith_rows, generate_problems, write_arith_parquet

    if args.merge or args.per_level_source or args.people is not None:
        raise ValueError("--people, --merge and --per-level-source apply to kk only; arith takes --level")
    problems = generate_problems(
        2 if args.level is None else args.level,
        args.split,
        args.count,
        seed=DEFAULT_SEED if args.seed is None else args.seed,
        start_index=0 if args.start_index is None else args.start_index,
    )
    rows = arith_rows(problems, template=args.template or "raw", data_source=args.data_source or "arith")
    path = write_arith_parquet(rows, args.out)
    print(f"wrote {len(rows)} rows (arith level {problems[0].level}, {args.split}) to {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.out.endswith(".parquet"):
        raise ValueError(f"--out must be a .parquet path, got {args.out!r}")
    return _run_kk(args) if args.task == "kk" else _run_arith(args)
