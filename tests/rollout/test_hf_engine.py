import pytest
import torch

from tests.models.helpers import kk_tokenizer, tiny_model
from tokenbalance.rollout import Generation, HFGenerateEngine, RolloutEngine, SamplingParams
from tokenbalance.rollout.hf import mask_through_first_eos

PROMPTS = ["User: who is a knight?", "A is a knave", "Zoey said that Oliver is a knight if and only if"]


def random_model(arch="llama", std=0.4, **overrides):
    """A tiny model with large random weights: peaked, varied next-token distributions (a freshly
    initialised model nearly repeats its input and has near-ties, which makes argmax fragile)."""
    model = tiny_model(arch, **overrides)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return kk_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(text) for text in PROMPTS]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return random_model(request.param)


def full_forward_logits(model, generation):
    """[B, T, V] logits of each response position from one forward over prompt + response."""
    ids, mask = generation.sequences()
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask.long(), position_ids=position_ids).logits
    prompt_len, response_len = generation.prompt_ids_BS.shape[1], generation.response_ids_BT.shape[1]
    return logits[:, prompt_len - 1 : prompt_len + response_len - 1].float()


def test_engine_satisfies_the_protocol(model, tokenizer):
    assert isinstance(HFGenerateEngine(model, tokenizer), RolloutEngine)


def test_shapes_dtypes_and_left_padding(model, tokenizer, prompts):
    gen = HFGenerateEngine(model, tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=7, temperature=1.0, seed=0)
    )
    lengths = [len(p) for p in prompts]
    batch, width = len(prompts), max(lengths)
    assert gen.prompt_ids_BS.shape == gen.prompt_mask_BS.shape == (batch, width)
    assert gen.prompt_ids_BS.dtype == gen.response_ids_BT.dtype == torch.int64
    assert gen.prompt_mask_BS.dtype == gen.response_mask_BT.dtype == gen.finished_B.dtype == torch.bool
    assert gen.sampler_logp_BT.dtype == torch.float32
    assert gen.response_ids_BT.shape == gen.response_mask_BT.shape == gen.sampler_logp_BT.shape == (batch, 7)
    for row, prompt in enumerate(prompts):
        assert gen.prompt_mask_BS[row].tolist() == [False] * (width - len(prompt)) + [True] * len(prompt)
        assert gen.prompt_ids_BS[row, width - len(prompt) :].tolist() == prompt
        assert (gen.prompt_ids_BS[row, : width - len(prompt)] == tokenizer.pad_token_id).all()


def test_greedy_equals_a_manual_argmax_loop(model, tokenizer, prompts):
    steps = 6
    gen = HFGenerateEngine(model, tokenizer, eos_token_ids=[10**6]).generate(
        prompts, SamplingParams(max_new_tokens=steps, temperature=0, seed=0)
    )
    for row, prompt in enumerate(prompts):
        ids, expected_ids, expected_logp = list(prompt), [], []
        for _ in range(steps):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1]
            token = int(logits.argmax())
            expected_ids.append(token)
            expected_logp.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
        assert gen.response_ids_BT[row].tolist() == expected_ids
        torch.testing.assert_close(gen.sampler_logp_BT[row], torch.tensor(expected_logp), atol=1e-4, rtol=0)
    assert len(set(gen.response_ids_BT[0].tolist())) > 1  # not a degenerate repeat


def test_greedy_is_deterministic_and_ignores_the_seed(model, tokenizer, prompts):
    engine = HFGenerateEngine(model, tokenizer)
    first = engine.generate(prompts, SamplingParams(max_new_tokens=5, temperature=0, seed=1))
    second = engine.generate(prompts, SamplingParams(max_new_tokens=5, temperature=0, seed=2))
    assert torch.equal(first.response_ids_BT, second.response_ids_BT)


def test_sampling_is_reproducible_with_a_seed_and_leaves_the_global_rng_alone(tokenizer, prompts):
    engine = HFGenerateEngine(tiny_model("llama"), tokenizer)  # near-uniform: samples vary a lot
    torch.manual_seed(99)
    expected_next = torch.rand(2)
    torch.manual_seed(99)
    a = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=5))
    assert torch.equal(torch.rand(2), expected_next)
    b = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=5))
    c = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=6))
    assert torch.equal(a.response_ids_BT, b.response_ids_BT)
    assert torch.equal(a.sampler_logp_BT, b.sampler_logp_BT)
    assert not torch.equal(a.response_ids_BT, c.response_ids_BT)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_sampler_logp_is_the_tempered_log_softmax_of_a_full_forward(model, tokenizer, prompts, temperature):
    gen = HFGenerateEngine(model, tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=8, temperature=temperature, seed=3)
    )
    logits_BTV = full_forward_logits(model, gen)
    expected_BT = torch.log_softmax(logits_BTV / temperature, -1).gather(2, gen.response_ids_BT[..., None])[..., 0]
    mask = gen.response_mask_BT
    torch.testing.assert_close(gen.sampler_logp_BT[mask], expected_BT[mask], atol=1e-4, rtol=0)
    assert (gen.sampler_logp_BT[~mask] == 0).all()


def test_sampler_logp_with_top_k_and_top_p(model, tokenizer, prompts):
    temperature, top_k, top_p = 0.8, 20, 0.9
    gen = HFGenerateEngine(model, tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=8, temperature=temperature, top_p=top_p, top_k=top_k, seed=4)
    )
    scores_BTV = full_forward_logits(model, gen) / temperature
    kth_best = scores_BTV.topk(top_k, -1).values[..., -1:]
    scores_BTV = scores_BTV.masked_fill(scores_BTV < kth_best, float("-inf"))
    probs_sorted, order = torch.softmax(scores_BTV, -1).sort(-1, descending=True)
    mass_before = probs_sorted.cumsum(-1) - probs_sorted
    keep_sorted = mass_before < top_p  # smallest prefix whose mass reaches top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    expected_BT = torch.log_softmax(scores_BTV.masked_fill(~keep, float("-inf")), -1)
    expected_BT = expected_BT.gather(2, gen.response_ids_BT[..., None])[..., 0]
    mask = gen.response_mask_BT
    assert keep.gather(2, gen.response_ids_BT[..., None])[..., 0][mask].all()
    torch.testing.assert_close(gen.sampler_logp_BT[mask], expected_BT[mask], atol=1e-4, rtol=0)
    assert (
        gen.sampler_logp_BT[mask]
        > torch.log_softmax(full_forward_logits(model, gen) / temperature, -1).gather(
            2, gen.response_ids_BT[..., None]
        )[..., 0][mask]
    ).any()  # truncation renormalised


def test_response_mask_runs_through_the_first_eos(tokenizer):
    model = random_model("qwen2")
    prompts = [tokenizer.encode(f"{name} is a knight") for name in ("A", "B", "Zoey", "Oliver", "Ethan", "Mia")]
    prompts = prompts * 3
    eos_ids = list(range(100, 180))  # ~15% of the vocabulary: responses end at varied positions
    gen = HFGenerateEngine(model, tokenizer, eos_token_ids=eos_ids).generate(
        prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)
    )
    pad = tokenizer.pad_token_id
    lengths = []
    rows = zip(gen.response_ids_BT.tolist(), gen.response_mask_BT.tolist(), gen.finished_B.tolist())
    for ids, mask, finished in rows:
        first_eos = next((t for t, token in enumerate(ids) if token in eos_ids), None)
        length = len(ids) if first_eos is None else first_eos + 1
        assert mask == [True] * length + [False] * (len(ids) - length)
        assert ids[length:] == [pad] * (len(ids) - length)
        assert finished == (first_eos is not None)
        lengths.append(length)
    assert gen.response_lengths_B.tolist() == lengths
    assert len(set(lengths)) >= 3 and not all(gen.finished_B.tolist()) and any(gen.finished_B.tolist())
    assert gen.response_token_lists()[0] == gen.response_ids_BT[0, : lengths[0]].tolist()


def test_pad_equal_to_eos_keeps_only_the_first_eos(tokenizer, prompts):
    model = random_model("llama")
    free = HFGenerateEngine(model, tokenizer, eos_token_ids=[10**6]).generate(
        prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=0)
    )
    eos = free.response_ids_BT[0, 2].item()  # row 0 emits it at step 2 (maybe earlier too)
    shared = kk_tokenizer()
    shared.pad_token = shared.convert_ids_to_tokens(eos)
    engine = HFGenerateEngine(model, shared, eos_token_ids=[eos])
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=0))
    first = free.response_ids_BT[0].tolist().index(eos)
    width = gen.response_ids_BT.shape[1]
    assert gen.response_mask_BT[0].tolist() == [True] * (first + 1) + [False] * (width - first - 1)
    assert gen.finished_B[0]


def test_mask_through_first_eos_by_hand():
    ids = torch.tensor([[5, 1, 7, 1], [1, 1, 1, 1], [5, 6, 7, 8], [5, 6, 7, 2]])
    mask = mask_through_first_eos(ids, torch.tensor([1, 2]))
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]


def test_budget_exhausted_rows_are_unfinished(tokenizer, prompts):
    gen = HFGenerateEngine(random_model(), tokenizer, eos_token_ids=[10**6]).generate(
        prompts, SamplingParams(max_new_tokens=3, temperature=1.0, seed=0)
    )
    assert gen.response_ids_BT.shape == (3, 3)
    assert gen.response_mask_BT.all() and not gen.finished_B.any()


def test_eval_mode_during_generation_and_previous_mode_restored(tokenizer, prompts):
    model = random_model()
    seen = []
    model.model.layers[0].register_forward_hook(lambda module, args, out: seen.append(module.training))
    engine = HFGenerateEngine(model, tokenizer)
    model.train()
    engine.generate(prompts, SamplingParams(max_new_tokens=2, temperature=1.0, seed=0))
    assert model.training and seen and not any(seen)
    model.eval()
    engine.generate(prompts, SamplingParams(max_new_tokens=2, temperature=1.0, seed=0))
    assert not model.training


def test_the_checkpoint_generation_config_does_not_change_sampling(tokenizer, prompts):
    model = random_model()
    engine = HFGenerateEngine(model, tokenizer)
    plain = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.top_k = 2
    model.generation_config.suppress_tokens = plain.response_ids_BT[:, 0].tolist()
    again = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    assert torch.equal(plain.response_ids_BT, again.response_ids_BT)
    assert model.generation_config.repetition_penalty == 3.0  # restored


def test_default_eos_ids_come_from_tokenizer_and_generation_config(tokenizer):
    model = tiny_model()
    assert HFGenerateEngine(model, tokenizer).eos_token_ids == (1,)
    model.generation_config.eos_token_id = [3, 1]
    assert HFGenerateEngine(model, tokenizer).eos_token_ids == (1, 3)
    assert HFGenerateEngine(model, tokenizer, eos_token_ids=[7, 7, 8]).eos_token_ids == (7, 8)


def test_prompt_errors(tokenizer, prompts):
    assert_prompt_errors(HFGenerateEngine(tiny_model(max_position_embeddings=64), tokenizer))


def assert_prompt_errors(engine):
    """The prompt checks every engine shares (a model with 64 positions and a 512-token vocabulary),
    then a prompt exactly at the length limit generates the full budget."""
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        engine.generate([], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[5, 6], []], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    too_long = r"prompt 1 has 55 tokens, more than the limit of 54 \(max_position_embeddings 64 - max_new_tokens 10\)"
    with pytest.raises(ValueError, match=too_long):
        engine.generate([[5] * 54, [5] * 55], SamplingParams(max_new_tokens=10, temperature=1.0, seed=0))
    with pytest.raises(ValueError, match=r"prompt 0 has a token id outside the vocabulary \[0, 512\)"):
        engine.generate([[5, 512]], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    gen = engine.generate(
        [[5] * 54], SamplingParams(max_new_tokens=10, temperature=1.0, seed=0)
    )  # exactly at the limit
    assert gen.response_ids_BT.shape == (1, 10)


def test_tokenizer_without_pad_is_refused():
    tokenizer = kk_tokenizer()
    tokenizer.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        HFGenerateEngine(tiny_model(), tokenizer)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        ({"temperature": -0.1}, r"temperature must be >= 0 \(0 = greedy\), got -0.1"),
        ({"temperature": float("nan")}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": -1}, r"top_k must be an integer >= 0 \(0 = off\), got -1"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{"max_new_tokens": 4, **kwargs})


def test_engine_validates_sampling_params(tokenizer):
    with pytest.raises(ValueError, match="top_p must be in"):
        HFGenerateEngine(tiny_model(), tokenizer).generate(
            [[5]], SamplingParams(max_new_tokens=2, temperature=1.0, top_p=0, seed=0)
        )


def test_generation_checks_shapes_and_dtypes():
    ids, mask = torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3, dtype=torch.bool)
    good = dict(
        prompt_ids_BS=ids,
        prompt_mask_BS=mask,
        response_ids_BT=torch.zeros(2, 4, dtype=torch.int64),
        response_mask_BT=torch.ones(2, 4, dtype=torch.bool),
        sampler_logp_BT=None,
        finished_B=torch.zeros(2, dtype=torch.bool),
    )
    gen = Generation(**good)
    assert gen.batch_size == 2 and gen.sequences()[0].shape == (2, 7)
    with pytest.raises(ValueError, match=r"response_mask_BT must be torch.bool of shape \(2, 4\), got torch.int64"):
        Generation(**{**good, "response_mask_BT": torch.ones(2, 4, dtype=torch.int64)})
    with pytest.raises(ValueError, match=r"sampler_logp_BT must be torch.float32 of shape \(2, 4\)"):
        Generation(**{**good, "sampler_logp_BT": torch.zeros(2, 3)})
