"""Mixed precision and the chunked output layer on the device: one RL step with float32 weights
under bfloat16 autocast (``model.autocast``) and the logits in chunks (``optim.logit_chunk_tokens``)
keeps float32 weights and AdamW state and moves every weight; the fast engine decodes from a
bfloat16 K/V cache there; log-probs under autocast stay within bfloat16 rounding of float32's; a
step with activation checkpointing (``optim.activation_checkpointing``) equals one without."""

import math

import pytest
import torch

from tests.cuda.helpers import step_config, synchronize
from tests.tolerances import assert_close_in
from tokenbalance.models import load_policy
from tokenbalance.rollout import layers
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import checkpointing, pack_sequences, response_logprobs
from tokenbalance.trainer.loop import prepare_training, rl_step
from tokenbalance.trainer.precision import ForwardSettings

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("method", ["grpo", "arlopti_kk_fig4_ar_lopti"])
def test_a_mixed_precision_chunked_step_keeps_float32_state(
    policy_dir, parity_task, device, tmp_path, monkeypatch, method
):
    extra = ("model.autocast=bfloat16", "optim.logit_chunk_tokens=16", "rollout.engine=fast")
    config = step_config(policy_dir, device, "float32", method, *extra)
    policy, tokenizer = load_policy(policy_dir, device=str(device), dtype=torch.float32)
    parts = prepare_training(config, tmp_path, policy, tokenizer, device, DistContext(device=device))
    before = {key: value.detach().clone() for key, value in policy.named_parameters()}
    caches: list[torch.dtype] = []
    original = layers.cache_dtype

    def recorded(weight: torch.Tensor) -> torch.dtype:
        caches.append(original(weight))
        return caches[-1]

    monkeypatch.setattr(layers, "cache_dtype", recorded)
    metrics = rl_step(parts, 0)
    synchronize(device)
    assert math.isfinite(metrics["loss/total"]) and metrics["optim/grad_norm"] > 0
    assert caches and set(caches) == {torch.bfloat16}  # the rollout decoded from a bfloat16 cache
    moved = [key for key, value in policy.named_parameters() if not torch.equal(value.detach(), before[key])]
    assert len(moved) == len(before)
    assert {(p.device.type, p.dtype) for p in policy.parameters()} == {(device.type, torch.float32)}
    state = parts.state.optimizer.state.values()
    assert all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in state)


def test_log_probs_under_autocast_and_in_chunks_are_within_bfloat16_rounding(policy_dir, device):
    policy, _ = load_policy(policy_dir, device=str(device), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    vocab = policy.config.vocab_size
    prompt = torch.randint(3, vocab, (4, 6), generator=generator).to(device)
    response = torch.randint(3, vocab, (4, 9), generator=generator).to(device)
    packed = pack_sequences(prompt, torch.ones_like(prompt), response, torch.ones_like(response))
    with torch.no_grad():
        exact = response_logprobs(policy, packed, temperature=1.0).logp_BT
        mixed = response_logprobs(
            policy, packed, temperature=1.0, forward_settings=ForwardSettings(torch.bfloat16, chunk_tokens=5)
        ).logp_BT
        logits = policy(input_ids=packed.input_ids_BL, attention_mask=packed.attention_mask_BL).logits
    # a logit moves by about one bfloat16 eps at the logits' scale; log p by twice that (4 eps: margin)
    tolerance = 4 * torch.finfo(torch.bfloat16).eps * max(1.0, float(logits.abs().max()))
    assert mixed.dtype == torch.float32
    assert float((mixed - exact).abs().max()) <= tolerance


def test_an_activation_checkpointed_step_equals_the_plain_one(policy_dir, parity_task, device, tmp_path):
    """``optim.activation_checkpointing`` on the device under the mixed-precision settings: the layers' recomputation
    gives the step's loss and gradient norm within bfloat16 rounding of the step that kept its activations."""
    extra = ("model.autocast=bfloat16", "optim.logit_chunk_tokens=16", "rollout.engine=fast", "optim.share_prompts=off")
    results = {}
    for checkpointed in (False, True):
        config = step_config(
            policy_dir, device, "float32", "grpo", *extra, f"optim.activation_checkpointing={checkpointed}"
        )
        policy, tokenizer = load_policy(policy_dir, device=str(device), dtype=torch.float32)
        run_dir, ctx = tmp_path / str(checkpointed), DistContext(device=device)
        parts = prepare_training(config, run_dir, policy, tokenizer, device, ctx)
        results[checkpointed] = (rl_step(parts, 0), checkpointing(policy))
        synchronize(device)
    (plain, plain_on), (kept, kept_on) = results[False], results[True]
    assert not plain_on and kept_on
    assert plain["optim/grad_norm"] > 0
    for key in ("loss/total", "optim/grad_norm"):
        assert_close_in(torch.tensor(kept[key]), torch.tensor(plain[key]), torch.bfloat16, msg=key)
