"""A task defined outside the package and registered at test time runs through the trainer.

Nothing outside ``tokenbalance.tasks`` knows this task: the config's ``data.task`` choices, the
data sources, the file reader, the SFT targets, the tokenizer corpus, the full reward, evaluation,
``gen-data`` and one short embedded-policy RL run all go through the Task protocol.
"""

import json
import math
import random

import pytest
import torch

from tests.trainer.conftest import SMALL_RUN
from tokenbalance.cli import main
from tokenbalance.config import DataConfig, RunConfig, SFTConfig, apply_overrides
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models import train_tokenizer
from tokenbalance.rollout.base import Generation
from tokenbalance.run.examples import eval_examples, rl_examples, sft_examples, sft_pairs
from tokenbalance.tasks import BaseTask, ScoreResult, Task, TaskExample, get_task, register_task, unregister_task
from tokenbalance.trainer.evaluate import evaluate, full_reward
from tokenbalance.trainer.runner import run_training


class AddTask(BaseTask):
    """Add two numbers of ``difficulty`` digits; reward 2 for the right sum, else 0."""

    name = "add"
    templates = ("plain",)
    max_reward = 2.0

    def examples(self, split, *, difficulty=None, count=None, seed=None, template=None, start_index=None):
        digits = 1 if difficulty is None else difficulty
        start = 0 if start_index is None else start_index
        out = []
        for index in range(start, start + (10 if count is None else count)):
            rng = random.Random(f"{seed or 0}/{split}/{digits}/{index}")
            a, b = (rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits) for _ in range(2))
            question = f"{a} + {b}"
            example = TaskExample("", question, str(a + b), "add", digits, index, {"split": split})
            out.append(TaskExample(**{**example.__dict__, "prompt": self.render_prompt(example, "plain")}))
        return out

    def render_prompt(self, example, template):
        return f"User: {example.question} =\nAssistant:"

    def score(self, response, example):
        text = response.strip()
        correct = text == example.ground_truth
        return ScoreResult(2.0 if correct else 0.0, {"format_ok": float(text.isdigit()), "correct": float(correct)})

    def sft_response(self, example, target):
        return f" {example.ground_truth}"

    def read_examples(self, path, template=None):
        rows = [json.loads(line) for line in open(path) if line.strip()]
        return [
            TaskExample(f"User: {r['question']} =\nAssistant:", r["question"], r["answer"], "add_file", 1, i)
            for i, r in enumerate(rows)
        ]


@pytest.fixture
def add_task():
    register_task("add", AddTask)
    yield get_task("add")
    unregister_task("add")


def test_registration_reaches_the_config(add_task):
    assert isinstance(add_task, Task) and add_task.max_reward == 2.0
    assert apply_overrides(RunConfig(), ["data.task=add"]).data.task == "add"
    with pytest.raises(ValueError, match="already registered"):
        register_task("add", AddTask)
    unregister_task("add")
    with pytest.raises(ValueError, match="data.task: unknown value 'add'; valid: 'kk', 'arith'"):
        apply_overrides(RunConfig(), ["data.task=add"])
    register_task("add", AddTask)  # the fixture unregisters it


def test_examples_sources_and_sft_targets(add_task, tmp_path):
    config = DataConfig(
        task="add", template="plain", train_difficulties=(1, 2), eval_difficulties=(2,), eval_count=3, rl_count=900
    )
    rl, held_out, sft = rl_examples(config), eval_examples(config), sft_examples(config, 5)
    assert [len(rl), len(held_out), len(sft)] == [1800, 3, 10]  # data.rl_count prompts per difficulty
    assert [e.difficulty for e in held_out] == [2, 2, 2] and {e.extra["split"] for e in held_out} == {"test"}
    # BaseTask's sources: held-out from the test split (seed 0), RL and SFT from train (seeds 1, 2)
    assert [e.question for e in held_out] == [e.question for e in add_task.examples("test", difficulty=2, count=3)]
    assert [e.question for e in sft[:5]] == [
        e.question for e in add_task.examples("train", difficulty=1, count=5, seed=2)
    ]
    assert rl[0].question != sft[0].question
    pairs = sft_pairs(config, SFTConfig(train_count=5))
    assert [p.response for p in pairs] == [f" {e.ground_truth}" for e in sft]
    assert all(add_task.score(p.response, e).reward == 2.0 for p, e in zip(pairs, sft))
    assert full_reward(add_task) == 2.0

    path = tmp_path / "add.jsonl"
    path.write_text('{"question": "2 + 3", "answer": "5"}\n{"question": "4 + 4", "answer": "8"}\n')
    from_file = rl_examples(DataConfig(task="add", template="plain", train_file=str(path)))
    assert [(e.prompt, e.ground_truth, e.data_source) for e in from_file] == [
        ("User: 2 + 3 =\nAssistant:", "5", "add_file"),
        ("User: 4 + 4 =\nAssistant:", "8", "add_file"),
    ]


class AnswerEngine:
    """Answers every other prompt correctly (the sum), the others with a wrong number."""

    def __init__(self, tokenizer, examples):
        self.tokenizer, self.examples, self.calls = tokenizer, examples, 0

    def generate(self, prompts, sampling, *, n=1):
        start = sampling.seed
        texts = [
            f" {e.ground_truth}" if i % 2 == 0 else f" {int(e.ground_truth) + 1}"
            for i, e in enumerate(self.examples[start : start + len(prompts)])
        ]
        eos = self.tokenizer.eos_token_id
        ids = [self.tokenizer.encode(t, add_special_tokens=False) + [eos] for t in texts]
        T = max(map(len, ids))
        response = torch.full((len(ids), T), self.tokenizer.pad_token_id)
        mask = torch.zeros((len(ids), T), dtype=torch.bool)
        for row, seq in enumerate(ids):
            response[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = True
        self.calls += 1
        return Generation(
            prompt_ids_BS=torch.zeros((len(ids), 1), dtype=torch.long),
            prompt_mask_BS=torch.ones((len(ids), 1), dtype=torch.bool),
            response_ids_BT=response,
            response_mask_BT=mask,
            sampler_logp_BT=None,
            finished_B=torch.ones(len(ids), dtype=torch.bool),
        )


def test_evaluate_counts_max_reward_as_correct(add_task):
    tokenizer = train_tokenizer(add_task.tokenizer_corpus((1, 2), "plain"), vocab_size=300)
    examples = add_task.examples("test", difficulty=1, count=4) + add_task.examples("test", difficulty=2, count=2)
    engine = AnswerEngine(tokenizer, examples)
    metrics = evaluate(
        engine,
        tokenizer,
        add_task,
        examples,
        eos_token_ids={tokenizer.eos_token_id},
        max_new_tokens=4,
        max_prompt_tokens=32,
        batch_size=4,
    )
    assert engine.calls == 4  # two batches per mode
    # each response is its answer's tokens and the EOS; the even rows of each batch are the right sums
    length = [len(tokenizer.encode(f" {e.ground_truth}", add_special_tokens=False)) + 1 for e in examples]
    wrong = [len(tokenizer.encode(f" {int(e.ground_truth) + 1}", add_special_tokens=False)) + 1 for e in examples]
    correct_rows, incorrect_rows = [0, 2, 4], [1, 3, 5]  # batches of 4 and 2: rows 0, 2 | 4 right
    for mode in ("greedy", "sample"):
        assert metrics[f"eval/{mode}/acc_1"] == 0.5 and metrics[f"eval/{mode}/acc_2"] == 0.5
        assert metrics[f"eval/{mode}/acc"] == 0.5 and metrics[f"eval/{mode}/reward"] == 1.0
        assert metrics[f"eval/{mode}/format_error"] == 0.0
        assert metrics[f"eval/{mode}/response_len_correct"] == sum(length[i] for i in correct_rows) / 3
        assert metrics[f"eval/{mode}/response_len_incorrect"] == sum(wrong[i] for i in incorrect_rows) / 3


def test_embedded_policy_and_a_short_run(add_task, tmp_path, capsys):
    overrides = [o for o in SMALL_RUN if not o.startswith("data.")] + [
        "data.task=add",
        "data.template=plain",
        "data.train_difficulties=[1]",
        "data.eval_difficulties=[1, 2]",
        "data.eval_count=4",
        "data.max_prompt_tokens=32",
        "rollout.max_new_tokens=4",
        "train.method=grpo",
        "model.hidden_size=32",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.intermediate_size=64",
        "model.vocab_size=320",
        f"model.cache_dir={tmp_path / 'cache'}",
        "sft.steps=3",
        "sft.batch_size=8",
        "sft.warmup_steps=1",
        "sft.train_count=40",
    ]
    config = apply_overrides(RunConfig(), overrides)
    config.output.run_dir = str(tmp_path / "run")
    records = read_metrics(run_training(config, log=lambda *_: None) / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in evals] == [0, 2]
    assert all(math.isfinite(r["loss/total"]) and 0.0 <= r["reward/mean"] <= 2.0 for r in train)
    # reward/acc counts responses at the task's max reward (2): mean reward = 2 * accuracy
    assert all(r["reward/mean"] == 2.0 * r["reward/acc"] for r in train)
    assert {"eval/greedy/acc_1", "eval/greedy/acc_2", "eval/sample/reward"} <= set(evals[0])
    assert (tmp_path / "cache").is_dir() and any(p.name.startswith("add-tiny-") for p in (tmp_path / "cache").iterdir())

    out = tmp_path / "add.parquet"
    assert main(["gen-data", "add", "--split", "test", "--out", str(out)]) == 2
    assert "task 'add' writes no data files" in capsys.readouterr().err and not out.exists()
