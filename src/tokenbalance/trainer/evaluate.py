"""Held-out evaluation as the AR-Lopti reference logs it: accuracy (reward == ``max_reward``) per difficulty for
greedy and one temperature-1 sample, mean reward, response length (also of correct / incorrect responses) and
format-error rate (docs/metrics.md)."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from tokenbalance.rollout.base import RolloutEngine, SamplingParams
from tokenbalance.run.examples import encode_prompts
from tokenbalance.run.state import EVAL_OUTCOMES
from tokenbalance.tasks.base import Task, TaskExample
from tokenbalance.trainer.scoring import decode_responses, score_responses

MODES = {"greedy": 0.0, "sample": 1.0}


def full_reward(task: Task) -> float:
    """The reward of a fully correct answer: the task's ``max_reward`` (K&K 3, math 1)."""
    return float(task.max_reward)


def evaluate(
    engine: RolloutEngine,
    tokenizer,
    task: Task,
    examples: Sequence[TaskExample],
    *,
    eos_token_ids: set[int],
    max_new_tokens: int,
    max_prompt_tokens: int,
    batch_size: int = 256,
    seed: int = 0,
    responses: list[dict] | None = None,
    on_batch: Callable[[int], None] | None = None,
    prompt_ids: Sequence[list[int]] | None = None,
) -> dict[str, float]:
    """``eval/{greedy,sample}/{acc,acc_<difficulty>,reward,response_len,response_len_correct,response_len_incorrect,
    format_error}`` (a length over no response is NaN; ``format_error`` only for tasks whose scores carry
    ``format_ok``).

    ``responses``: appended one record per response (mode, data source, index, difficulty, reward, correct, tokens,
    format_ok or None, text). ``on_batch``: called with the responses scored so far (``len(MODES) * len(examples)`` in
    all). ``prompt_ids``: the prompts already encoded (:class:`~tokenbalance.run.setup.RunSetup`)."""
    prompts = list(prompt_ids) if prompt_ids is not None else encode_prompts(tokenizer, examples, max_prompt_tokens)
    target = full_reward(task)
    metrics: dict[str, float] = {}
    scored = 0
    for mode, temperature in MODES.items():
        per_level: dict[int, list[float]] = defaultdict(list)
        rewards, lengths, format_errors = [], [], []
        lengths_by_outcome: dict[bool, list[int]] = {True: [], False: []}
        for start in range(0, len(prompts), batch_size):
            batch = examples[start : start + batch_size]
            sampling = SamplingParams(max_new_tokens, temperature, seed=seed + start)
            out = engine.generate(prompts[start : start + batch_size], sampling)
            texts = decode_responses(tokenizer, out.response_ids_BT, out.response_mask_BT, eos_token_ids)
            for example, text, result, length in zip(
                batch, texts, score_responses(task, texts, batch), out.response_mask_BT.sum(dim=1).tolist()
            ):
                correct = result.reward == target
                format_ok = float(result.metrics["format_ok"]) if "format_ok" in result.metrics else None
                per_level[example.difficulty].append(float(correct))
                rewards.append(result.reward)
                lengths.append(length)
                lengths_by_outcome[correct].append(length)
                if format_ok is not None:
                    format_errors.append(1.0 - format_ok)
                if responses is not None:
                    responses.append(
                        {
                            "mode": mode,
                            "data_source": example.data_source,
                            "index": example.index,
                            "difficulty": example.difficulty,
                            "reward": result.reward,
                            "correct": correct,
                            "tokens": length,
                            "format_ok": format_ok,
                            "text": text,
                        }
                    )
            scored += len(batch)
            if on_batch is not None:
                on_batch(scored)
        prefix = f"eval/{mode}"
        for level, values in sorted(per_level.items()):
            metrics[f"{prefix}/acc_{level}"] = sum(values) / len(values)
        level_accs = [metrics[f"{prefix}/acc_{level}"] for level in sorted(per_level)]
        metrics[f"{prefix}/acc"] = sum(level_accs) / len(level_accs)
        metrics[f"{prefix}/reward"] = sum(rewards) / len(rewards)
        metrics[f"{prefix}/response_len"] = sum(lengths) / len(lengths)
        for correct, name in ((True, "correct"), (False, "incorrect")):
            chosen = lengths_by_outcome[correct]
            metrics[f"{prefix}/response_len_{name}"] = sum(chosen) / len(chosen) if chosen else float("nan")
        if format_errors:
            metrics[f"{prefix}/format_error"] = sum(format_errors) / len(format_errors)
    return metrics


def outcome_lines(step: int, responses: list[dict]) -> list[dict]:
    """One record per mode of an evaluation's ``responses`` (:func:`evaluate`'s): the step, the mode, a digest of the
    examples in order (``examples``: two runs' outcomes pair only when it is the same) and ``correct``, one character
    per example, ``1`` correct and ``0`` not."""
    lines = []
    for mode in MODES:
        chosen = [r for r in responses if r["mode"] == mode]
        if not chosen:
            continue
        keys = "\n".join(f"{r['data_source']}:{r['difficulty']}:{r['index']}" for r in chosen)
        lines.append(
            {
                "step": step,
                "mode": mode,
                "examples": hashlib.sha256(keys.encode()).hexdigest()[:16],
                "correct": "".join("1" if r["correct"] else "0" for r in chosen),
            }
        )
    return lines


def append_outcomes(run_dir: Path, step: int, responses: list[dict]) -> None:
    """Append an evaluation's per-example outcomes to ``run_dir/eval_outcomes.jsonl``."""
    with open(Path(run_dir) / EVAL_OUTCOMES, "a") as out:
        for line in outcome_lines(step, responses):
            out.write(json.dumps(line) + "\n")


def read_outcomes(run_dir: Path) -> dict[tuple[int, str], dict]:
    """The outcomes of each (step, mode) of a run, the last line of each winning (an evaluation redone after a resume
    replaces the earlier one); empty when the run has none. A torn last line is skipped."""
    path = Path(run_dir) / EVAL_OUTCOMES
    if not path.is_file():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            found[(int(record["step"]), str(record["mode"]))] = record
        except (ValueError, KeyError, TypeError):
            continue
    return found
