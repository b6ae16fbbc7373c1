"""``tokenbalance eval``: held-out accuracy of a policy directory (greedy and one sample at T = 1)."""

from __future__ import annotations

import argparse
import json

from tokenbalance.commands.train import add_config_arguments, config_from_args, printed_config_help


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="held-out accuracy per difficulty of a policy")
    add_config_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    import torch

    from tokenbalance.models import load_policy
    from tokenbalance.rollout import make_engine
    from tokenbalance.tasks import get_task
    from tokenbalance.trainer.data import eval_examples
    from tokenbalance.trainer.distributed import DistContext
    from tokenbalance.trainer.evaluate import evaluate
    from tokenbalance.trainer.runner import check_before_work, compute_device, policy_path

    config = config_from_args(args)
    check_before_work(config)  # data, tokenizer, prompt lengths, device: before any model work
    device = compute_device(config)
    path = policy_path(config, device, DistContext(device=device), print)
    model, tokenizer = load_policy(path, device=device, dtype=getattr(torch, config.model.dtype))
    engine = make_engine(config.rollout.engine, model, tokenizer)
    metrics = evaluate(
        engine,
        tokenizer,
        get_task(config.data.task),
        eval_examples(config.data),
        eos_token_ids=set(engine.eos_token_ids),
        max_new_tokens=config.rollout.max_new_tokens,
        max_prompt_tokens=config.data.max_prompt_tokens,
        seed=config.train.seed,
    )
    if args.json:
        print(json.dumps(metrics))
    else:
        for key, value in metrics.items():
            print(f"{key:<32}{value:.4f}")
    return 0
