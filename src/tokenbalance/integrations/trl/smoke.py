"""A few TRL steps per method on the tiny model, on CPU: the end-to-end and data-parallel check.

Writes one JSON per method and rank (losses, metrics, optimizer steps, a SHA-256 of the final
parameters). The reward adds a dense term to K&K's, which is constant on a random tiny model.
docs/trl.md, "Use", has the rest.

    python -m tokenbalance.integrations.trl.smoke --out runs/trl-smoke
    torchrun --standalone --nproc_per_node 2 -m tokenbalance.integrations.trl.smoke --out runs/trl-smoke
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenbalance.algorithms.methods import Method

SMOKE_METHODS = ("grpo", "ar", "tr_grpo", "lopti", "nthr")
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_DISABLED": "true",
    "TOKENIZERS_PARALLELISM": "false",
}


def build_tiny_policy(directory: str | os.PathLike, *, seed: int = 0) -> Path:
    """A 2-layer, hidden-32 Llama and a 512-token K&K tokenizer saved to ``directory``."""
    from tokenbalance.models import TinyModelConfig, build_tiny_model, save_policy, train_tokenizer
    from tokenbalance.tasks import DEFAULT_TASK, get_task

    tokenizer = train_tokenizer(get_task(DEFAULT_TASK).tokenizer_corpus((2, 3), "plain"), vocab_size=512)
    config = TinyModelConfig(
        hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=256
    )
    return save_policy(build_tiny_model(config, tokenizer, seed=seed), tokenizer, directory)


def even_token_share(prompts, completions, completion_ids, **_) -> list[float]:
    """Share of even token ids in each completion: a dense reward, so that groups are rarely all equal."""
    return [sum(int(t) % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


even_token_share.max_reward = 1.0  # NTHR's "correct" = the maximum of KK + this = 4 (never on a random model)


def parameter_digest(model) -> str:
    """SHA-256 of every parameter's bytes, in name order (identical models give identical digests)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().view(-1).double().numpy().tobytes())
    return digest.hexdigest()


def method_from_spec(spec: str) -> Method:
    """A preset with dotted overrides: ``"lopti@lopti.eta=0.002"`` (values parsed as JSON when they can be)."""
    from tokenbalance.algorithms.presets import resolve_method

    name, *assignments = spec.split("@")
    overrides = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise ValueError(f"method spec {spec!r}: expected name@field=value, got {assignment!r}")
        try:
            overrides[key] = json.loads(text)
        except json.JSONDecodeError:
            overrides[key] = text
    return resolve_method(name, overrides, setting="--methods", key_prefix=f"--methods {name}@")


def run_method(
    method: Method | str,
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    steps: int = 2,
    group_size: int = 4,
    prompts_per_step: int = 2,
    max_completion_length: int = 16,
    learning_rate: float = 1e-2,
    seed: int = 0,
) -> dict:
    """Train ``method`` for ``steps`` generation batches; returns what the tests assert on."""
    import torch

    from tokenbalance.algorithms.presets import resolve_method
    from tokenbalance.integrations.trl.build import build_grpo_trainer
    from tokenbalance.integrations.trl.config import pass_count
    from tokenbalance.integrations.trl.rewards import TaskReward, task_prompt_dataset
    from tokenbalance.models import load_policy

    torch.set_num_threads(1)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    method = resolve_method(method)
    passes = pass_count(method)
    _, tokenizer = load_policy(model_dir)
    dataset = task_prompt_dataset(prompts_per_step * steps, difficulty=2, template="compact")
    trainer = build_grpo_trainer(
        str(model_dir),
        tokenizer=tokenizer,
        train_dataset=dataset,
        reward_funcs=[TaskReward(tokenizer), even_token_share],
        reward_weights=[1.0, 1.0],
        method=method,
        group_size=group_size,
        prompts_per_step=prompts_per_step,
        max_completion_length=max_completion_length,
        output_dir=str(output_dir),
        world_size=world_size,
        max_steps=steps * passes,
        learning_rate=learning_rate,
        seed=seed,
        shuffle_dataset=False,
    )
    policy = trainer.accelerator.unwrap_model(trainer.model)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainer.train()
    change = math.sqrt(sum(float((p.detach() - before[n]).double().pow(2).sum()) for n, p in policy.named_parameters()))
    steps_logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {
        "method": method.name,
        "rank": trainer.accelerator.process_index,
        "world_size": trainer.accelerator.num_processes,
        "optimizer_steps": trainer.state.global_step,
        "generation_batches": sum("reward" in entry for entry in steps_logged),
        "losses": [entry["loss"] for entry in steps_logged],
        "grad_norms": [entry["grad_norm"] for entry in steps_logged],
        "pass_index": [entry.get("lopti/pass_index") for entry in steps_logged],
        "metric_keys": sorted({key for entry in steps_logged for key in entry}),
        "log": steps_logged,
        "parameter_change": change,
        "parameter_digest": parameter_digest(policy),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="local policy directory (default: build the tiny one under --out)")
    parser.add_argument("--out", required=True, help="output directory (one JSON per method and rank)")
    parser.add_argument(
        "--methods",
        default=",".join(SMOKE_METHODS),
        help="comma-separated presets, each optionally with overrides: lopti@lopti.eta=0.002",
    )
    parser.add_argument("--steps", type=int, default=2, help="generation batches per method")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--max-completion-length", type=int, default=16)
    args = parser.parse_args(argv)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model
    if model_dir is None:
        model_dir = out / "tiny-policy"
        if int(os.environ.get("RANK", "0")) == 0 and not model_dir.exists():
            build_tiny_policy(model_dir)
        _wait_for(model_dir)
    for spec in args.methods.split(","):
        method = method_from_spec(spec)
        result = run_method(
            method,
            model_dir,
            out / method.name,
            steps=args.steps,
            group_size=args.group_size,
            prompts_per_step=args.prompts_per_step,
            max_completion_length=args.max_completion_length,
        )
        path = out / f"{method.name}.rank{result['rank']}.json"
        path.write_text(json.dumps(result, indent=1, default=float))
        print(
            f"{method.name} rank {result['rank']}/{result['world_size']}: {result['optimizer_steps']} optimizer "
            f"steps, losses {result['losses']}, parameter change {result['parameter_change']:.3g}"
        )


def _wait_for(path: Path, timeout_s: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not (path / "config.json").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: rank 0 did not write the tiny policy within {timeout_s:.0f} s")
        time.sleep(0.2)


if __name__ == "__main__":
    main()
