"""Rollout engines: prompts as token ids in, sampled responses with masks and log-probs out.

    from tokenbalance.rollout import HFGenerateEngine, SamplingParams
    gen = HFGenerateEngine(model, tokenizer).generate(prompt_ids, SamplingParams(max_new_tokens=128, seed=0), n=4)

``base`` (:class:`Generation`, :class:`SamplingParams`, the :class:`RolloutEngine` protocol), ``hf``
(``transformers``' ``generate``), ``fast`` (a preallocated-KV-cache decode loop for Llama / Qwen2);
:func:`make_engine` picks one by name, ``auto`` as docs/training.md ("Rollout engines") says."""

from tokenbalance.rollout.base import Generation, RolloutEngine, SamplingParams
from tokenbalance.rollout.fast import FastEngine
from tokenbalance.rollout.hf import HFGenerateEngine
from tokenbalance.rollout.layers import static_path_problem

ENGINES = {"hf": HFGenerateEngine, "fast": FastEngine}
ENGINE_CHOICES = ("auto", *ENGINES)
FAST_ENGINE_MAX_PARAMS = 100_000_000  # on a CPU: the fused weight copies made every call stay cheap
# on CUDA the fast engine replays each decode step as a CUDA graph (measured at Qwen2.5-0.5B's shape on one H100,
# docs/results.md); its fused copies cost about 1 GB at 0.5B, so larger models keep `generate` until measured
FAST_ENGINE_MAX_PARAMS_CUDA = 1_000_000_000


def auto_engine(model) -> tuple[str, str]:
    """The engine ``auto`` picks for ``model`` on its device, and why (one line)."""
    device = model.get_input_embeddings().weight.device
    params = sum(p.numel() for p in model.parameters())
    limits = {"cpu": FAST_ENGINE_MAX_PARAMS, "cuda": FAST_ENGINE_MAX_PARAMS_CUDA}
    if device.type not in limits:
        return "hf", f"{device.type} device (the fast engine is measured on CPU and CUDA only)"
    problem = static_path_problem(model)
    if problem is not None:
        return "hf", f"the fast engine's static path does not support {problem}"
    if params > limits[device.type]:
        limit = limits[device.type] / 1e6
        return "hf", f"{params / 1e6:.0f}M parameters (fast engine on {device.type}: at most {limit:.0f}M)"
    how = "CPU" if device.type == "cpu" else "CUDA, decode steps replayed as a CUDA graph"
    return "fast", f"{how}, {params / 1e6:.1f}M-parameter {type(model).__name__}"


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
    "FAST_ENGINE_MAX_PARAMS_CUDA",
    "FastEngine",
    "Generation",
    "HFGenerateEngine",
    "RolloutEngine",
    "SamplingParams",
    "auto_engine",
    "make_engine",
]
