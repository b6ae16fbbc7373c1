"""Rollout engines: prompts as token ids in, sampled responses with masks and log-probs out.

    from tokenbalance.rollout import HFGenerateEngine, SamplingParams
    sampling = SamplingParams(max_new_tokens=128, temperature=1.0, seed=0)
    gen = HFGenerateEngine(model, tokenizer).generate(prompt_ids, sampling, n=4)
    gen.response_ids_BT, gen.response_mask_BT, gen.sampler_logp_BT, gen.finished_B

Modules: ``base`` (:class:`Generation`, :class:`SamplingParams`, the :class:`RolloutEngine`
protocol), ``hf`` (``transformers`` ``generate``; CPU or one GPU), ``fast`` (a preallocated-KV-cache decode
loop for Llama / Qwen2, falling back to the model's own cached forward otherwise).
:func:`make_engine` picks one by name. No vLLM engine here.

``auto`` (the trainer's default) picks ``fast`` only where it is measured faster and safe: on CPU,
for a Llama / Qwen2 model of at most :data:`FAST_ENGINE_MAX_PARAMS` parameters (the fast engine
builds fused copies of the attention and MLP weights for every call: cheap for a tiny model, a few
GB for a 3B one). Everywhere else, GPUs included, ``hf``. Measurements: ``docs/results.md``.

CPU: as above. One GPU: move the model first (``model.to("cuda")``); the engine follows its device.
Tests: ``.venv/bin/pytest tests/rollout -q``.
"""

from tokenbalance.rollout.base import Generation, RolloutEngine, SamplingParams
from tokenbalance.rollout.fast import FastEngine, static_path_problem
from tokenbalance.rollout.hf import HFGenerateEngine

ENGINES = {"hf": HFGenerateEngine, "fast": FastEngine}
ENGINE_CHOICES = ("auto", *ENGINES)
FAST_ENGINE_MAX_PARAMS = 100_000_000


def auto_engine(model) -> tuple[str, str]:
    """The engine ``auto`` picks for ``model`` on its device, and why (one line)."""
    device = model.get_input_embeddings().weight.device
    params = sum(p.numel() for p in model.parameters())
    if device.type != "cpu":
        return "hf", f"{device.type} device (the fast engine is measured on CPU only)"
    problem = static_path_problem(model)
    if problem is not None:
        return "hf", f"the fast engine's static path does not support {problem}"
    if params > FAST_ENGINE_MAX_PARAMS:
        return "hf", f"{params / 1e6:.0f}M parameters (fast engine: at most {FAST_ENGINE_MAX_PARAMS / 1e6:.0f}M)"
    return "fast", f"CPU, {params / 1e6:.1f}M-parameter {type(model).__name__}"


def make_engine(name: str, model, tokenizer) -> RolloutEngine:
    """The rollout engine called ``name`` (``auto``, ``hf`` or ``fast``) over ``model``."""
    if name not in ENGINE_CHOICES:
        raise ValueError(f"rollout.engine: unknown engine {name!r}; valid: {', '.join(ENGINE_CHOICES)}")
    if name == "auto":
        name, _ = auto_engine(model)
    return ENGINES[name](model, tokenizer)


__all__ = [
    "ENGINES",
    "ENGINE_CHOICES",
    "FAST_ENGINE_MAX_PARAMS",
    "FastEngine",
    "Generation",
    "HFGenerateEngine",
    "RolloutEngine",
    "SamplingParams",
    "auto_engine",
    "make_engine",
]
