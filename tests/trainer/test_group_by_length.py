"""Micro-batches of rows of similar length (``optim.group_by_length``): each forward stops at its own
longest response (``trim_padding``) and the log-probs, the loss and the gradient are those of the
untrimmed, ungrouped forward up to float rounding; off, nothing changes."""

import pytest
import torch

from tests.models.helpers import tiny_model
from tests.tolerances import assert_close_in
from tests.trainer.conftest import SMALL_RUN
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.tasks.base import ScoreResult
from tokenbalance.trainer import batch as batch_module
from tokenbalance.trainer.logprobs import (
    batched_response_logprobs,
    micro_batches,
    pack_sequences,
    response_logprobs,
)
from tokenbalance.trainer.runner import run_training

CLOCK_KEYS = ("timing/", "throughput/", "peak_")


def ragged_batch(groups: int = 3, group_size: int = 4, prompt_len: int = 5, width: int = 9, seed: int = 0):
    """Groups sharing a prompt, responses of lengths 1..width in a scrambled order."""
    generator = torch.Generator().manual_seed(seed)
    rows = groups * group_size
    prompts_PS = torch.randint(10, 300, (groups, prompt_len), generator=generator)
    responses_BT = torch.randint(10, 300, (rows, width), generator=generator)
    lengths_B = 1 + torch.randperm(rows, generator=generator) % width
    mask_BT = torch.arange(width)[None, :] < lengths_B[:, None]
    packed = pack_sequences(
        prompts_PS.repeat_interleave(group_size, 0),
        torch.ones(rows, prompt_len, dtype=torch.bool),
        responses_BT.masked_fill(~mask_BT, 0),
        mask_BT,
        torch.arange(groups).repeat_interleave(group_size),
    )
    return packed, mask_BT, lengths_B


def test_micro_batches_are_the_contiguous_chunks_unless_grouped_by_length():
    packed, _, lengths_B = ragged_batch()
    assert micro_batches(packed, slice(0, 12), 5, group_by_length=False) == [slice(0, 5), slice(5, 10), slice(10, 12)]
    assert micro_batches(packed, slice(4, 12), 8, group_by_length=True) == [slice(4, 12)]  # one: nothing to group
    chunks = micro_batches(packed, slice(2, 12), 4, group_by_length=True)
    assert [len(c) for c in chunks] == [4, 4, 2]
    rows = torch.cat(chunks)
    assert sorted(rows.tolist()) == list(range(2, 12))  # every row of the mini-batch once, no other
    assert lengths_B[rows].tolist() == sorted(lengths_B[2:12].tolist())  # shortest first


def test_a_trimmed_forward_equals_the_full_width_one_with_zeros_after_the_longest_response():
    model = tiny_model("llama").double().train()
    packed, mask_BT, lengths_B = ragged_batch()
    short = torch.nonzero(lengths_B <= 4).squeeze(1)  # a micro-batch whose longest response is 4
    sub, sub_mask = packed.rows(short), mask_BT[short]
    outputs = {}
    for trim in (False, True):
        model.zero_grad()
        out = response_logprobs(model, sub, temperature=0.7, with_entropy=True, with_hidden=True, trim_padding=trim)
        (out.logp_BT * sub_mask).sum().backward()
        outputs[trim] = (out, [p.grad.clone() for p in model.parameters()])
    (full, full_grads), (trimmed, trimmed_grads) = outputs[False], outputs[True]
    assert trimmed.logp_BT.shape == full.logp_BT.shape == sub_mask.shape
    assert trimmed.hidden_BTD.shape == full.hidden_BTD.shape
    # float64 model, float32 rotary tables: agreement to float32 rounding
    assert_close_in(trimmed.logp_BT[sub_mask], full.logp_BT[sub_mask], torch.float32)
    assert_close_in(trimmed.entropy_BT[sub_mask], full.entropy_BT[sub_mask], torch.float32)
    for got, want in zip(trimmed_grads, full_grads, strict=True):
        assert_close_in(got, want, torch.float32)
    assert max(g.abs().max().item() for g in full_grads) > 1e-2
    assert not trimmed.logp_BT[:, 4:].any() and not trimmed.hidden_BTD[:, 4:].any()  # never computed
    assert full.logp_BT[:, 4:].abs().sum() > 0


def test_grouped_no_grad_log_probs_come_back_in_the_batch_order():
    model = tiny_model("llama").double().eval()
    packed, mask_BT, _ = ragged_batch()
    plain = batched_response_logprobs(model, packed, temperature=1.0, micro_batch=5, with_entropy=True)
    grouped = batched_response_logprobs(
        model, packed, temperature=1.0, micro_batch=5, with_entropy=True, group_by_length=True
    )
    assert_close_in(grouped.logp_BT[mask_BT], plain.logp_BT[mask_BT], torch.float32)
    assert_close_in(grouped.entropy_BT[mask_BT], plain.entropy_BT[mask_BT], torch.float32)
    shortest = micro_batches(packed, slice(0, 12), 5, group_by_length=True)[0]  # its forward stops early
    longest = int(mask_BT[shortest].sum(1).max())
    assert longest < mask_BT.shape[1] and not grouped.logp_BT[shortest, longest:].any()


@pytest.fixture
def length_rewards(monkeypatch):
    def score(task, texts, examples):
        return [ScoreResult(float(len(text) % 4)) for text in texts]

    monkeypatch.setattr(batch_module, "score_responses", score)


@pytest.mark.parametrize("method", ["arlopti_kk_fig4_grpo", "arlopti_kk_fig4_ar_lopti"])
def test_a_grouped_step_computes_the_same_loss_and_update(tiny_policy_dir, tmp_path, length_rewards, method):
    """One step of 8 responses in micro-batches of 2, grouped by length or not: the same losses,
    gradient norm and clip fraction to float32 rounding (the tiny policy is float32); a grouped run
    again gives the same bits."""
    first = {}
    for grouped in (False, True, "again"):
        config = apply_overrides(
            RunConfig(),
            [
                *SMALL_RUN,
                f"model.path={tiny_policy_dir}",
                f"train.method={method}",
                "train.steps=1",
                "optim.mini_batch_size=8",
                "optim.micro_batch_size=2",
                f"optim.group_by_length={str(bool(grouped)).lower()}",
            ],
        )
        config.output.run_dir = str(tmp_path / f"grouped-{grouped}")
        run_dir = run_training(config, log=lambda *_: None)
        (first[grouped],) = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    plain, grouped = first[False], first[True]
    assert {k: v for k, v in grouped.items() if not k.startswith(CLOCK_KEYS)} == {
        k: v for k, v in first["again"].items() if not k.startswith(CLOCK_KEYS)
    }
    assert plain["optim/grad_norm"] > 1e-4 and plain["response/len_mean"] > 1
    for key in ("loss/policy", "loss/total", "optim/grad_norm", "clip/frac", "adv/abs_mean"):
        assert grouped[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-6), key
