"""Both rollout engines on the device, float32 and bfloat16, against the full-forward sampler.

float32: ``FastEngine`` draws exactly the tokens of a sampler that runs the model's full forward
at every step with the same random stream (its static and grouped decoders, and on CUDA its
default, each step replayed as a CUDA graph); greedy decoding of both engines is the full
forward's argmax. bfloat16 (and, for ``HFGenerateEngine``, which draws
from torch's global stream, float32 too): the log-prob each engine reports for its tokens equals a
full forward of the same tokens within a tolerance derived from the dtype, and the sampled tokens
follow the full forward's distribution (a chi-square test over 6,144 draws).
"""

from __future__ import annotations

import pytest
import torch

from tests.cuda.helpers import (
    NO_EOS,
    logit_atol,
    rank_chi_square,
    reference_sample,
    small_vocab_model,
)
from tests.models.helpers import kk_tokenizer
from tests.rollout.test_hf_engine import full_forward_logits
from tokenbalance.rollout import FastEngine, HFGenerateEngine, SamplingParams

pytestmark = pytest.mark.cuda

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ENGINES = {"fast": FastEngine, "hf": HFGenerateEngine}
PROMPTS = [[3, 5, 7, 9, 2, 4], [6, 8], [10, 11, 12, 13, 14, 15, 2, 3, 4], [5]]  # ragged: left padding
# seeded draws: one outcome per device; the last test checks that a 10% error of the temperature
# falls below this floor
P_VALUE_FLOOR = 1e-4


@pytest.fixture(scope="module")
def tokenizer():
    return kk_tokenizer()


@pytest.fixture(scope="module")
def models(device):
    return {name: small_vocab_model().to(device=device, dtype=dtype) for name, dtype in DTYPES.items()}


@pytest.mark.parametrize(
    "n, temperature, top_k, top_p",
    [(1, 1.0, 0, 1.0), (4, 1.0, 0, 1.0), (1, 1.3, 5, 0.9), (4, 0.7, 0, 0.8)],
    ids=["static", "grouped", "static-topk-topp", "grouped-topp"],
)
@pytest.mark.parametrize("cuda_graph", [None, False], ids=["default", "no-graph"])
def test_fast_engine_draws_the_full_forward_samplers_tokens_in_float32(
    models, tokenizer, device, n, temperature, top_k, top_p, cuda_graph
):
    """The default on CUDA replays each step as a CUDA graph (fixed shapes); ``cuda_graph=False`` is the eager
    static / grouped decoder."""
    model = models["float32"]
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS, cuda_graph=cuda_graph)
    assert engine.path == "static"
    assert engine.fixed_shapes(device) == (device.type == "cuda" and cuda_graph is None)
    kwargs = dict(max_new_tokens=8, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    gen = engine.generate(PROMPTS, SamplingParams(**kwargs), n=n)
    assert gen.response_ids_BT.device.type == device.type
    rows = [prompt for prompt in PROMPTS for _ in range(n)]
    tokens, logps = reference_sample(model, rows, tokenizer.pad_token_id, **kwargs)
    assert torch.equal(gen.response_ids_BT, tokens)
    assert gen.response_mask_BT.all() and not gen.finished_B.any()
    atol = logit_atol(torch.float32, full_forward_logits(model, gen) / temperature)
    torch.testing.assert_close(gen.sampler_logp_BT, logps, atol=atol, rtol=0)
    assert len({tuple(row) for row in gen.response_ids_BT.tolist()}) > len(PROMPTS) // 2  # not degenerate


@pytest.mark.parametrize("engine_name", list(ENGINES))
def test_greedy_decoding_is_the_full_forward_argmax_in_float32(models, tokenizer, engine_name):
    model = models["float32"]
    gen = ENGINES[engine_name](model, tokenizer, eos_token_ids=NO_EOS).generate(
        PROMPTS, SamplingParams(max_new_tokens=8, temperature=0, seed=0)
    )
    tokens, logps = reference_sample(model, PROMPTS, tokenizer.pad_token_id, max_new_tokens=8, temperature=0, seed=0)
    assert torch.equal(gen.response_ids_BT, tokens)
    atol = logit_atol(torch.float32, full_forward_logits(model, gen))
    torch.testing.assert_close(gen.sampler_logp_BT, logps, atol=atol, rtol=0)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("engine_name", list(ENGINES))
def test_sampling_follows_the_full_forward_distribution(models, tokenizer, device, engine_name, dtype_name):
    model, dtype, temperature = models[dtype_name], DTYPES[dtype_name], 0.8
    engine = ENGINES[engine_name](model, tokenizer, eos_token_ids=NO_EOS)
    gen = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, temperature=temperature, seed=5), n=256)
    assert gen.response_ids_BT.shape == (len(PROMPTS) * 256, 6) and gen.response_ids_BT.device.type == device.type
    logits_BTV = full_forward_logits(model, gen)  # the same dtype as the engine, then float32

    # the log-prob the engine reports for each token = the full forward's, to the dtype's rounding
    expected_BT = torch.log_softmax(logits_BTV / temperature, dim=-1).gather(2, gen.response_ids_BT[..., None])[..., 0]
    difference = float((gen.sampler_logp_BT - expected_BT).abs().max())
    atol = logit_atol(dtype, logits_BTV / temperature)
    assert difference <= atol, f"max |sampler log-prob - full forward| {difference:.3g} > {atol:.3g} ({dtype})"

    # the tokens follow the full forward's distribution
    probs_NV = torch.softmax(logits_BTV / temperature, dim=-1).flatten(0, 1)
    statistic, dof, p_value = rank_chi_square(probs_NV, gen.response_ids_BT.flatten())
    assert p_value >= P_VALUE_FLOOR, f"chi-square {statistic:.1f} with {dof} degrees of freedom: p = {p_value:.2g}"


def test_the_frequency_test_rejects_a_wrong_temperature(models, tokenizer):
    """The chi-square test above would fail an engine whose temperature were 10% off."""
    model = models["float32"]
    gen = FastEngine(model, tokenizer, eos_token_ids=NO_EOS).generate(
        PROMPTS, SamplingParams(max_new_tokens=6, temperature=0.88, seed=5), n=256
    )
    probs_NV = torch.softmax(full_forward_logits(model, gen) / 0.8, dim=-1).flatten(0, 1)
    _, _, p_value = rank_chi_square(probs_NV, gen.response_ids_BT.flatten())
    assert p_value < P_VALUE_FLOOR
