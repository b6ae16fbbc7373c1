"""``tokenbalance diagnose buckets|lld|nthr`` end to end on a tiny model, the NTHR selection against the
algorithm's weights, and bad input (mismatched tokenizer, bad edges, a run without a checkpoint)."""

import json
import math

import pytest
import torch

from tests.algorithms.helpers import make_batch
from tokenbalance.algorithms.methods import compute_advantages
from tokenbalance.algorithms.nthr import NTHRConfig, nthr_correct, nthr_token_weights
from tokenbalance.algorithms.presets import get_method
from tokenbalance.cli import main
from tokenbalance.diagnostics.nthr_view import bracket_selected, nthr_selections
from tokenbalance.diagnostics.token_classes import token_pieces
from tokenbalance.models import load_policy, save_policy
from tokenbalance.run.checkpoints import policy_dir

torch.set_num_threads(1)
SMALL = [
    "--set",
    "data.train_difficulties=[2]",
    "--set",
    "rollout.max_new_tokens=10",
    "--set",
    "optim.micro_batch_size=4",
    "--set",
    "train.threads=1",
    "--prompts",
    "2",
    "--group-size",
    "4",
]


def test_diagnose_buckets(tiny_policy_dir, tmp_path, mixed_rewards, capsys):
    out = tmp_path / "buckets.json"
    # a low temperature spreads the random model's token probabilities over the buckets (with the
    # HF engine's random stream this sample fills all four; the spread depends on the sample)
    assert (
        main(
            [
                "diagnose",
                "buckets",
                str(tiny_policy_dir),
                *SMALL,
                "--set",
                "rollout.temperature=0.1",
                "--set",
                "rollout.engine=hf",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "update on lowest tokens ([0, 0.25)" in printed and "up|A>0" in printed
    result = json.loads(out.read_text())
    updates = result["updates"]
    assert list(updates) == ["all", "lowest", "highest"] and result["lr"] == 1e-3
    counts = [row["tokens"] for row in updates["all"]["buckets"]]
    assert sum(counts) == result["tokens"] and all(c > 0 for c in counts)
    assert updates["all"]["updated_tokens"] == result["tokens"]  # two correct + two wrong: no zero advantage
    assert updates["lowest"]["updated_tokens"] == counts[0] and updates["highest"]["updated_tokens"] == counts[-1]
    assert 0 < updates["highest"]["grad_norm"] < updates["all"]["grad_norm"]
    assert any(abs(row["dp_mean"]) > 1e-6 for row in updates["all"]["buckets"])
    first = updates["all"]["buckets"][0]  # the table prints small changes with their digits, not +0.0000
    assert f"{first['dp_mean']:+.2e}" in printed and "+0.0000" not in printed
    for update in updates.values():
        for row in update["buckets"]:
            assert row["pos_up_frac"] is None or 0.0 <= row["pos_up_frac"] <= 1.0


def test_diagnose_lld(tiny_policy_dir, tmp_path, mixed_rewards, capsys):
    out = tmp_path / "lld.json"
    assert (
        main(
            ["diagnose", "lld", str(tiny_policy_dir), *SMALL, "--optimizer", "sgd", "--lr", "0.05", "--json", str(out)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["summary"]["questions"] == 2 and len(result["questions"]) == 2
    for row in result["questions"]:
        assert row["correct"] == 2 and row["group_size"] == 4 and math.isfinite(row["delta"])
        assert row["delta"] != 0.0  # the update moved the correct responses
    assert "LLD share" in capsys.readouterr().out


def test_diagnose_nthr_prints_selected_tokens(tiny_policy_dir, mixed_rewards, capsys):
    # beta = -inf selects every negative token: each incorrect response is printed fully bracketed
    assert (
        main(
            [
                "diagnose",
                "nthr",
                str(tiny_policy_dir),
                *SMALL,
                "--plain",
                "--max-groups",
                "1",
                "--set",
                "train.method_overrides.nthr.beta=-inf",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "2 mixed group(s)" in printed and "p = 0.500, eta = 0.000" in printed
    responses = [line for line in printed.splitlines() if line.startswith("--- response")]
    assert len(responses) == 2 and all("selected" in line for line in responses)
    lines = printed.splitlines()
    body = lines[lines.index(responses[0]) + 1]
    assert body.startswith("[") and body.endswith("]")


@pytest.mark.parametrize("positives", ["correct", "advantage_sign"])
@pytest.mark.parametrize("beta, exclude", [(1.0, False), (0.0, True), (-math.inf, False)])
def test_nthr_selection_matches_the_algorithm_weights(beta, exclude, positives):
    batch = make_batch(seed=5, groups=3, group_size=4, binary=False)  # graded: the two rules differ
    config = NTHRConfig(beta=beta, eta=0.5, anchor_exclude_self=exclude, positives=positives, correct_threshold=0.0)
    correct_B = nthr_correct(batch.scores_B, config)
    adv = compute_advantages(get_method("grpo"), batch.scores_B, batch.group_ids_B, batch.mask_BT)
    weights, metrics = nthr_token_weights(
        adv,
        batch.mask_BT,
        batch.group_ids_B,
        batch.tokens_BT,
        batch.old_logp_BT,
        batch.hidden_BTD,
        batch.unembed_VD,
        config,
        correct_B=correct_B,
    )
    views = nthr_selections(
        adv,
        batch.mask_BT,
        batch.group_ids_B,
        batch.tokens_BT,
        batch.old_logp_BT,
        batch.hidden_BTD,
        batch.unembed_VD,
        config,
        correct_B=correct_B,
    )
    assert len(views) == metrics["nthr/mixed_groups"] > 0
    selected = torch.zeros_like(batch.mask_BT)
    for view in views:
        for n, row in enumerate(view.negative_rows):
            selected[row] = view.selected_NT[n]
    assert torch.equal(selected, weights == 0.5)
    total_neg = sum(int(batch.mask_BT[v.negative_rows].sum()) for v in views)
    assert int(selected.sum()) / total_neg == pytest.approx(metrics["nthr/selected_frac"])


def test_bracketing_and_token_pieces(tiny_policy_dir):
    assert bracket_selected(["a", "b", "c", "d"], [True, True, False, True]) == "[ab]c[d]"
    assert bracket_selected(["a", "b"], [False, False]) == "ab"
    _, tokenizer = load_policy(tiny_policy_dir)
    ids = tokenizer.encode("Ava is a knight <answer> Émile", add_special_tokens=False)
    assert "".join(token_pieces(tokenizer, ids)) == tokenizer.decode(ids, skip_special_tokens=False)


def test_checkpoint_that_does_not_match_the_tokenizer(tiny_policy_dir, tmp_path, capsys):
    model, tokenizer = load_policy(tiny_policy_dir)
    model.resize_token_embeddings(len(tokenizer) - 40)
    save_policy(model, tokenizer, tmp_path / "mismatch")
    assert main(["diagnose", "buckets", str(tmp_path / "mismatch"), *SMALL]) == 2
    assert "tokenizer and weights do not belong together" in capsys.readouterr().err


def test_bad_edges_and_run_without_checkpoint(tiny_policy_dir, tmp_path, capsys):
    assert main(["diagnose", "buckets", str(tiny_policy_dir), *SMALL, "--edges", "0,0.5,0.9"]) == 2
    assert "diagnostics.bucket_edges: the buckets must cover [0, 1]" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert main(["diagnose", "lld", str(run), *SMALL]) == 2
    assert "without a complete checkpoint" in capsys.readouterr().err
    (run / "checkpoints" / "step_000003" / "model").mkdir(parents=True)
    (run / "checkpoints" / "step_000003" / "model" / "config.json").write_text("{}")
    assert main(["diagnose", "lld", str(run), *SMALL]) == 2  # a model without its trainer files: not complete
    assert "without a complete checkpoint" in capsys.readouterr().err
    for name in ("trainer_state.json", "optimizer.safetensors"):
        (run / "checkpoints" / "step_000003" / name).write_text("{}")
    assert policy_dir(str(run)) == str(run / "checkpoints" / "step_000003" / "model")  # no latest yet
    (run / "checkpoints" / "latest").write_text("step_000003\n")
    assert policy_dir(str(run)) == str(run / "checkpoints" / "step_000003" / "model")
    assert policy_dir(str(tiny_policy_dir)) == str(tiny_policy_dir)


@pytest.fixture(scope="module")
def arith_policy_dir(tmp_path_factory):
    """A random tiny model with the arith working's tokenizer."""
    from tokenbalance.models import TinyModelConfig, build_tiny_model, train_tokenizer
    from tokenbalance.tasks import get_task

    path = tmp_path_factory.mktemp("arith-policy") / "tiny"
    tokenizer = train_tokenizer(list(get_task("arith").tokenizer_corpus([1], "plain")))
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer, seed=0
    )
    save_policy(model, tokenizer, path)
    return path


def test_diagnose_buckets_by_token_class(arith_policy_dir, tmp_path, monkeypatch, capsys):
    from tokenbalance.tasks.arith import TOKEN_CLASSES, ArithTask
    from tokenbalance.tasks.base import ScoreResult

    calls = {"n": 0}

    def score(self, response, example):  # two right and two wrong per group: every advantage nonzero
        calls["n"] += 1
        return ScoreResult(1.0 if calls["n"] % 4 in (1, 2) else 0.0, {})

    monkeypatch.setattr(ArithTask, "score", score)
    out = tmp_path / "buckets.json"
    arith = ["--set", "data.task=arith", "--set", "data.template=plain", "--set", "data.train_difficulties=[1]"]
    assert main(["diagnose", "buckets", str(arith_policy_dir), *SMALL, *arith, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    profile = result["class_profile"]
    assert [row["class"] for row in profile["classes"]] == list(TOKEN_CLASSES)
    assert sum(row["tokens"] for row in profile["classes"]) == profile["tokens"] == result["tokens"]
    per_bucket = [sum(row["buckets"][b] for row in profile["classes"]) for b in range(4)]
    assert per_bucket == [row["tokens"] for row in result["updates"]["all"]["buckets"]]
    assert f"{profile['low_decision_share']:.1%} of those decisions" in printed
    for update in result["updates"].values():
        signed = sum(row["tokens"] for row in update["by_class"])
        assert signed == result["tokens"]  # every token has a class, an interval and a nonzero advantage
