"""Rollout engines: prompts as token ids in, sampled responses with masks and log-probs out.

    from tokenbalance.rollout import HFGenerateEngine
    gen = HFGenerateEngine(model, tokenizer).generate(prompt_ids, max_new_tokens=128,
                                                      temperature=1.0, seed=0)
    gen.response_ids_BT, gen.response_mask_BT, gen.sampler_logp_BT, gen.finished_B

Modules: ``base`` (:class:`Generation`, :class:`SamplingParams`, the :class:`RolloutEngine`
protocol), ``hf`` (``transformers`` ``generate``; CPU or one GPU), ``fast`` (a preallocated-KV-cache decode
loop for Llama / Qwen2, falling back to the model's own cached forward otherwise).
:func:`make_engine` picks one by name. No vLLM engine here.

CPU: as above (a 1.2 M-parameter tiny model samples about 1,900 tokens/s at batch 64 on one
core). One GPU: move the model first (``model.to("cuda")``); the engine follows its device.
Tests: ``.venv/bin/pytest tests/rollout -q`` (about 7 s).
"""

from tokenbalance.rollout.base import Generation, RolloutEngine, SamplingParams
from tokenbalance.rollout.fast import FastEngine
from tokenbalance.rollout.hf import HFGenerateEngine

ENGINES = {"hf": HFGenerateEngine, "fast": FastEngine}


def make_engine(name: str, model, tokenizer) -> RolloutEngine:
    """The rollout engine called ``name`` (``hf`` or ``fast``) over ``model``."""
    if name not in ENGINES:
        raise ValueError(f"rollout.engine: unknown engine {name!r}; valid: {', '.join(ENGINES)}")
    return ENGINES[name](model, tokenizer)


__all__ = ["ENGINES", "FastEngine", "Generation", "HFGenerateEngine", "RolloutEngine", "SamplingParams", "make_engine"]
