"""``tokenbalance train``: the RL loop (docs/training.md).

With no arguments it builds (or reuses) the embedded tiny policy and runs AR + Lopti on K&K."""

from __future__ import annotations

import argparse
from pathlib import Path


def nonempty(value: str) -> str:
    """An argparse ``type`` for paths and names: taken verbatim, but never empty (an empty value is an unset shell
    variable far more often than a wish for the default)."""
    if value == "":
        raise argparse.ArgumentTypeError("empty value (an unset shell variable?); give a value or leave the option out")
    return value


def add_set_option(parser: argparse.ArgumentParser, help: str) -> None:
    """The repeatable ``--set SECTION.FIELD=VALUE`` option, collected in ``args.overrides``."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE", help=help
    )


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=nonempty, help="YAML run config (see --help-config for every option)")
    add_set_option(parser, "override one option, e.g. --set rollout.group_size=4 (repeatable)")
    parser.add_argument(
        "--model",
        type=nonempty,
        help="local Hugging Face model directory, or a run directory (its latest checkpoint) "
        "(default: the embedded tiny policy)",
    )
    parser.add_argument("--device", type=nonempty, help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--help-config", action="store_true", help="list every config option with its default")
    add_data_arguments(parser)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Your prompts and reward function (docs/tasks.md), the same flags for every command."""
    yours = parser.add_argument_group(
        "your data and reward (docs/tasks.md)",
        "your rows, scored by your function: fn(response, **row) -> reward",
    )
    yours.add_argument(
        "--data", type=nonempty, metavar="FILE", help="prompts: a parquet or JSONL file (data.train_file)"
    )
    yours.add_argument(
        "--eval-data", type=nonempty, metavar="FILE", help="held-out prompts, the same columns (data.eval_file)"
    )
    yours.add_argument(
        "--reward",
        type=nonempty,
        metavar="MODULE:FUNCTION",
        help="your reward function, e.g. mypkg.rewards:gsm8k or rewards.py:gsm8k (data.reward)",
    )
    yours.add_argument(
        "--prompt-column",
        type=nonempty,
        metavar="NAME",
        help="the column holding the prompt: text, or chat messages (data.prompt_column, default prompt)",
    )
    yours.add_argument(
        "--target-column",
        type=nonempty,
        metavar="NAME",
        help="the column holding a good response to each prompt: without --model, the embedded tiny tokenizer "
        "and model are built on your rows and warm-started on it (data.target_column)",
    )


def printed_config_help(args: argparse.Namespace) -> bool:
    """Print every config option (the method's with the values of ``--method`` / ``--config`` / ``--set``) and return
    True when ``--help-config`` was given."""
    if not args.help_config:
        return False
    from tokenbalance.config import describe_options

    print("\n".join(describe_options(config_from_args(args))))
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
        ("data", "data.train_file"),
        ("eval_data", "data.eval_file"),
        ("reward", "data.reward"),
        ("prompt_column", "data.prompt_column"),
        ("target_column", "data.target_column"),
        ("count", "data.eval_count"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            shorthand.append(f"{key}={value}")
    config = apply_overrides(config, shorthand + args.overrides)
    if getattr(args, "model", None) is not None:
        from tokenbalance.run.checkpoints import policy_dir

        config.model.path = policy_dir(args.model)  # a run directory: its latest checkpoint's policy
    if args.no_progress:
        config.output.progress = False
    return config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="RL training (default: the embedded tiny K&K run)")
    add_config_arguments(parser)
    parser.add_argument(
        "--method",
        type=nonempty,
        help="method preset (tokenbalance list-methods), or your token rule: MODULE:RULE or FILE.py:RULE "
        "(docs/methods.md §10)",
    )
    parser.add_argument("--steps", type=int, help="RL steps")
    parser.add_argument("--run-dir", type=nonempty, help="run directory: new or empty (default runs/<method>-<time>)")
    parser.add_argument(
        "--resume",
        type=nonempty,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its latest checkpoint with its saved config; --steps N extends it "
        "to N steps; other changes (--set of anything but reporting/device, --method, --config, --seed) are refused",
    )
    parser.set_defaults(func=run)


def resumed_config(args: argparse.Namespace):
    """The saved config of the run in ``--resume RUN`` with the changes a resume allows (more ``--steps``, reporting,
    device); any other change is refused, naming it (never ignored)."""
    from tokenbalance.config import apply_overrides, load_config
    from tokenbalance.run.resume import RESUMABLE_KEYS, changed_setting

    run_dir = Path(args.resume)
    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    names = (
        "config",
        "model",
        "seed",
        "method",
        "run_dir",
        "data",
        "eval_data",
        "reward",
        "prompt_column",
        "target_column",
    )
    refused = [flag for flag in names if getattr(args, flag, None)]
    if refused:
        flags = ", ".join("--" + flag.replace("_", "-") for flag in refused)
        raise ValueError(
            f"--resume {run_dir}: {flags} cannot change a run that has started (its checkpoints belong to "
            f"{run_dir / 'config.yaml'}); only --steps, --device and reporting options may. To change it, start a "
            f"new run from a checkpoint's weights: --model {run_dir}/checkpoints/step_N/model --run-dir NEW_DIR"
        )
    saved = load_config(run_dir / "config.yaml")
    changes = ([f"train.steps={args.steps}"] if args.steps is not None else []) + list(args.overrides)
    if args.device is not None:
        changes.append(f"train.device={args.device}")
    config = apply_overrides(saved, changes)
    changed = changed_setting(saved, config)
    if changed is not None:
        key, before, after = changed
        raise ValueError(
            f"--resume {run_dir}: {key} cannot change mid-run ({before!r} -> {after!r}); a resume may change only "
            f"{', '.join(RESUMABLE_KEYS)}. Start a new run to change it."
        )
    if args.no_progress:
        config.output.progress = False
    return config


def run(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.trainer.runner import run_training

    if args.resume is not None:
        run_training(resumed_config(args), run_dir=Path(args.resume), resume=True)
        return 0
    run_training(config_from_args(args))
    return 0
