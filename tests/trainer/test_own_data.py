"""Your own problem on a CPU without ``--model``: ``--target-column`` builds the embedded tiny
tokenizer and model on your rows, warm-starts it on the targets, caches it like the K&K default,
and RL follows; refused in one line, before any work, when the rows have no target."""

import json
import math
from pathlib import Path

import pytest

from tests.tasks.reward_modules import write_jsonl
from tests.trainer.conftest import SMALL_RUN
from tokenbalance.cli import main
from tokenbalance.config import RunConfig, apply_overrides, load_config
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models.loading import load_checked_tokenizer
from tokenbalance.run.examples import SFTPair, row_pairs
from tokenbalance.trainer import runner
from tokenbalance.trainer.embedded import embedded_key
from tokenbalance.user_code import load_function

EXAMPLE = Path(__file__).parents[2] / "examples" / "reverse"
REWARD = f"{EXAMPLE / 'rewards.py'}:reverse"
TINY = [  # a tiny model and a short SFT, so that the build takes seconds
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "sft.steps=30",
    "sft.batch_size=8",
    "sft.warmup_steps=3",
    "sft.lr=0.01",
]
RUN = [o for o in SMALL_RUN if not o.startswith("data.")] + ["train.method=grpo", "train.steps=1", *TINY]


def example_rows(name: str, count: int) -> list[dict]:
    return [json.loads(line) for line in (EXAMPLE / name).read_text().splitlines()[:count]]


@pytest.fixture
def files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", example_rows("train.jsonl", 8))
    write_jsonl(tmp_path / "test.jsonl", example_rows("test.jsonl", 4))
    return tmp_path


def args(tmp_path, *extra, command="train"):
    sets = [arg for override in RUN for arg in ("--set", override)]
    yours = ["--data", str(tmp_path / "train.jsonl"), "--eval-data", str(tmp_path / "test.jsonl"), "--reward", REWARD]
    where = ["--run-dir", str(tmp_path / "run")] if command == "train" else []
    cache = ["--set", f"model.cache_dir={tmp_path / 'cache'}"]
    return [command, *where, *yours, *sets, *cache, *extra]


def test_the_example_rows_are_sft_pairs_and_its_reward_scores_them():
    config = apply_overrides(
        RunConfig(),
        [
            f"data.train_file={EXAMPLE / 'train.jsonl'}",
            f"data.eval_file={EXAMPLE / 'test.jsonl'}",
            f"data.reward={REWARD}",
            "data.target_column=target",
        ],
    )
    pairs = row_pairs(config.data)
    assert len(pairs) == 2000 and pairs[0] == SFTPair("reverse: n b i p =", " p i b n")
    reverse = load_function(REWARD, "data.reward")
    assert [reverse(text, " p i b n") for text in (" p i b n", "p i b x", "n b i p", "")] == [1.0, 0.375, 0.0, 0.0]


def test_train_without_model_builds_the_tiny_policy_on_your_rows_then_rl(files, capsys):
    assert main(args(files, "--target-column", "target")) == 0
    out = capsys.readouterr().out
    assert "embedded policy: tiny llama with" in out and "SFT for 30 steps" in out
    cached = list((files / "cache").iterdir())
    assert [p.name.split("-")[:2] for p in cached] == [["function", "tiny"]]
    saved = load_config(files / "run" / "config.yaml")
    assert saved.model.path == str(cached[0]) and saved.data.target_column == "target"
    summary = json.loads((cached[0] / "tokenbalance_sft.json").read_text())
    tokenizer = load_checked_tokenizer(cached[0])
    assert summary["sft_final_loss"] < math.log(len(tokenizer)) - 1  # it learnt from the targets
    assert tokenizer.tokenize(" p i b n") == ["Ġp", "Ġi", "Ġb", "Ġn"]  # built on the rows' text
    records = read_metrics(files / "run" / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [("eval", 0), ("train", 1), ("eval", 1)]
    # the same flags again (eval, no --model): the cached policy is reused, not built again
    assert main(args(files, "--target-column", "target", "--count", "2", command="eval")) == 0
    assert f"embedded policy: reusing {cached[0]}" in capsys.readouterr().out


def test_the_cache_key_follows_the_rows_and_the_columns(files):
    def key(*extra):
        return embedded_key(
            apply_overrides(
                RunConfig(),
                [
                    f"data.train_file={files / 'train.jsonl'}",
                    f"data.eval_file={files / 'test.jsonl'}",
                    f"data.reward={REWARD}",
                    "data.target_column=target",
                    *extra,
                ],
            )
        )

    first = key()
    assert first.startswith("function-tiny-") and key() == first
    assert key("data.prompt_column=target") != first
    (files / "train.jsonl").write_text((files / "train.jsonl").read_text().replace("reverse", "flip"))
    assert key() != first


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "no target column",
            "data.reward: give the policy to train with --model PATH (a Hugging Face model directory), or "
            "--target-column NAME",
        ),
        (
            "a row without its target",
            "{tmp}/train.jsonl: row 1 (line 2): column 'good' (data.target_column): missing; the row's columns: prompt, "
            "target",
        ),
        (
            "an empty target",
            "{tmp}/train.jsonl: row 1 (line 2): column 'good' (data.target_column): expected non-empty",
        ),
        (
            "with --model",
            "data.target_column='good': it builds the embedded tiny model on your rows, without --model",
        ),
    ],
)
def test_a_file_without_targets_is_one_line_before_any_work(files, tiny_policy_dir, monkeypatch, capsys, case, message):
    def no_model(*args, **kwargs):
        raise AssertionError("the policy was built or loaded before the input was checked")

    monkeypatch.setattr(runner, "load_run_policy", no_model)
    monkeypatch.setattr(runner, "policy_path", no_model)
    rows = [{**row, "good": row["target"]} for row in example_rows("train.jsonl", 3)]  # the reward takes target
    if case == "a row without its target":
        del rows[1]["good"]
    if case == "an empty target":
        rows[1]["good"] = " "
    write_jsonl(files / "train.jsonl", rows)
    extra = {"no target column": [], "with --model": ["--target-column", "good", "--model", str(tiny_policy_dir)]}
    assert main(args(files, *extra.get(case, ["--target-column", "good"]))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(tmp=files) in err, err
    assert not (files / "run").exists() and not (files / "cache").exists()


def test_a_target_column_without_your_reward_is_refused(capsys):
    assert main(["train", "--target-column", "target"]) == 2
    assert "data.target_column='target': the target column of your rows goes with your reward function" in (
        capsys.readouterr().err
    )


def test_sft_builds_the_same_policy_on_your_rows(files, capsys):
    """``tokenbalance sft --out DIR`` with the same flags builds the policy ``train`` would cache."""
    sets = [arg for override in TINY for arg in ("--set", override)]
    yours = ["--data", str(files / "train.jsonl"), "--eval-data", str(files / "test.jsonl"), "--reward", REWARD]
    out = files / "sft"
    assert main(["sft", "--out", str(out), *yours, "--target-column", "target", *sets, "--no-progress"]) == 0
    assert f"saved the SFT policy to {out}" in capsys.readouterr().out
    assert load_checked_tokenizer(out).tokenize(" p i b n") == ["Ġp", "Ġi", "Ġb", "Ġn"]
    assert main(["sft", "--out", str(files / "sft2"), *yours, *sets]) == 2  # no target column: one line
    assert "(--target-column NAME)" in capsys.readouterr().err
