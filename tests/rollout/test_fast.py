"""FastEngine: the same tokens as a step-by-step full-forward sampler with the same random stream."""

from types import SimpleNamespace

import pytest
import torch

from tests.models.helpers import kk_tokenizer, tiny_model
from tests.rollout.test_hf_engine import PROMPTS, assert_prompt_errors, full_forward_logits, random_model
from tokenbalance.rollout import FastEngine, HFGenerateEngine, RolloutEngine, SamplingParams, fast
from tokenbalance.rollout.layers import autocast_dtype, cache_dtype, layer_weights, static_path_problem
from tokenbalance.rollout.sampling import draw, sample_next, truncate_logits

NO_EOS = [10**6]
# float32 cached vs uncached forwards differ by ~1e-6 relative in the logits (HFGenerateEngine's own
# log-probs are as far from the full forward); tokens must match exactly, log-probs to this:
LOGP_TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tokenizer():
    return kk_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(text) for text in PROMPTS]  # ragged: 8, 4 and 13 tokens


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen2-gqa"])
def model(request):
    torch.set_num_threads(1)
    if request.param == "qwen2-gqa":
        return random_model("qwen2", num_kv_heads=2)
    return random_model(request.param)


def reference_sample(model, engine, prompts, *, max_new_tokens, temperature, top_k=0, top_p=1.0, seed, generator=None):
    """A straightforward sampler: every step runs the model's full forward (no cache) over the
    left-padded prompts + the tokens so far and calls ``sample_next`` on the last logits, drawing
    for every row, finished rows then overwritten with pad. -> (tokens_BT, logp_BT)."""
    width = max(len(p) for p in prompts)
    pad = engine.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    eos = torch.tensor(engine.eos_token_ids)
    generator = generator or torch.Generator().manual_seed(seed)
    finished = torch.zeros(len(prompts), dtype=torch.bool)
    tokens, logps = [], []
    for _ in range(max_new_tokens):
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, position_ids=position_ids).logits[:, -1]
        token, logp = sample_next(logits, temperature, top_k, top_p, generator)
        token, logp = token.masked_fill(finished, pad), logp.masked_fill(finished, 0.0)
        finished |= torch.isin(token, eos)
        tokens.append(token)
        logps.append(logp)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if finished.all():
            break
    return torch.stack(tokens, 1), torch.stack(logps, 1)


def assert_matches_reference(gen, tokens, logps, eos_ids):
    assert torch.equal(gen.response_ids_BT, tokens)
    expected_mask = torch.ones_like(tokens, dtype=torch.bool)
    for row in range(tokens.shape[0]):
        hits = [t for t, token in enumerate(tokens[row].tolist()) if token in eos_ids]
        if hits:
            expected_mask[row, hits[0] + 1 :] = False
    assert torch.equal(gen.response_mask_BT, expected_mask)
    torch.testing.assert_close(gen.sampler_logp_BT, logps.masked_fill(~expected_mask, 0.0), **LOGP_TOL)


def test_engine_satisfies_the_protocol_and_picks_the_static_path(model, tokenizer):
    engine = FastEngine(model, tokenizer)
    assert isinstance(engine, RolloutEngine)
    assert engine.path == "static"


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (0, 0, 1.0), (1.0, 5, 1.0), (0.8, 0, 0.6), (1.3, 20, 0.9)],
)
def test_same_tokens_as_a_full_forward_sampler(model, tokenizer, prompts, temperature, top_k, top_p):
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS)
    kwargs = dict(max_new_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, seed=7)
    gen = engine.generate(prompts, SamplingParams(**kwargs))
    tokens, logps = reference_sample(model, engine, prompts, **kwargs)
    assert_matches_reference(gen, tokens, logps, NO_EOS)
    assert gen.response_ids_BT.shape == (3, 10) and not gen.finished_B.any()
    assert len(set(gen.response_ids_BT[0].tolist())) > 1  # not a degenerate repeat


def test_grouped_prompts_share_one_prefill_and_match_the_reference(model, tokenizer, prompts, monkeypatch):
    grouped = [ids for ids in prompts[:3] for _ in range(4)]  # the GRPO layout: each prompt G times in a row
    used = []
    monkeypatch.setattr(fast, "GroupedCacheDecoder", spy(fast.GroupedCacheDecoder, used, "group_size"))
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS)
    gen = engine.generate(prompts[:3], SamplingParams(max_new_tokens=6, temperature=1.0, seed=3), n=4)
    tokens, logps = reference_sample(model, engine, grouped, max_new_tokens=6, temperature=1.0, seed=3)
    assert_matches_reference(gen, tokens, logps, NO_EOS)
    assert len({tuple(row) for row in gen.response_ids_BT[:4].tolist()}) > 1  # a group's rows still differ
    assert used == [4]  # the grouped decoder ran, with groups of 4


def spy(cls, calls, attribute):
    """``cls`` recording each instance's ``attribute`` in ``calls``."""

    def make(*args, **kwargs):
        decoder = cls(*args, **kwargs)
        calls.append(getattr(decoder, attribute))
        return decoder

    return make


def test_n_samples_per_prompt_are_prompt_major_and_marked(model, tokenizer, prompts):
    """``n`` repeats each prompt in a row and records G; the same call with the prompts repeated by
    hand and n = 1 samples the same first tokens' distribution layout (rows p * G + g)."""
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS)
    gen = engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, temperature=0, seed=0), n=3)
    assert gen.group_size == 3 and gen.batch_size == 6
    assert gen.prompt_B.tolist() == [0, 0, 0, 1, 1, 1]
    single = engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, temperature=0, seed=0))
    assert torch.equal(gen.response_ids_BT[[0, 3]], single.response_ids_BT)  # greedy: each group's rows agree
    assert torch.equal(gen.response_ids_BT[0], gen.response_ids_BT[2])
    with pytest.raises(ValueError, match="n \\(samples per prompt\\) must be an integer >= 1"):
        engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, temperature=0, seed=0), n=0)


@pytest.mark.parametrize(
    "path, cuda_graph", [("static", None), ("model", None), ("static", True)], ids=["static", "model", "fixed-shape"]
)
def test_rows_finish_at_different_times(tokenizer, path, cuda_graph):
    """``cuda_graph=True`` on a CPU: the fixed-shape step a CUDA graph would replay, run eagerly."""
    model = random_model("qwen2", num_kv_heads=2)
    prompts = [tokenizer.encode(f"{name} is a knight") for name in ("A", "B", "Zoey", "Oliver", "Ethan", "Mia")] * 2
    eos_ids = list(range(100, 160))  # ~12% of the vocabulary: rows stop at varied steps
    engine = FastEngine(model, tokenizer, eos_token_ids=eos_ids, path=path, cuda_graph=cuda_graph)
    kwargs = dict(max_new_tokens=12, temperature=1.0, seed=0)
    gen = engine.generate(prompts, SamplingParams(**kwargs))
    tokens, logps = reference_sample(model, engine, prompts, **kwargs)
    assert_matches_reference(gen, tokens, logps, eos_ids)
    lengths = gen.response_lengths_B
    assert gen.finished_B.any() and not gen.finished_B.all()
    assert (lengths < 12).any() and (lengths == 12).any() and len(set(lengths.tolist())) >= 3
    assert gen.finished_B.tolist() == [bool(set(r) & set(eos_ids)) for r in gen.response_token_lists()]


def test_stops_early_when_every_row_has_finished(tokenizer, prompts):
    model = random_model("llama")
    free = FastEngine(model, tokenizer, eos_token_ids=NO_EOS).generate(
        prompts, SamplingParams(max_new_tokens=4, temperature=0, seed=0)
    )
    eos_ids = free.response_ids_BT[:, 1].tolist()  # every row emits one of these at step <= 1
    engine = FastEngine(model, tokenizer, eos_token_ids=eos_ids)
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=20, temperature=0, seed=0))
    assert gen.finished_B.all() and gen.response_ids_BT.shape[1] <= 2
    tokens, logps = reference_sample(model, engine, prompts, max_new_tokens=20, temperature=0, seed=0)
    assert_matches_reference(gen, tokens, logps, eos_ids)


def test_mask_is_true_through_the_first_eos_and_pad_after(tokenizer):
    model = random_model("llama")
    prompts = [tokenizer.encode(f"{name} is a knave") for name in ("A", "B", "Zoey", "Oliver")] * 2
    eos_ids = list(range(100, 180))
    gen = FastEngine(model, tokenizer, eos_token_ids=eos_ids).generate(
        prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=1)
    )
    pad = tokenizer.pad_token_id
    for ids, mask, logp in zip(gen.response_ids_BT.tolist(), gen.response_mask_BT.tolist(), gen.sampler_logp_BT):
        first = next((t for t, token in enumerate(ids) if token in eos_ids), None)
        length = len(ids) if first is None else first + 1
        assert mask == [True] * length + [False] * (len(ids) - length)
        assert ids[length:] == [pad] * (len(ids) - length)
        assert (logp[length:] == 0).all() and (logp[:length] < 0).all()


def test_fallback_path_matches_the_reference(tokenizer, prompts):
    model = random_model("llama", num_kv_heads=2)
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS, path="model")
    assert engine.path == "model"
    kwargs = dict(max_new_tokens=6, temperature=0.9, top_k=30, seed=3)
    gen = engine.generate(prompts, SamplingParams(**kwargs))
    assert_matches_reference(gen, *reference_sample(model, engine, prompts, **kwargs), NO_EOS)


def test_sub_batches_continue_the_same_random_stream(tokenizer, prompts):
    model = random_model("qwen2")
    batch = prompts * 2
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS, max_batch_size=4)
    gen = engine.generate(batch, SamplingParams(max_new_tokens=5, temperature=1.0, seed=2))
    generator = torch.Generator().manual_seed(2)
    width = max(map(len, batch))
    first, second = (
        reference_sample(model, engine, part, max_new_tokens=5, temperature=1.0, seed=2, generator=generator)
        for part in (batch[:4], batch[4:])
    )
    assert torch.equal(gen.response_ids_BT, torch.cat([first[0], second[0]]))
    torch.testing.assert_close(gen.sampler_logp_BT, torch.cat([first[1], second[1]]), **LOGP_TOL)
    assert gen.prompt_ids_BS.shape == (6, width)


def test_sub_batches_of_different_lengths_are_padded_together(tokenizer, prompts):
    model = random_model("llama")
    free = FastEngine(model, tokenizer, eos_token_ids=NO_EOS).generate(
        prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=0)
    )
    eos = free.response_ids_BT[0, 0].item()  # row 0 stops at once; its sub-batch is 1 column wide
    whole, split = (
        FastEngine(model, tokenizer, eos_token_ids=[eos], max_batch_size=size).generate(
            prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=0)
        )
        for size in (None, 1)
    )
    assert split.response_ids_BT.shape[1] > 1 and split.response_lengths_B[0] == 1
    for name in ("response_ids_BT", "response_mask_BT", "finished_B", "prompt_ids_BS"):
        assert torch.equal(getattr(whole, name), getattr(split, name)), name
    torch.testing.assert_close(whole.sampler_logp_BT, split.sampler_logp_BT, **LOGP_TOL)


def test_same_seed_same_output_different_seed_different(tokenizer, prompts):
    engine = FastEngine(tiny_model("llama"), tokenizer)  # near-uniform: samples vary a lot
    torch.manual_seed(99)
    expected_next = torch.rand(2)
    torch.manual_seed(99)
    a = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=5))
    assert torch.equal(torch.rand(2), expected_next)  # the global RNG is untouched
    b = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=5))
    c = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=6))
    assert torch.equal(a.response_ids_BT, b.response_ids_BT) and torch.equal(a.sampler_logp_BT, b.sampler_logp_BT)
    assert not torch.equal(a.response_ids_BT, c.response_ids_BT)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logp_is_the_tempered_log_softmax_of_a_full_forward(model, tokenizer, prompts, temperature):
    gen = FastEngine(model, tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=8, temperature=temperature, seed=3)
    )
    logits_BTV = full_forward_logits(model, gen)
    expected_BT = torch.log_softmax(logits_BTV / temperature, -1).gather(2, gen.response_ids_BT[..., None])[..., 0]
    mask = gen.response_mask_BT
    torch.testing.assert_close(gen.sampler_logp_BT[mask], expected_BT[mask], **LOGP_TOL)
    assert (gen.sampler_logp_BT[~mask] == 0).all()


def test_greedy_logp_is_the_untempered_log_softmax_and_ignores_the_seed(model, tokenizer, prompts):
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS)
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=1))
    logits_BTV = full_forward_logits(model, gen)
    assert torch.equal(gen.response_ids_BT, logits_BTV.argmax(-1))
    expected_BT = torch.log_softmax(logits_BTV, -1).gather(2, gen.response_ids_BT[..., None])[..., 0]
    torch.testing.assert_close(gen.sampler_logp_BT, expected_BT, **LOGP_TOL)
    other = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=2))
    assert torch.equal(gen.response_ids_BT, other.response_ids_BT)


def test_greedy_equals_the_hf_engine(model, tokenizer, prompts):
    fast = FastEngine(model, tokenizer, eos_token_ids=NO_EOS).generate(
        prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=0)
    )
    hf = HFGenerateEngine(model, tokenizer, eos_token_ids=NO_EOS).generate(
        prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=0)
    )
    assert torch.equal(fast.prompt_ids_BS, hf.prompt_ids_BS) and torch.equal(fast.response_ids_BT, hf.response_ids_BT)
    torch.testing.assert_close(fast.sampler_logp_BT, hf.sampler_logp_BT, **LOGP_TOL)


def test_truncate_logits_by_hand():
    scores = torch.log(torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.05, 0.05, 0.6, 0.3]]))
    kept = lambda out: torch.isfinite(out).tolist()  # noqa: E731
    assert kept(truncate_logits(scores, 2, 1.0)) == [[True, True, True, False], [False, False, True, True]]  # ties
    assert kept(truncate_logits(scores, 0, 0.6)) == [[True, True, False, False], [False, False, True, False]]
    assert kept(truncate_logits(scores, 0, 0.01)) == [[True, False, False, False], [False, False, True, False]]
    assert kept(truncate_logits(scores, 1, 1.0)) == [[True, False, False, False], [False, False, True, False]]
    assert torch.equal(truncate_logits(scores, 0, 1.0), scores)


def test_sample_next_draws_b_uniforms_per_step_and_matches_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]])).expand(20000, 5)
    generator, expected_state = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    token, logp = sample_next(logits, 1.0, 0, 1.0, generator)
    assert token.dtype == torch.int64 and logp.dtype == torch.float32 and token.shape == logp.shape == (20000,)
    torch.rand(20000, dtype=torch.float64, generator=expected_state)  # exactly B float64 uniforms were used
    assert torch.equal(generator.get_state(), expected_state.get_state())
    frequencies = torch.bincount(token, minlength=5) / 20000.0
    torch.testing.assert_close(frequencies, torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0]), atol=0.015, rtol=0)
    torch.testing.assert_close(logp, torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))[token], atol=1e-6, rtol=0)
    kept, _ = sample_next(logits, 2.0, 2, 1.0, generator)  # top-k 2 at any temperature: tokens 0 and 1 only
    assert set(kept.tolist()) == {0, 1}
    nucleus, nucleus_logp = sample_next(logits, 1.0, 0, 0.7, generator)  # 0.5 + 0.3 reach 0.7
    assert set(nucleus.tolist()) == {0, 1}
    torch.testing.assert_close(nucleus_logp, torch.log(torch.tensor([0.625, 0.375]))[nucleus], atol=1e-6, rtol=0)
    greedy, greedy_logp = sample_next(logits[:2], 0, 3, 0.5, None)
    assert greedy.tolist() == [0, 0]
    torch.testing.assert_close(greedy_logp, torch.log(torch.tensor([0.5, 0.5])))


def test_draw_never_picks_a_token_without_mass():
    probs = torch.zeros(4096, 6)
    probs[:, 2] = 1e-30  # tiny but positive next to exact zeros
    probs[:, 4] = 1.0
    token = draw(probs, torch.Generator().manual_seed(0))
    assert set(token.tolist()) <= {2, 4}


def test_eval_mode_during_generation_and_previous_mode_restored(tokenizer, prompts):
    model = random_model()
    model.train()
    FastEngine(model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=2, temperature=1.0, seed=0))
    assert model.training


def test_unsupported_configs_fall_back_or_are_refused(tokenizer):
    model = tiny_model("qwen2")
    model.config.layer_types = ["sliding_attention"] * len(model.config.layer_types)
    assert "layer types" in static_path_problem(model)
    assert FastEngine(model, tokenizer).path == "model"
    with pytest.raises(ValueError, match=r"does not support Qwen2ForCausalLM with layer types \['sliding_attention'\]"):
        FastEngine(model, tokenizer, path="static")
    with pytest.raises(ValueError, match="path must be one of auto, static, model"):
        FastEngine(tiny_model(), tokenizer, path="fast")
    with pytest.raises(ValueError, match="max_batch_size must be None or an integer >= 1, got 0"):
        FastEngine(tiny_model(), tokenizer, max_batch_size=0)


def test_prompt_and_parameter_errors(tokenizer):
    engine = FastEngine(tiny_model(max_position_embeddings=64), tokenizer, eos_token_ids=NO_EOS)
    assert_prompt_errors(engine)
    with pytest.raises(ValueError, match="top_p must be in"):
        engine.generate([[5]], SamplingParams(max_new_tokens=2, temperature=1.0, top_p=0, seed=0))
    no_pad = kk_tokenizer()
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        FastEngine(tiny_model(), no_pad)


def test_auto_engine_is_fast_only_for_small_static_models_on_cpu(model, monkeypatch):
    import tokenbalance.rollout as rollout

    assert rollout.auto_engine(model)[0] == "fast"
    monkeypatch.setattr(rollout, "FAST_ENGINE_MAX_PARAMS", 10)  # a "large" model: the fused weight copies cost GBs
    name, why = rollout.auto_engine(model)
    assert name == "hf" and "parameters" in why
    monkeypatch.setattr(rollout, "FAST_ENGINE_MAX_PARAMS", 10**9)
    monkeypatch.setattr(rollout, "static_path_problem", lambda m: "architecture X")
    assert rollout.auto_engine(model) == ("hf", "the fast engine's static path does not support architecture X")


def test_auto_engine_on_cuda_is_fast_up_to_its_own_limit(model, monkeypatch):
    import tokenbalance.rollout as rollout

    meta = random_model("qwen2").to("meta")  # a device type the engine was never measured on
    assert rollout.auto_engine(meta) == ("hf", "meta device (the fast engine is measured on CPU and CUDA only)")
    on_cuda = SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda")))  # where auto_engine looks
    monkeypatch.setattr(model, "get_input_embeddings", lambda: on_cuda)
    monkeypatch.setattr(rollout, "FAST_ENGINE_MAX_PARAMS", 10)  # the CPU limit does not apply on CUDA
    name, why = rollout.auto_engine(model)
    assert name == "fast" and why.startswith("CUDA, decode steps replayed as a CUDA graph")
    monkeypatch.setattr(rollout, "FAST_ENGINE_MAX_PARAMS_CUDA", 10)
    assert rollout.auto_engine(model)[1].endswith("(fast engine on cuda: at most 0M)")


@pytest.mark.parametrize("group_size", [1, 6])
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0, 0, 1.0), (1.3, 20, 0.9)])
def test_finished_rows_leave_the_batch_and_no_bit_changes(
    tokenizer, group_size, temperature, top_k, top_p, monkeypatch
):
    """Compaction (one thread, its default there): the rows still decoded, the random stream and so
    every token and log-prob are those of the full batch, bit for bit, grouped or not."""
    torch.set_num_threads(1)
    model = random_model("qwen2", num_kv_heads=2)
    names = ("A", "B", "Zoey", "Oliver", "Ethan", "Mia", "Liam", "Ava")
    prompts = [tokenizer.encode(f"{name} is a knight") for name in names] * (6 // group_size)
    eos_ids = list(range(100, 130))  # ~6% of the vocabulary: rows stop at varied steps
    kept = []
    for decoder in (fast.GroupedCacheDecoder, fast.StaticCacheDecoder):
        original = decoder.select
        monkeypatch.setattr(
            decoder, "select", lambda self, keep, t, o=original: kept.append(len(keep)) or o(self, keep, t)
        )
    sampling = SamplingParams(max_new_tokens=40, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)
    compacted = FastEngine(model, tokenizer, eos_token_ids=eos_ids).generate(prompts, sampling, n=group_size)
    assert kept and min(kept) >= fast.MIN_COMPACT_ROWS  # it ran, never below the bound
    full = FastEngine(model, tokenizer, eos_token_ids=eos_ids, compact=False).generate(prompts, sampling, n=group_size)
    lengths = full.response_lengths_B
    assert len(set(lengths.tolist())) >= 5 and 0 < int(full.finished_B.sum()) <= 48
    for field in ("response_ids_BT", "response_mask_BT", "sampler_logp_BT", "finished_B"):
        assert torch.equal(getattr(compacted, field), getattr(full, field)), field


def test_compaction_keeps_the_unfinished_rows_in_order():
    finished = torch.tensor([True, False, True, True, False, True, True, True, True, True, False, True])
    assert fast.compaction(finished).tolist() == [0, 1, 2, 3, 4, 5, 6, 10]  # topped up to 8 with finished ones
    assert fast.compaction(torch.zeros(40, dtype=torch.bool)) is None
    few = torch.zeros(40, dtype=torch.bool)
    few[:9] = True
    assert fast.compaction(few) is None  # under a quarter finished
    few[:10] = True
    assert fast.compaction(few).tolist() == list(range(10, 40))


def test_under_bfloat16_autocast_the_cache_is_bfloat16(model):
    weight = model.get_input_embeddings().weight
    assert cache_dtype(weight) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cache_dtype(weight) == torch.bfloat16
        layers = layer_weights(model, autocast_dtype("cpu"))
    assert {layer.qkv_weight.dtype for layer in layers} == {torch.bfloat16}
    assert weight.dtype == torch.float32  # the model keeps its float32 weights


@pytest.mark.parametrize("n", [1, 3])  # the static decoder, and the grouped one
def test_under_bfloat16_autocast_sampler_logp_matches_a_full_forward_under_it(model, tokenizer, prompts, n):
    # Both sides compute in bfloat16 (products rounded to 2^-8 relative) in different orders and
    # shapes (cached one-token steps vs one forward; bfloat16 keys and values in the cache), so a
    # logit differs by about one eps = 2^-7 of the logits' scale; log p by twice that. 4 eps leaves
    # a margin and stays far below a wrong token or position (a whole unit of log p).
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gen = FastEngine(model, tokenizer).generate(
            prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=3), n=n
        )
        logits_BTV = full_forward_logits(model, gen)
    expected_BT = torch.log_softmax(logits_BTV, -1).gather(2, gen.response_ids_BT[..., None])[..., 0]
    mask = gen.response_mask_BT
    tolerance = 4 * torch.finfo(torch.bfloat16).eps * max(1.0, float(logits_BTV.abs().max()))
    assert float((gen.sampler_logp_BT[mask] - expected_BT[mask]).abs().max()) <= tolerance
    assert gen.sampler_logp_BT.dtype == torch.float32


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0, 0, 1.0), (1.3, 20, 0.9)])
def test_the_fixed_shape_step_matches_the_full_forward_sampler(
    model, tokenizer, prompts, temperature, top_k, top_p, monkeypatch
):
    """``cuda_graph=True`` on a CPU: the step a CUDA graph would replay (whole zeroed cache under a mask, column and
    token read from tensors) draws the reference's tokens, with groups (each row its own prompt copy)."""
    used = []
    monkeypatch.setattr(fast, "FixedShapeDecoder", spy(fast.FixedShapeDecoder, used, "capture"))
    engine = FastEngine(model, tokenizer, eos_token_ids=NO_EOS, cuda_graph=True)
    kwargs = dict(max_new_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)
    gen = engine.generate(prompts, SamplingParams(**kwargs), n=2)
    rows = [ids for ids in prompts for _ in range(2)]
    tokens, logps = reference_sample(model, engine, rows, **kwargs)
    assert_matches_reference(gen, tokens, logps, NO_EOS)
    assert used == [False]  # one decoder, run eagerly (no capture off CUDA)
    assert not engine.compacts(torch.device("cpu"))


def test_fixed_shapes_are_the_default_on_cuda_only(model, tokenizer):
    engine = FastEngine(model, tokenizer)
    assert engine.fixed_shapes(torch.device("cuda")) and not engine.fixed_shapes(torch.device("cpu"))
    assert not FastEngine(model, tokenizer, cuda_graph=False).fixed_shapes(torch.device("cuda"))
    assert not FastEngine(model, tokenizer, path="model", cuda_graph=True).fixed_shapes(torch.device("cpu"))
    with pytest.raises(ValueError, match="cuda_graph must be None, True or False"):
        FastEngine(model, tokenizer, cuda_graph="yes")
