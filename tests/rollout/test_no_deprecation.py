"""Our calls into transformers raise no DeprecationWarning / FutureWarning on the installed version.

transformers renames arguments with a FutureWarning some releases before it drops them (5.24 warns
that ``past_key_values=`` goes away in 5.40; the cache is ``cache=`` there, while 5.10 knows only
``past_key_values=`` and silently ignores ``cache=``). CI runs this on the pinned version
(constraints.txt); run it on the newest one pyproject allows before widening a range.
"""

import warnings

import pytest
import torch
from transformers import DynamicCache

from tests.models.helpers import kk_tokenizer, tiny_model
from tests.rollout.test_hf_engine import PROMPTS
from tokenbalance.rollout import FastEngine, HFGenerateEngine, SamplingParams
from tokenbalance.rollout.decoders import cache_kwargs
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences, response_logprobs
from tokenbalance.trainer.precision import ForwardSettings

DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, DEPRECATIONS)
    ]


@pytest.fixture(scope="module")
def tokenizer():
    return kk_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return tiny_model(request.param)


def test_cache_reaches_the_model_under_the_name_its_forward_takes(model):
    """A wrong name is not an error on every version (5.10 swallows ``cache=`` in ``**kwargs``):
    the cache must hold the prompt's keys and values afterwards."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.get_decoder()(
            input_ids=torch.tensor([[3, 4, 5]]), **cache_kwargs(model.get_decoder(), cache), use_cache=True
        )
        assert cache.get_seq_length() == 3
        model(input_ids=torch.tensor([[6]]), **cache_kwargs(model, cache), use_cache=True)
        assert cache.get_seq_length() == 4


def test_rollout_and_logprob_paths_emit_no_deprecation_warning(model, tokenizer):
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generations = [
            FastEngine(model, tokenizer, path="auto").generate(prompts, params, n=2),  # grouped static decoder
            FastEngine(model, tokenizer, path="auto").generate(prompts, params),  # static decoder
            FastEngine(model, tokenizer, path="model").generate(prompts, params, n=2),  # model's forward + cache
            HFGenerateEngine(model, tokenizer).generate(prompts, params, n=2),
        ]
        for generation in generations:
            packed = pack_sequences(
                generation.prompt_ids_BS,
                generation.prompt_mask_BS,
                generation.response_ids_BT,
                generation.response_mask_BT,
                generation.prompt_B,
            )
            # old log-probs (no grad, shared prompts, NTHR's hidden states) and the update's pass
            batched_response_logprobs(
                model, packed, temperature=1.0, micro_batch=4, with_hidden=True, with_entropy=True
            )
            model.train()
            for share_prompts in (True, False):
                settings = ForwardSettings(share_prompts=share_prompts)
                out = response_logprobs(model, packed, temperature=1.0, with_entropy=True, forward_settings=settings)
                out.logp_BT.sum().backward()
            model.zero_grad(set_to_none=True)
            model.eval()
    assert deprecations(caught) == []
