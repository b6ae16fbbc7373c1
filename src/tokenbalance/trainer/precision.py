"""The compute type of a run's forwards, and the check that a half-precision policy can still learn.

``model.autocast=bfloat16``: forwards under ``torch.autocast``, float32 master weights, log-probs and losses (float16
refused); ``model.dtype=bfloat16`` stores bfloat16 weights, refused when an AdamW step would round away
(:func:`check_update_resolution`). docs/training.md ("Mixed precision")."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tokenbalance.config import RunConfig

AUTOCAST_DTYPES = {"off": None, "bfloat16": torch.bfloat16}


def compute_dtype(autocast: str) -> torch.dtype | None:
    """The autocast type ``model.autocast`` names (``None``: off; the config refuses float16)."""
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"model.autocast={autocast!r}: valid: {', '.join(AUTOCAST_DTYPES)}")
    return AUTOCAST_DTYPES[autocast]


@dataclass(frozen=True)
class ForwardSettings:
    """How every forward of a run computes: ``compute_dtype`` the ``torch.autocast`` type (``model.autocast``;
    ``None``: the parameters' own), ``chunk_tokens`` positions per output-layer chunk (``optim.logit_chunk_tokens``;
    0: all at once), ``share_prompts`` each distinct prompt run once (``optim.share_prompts``), ``keep_weight_casts``
    one conversion of the weights per optimizer step under autocast (:func:`weight_casts_kept`; always on in a run,
    off only to measure what it saves: the same bits either way)."""

    compute_dtype: torch.dtype | None = None
    chunk_tokens: int = 0
    share_prompts: bool = True
    keep_weight_casts: bool = True

    @classmethod
    def from_config(cls, config: RunConfig, device: torch.device) -> ForwardSettings:
        share = shares_prompts(config.optim.share_prompts, device)
        return cls(compute_dtype(config.model.autocast), config.optim.logit_chunk_tokens, share)


def shares_prompts(setting: str, device: torch.device) -> bool:
    """``optim.share_prompts`` on ``device``: "auto" shares on a CPU, where it made the update faster, and not on
    CUDA, where it made it slower (docs/results.md, "Speed")."""
    if setting == "auto":
        return device.type == "cpu"
    return setting == "on"


PLAIN_FORWARD = ForwardSettings()


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 in hardware: a GPU, or a CPU with AVX-512 BF16 or AMX (elsewhere, e.g.
    an AVX2-only CPU, torch emulates bfloat16 products, slower than float32)."""
    if device.type != "cpu":
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def slow_autocast_warning(dtype: torch.dtype | None, device: torch.device) -> str | None:
    """The warning for ``model.autocast`` on a device that emulates its type (``None``: none due)."""
    if dtype != torch.bfloat16 or native_bfloat16(device):
        return None
    return (
        "model.autocast=bfloat16 on a CPU without AVX-512 BF16 or AMX: torch emulates bfloat16 products there, "
        'slower than float32 (docs/training.md "Mixed precision"); model.autocast=off is faster on this machine'
    )


def model_device_type(model) -> str:
    """The device type of ``model``'s parameters ('cpu', 'cuda')."""
    return next(model.parameters()).device.type


@contextlib.contextmanager
def forward_precision(model, dtype: torch.dtype | None, *, cache_weights: bool = True) -> Iterator[None]:
    """``torch.autocast`` to ``dtype`` on ``model``'s device around a forward; nothing with ``None``.
    ``cache_weights`` False: each use of a weight converts it afresh, not reusing (or keeping) a copy."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=model_device_type(model), dtype=dtype, cache_enabled=cache_weights):
        yield


@contextlib.contextmanager
def weight_casts_kept(model, dtype: torch.dtype | None, *, keep: bool = True) -> Iterator[None]:
    """Keep ``torch.autocast``'s ``dtype`` copies of ``model``'s float32 weights for every :func:`forward_precision`
    inside, so that a step's micro-batches convert each weight once, not once per forward. A disabled autocast region
    around them: autocast drops its weight cache only when the outermost region ends, and a disabled one computes
    nothing differently (the backwards inside run as they would outside).

    The copies carry the autograd state of the forward that made them, so the forwards inside must all run with
    gradient or all without, and the weights must not change inside (an optimizer step ends the region first). A
    backward adds the gradients of all uses of one copy in ``dtype`` before converting the sum: across micro-batches
    each backward has its own, but within one forward a weight used many times (the output layer's chunks) needs
    ``forward_precision(..., cache_weights=False)``.
    Nothing with ``dtype`` ``None``, with ``keep`` False (the caller's: activation checkpointing recomputes forwards
    in the backward) or inside an enabled autocast region (its cache lives as long as it does). Frozen weights (a
    reference policy's) are never cached by autocast."""
    device_type = model_device_type(model)
    if dtype is None or not keep or torch.is_autocast_enabled(device_type):  # inside a region, the cache lives on
        yield
        return
    with torch.autocast(device_type=device_type, dtype=dtype, enabled=False):
        yield


def frozen_copy(model, dtype: torch.dtype | None):
    """A frozen copy of ``model`` (eval mode, no gradients) for forwards under ``dtype``'s autocast only: the reference
    policy. With ``dtype`` its linear layers' float32 weights and biases are stored in ``dtype``, the copies autocast
    would make at every forward (a frozen weight is never in its cache) made once: the same bits, no conversion per
    forward, and those tensors' memory halved. Embeddings and norms keep their type (autocast runs them in it); a
    tied output layer gets its own copy, the embedding keeps the original."""
    copied = copy.deepcopy(model).eval()
    for param in copied.parameters():
        param.requires_grad_(False)
    if dtype is not None:
        for module in copied.modules():
            if isinstance(module, torch.nn.Linear):
                for name, tensor in list(module.named_parameters(recurse=False)):
                    if tensor.dtype == torch.float32:  # autocast's inputs (it leaves float64 alone)
                        setattr(module, name, torch.nn.Parameter(tensor.detach().to(dtype), requires_grad=False))
    return copied


def spacing(dtype: torch.dtype, magnitude: float) -> float:
    """The distance between ``dtype``'s neighbouring values at ``magnitude`` (> 0, normal range): 2^(exponent -
    mantissa bits); bfloat16 at 0.02: 2^(-6 - 7) = 1.2e-4."""
    mantissa_bits = round(-math.log2(torch.finfo(dtype).eps))
    return 2.0 ** (math.floor(math.log2(magnitude)) - mantissa_bits)


def typical_weight_magnitude(model) -> float:
    """The median over ``model``'s trainable matrices (2-D and above) of each one's mean |w|."""
    means = [
        float(p.detach().abs().float().mean())
        for p in model.parameters()
        if p.requires_grad and p.dim() >= 2 and p.numel()
    ]
    if not means:
        return 0.0
    means.sort()
    return means[len(means) // 2]


def lost_update(dtype: torch.dtype, lr: float, magnitude: float) -> bool:
    """Whether an AdamW step of about ``lr`` on a weight of ``magnitude`` rounds back to the weight in ``dtype`` (it
    is below half the spacing there)."""
    return magnitude > 0 and lr < spacing(dtype, magnitude) / 2


def check_update_resolution(dtype: torch.dtype, lr: float, magnitude: float) -> None:
    """``ValueError`` naming the fix when a half-precision policy would not move at ``lr`` (:func:`lost_update` at its
    typical weight magnitude); float32 and float64 always pass."""
    if dtype not in (torch.bfloat16, torch.float16) or not lost_update(dtype, lr, magnitude):
        return
    name = str(dtype).removeprefix("torch.")
    raise ValueError(
        f"model.dtype={name} with optim.lr={lr:g}: an AdamW step (about lr) is below half of {name}'s spacing "
        f"({spacing(dtype, magnitude):.2g}) at the policy's typical |w| ({magnitude:.2g}), so updates round away "
        f"and training silently freezes; use model.dtype=float32 with model.autocast=bfloat16 (float32 master "
        f"weights, bfloat16 compute)"
    )
