"""The old policy's forward run once, with gradient, as the update's first forward
(``trainer/update.py``, :func:`tokenbalance.trainer.loop.first_update_forward`) changes no bit: a
run logs every value and ends with the weights of a run that computes the old log-probs in their
own no-gradient forward, for every method family (Lopti's two passes and a token rule's split
fall back to the separate forward), with the diagnostics' gradient shares, an entropy bonus, NTHR's
hidden states and the gradient-norm probe. The rewards are the response lengths mod 4 (a random
tiny policy earns no K&K reward), so every step has advantages and a gradient."""

import pytest
import torch

from tests.trainer.conftest import SMALL_RUN
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.tasks.base import ScoreResult
from tokenbalance.trainer import batch as batch_module
from tokenbalance.trainer import loop
from tokenbalance.trainer.runner import run_training

ONE_MICRO_BATCH = ["optim.mini_batch_size=8", "optim.micro_batch_size=8", "train.steps=3", "train.save_every=3"]
CLOCK_KEYS = ("timing/", "throughput/", "peak_")


@pytest.fixture(autouse=True)
def length_rewards(monkeypatch):
    def score(task, texts, examples):
        return [ScoreResult(float(len(text) % 4)) for text in texts]

    monkeypatch.setattr(batch_module, "score_responses", score)


def run(tmp_path, name: str, overrides: list[str]) -> tuple[list[dict], dict]:
    config = apply_overrides(RunConfig(), SMALL_RUN + ONE_MICRO_BATCH + overrides)
    config.output.run_dir = str(tmp_path / name)
    run_dir = run_training(config, log=lambda *_: None)
    records = [
        {k: v for k, v in r.items() if not any(k.startswith(p) for p in CLOCK_KEYS)}
        for r in read_metrics(run_dir / "metrics.jsonl")
    ]
    from safetensors.torch import load_file

    weights = load_file(str(run_dir / "checkpoints" / "step_000003" / "model" / "model.safetensors"))
    return records, weights


@pytest.mark.parametrize(
    ("method", "extra", "shared"),
    [
        ("arlopti_kk_fig4_grpo", [], True),
        ("arlopti_kk_fig4_ar", ["method.entropy_coeff=0.01", "diagnostics.grad_norm_every=2"], True),
        ("tr_grpo", ["diagnostics.grad_share=false"], True),
        ("nthr", [], True),
        ("arlopti_kk_fig4_ar_lopti", [], False),
    ],
)
def test_the_shared_first_forward_changes_no_bit(tiny_policy_dir, tmp_path, monkeypatch, method, extra, shared):
    overrides = [f"model.path={tiny_policy_dir}", f"train.method={method}", *extra]
    calls = []
    original = loop.first_update_forward

    def counting(parts, batch):
        first = original(parts, batch)
        calls.append(first is not None)
        return first

    monkeypatch.setattr(loop, "first_update_forward", counting)
    records, weights = run(tmp_path, "shared", overrides)
    assert calls == [shared] * 3
    monkeypatch.setattr(loop, "first_update_forward", lambda parts, batch: None)
    separate, separate_weights = run(tmp_path, "separate", overrides)
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert records == separate
    trained = [r for r in records if r["kind"] == "train"]
    assert all(r["adv/abs_mean"] > 0 and r["optim/grad_norm"] > 1e-4 for r in trained)
    assert weights.keys() == separate_weights.keys()
    assert all(torch.equal(weights[k], separate_weights[k]) for k in weights)


def test_no_sharing_when_the_batch_spans_micro_batches(tiny_policy_dir, tmp_path, monkeypatch):
    calls = []
    original = loop.first_update_forward
    monkeypatch.setattr(loop, "first_update_forward", lambda p, b: calls.append(original(p, b)))
    overrides = [f"model.path={tiny_policy_dir}", "optim.micro_batch_size=4", "train.steps=1"]
    config = apply_overrides(RunConfig(), SMALL_RUN + ONE_MICRO_BATCH + overrides)
    config.output.run_dir = str(tmp_path / "run")
    run_training(config, log=lambda *_: None)
    assert calls == [None]
