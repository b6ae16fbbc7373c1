"""``tokenbalance plot``: figures of one or more runs from their ``metrics.jsonl`` (PNG and SVG; docs/metrics.md,
"Plots"); ``--testbeds`` draws the across-testbeds figure from grids' records instead, ``--redraw`` every committed
figure from its committed data (docs/results.md).

    tokenbalance plot runs/grpo-A runs/ar_lopti-B --out plots/
    tokenbalance plot --testbeds docs/results/testbeds.json --out docs/results/
    tokenbalance plot --redraw docs/results/figures.json"""

from __future__ import annotations

import argparse

from tokenbalance.commands.train import nonempty


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plot", help="plot training curves and diagnostics of runs (metrics.jsonl)")
    parser.add_argument(
        "run_dirs", nargs="*", type=nonempty, metavar="RUN_DIR", help="run directories holding metrics.jsonl"
    )
    parser.add_argument(
        "--testbeds",
        type=nonempty,
        metavar="MANIFEST",
        help="instead of runs: a JSON list of {name, accuracy, profile} (a grid's accuracy.csv and its start "
        "policy's diagnose buckets --json), drawn as each method's paired gain over GRPO against the share of "
        "low-probability tokens that are decisions (testbeds_<mode>.png); needs --out",
    )
    parser.add_argument(
        "--mode", choices=("greedy", "sample"), default="greedy", help="with --testbeds: which accuracy"
    )
    parser.add_argument(
        "--redraw",
        type=nonempty,
        metavar="MANIFEST",
        help="instead of runs: draw every figure a figure manifest lists from the data it names "
        "(docs/results/figures.json: every committed figure, from the committed records), into --out (default: "
        "beside the manifest, replacing the figures an earlier plot or ablate wrote)",
    )
    parser.add_argument(
        "--out",
        type=nonempty,
        help="output directory (default: the first RUN_DIR/plots); figure files there are replaced only when an "
        "earlier plot wrote them",
    )
    parser.add_argument(
        "--format", help="comma-separated image formats: png, svg (default both; --redraw writes the manifest's PNGs)"
    )
    parser.add_argument(
        "--labels",
        help="comma-separated legend names, one per RUN_DIR in order (default: each run's method and seed), "
        "e.g. to compare two testbeds' runs of one method",
    )
    parser.set_defaults(func=run, uses_torch=False)  # no threading policy to choose (cli.main)


def run(args: argparse.Namespace) -> int:
    from tokenbalance.diagnostics.plots import load_run, plot_runs

    if args.redraw is not None:
        return plot_redraw(args)
    formats = tuple(f.strip() for f in (args.format or "png,svg").split(",") if f.strip())
    if args.testbeds is not None:
        return plot_testbeds(args, formats)
    if not args.run_dirs:
        raise ValueError("give RUN_DIR(s) to plot, or --testbeds MANIFEST")
    labels = [label.strip() for label in args.labels.split(",")] if args.labels is not None else None
    written = plot_runs(args.run_dirs, args.out, formats=formats, labels=labels)
    for run_dir in args.run_dirs:
        skipped = load_run(run_dir).skipped_lines
        if skipped:
            print(f"{run_dir}: skipped {skipped} unreadable line(s) in metrics.jsonl")
    for path in written:
        print(path)
    return 0


def plot_testbeds(args: argparse.Namespace, formats: tuple[str, ...]) -> int:
    from pathlib import Path

    from tokenbalance.ablate.testbeds import gains_figure, testbed_points
    from tokenbalance.diagnostics.plots import save_figures

    if args.run_dirs or args.labels is not None:
        raise ValueError("--testbeds draws from its manifest alone: drop the RUN_DIR(s) and --labels")
    if args.out is None:
        raise ValueError("--testbeds needs --out DIR (where testbeds_<mode>.png goes)")
    points = testbed_points(Path(args.testbeds), args.mode)
    for path in save_figures(
        Path(args.out), {f"testbeds_{args.mode}": lambda: gains_figure(points, args.mode)}, formats
    ):
        print(path)
    return 0


def plot_redraw(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tokenbalance.ablate.redraw import redraw

    used = [
        flag
        for flag, value in (("RUN_DIR", args.run_dirs), ("--labels", args.labels), ("--testbeds", args.testbeds))
        if value
    ]
    used += ["--format"] if args.format is not None else []
    used += ["--mode"] if args.mode != "greedy" else []
    if used:
        raise ValueError(f"--redraw draws what its manifest lists, as PNG: drop {', '.join(used)}")
    for path in redraw(Path(args.redraw), Path(args.out) if args.out else None):
        print(path)
    return 0
