"""Rollout engines: prompts as token ids in, sampled responses with masks and log-probs out.

    from tokenbalance.rollout import HFGenerateEngine
    gen = HFGenerateEngine(model, tokenizer).generate(prompt_ids, max_new_tokens=128,
                                                      temperature=1.0, seed=0)
    gen.response_ids_BT, gen.response_mask_BT, gen.sampler_logp_BT, gen.finished_B

Modules: ``base`` (:class:`Generation`, :class:`SamplingParams`, the :class:`RolloutEngine`
protocol), ``hf`` (``transformers`` ``generate``; CPU or one GPU). No vLLM engine here.
"""

from tokenbalance.rollout.base import Generation, RolloutEngine, SamplingParams
from tokenbalance.rollout.hf import HFGenerateEngine

__all__ = ["Generation", "HFGenerateEngine", "RolloutEngine", "SamplingParams"]
