"""``tokenbalance eval``: held-out accuracy of a policy directory (greedy and one sample at T = 1); ``--responses
FILE`` keeps every response with its reward."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenbalance.commands.train import add_config_arguments, config_from_args, nonempty, printed_config_help
from tokenbalance.outputs import check_output_file, json_written_by, write_text_atomic

WRITTEN_BY = "tokenbalance eval"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="held-out accuracy per difficulty of a policy")
    add_config_arguments(parser)
    parser.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="held-out examples per difficulty of a generated task (data.eval_count, default 1000); an --eval-data "
        "file is evaluated whole",
    )
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.add_argument(
        "--responses",
        metavar="FILE",
        type=nonempty,
        help="also write every response (mode, puzzle, reward, correct, tokens, text) as JSON to this file (a new file)",
    )
    parser.add_argument("--force", action="store_true", help="replace a --responses file an earlier eval wrote")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    import torch

    from tokenbalance.diagnostics.sinks import dump_json
    from tokenbalance.models import load_policy
    from tokenbalance.rollout import make_engine
    from tokenbalance.run.setup import prepare
    from tokenbalance.trainer.distributed import DistContext
    from tokenbalance.trainer.evaluate import MODES, evaluate
    from tokenbalance.trainer.precision import compute_dtype, forward_precision
    from tokenbalance.trainer.progress import StepProgress
    from tokenbalance.trainer.runner import compute_device, policy_path

    config = config_from_args(args)
    if args.responses:  # a file of the user's is never replaced: checked before any model work
        check_output_file(args.responses, "--responses", force=args.force, written_by=json_written_by(WRITTEN_BY))
    setup = prepare(config)  # data, tokenizer, prompt lengths, device: before any model work
    device = compute_device(config)
    path = policy_path(config, device, DistContext(device=device), print, setup)
    model, tokenizer = load_policy(
        path, device=device, dtype=getattr(torch, config.model.dtype), tokenizer=setup.tokenizer
    )
    setup = setup.with_tokenizer(tokenizer)
    engine = make_engine(config.rollout.engine, model, tokenizer)
    responses: list[dict] | None = [] if args.responses else None
    examples = setup.eval_examples
    with (
        StepProgress(
            len(MODES) * len(examples), enabled=config.output.progress, description="eval", unit="response"
        ) as bar,
        forward_precision(model, compute_dtype(config.model.autocast)),  # as the run's evaluations
    ):
        metrics = evaluate(
            engine,
            tokenizer,
            setup.task,
            examples,
            eos_token_ids=set(engine.eos_token_ids),
            max_new_tokens=config.rollout.max_new_tokens,
            max_prompt_tokens=config.data.max_prompt_tokens,
            seed=config.train.seed,
            responses=responses,
            on_batch=lambda scored: bar.advance(scored, {}),
            prompt_ids=setup.eval_prompt_ids,
        )
    if args.responses:
        document = {"written_by": WRITTEN_BY, "model": str(path), "metrics": metrics, "responses": responses}
        Path(args.responses).parent.mkdir(parents=True, exist_ok=True)  # checked writable before the work
        write_text_atomic(args.responses, dump_json(document, indent=1) + "\n")  # NaN as null
    if args.json:
        print(dump_json(metrics))
    else:
        for key, value in metrics.items():
            print(f"{key:<36}{value:.4f}")
    if args.responses:
        print(f"written: {args.responses}", file=sys.stderr if args.json else sys.stdout)
    return 0
