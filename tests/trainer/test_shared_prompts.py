"""The shared-prompt forward equals the one-pass forward (log-probs, entropies, hidden states, gradients)."""

import pytest
import torch

from tests.models.helpers import tiny_model
from tests.tolerances import assert_close_in
from tokenbalance.config import RunConfig
from tokenbalance.trainer.logprobs import pack_sequences, response_logprobs, shared_prompt_rows
from tokenbalance.trainer.precision import ForwardSettings


def grouped_batch(groups: int = 3, group_size: int = 4, prompt_len: int = 7, response_len: int = 6, seed: int = 0):
    """``groups`` distinct prompts (the first left-padded by 2), each repeated ``group_size`` times,
    with distinct responses; one response ends early (right padding)."""
    generator = torch.Generator().manual_seed(seed)
    prompts_PS = torch.randint(10, 300, (groups, prompt_len), generator=generator)
    prompt_mask_PS = torch.ones(groups, prompt_len, dtype=torch.bool)
    prompt_mask_PS[0, :2] = False
    prompts_PS = prompts_PS.masked_fill(~prompt_mask_PS, 0)
    rows = groups * group_size
    responses_BT = torch.randint(10, 300, (rows, response_len), generator=generator)
    response_mask_BT = torch.ones(rows, response_len, dtype=torch.bool)
    response_mask_BT[1, 3:] = False
    return pack_sequences(
        prompts_PS.repeat_interleave(group_size, 0),
        prompt_mask_PS.repeat_interleave(group_size, 0),
        responses_BT,
        response_mask_BT,
        torch.arange(groups).repeat_interleave(group_size),
    ), response_mask_BT


def test_shared_prompt_rows_follow_the_group_structure():
    packed, _ = grouped_batch(groups=3, group_size=4)
    first_U, inverse_B = shared_prompt_rows(packed)
    assert first_U.tolist() == [0, 4, 8]
    # rows of one group map to the same prompt, whose first row is the group's first row
    assert first_U[inverse_B].tolist() == [0] * 4 + [4] * 4 + [8] * 4
    # a subset of rows (a micro-batch) keeps its own structure
    first_U, inverse_B = shared_prompt_rows(packed.rows(slice(2, 7)))
    assert first_U.tolist() == [0, 2] and inverse_B.tolist() == [0, 0, 1, 1, 1]


def test_shared_prompt_rows_none_without_groups():
    assert shared_prompt_rows(grouped_batch(groups=3, group_size=1)[0]) is None
    packed, _ = grouped_batch(groups=3, group_size=4)
    unmarked = packed.rows(slice(None)).__class__(
        *[getattr(packed, f) for f in ("input_ids_BL", "attention_mask_BL", "position_ids_BL", "prompt_len")]
    )
    assert shared_prompt_rows(unmarked) is None  # no group structure given: nothing is guessed from tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_equals_full_forward(arch):
    model = tiny_model(arch).double().train()
    packed, mask_BT = grouped_batch()
    outputs = {}
    for share in (False, True):
        model.zero_grad()
        settings = ForwardSettings(share_prompts=share)
        out = response_logprobs(
            model,
            packed,
            temperature=0.7,
            with_entropy=True,
            with_hidden=True,
            entropy_grad=True,
            forward_settings=settings,
        )
        ((out.logp_BT * mask_BT).sum() + (out.entropy_BT * mask_BT).sum()).backward()
        outputs[share] = (out, [p.grad.clone() for p in model.parameters()])
    (full, full_grads), (shared, shared_grads) = outputs[False], outputs[True]
    # float64 model; the rotary tables are float32 in transformers, computed over other shapes
    # so the agreement is bounded by float32 rounding
    assert_close_in(shared.logp_BT[mask_BT], full.logp_BT[mask_BT], torch.float32)
    assert_close_in(shared.entropy_BT[mask_BT], full.entropy_BT[mask_BT], torch.float32)
    assert_close_in(shared.hidden_BTD[mask_BT], full.hidden_BTD[mask_BT], torch.float32)
    for got, want in zip(shared_grads, full_grads, strict=True):
        assert_close_in(got, want, torch.float32)
    assert max(g.abs().max().item() for g in full_grads) > 1e-2  # the comparison is not between zeros


def test_entropy_is_detached_unless_asked():
    model = tiny_model("llama").train()
    packed, _ = grouped_batch()
    logged = response_logprobs(model, packed, temperature=1.0, with_entropy=True)
    bonus = response_logprobs(model, packed, temperature=1.0, with_entropy=True, entropy_grad=True)
    assert logged.logp_BT.requires_grad and not logged.entropy_BT.requires_grad
    assert bonus.entropy_BT.requires_grad
    torch.testing.assert_close(logged.entropy_BT, bonus.entropy_BT.detach())


@pytest.mark.parametrize(
    ("setting", "device", "shares"),
    [("auto", "cpu", True), ("auto", "cuda", False), ("on", "cuda", True), ("on", "cpu", True), ("off", "cpu", False)],
)
def test_share_prompts_is_chosen_per_device(setting, device, shares):
    """``optim.share_prompts=auto`` shares on a CPU and not on CUDA (docs/results.md, "Speed"); on/off on both."""
    config = RunConfig()
    config.optim.share_prompts = setting
    assert ForwardSettings.from_config(config, torch.device(device)).share_prompts is shares
