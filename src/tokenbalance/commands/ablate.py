"""``tokenbalance ablate``: a grid of methods x seeds, resumable, into one results directory with the paper-layout
table (mean and 95% CI over seeds, paired differences), the reward curves, the per-step cost and the Figure 1 panels;
``--runner verl`` writes the grid at paper scale instead.

    tokenbalance ablate --preset kk-tiny --seeds 0,1,2,3,4    # run it again after an interruption: it resumes
    tokenbalance ablate --runner verl --verl-models 3b,7b     # verl scripts, one per cell (docs/scale.md)

Every option, preset and output file: docs/ablate.md."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from tokenbalance.commands.train import add_set_option, nonempty

DEFAULT_VERL_MODELS = "3b,7b"
DEFAULT_PRESET = "kk-tiny"
DEFAULT_FIGURE_PROMPTS = 16


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ablate", help="grid of methods x seeds: paper-layout table with CIs over seeds, curves, cost (resumable)"
    )
    parser.add_argument(
        "--preset", help=f"grid preset (--list; default {DEFAULT_PRESET}; --runner verl --report-only: the grid's)"
    )
    parser.add_argument("--methods", help="comma-separated rows (default: the preset's); keys or method presets")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--steps", type=int, help="RL steps per cell (default: the preset's)")
    parser.add_argument("--out", type=nonempty, help="results directory (default runs/ablate-<preset>)")
    parser.add_argument(
        "--config", type=nonempty, help="YAML run config the preset's overrides apply to (default: the defaults)"
    )
    add_set_option(parser, "override one run option for every cell (repeatable; method.* is refused)")
    parser.add_argument(
        "--model", type=nonempty, help="start policy directory for every seed (default: SFT per seed, cached)"
    )
    parser.add_argument("--device", type=nonempty, help="cpu, cuda, cuda:N or auto")
    parser.add_argument(
        "--runner",
        choices=("local", "verl"),
        default="local",
        help="local: run the grid here; verl: write the grid at paper scale as verl scripts (one per cell, a "
        "one-node driver, a Slurm array) after printing its size and estimated cost; with --report-only, build the "
        "table from the verl cells' logs",
    )
    parser.add_argument(
        "--verl-models",
        help="--runner verl: models (3b, 7b; default both; with --report-only: the grid's, or a part of them)",
    )
    parser.add_argument(
        "--isolation",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="run each cell in a child process (default: a crashed cell does not stop the grid) or in this one",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="cells run at once, each in its own process with CPUs / jobs threads (default: one per CPU on a CPU, "
        "one with --device cuda or --isolation inprocess; docs/ablate.md)",
    )
    parser.add_argument(
        "--records",
        type=nonempty,
        help="keep each finished cell's config, metrics and status in this directory (small; no checkpoints) and "
        "restore finished cells from it on a machine that lacks them, so none runs twice (with --report-only: restore "
        "them, run none, report; docs/ablate.md)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only rebuild the tables and figures (--runner verl: from the verl cells' logs in OUT/verl)",
    )
    parser.add_argument(
        "--pairing",
        choices=("fingerprint", "step0"),
        default="fingerprint",
        help="which cells of a seed the differences pair: fingerprint (default: their fingerprints.json agree; a "
        "record without one pairs with nothing) or step0 (also records of older code without fingerprints, when "
        "their step-0 evaluations agree on every value; weaker, named in the report); docs/ablate.md",
    )
    parser.add_argument("--no-figure", action="store_true", help="skip the Figure 1 panels (one batch, two rows)")
    parser.add_argument(
        "--figure-prompts",
        type=int,
        default=DEFAULT_FIGURE_PROMPTS,
        help=f"prompts of the Figure 1 batch (default {DEFAULT_FIGURE_PROMPTS})",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress display")
    parser.add_argument("--list", action="store_true", help="list the grid presets and rows, then exit")
    parser.set_defaults(func=run)


def _split(text: str | None, flag: str = "--methods") -> list[str] | None:
    """The comma-separated items of ``text``; None when the flag was not given. An empty value (an unset shell
    variable) is refused: it must not silently mean the preset's whole grid."""
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"{flag}: empty value {text!r}; give comma-separated items or leave the flag out")
    return parts


def _seeds(text: str | None) -> list[int] | None:
    parts = _split(text, "--seeds")
    if parts is None:
        return None
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers, got {text!r}") from None


# What the grid sets in every cell itself: a --set of these would be silently replaced, so it is refused naming the
# flag that sets it.
GRID_KEYS = {
    "train.method": "--methods",
    "train.seed": "--seeds",
    "train.steps": "--steps",
    "output.run_dir": "--out",
    "train.start_eval_cache": "--out (the cells share OUT/start_evals/)",
    "output.progress": "--no-progress",
}
# Flags that only the local grid uses: refused with --runner verl instead of being listed as if used.
LOCAL_ONLY = ("set", "config", "model", "device", "jobs", "steps", "records")


def check_flags(args: argparse.Namespace) -> None:
    """Every flag takes effect or is refused by name, before any work."""
    for override in args.overrides:
        key = override.split("=", 1)[0].strip()
        if key in GRID_KEYS:
            raise ValueError(f"--set {override}: the grid sets {key} in every cell; use {GRID_KEYS[key]}")
    if args.report_only and (args.jobs is not None or args.isolation != "subprocess"):
        raise ValueError("--report-only: runs no cell, so --jobs and --isolation do not apply; leave them out")
    if args.runner == "verl":
        given = [flag for flag in LOCAL_ONLY if getattr(args, "overrides" if flag == "set" else flag, None)]
        given += [
            flag
            for flag, used in (
                ("isolation", args.isolation != "subprocess"),
                ("no-figure", args.no_figure),
                ("figure-prompts", args.figure_prompts != DEFAULT_FIGURE_PROMPTS),
            )
            if used
        ]
        if given:
            raise ValueError(
                f"--runner verl: {', '.join('--' + f for f in given)} apply to the local grid only; the verl grid "
                "runs the AR-Lopti K&K presets (docs/ablate.md); leave them out"
            )
    elif args.verl_models is not None:
        raise ValueError("--verl-models: applies to --runner verl only")


def methods_word(row) -> str:
    """How ``--methods`` names ``row``: its key for a grid row or a method preset, the name it was given for a token
    rule (``MODULE:RULE``, or ``FILE.py:RULE`` with the file's absolute path, so that the command runs from any
    directory), whose key is the rule's own name."""
    from tokenbalance.ablate.grid import GRID_METHODS
    from tokenbalance.user_code import is_spec, normalized_spec

    if row.key in GRID_METHODS:
        return row.key
    return normalized_spec(row.preset, "--methods") if is_spec(row.preset) else row.preset


def command_line(args: argparse.Namespace, plan, out: Path) -> str:
    """The canonical command of this grid (every choice explicit), for the report and the script; it runs as printed
    (a test runs it): rows as ``--methods`` takes them, the figure flags kept."""
    parts = [
        "tokenbalance ablate",
        f"--preset {plan.preset.name}",
        f"--methods {shlex.quote(','.join(methods_word(m) for m in plan.methods))}",
        f"--seeds {','.join(map(str, plan.seeds))}",
        *([f"--steps {plan.steps}"] if args.runner == "local" else []),  # verl: the scripts' 5 epochs
        f"--out {shlex.quote(str(out))}",
    ]
    for flag in ("config", "model", "device", "records"):
        if getattr(args, flag):
            parts.append(f"--{flag} {shlex.quote(str(getattr(args, flag)))}")
    parts += [f"--set {shlex.quote(o)}" for o in args.overrides]
    if args.runner == "verl":
        parts += ["--runner verl", f"--verl-models {args.verl_models}"]
    else:
        parts += ["--no-figure"] if args.no_figure else []
        parts += [f"--pairing {args.pairing}"] if getattr(args, "pairing", "fingerprint") != "fingerprint" else []
        parts += [f"--figure-prompts {args.figure_prompts}"] if args.figure_prompts != DEFAULT_FIGURE_PROMPTS else []
    return " ".join(parts)


def list_grids() -> None:
    from tokenbalance.ablate.grid import GRID_METHODS, GRID_PRESETS

    print("grid presets:")
    for preset in GRID_PRESETS.values():
        print(f"  {preset.name}: {preset.description}")
        print(
            f"      rows {', '.join(preset.methods)}; seeds {', '.join(map(str, preset.seeds))}; steps {preset.steps}"
        )
        print(f"      overrides: {' '.join(preset.overrides) or 'none'}")
    print("rows (key: label = method preset, compared with):")
    for row in GRID_METHODS.values():
        print(f"  {row.key}: {row.label} = {row.preset}" + (f", vs {row.baseline}" if row.baseline else ""))


def write_verl(args: argparse.Namespace, plan, out: Path) -> int:
    """Print the verl grid's size and estimated cost, then write its scripts into ``OUT/verl``."""
    from tokenbalance.ablate.verl.cost import CellCost, assumptions, cost_table
    from tokenbalance.ablate.verl.grid import verl_cells
    from tokenbalance.ablate.verl.plan import write_plan
    from tokenbalance.ablate.verl.scripts import write_verl_grid
    from tokenbalance.outputs import record_written

    given = args.verl_models if args.verl_models is not None else DEFAULT_VERL_MODELS
    models = tuple(_split(given, "--verl-models") or ())
    args.verl_models = ",".join(models)
    cells, unsupported = verl_cells(plan.methods, plan.seeds, models)
    if not cells:  # every check first: a refused grid writes nothing
        raise ValueError(
            f"--runner verl: no cell to run ({'; '.join(f'{row.label}: {why}' for row, why in unsupported)})"
        )
    costs = [CellCost(cell.model, cell.launch.update_passes) for cell in cells]
    rows = len(plan.methods) - len(unsupported)
    summary = [
        f"verl grid {plan.preset.name}: {rows} rows x {len(models)} models x {len(plan.seeds)} seeds = {len(cells)} "
        "cells, each one job on 1 node x 4 GPUs (the AR-Lopti scripts)",
        f"rows: {', '.join(f'{r.label} ({r.preset})' for r in plan.methods if r not in dict(unsupported))}; "
        f"models: {', '.join(models)}; seeds: {', '.join(map(str, plan.seeds))}",
        *assumptions(),
        *cost_table(costs),
    ]
    print("\n".join(summary))
    for row, why in unsupported:
        print(f"not on verl: {row.label} ({row.preset}): {why}")
    out = Path(os.path.abspath(out))  # the scripts and their commands name it: absolute, they run from anywhere
    grid_dir = out / "verl"
    out.mkdir(parents=True, exist_ok=True)
    record_written(out, ["verl"])
    driver, slurm = write_verl_grid(
        grid_dir,
        plan.preset.name,
        cells,
        unsupported,
        summary=summary,
        longest_cell_hours=max(cost.wall_hours for cost in costs),
        command=command_line(args, plan, out),
    )
    write_plan(grid_dir, plan.preset.name, [methods_word(m) for m in plan.methods], list(plan.seeds), list(models))
    print(f"written: {len(cells)} cell scripts in {grid_dir / 'cells'}, {driver.name} (one node), {slurm.name} (Slurm)")
    print(f"run on one node: bash {shlex.quote(str(driver))}   (DRY_RUN=1 first: checks every cell's config)")
    print(f"one job per cell: sbatch {shlex.quote(str(slurm))}   (adapt its #SBATCH header to your cluster)")
    print(f"the table afterwards: {command_line(args, plan, out)} --report-only")
    return 0


def verl_report_plan(args: argparse.Namespace, out: Path):
    """The plan ``--report-only`` reports: the grid's own (``OUT/verl/plan.json``), or the part of it the
    flags name; a grid written before plans were kept: the flags' (checked against its ``cells.txt``)."""
    from tokenbalance.ablate.grid import grid_preset, make_plan
    from tokenbalance.ablate.verl.grid import verl_cells
    from tokenbalance.ablate.verl.plan import check_cells_written, chosen, read_plan

    grid_dir = out / "verl"
    if not (grid_dir / "cells.txt").is_file():
        raise ValueError(
            f"--report-only: {grid_dir} holds no verl grid (write it first: the command without --report-only)"
        )
    recorded = read_plan(grid_dir)
    if recorded is None:
        preset = grid_preset(args.preset or DEFAULT_PRESET)
        plan = make_plan(preset, methods=_split(args.methods), seeds=_seeds(args.seeds))
        given = args.verl_models if args.verl_models is not None else DEFAULT_VERL_MODELS
        models = _split(given, "--verl-models") or []
    else:
        if args.preset is not None and args.preset != recorded["preset"]:
            raise ValueError(
                f"--report-only --preset: the grid in {grid_dir} was written with --preset {recorded['preset']}, "
                f"not {args.preset}; leave --preset out"
            )
        preset = grid_preset(recorded["preset"])
        given = make_plan(preset, methods=_split(args.methods)) if args.methods is not None else None
        words = chosen("--methods", [methods_word(m) for m in given.methods] if given else None, recorded["methods"])
        seeds = chosen("--seeds", _seeds(args.seeds), recorded["seeds"])
        models = chosen("--verl-models", _split(args.verl_models, "--verl-models"), recorded["models"])
        plan = make_plan(preset, methods=words, seeds=seeds)
    cells, _ = verl_cells(plan.methods, plan.seeds, tuple(models))
    check_cells_written(grid_dir, [cell.name for cell in cells])
    args.verl_models = ",".join(models)
    return plan


def report_verl(args: argparse.Namespace, plan, out: Path) -> int:
    """The paper-layout report of each model from the verl cells' logs in ``OUT/verl``; exit status 1
    when a cell of the plan gives no final accuracy (each named with why)."""
    from tokenbalance.ablate.verl.report import write_verl_reports

    grid_dir = out / "verl"
    models = tuple(_split(args.verl_models, "--verl-models") or ())
    reports, unusable = write_verl_reports(
        grid_dir, plan.preset.name, plan.methods, plan.seeds, models, command=command_line(args, plan, out)
    )
    for report in reports:
        print(report.read_text())
    print(
        "written: " + ", ".join(str(report.parent) for report in reports) + " (results.md, accuracy.csv, cells.csv, "
        "step_cost.csv, reward_curves.png; report-<model>: each cell's last validation, report-<model>-last3: the "
        "mean of its last 3, the paper's reading)"
    )
    if unusable:
        print(
            f"cells without a final accuracy: {len(unusable)}: "
            + "; ".join(f"{result.cell.name} ({result.status})" for result in unusable),
            file=sys.stderr,
        )
        return 1
    return 0


def figure(out: Path, plan, prompts: int) -> Path | None:
    """The Figure 1 panels (GRPO vs AR + Lopti) on one batch from the first seed's start policy; the measurement is
    kept in figure1_buckets.json and reused (delete it to measure again)."""
    from tokenbalance.ablate import figure1
    from tokenbalance.ablate.grid import GRID_METHODS
    from tokenbalance.config import load_config

    data_path = out / "figure1_buckets.json"
    if not data_path.is_file():
        config_file = out / "configs" / f"{plan.cells[0].name}.yaml"
        policy = load_config(config_file).model.path if config_file.is_file() else None
        if policy is None or not Path(policy).is_dir():
            print("figure 1: skipped (the first seed's start policy is not built yet)")
            return None
        rows = [GRID_METHODS["grpo"], GRID_METHODS["ar_lopti"]]
        print(
            f"figure 1: measuring GRPO's and + AR + Lopti's single update on {prompts} prompt(s) from {policy} "
            f"(--no-figure skips it; kept in {data_path.name} for later reports)",
            flush=True,
        )
        figure1.write_json(data_path, figure1.measure(config_file, rows, prompts=prompts))
    return figure1.plot(figure1.read_json(data_path), out / "figure1_buckets.png")


def grid_task(args: argparse.Namespace, plan):
    """The task every cell trains on (the preset's, or ``--config`` / ``--set``'s)."""
    from tokenbalance.ablate.cells import base_config
    from tokenbalance.run.examples import task_for

    return task_for(base_config(plan, config_path=args.config, model=args.model, device=args.device).data)


def run(args: argparse.Namespace) -> int:
    if args.list:
        list_grids()
        return 0
    from tokenbalance.ablate.grid import grid_preset, make_plan

    check_flags(args)
    from tokenbalance.ablate.runner import GRID_FILES, adopt_earlier_grid
    from tokenbalance.outputs import check_files_replaceable

    if args.runner == "verl" and args.report_only:
        out = Path(args.out or f"runs/ablate-{args.preset or DEFAULT_PRESET}")
        adopt_earlier_grid(out)
        check_files_replaceable(out, GRID_FILES, "--out")
        return report_verl(args, verl_report_plan(args, out), out)
    plan = make_plan(
        grid_preset(args.preset or DEFAULT_PRESET),
        methods=_split(args.methods),
        seeds=_seeds(args.seeds),
        steps=args.steps,
        overrides=args.overrides,
    )
    out = Path(args.out or f"runs/ablate-{plan.preset.name}")
    adopt_earlier_grid(out)  # a grid written before OUT had a manifest continues
    check_files_replaceable(out, GRID_FILES, "--out")  # nothing of the user's in OUT is replaced
    if args.runner == "verl":
        return write_verl(args, plan, out)
    if args.figure_prompts < 1:
        raise ValueError(f"--figure-prompts: must be >= 1, got {args.figure_prompts}")
    from tokenbalance.ablate.curves import reward_curves
    from tokenbalance.ablate.report import local_source, write_report
    from tokenbalance.ablate.results import collect
    from tokenbalance.ablate.runner import REPORT_FILES, run_grid
    from tokenbalance.outputs import record_written

    failed: list[str] = []
    if args.report_only and args.records:  # the finished cells of the records, restored into OUT; none run
        run_grid(
            plan,
            out,
            config_path=args.config,
            model=args.model,
            device=args.device,
            records=Path(args.records),
            run_cells=False,
            progress=False,
        )
    elif not args.report_only:
        try:
            outcome = run_grid(
                plan,
                out,
                config_path=args.config,
                model=args.model,
                device=args.device,
                isolation=args.isolation,
                jobs=args.jobs,
                records=Path(args.records) if args.records else None,
                progress=not args.no_progress,
            )
        except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: say where the grid is and how to go on
            reason = str(err).split(";")[0] or "interrupted"
            raise KeyboardInterrupt(
                f"{reason}; the grid in {out} stopped (its running cells stopped resumable). Continue it with: "
                f"{command_line(args, plan, out)}"
            ) from None
        failed = outcome.failed
    elif not out.is_dir():
        raise ValueError(f"--report-only: {out} does not exist (run the grid first)")
    record_written(out, REPORT_FILES)
    results = collect(plan, out)
    figures = [reward_curves(plan, results, out / "reward_curves.png").name]
    if not args.no_figure:
        made = figure(out, plan, args.figure_prompts)
        figures += [made.name] if made else []
    report = write_report(
        plan,
        results,
        out,
        command=command_line(args, plan, out),
        difficulty_label=grid_task(args, plan).difficulty_label,
        figures=tuple(figures),
        source=local_source(out, plan, results, args.pairing),
    )
    print(report.read_text())
    print(f"written: {report}, accuracy.csv, cells.csv, step_cost.csv, {', '.join(figures)} in {out}")
    if failed:
        print(f"failed cells (run the command again to resume them; logs in {out / 'logs'}): {', '.join(failed)}")
        return 1
    return 0
