"""Rollouts for small models with a preallocated KV cache and a hand-written decode loop.

    engine = FastEngine(model, tokenizer)
    gen = engine.generate(prompt_ids, SamplingParams(max_new_tokens=256, temperature=1.0, seed=step))

Same interface and output as :class:`~tokenbalance.rollout.hf.HFGenerateEngine`, faster on small Llama / Qwen2 models
(it runs their decoder layers itself; other models use their own cached forward). What it does, reproduces bit for bit
and its speed: docs/training.md ("Rollout engines")."""

from __future__ import annotations

import contextlib
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from tokenbalance.rollout.base import Generation, SamplingParams
from tokenbalance.rollout.hf import PromptEngine, mask_through_first_eos

STATIC_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # frequencies fixed at init
PATHS = ("auto", "static", "model")


# -------------------------------------------------------------------------------------------- Sampling (shared with
# the reference sampler of the tests)


def truncate_logits(scores_BV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[B, V] scores with everything outside the top-k, then outside the top-p nucleus, at -inf.

    top-k keeps ties with the k-th best score (like ``transformers``' ``TopKLogitsWarper``); top-p keeps the smallest
    prefix of tokens, most probable first, whose mass reaches ``top_p`` (always at least one token). ``top_k == 0`` /
    ``top_p == 1`` switch a step off."""
    if 0 < top_k < scores_BV.shape[-1]:
        kth_best_B1 = scores_BV.topk(top_k, dim=-1).values[:, -1:]
        scores_BV = scores_BV.masked_fill(scores_BV < kth_best_B1, float("-inf"))
    if top_p < 1.0:
        probs_sorted_BV, order_BV = torch.softmax(scores_BV, dim=-1).sort(dim=-1, descending=True)
        mass_before_BV = probs_sorted_BV.cumsum(dim=-1) - probs_sorted_BV
        keep_BV = torch.empty_like(order_BV, dtype=torch.bool).scatter_(-1, order_BV, mass_before_BV < top_p)
        scores_BV = scores_BV.masked_fill(~keep_BV, float("-inf"))
    return scores_BV


def uniforms(rows: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """[rows, 1] float64 in (0, 1]: the draws :func:`draw` makes for ``rows`` rows."""
    return 1.0 - torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=device)


def draw(probs_BV: torch.Tensor, generator: torch.Generator | None, u_B1: torch.Tensor | None = None) -> torch.Tensor:
    """[B] int64: one index per row with probability ``probs / probs.sum()``, by inverse CDF in float64.

    Uses exactly B float64 uniforms from ``generator`` per call whatever the values (every sampler consumes the stream
    identically); ``u`` lies in (0, 1], so the chosen token always has positive probability. ``u_B1``: uniforms drawn
    already (:func:`uniforms`; the compacted loop passes the live rows' ones)."""
    cdf_BV = probs_BV.double().cumsum(dim=-1)
    if u_B1 is None:
        u_B1 = uniforms(probs_BV.shape[0], generator, probs_BV.device)
    return torch.searchsorted(cdf_BV, u_B1 * cdf_BV[:, -1:]).squeeze(1)


def sample_next(
    logits_BV: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    u_B1: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_B int64, logp_B float32)``: one token per row and its log-prob under the processed distribution.

    ``temperature == 0``: argmax, no randomness, ``logp`` = the untempered log-softmax. Otherwise ``logits /
    temperature`` truncated (:func:`truncate_logits`) and drawn by :func:`draw` (always all B rows)."""
    logits_BV = logits_BV.float()
    if temperature == 0:
        token_B = logits_BV.argmax(dim=-1)
        logp_BV = torch.log_softmax(logits_BV, dim=-1)
    else:
        scores_BV = truncate_logits(logits_BV / temperature, top_k, top_p)
        logp_BV = torch.log_softmax(scores_BV, dim=-1)
        token_B = draw(logp_BV.exp(), generator, u_B1)
    return token_B, logp_BV.gather(1, token_B[:, None]).squeeze(1)


# -------------------------------------------------------------------------------------------- Static-cache decoder
# for Llama / Qwen2


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights, q/k/v and gate/up fused; biases ``None`` where absent."""

    input_norm: torch.nn.Module
    post_attention_norm: torch.nn.Module
    qkv_weight: torch.Tensor  # [(H + 2 H_kv) Dh, D]
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor  # [D, H Dh]
    o_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor  # [2 I, D]
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor  # [D, I]
    down_bias: torch.Tensor | None
    act_fn: Callable[[torch.Tensor], torch.Tensor]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float


def fuse(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight, bias)`` of the linears stacked along their outputs (bias ``None`` if none has one)."""
    weight = torch.cat([linear.weight for linear in linears], dim=0)
    if all(linear.bias is None for linear in linears):
        return weight, None
    biases = [
        linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features) for linear in linears
    ]
    return weight, torch.cat(biases)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The type ``torch.autocast`` computes matrix products in on ``device_type`` here and now (``None`` outside an
    autocast region)."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``tensor`` in ``dtype`` (itself with ``None``)."""
    return tensor if dtype is None else tensor.to(dtype)


def cast_bias(bias: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return None if bias is None else cast(bias, dtype)


def cache_dtype(weight: torch.Tensor) -> torch.dtype:
    """The K/V cache's type: the autocast type under ``torch.autocast`` (``model.autocast``: half the bytes each
    attention step reads, the keys and values as the products made them), else the weights'."""
    return autocast_dtype(weight.device.type) or weight.dtype


def empty_cache(
    rows: int, columns: int, layer: LayerWeights, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's uninitialised K/V buffers, ``[rows, H_kv, columns, Dh]`` each, in :func:`cache_dtype` on
    ``weight``'s device."""
    shape = (rows, layer.num_kv_heads, columns, layer.head_dim)
    dtype = cache_dtype(weight)
    return torch.empty(shape, dtype=dtype, device=weight.device), torch.empty(shape, dtype=dtype, device=weight.device)


def layer_weights(model: PreTrainedModel, dtype: torch.dtype | None = None) -> list[LayerWeights]:
    """Every decoder layer's current weights (fused copies: call again after an optimizer step), the matrices and
    biases cast to ``dtype`` when given (under autocast: cast once per call instead of at every product)."""
    config, layers = model.config, []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv_weight, qkv_bias = fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up_weight, gate_up_bias = fuse([mlp.gate_proj, mlp.up_proj])
        layers.append(
            LayerWeights(
                input_norm=layer.input_layernorm,
                post_attention_norm=layer.post_attention_layernorm,
                qkv_weight=cast(qkv_weight, dtype),
                qkv_bias=cast_bias(qkv_bias, dtype),
                o_weight=cast(attn.o_proj.weight, dtype),
                o_bias=cast_bias(attn.o_proj.bias, dtype),
                gate_up_weight=cast(gate_up_weight, dtype),
                gate_up_bias=cast_bias(gate_up_bias, dtype),
                down_weight=cast(mlp.down_proj.weight, dtype),
                down_bias=cast_bias(mlp.down_proj.bias, dtype),
                act_fn=mlp.act_fn,
                num_heads=config.num_attention_heads,
                num_kv_heads=config.num_key_value_heads,
                head_dim=attn.head_dim,
                scaling=attn.scaling,
            )
        )
    return layers


def static_path_problem(model: PreTrainedModel) -> str | None:
    """Why the static-cache decoder cannot run ``model`` (``None`` when it can)."""
    name = type(model).__name__
    if name not in STATIC_ARCHITECTURES:
        return f"architecture {name} is not one of {', '.join(STATIC_ARCHITECTURES)}"
    config = model.config
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"{name} with layer types {sorted(layer_types)} (only full attention is supported)"
    rope_type = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        return f"{name} with RoPE type {rope_type!r} (supported: {', '.join(STATIC_ROPE_TYPES)})"
    return None


def rotate(x_BQHD: torch.Tensor, cos_BQD: torch.Tensor, sin_BQD: torch.Tensor) -> torch.Tensor:
    """RoPE as ``transformers`` applies it (rotate-half convention); cos/sin broadcast over heads. Works on the [B, Q,
    heads, Dh] layout, so queries and keys rotate in one call."""
    cos_BQ1D, sin_BQ1D = cos_BQD[:, :, None], sin_BQD[:, :, None]
    half = x_BQHD.shape[-1] // 2
    rotated_BQHD = torch.cat((-x_BQHD[..., half:], x_BQHD[..., :half]), dim=-1)
    return x_BQHD * cos_BQ1D + rotated_BQHD * sin_BQ1D


def project(
    layer: LayerWeights, x_BQD: torch.Tensor, cos_BQD: torch.Tensor, sin_BQD: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_BHQD, k_BKQD, v_BKQD)`` of Q new positions, queries and keys rotated (K = the K/V heads)."""
    batch, queries, _ = x_BQD.shape
    heads, kv_heads, head_dim = layer.num_heads, layer.num_kv_heads, layer.head_dim
    qkv_BQE = F.linear(x_BQD, layer.qkv_weight, layer.qkv_bias)
    qk_BQE, v_BQE = qkv_BQE.split([(heads + kv_heads) * head_dim, kv_heads * head_dim], dim=-1)
    qk_BQHD = rotate(qk_BQE.view(batch, queries, heads + kv_heads, head_dim), cos_BQD, sin_BQD)
    return (
        qk_BQHD[:, :, :heads].transpose(1, 2),
        qk_BQHD[:, :, heads:].transpose(1, 2),
        v_BQE.view(batch, queries, kv_heads, head_dim).transpose(1, 2),
    )


def attend(
    layer: LayerWeights, q_BHQD: torch.Tensor, k_BKLD: torch.Tensor, v_BKLD: torch.Tensor, mask_B1QL: torch.Tensor
) -> torch.Tensor:
    """The queries' attention over the L cached columns where ``mask_B1QL`` (bool) is true, through the output
    projection. -> [B, Q, D]."""
    batch, heads, queries, head_dim = q_BHQD.shape
    out_BHQD = F.scaled_dot_product_attention(
        q_BHQD,
        k_BKLD,
        v_BKLD,
        attn_mask=mask_B1QL,
        scale=layer.scaling,
        enable_gqa=layer.num_kv_heads != heads,
    )
    out_BQE = out_BHQD.transpose(1, 2).reshape(batch, queries, heads * head_dim)
    return F.linear(out_BQE, layer.o_weight, layer.o_bias)


def attention(
    layer: LayerWeights,
    x_BQD: torch.Tensor,
    cos_BQD: torch.Tensor,
    sin_BQD: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    start: int,
    mask_B1QK: torch.Tensor,
) -> torch.Tensor:
    """Self-attention of Q new positions, written to cache columns [start, start + Q), attending to the K = start + Q
    columns filled so far where ``mask_B1QK`` (bool) is true. -> [B, Q, D]."""
    q_BHQD, k_BKQD, v_BKQD = project(layer, x_BQD, cos_BQD, sin_BQD)
    k_cache_BKLD, v_cache_BKLD = cache
    end = start + x_BQD.shape[1]
    k_cache_BKLD[:, :, start:end] = k_BKQD
    v_cache_BKLD[:, :, start:end] = v_BKQD
    return attend(layer, q_BHQD, k_cache_BKLD[:, :, :end], v_cache_BKLD[:, :, :end], mask_B1QK)


def mlp(layer: LayerWeights, x_BQD: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP with the fused gate/up matrix. -> [B, Q, D]."""
    gate_BQI, up_BQI = F.linear(x_BQD, layer.gate_up_weight, layer.gate_up_bias).chunk(2, dim=-1)
    return F.linear(layer.act_fn(gate_BQI).mul_(up_BQI), layer.down_weight, layer.down_bias)


def decoder_layers(
    layers: list[LayerWeights],
    hidden_BQD: torch.Tensor,
    cos_BQD: torch.Tensor,
    sin_BQD: torch.Tensor,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
    start: int,
    mask_B1QK: torch.Tensor,
) -> torch.Tensor:
    """All pre-norm decoder blocks over Q new positions (see :func:`attention`). -> [B, Q, D]."""
    for layer, cache in zip(layers, caches):
        normed_BQD = layer.input_norm(hidden_BQD)
        hidden_BQD = hidden_BQD + attention(layer, normed_BQD, cos_BQD, sin_BQD, cache, start, mask_B1QK)
        hidden_BQD = hidden_BQD + mlp(layer, layer.post_attention_norm(hidden_BQD))
    return hidden_BQD


def position_ids(prompt_mask_BS: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """[B, S + T] int64 positions: real prompt tokens count from 0 (pads get 0), responses go on."""
    prompt_positions_BS = (prompt_mask_BS.long().cumsum(dim=1) - 1).clamp(min=0)
    steps_T = torch.arange(max_new_tokens, device=prompt_mask_BS.device)
    response_positions_BT = prompt_mask_BS.sum(dim=1, keepdim=True) + steps_T
    return torch.cat([prompt_positions_BS, response_positions_BT], dim=1)


def prefill_mask(prompt_mask_BS: torch.Tensor) -> torch.Tensor:
    """[B, 1, S, S] bool: causal, real keys only; every position also sees itself, so the rows of pad queries are
    never empty (their outputs are unused, real queries never see a pad)."""
    width = prompt_mask_BS.shape[1]
    causal_PP = torch.ones(width, width, dtype=torch.bool, device=prompt_mask_BS.device).tril()
    diagonal_PP = torch.eye(width, dtype=torch.bool, device=prompt_mask_BS.device)
    return ((causal_PP & prompt_mask_BS[:, None, :]) | diagonal_PP)[:, None]


def rope_tables(
    model: PreTrainedModel, prompt_mask_BS: torch.Tensor, max_new_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos_BLD, sin_BLD)``: the model's RoPE tables at every row's positions (see :func:`position_ids`)."""
    embed = model.get_input_embeddings()
    positions_BL = position_ids(prompt_mask_BS, max_new_tokens)
    table_positions_1N = torch.arange(int(positions_BL.max()) + 1, device=embed.weight.device)[None]
    cos_1ND, sin_1ND = model.model.rotary_emb(embed.weight[:1], table_positions_1N)
    return cos_1ND[0][positions_BL], sin_1ND[0][positions_BL]


def final_logits(model: PreTrainedModel, hidden_BD: torch.Tensor) -> torch.Tensor:
    """[B, V] float32 next-token logits from the last layer's output at one position."""
    return model.get_output_embeddings()(model.model.norm(hidden_BD)).float()


def grouped_attention(
    layer: LayerWeights,
    x_B1D: torch.Tensor,
    cos_B1D: torch.Tensor,
    sin_B1D: torch.Tensor,
    prompt_cache: tuple[torch.Tensor, torch.Tensor],
    response_cache: tuple[torch.Tensor, torch.Tensor],
    t: int,
    prompt_bias_U11S: torch.Tensor,
    group_size: int,
    slot_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step's self-attention -> [B, 1, D] for groups of G rows sharing a prompt.

    The prompt's K/V ([U, H_kv, S, Dh], U = B / G) are read once per group (the G rows' queries as one matrix); the
    response's K/V ([B, H_kv, T, Dh], column ``t`` written here) are per row; one softmax spans both. ``slot_B``: the
    rows are some of the U x G slots (a compacted batch, :meth:`GroupedCacheDecoder.select`); the prompt part still
    runs on all slots, so each row gets the same bits as in the full batch."""
    batch = x_B1D.shape[0]
    heads, kv_heads, head_dim = layer.num_heads, layer.num_kv_heads, layer.head_dim
    G = group_size
    rep, groups = heads // kv_heads, (batch if slot_B is None else prompt_bias_U11S.shape[0] * G) // G
    qkv_B1E = F.linear(x_B1D, layer.qkv_weight, layer.qkv_bias)
    qk_B1E, v_B1E = qkv_B1E.split([(heads + kv_heads) * head_dim, kv_heads * head_dim], dim=-1)
    qk_BHD = rotate(qk_B1E.view(batch, 1, heads + kv_heads, head_dim), cos_B1D, sin_B1D)[:, 0]
    k_resp_BKTD, v_resp_BKTD = response_cache
    k_resp_BKTD[:, :, t] = qk_BHD[:, heads:]
    v_resp_BKTD[:, :, t] = v_B1E.view(batch, kv_heads, head_dim)
    k_prompt_UKSD, v_prompt_UKSD = prompt_cache
    prompt_len = k_prompt_UKSD.shape[2]
    q_BKRD = qk_BHD[:, :heads].reshape(batch, kv_heads, rep, head_dim)  # query head h uses kv head h // rep
    slots = groups * G  # == batch unless compacted
    q_slots = q_BKRD
    if slot_B is not None:
        q_slots = q_BKRD.new_zeros(slots, kv_heads, rep, head_dim).index_copy_(0, slot_B, q_BKRD)
    q_UKMD = (
        q_slots.view(groups, G, kv_heads, rep, head_dim).transpose(1, 2).reshape(groups, kv_heads, G * rep, head_dim)
    )
    scores_UKMS = torch.matmul(q_UKMD, k_prompt_UKSD.transpose(-1, -2)) * layer.scaling + prompt_bias_U11S
    scores_BKRS = (
        scores_UKMS.view(groups, kv_heads, G, rep, prompt_len).transpose(1, 2).reshape(slots, kv_heads, rep, prompt_len)
    )
    if slot_B is not None:
        scores_BKRS = scores_BKRS[slot_B]
    scores_BKRT = torch.matmul(q_BKRD, k_resp_BKTD[:, :, : t + 1].transpose(-1, -2)) * layer.scaling
    probs_BKRL = torch.softmax(torch.cat([scores_BKRS, scores_BKRT], dim=-1), dim=-1)
    probs_BKRP, probs_BKRT = probs_BKRL.split([prompt_len, t + 1], dim=-1)
    if slot_B is not None:
        probs_BKRP = probs_BKRP.new_zeros(slots, kv_heads, rep, prompt_len).index_copy_(0, slot_B, probs_BKRP)
    probs_UKMS = (
        probs_BKRP.reshape(groups, G, kv_heads, rep, prompt_len)
        .transpose(1, 2)
        .reshape(groups, kv_heads, G * rep, prompt_len)
    )
    out_UKMD = torch.matmul(probs_UKMS, v_prompt_UKSD)
    prompt_out_BKRD = (
        out_UKMD.view(groups, kv_heads, G, rep, head_dim).transpose(1, 2).reshape(slots, kv_heads, rep, head_dim)
    )
    if slot_B is not None:
        prompt_out_BKRD = prompt_out_BKRD[slot_B]
    out_BKRD = prompt_out_BKRD + torch.matmul(probs_BKRT, v_resp_BKTD[:, :, : t + 1])
    return F.linear(out_BKRD.reshape(batch, 1, heads * head_dim), layer.o_weight, layer.o_bias)


def kept_columns(cache_BHLD: torch.Tensor, keep_A: torch.Tensor, columns: int) -> torch.Tensor:
    """A new cache buffer of the rows ``keep_A`` with their first ``columns`` columns copied (the rest is written by
    later steps)."""
    kept_AHLD = cache_BHLD.new_empty((keep_A.shape[0], *cache_BHLD.shape[1:]))
    kept_AHLD[:, :, :columns] = cache_BHLD[keep_A, :, :columns]
    return kept_AHLD


class GroupedCacheDecoder:
    """Prefill and one-token steps for B / G distinct prompts each repeated G times in a row: each prompt's K/V
    columns are stored once ([U, H_kv, S, Dh]) and read once per group per step (:func:`grouped_attention`)."""

    def __init__(
        self,
        model: PreTrainedModel,
        layers: list[LayerWeights],
        prompt_ids_BS: torch.Tensor,
        prompt_mask_BS: torch.Tensor,
        max_new_tokens: int,
        group_size: int,
    ) -> None:
        batch, width = prompt_ids_BS.shape
        self.model, self.layers, self.width, self.group_size = model, layers, width, group_size
        self.first_U = torch.arange(0, batch, group_size, device=prompt_ids_BS.device)
        self.prompt_ids_US, self.prompt_mask_US = prompt_ids_BS[self.first_U], prompt_mask_BS[self.first_U]
        weight = model.get_input_embeddings().weight
        groups = self.first_U.shape[0]
        self.prompt_caches = [empty_cache(groups, width, layer, weight) for layer in layers]
        self.response_caches = [empty_cache(batch, max_new_tokens, layer, weight) for layer in layers]
        self.cos_BLD, self.sin_BLD = rope_tables(model, prompt_mask_BS, max_new_tokens)
        self.prompt_bias_U11S = torch.zeros(groups, 1, 1, width, dtype=weight.dtype, device=weight.device).masked_fill(
            ~self.prompt_mask_US[:, None, None, :], float("-inf")
        )
        rows_B = torch.arange(batch, device=prompt_ids_BS.device)
        self.group_B, self.member_B = rows_B // group_size, rows_B % group_size  # of the rows still decoded
        self.slot_B: torch.Tensor | None = None  # None: all rows, in order (no select yet)

    def prefill(self) -> torch.Tensor:
        width = self.width
        hidden_USD = self.model.get_input_embeddings()(self.prompt_ids_US)
        hidden_USD = decoder_layers(
            self.layers,
            hidden_USD,
            self.cos_BLD[self.first_U, :width],
            self.sin_BLD[self.first_U, :width],
            self.prompt_caches,
            0,
            prefill_mask(self.prompt_mask_US),
        )
        return final_logits(self.model, hidden_USD[:, -1]).repeat_interleave(self.group_size, dim=0)

    def select(self, keep_A: torch.Tensor, t: int) -> None:
        """Decode only the rows ``keep_A`` (positions among the rows decoded so far, increasing) from now on; response
        cache columns [0, t) are kept. Groups without a kept row are dropped; the others keep their G slots in the
        prompt part (:func:`grouped_attention`'s ``slot_B``)."""
        group_A, member_A = self.group_B[keep_A], self.member_B[keep_A]
        kept_U = torch.unique(group_A)  # sorted
        renumbered_A = torch.searchsorted(kept_U, group_A)
        self.prompt_caches = [(k[kept_U], v[kept_U]) for k, v in self.prompt_caches]
        self.prompt_bias_U11S = self.prompt_bias_U11S[kept_U]
        self.response_caches = [
            (kept_columns(k, keep_A, t), kept_columns(v, keep_A, t)) for k, v in self.response_caches
        ]
        self.cos_BLD, self.sin_BLD = self.cos_BLD[keep_A], self.sin_BLD[keep_A]
        self.group_B, self.member_B = renumbered_A, member_A
        self.slot_B = renumbered_A * self.group_size + member_A

    def step(self, token_B: torch.Tensor, t: int) -> torch.Tensor:
        column = self.width + t
        cos_B1D, sin_B1D = self.cos_BLD[:, column : column + 1], self.sin_BLD[:, column : column + 1]
        hidden_B1D = self.model.get_input_embeddings()(token_B[:, None])
        for layer, prompt_cache, response_cache in zip(self.layers, self.prompt_caches, self.response_caches):
            normed_B1D = layer.input_norm(hidden_B1D)
            hidden_B1D = hidden_B1D + grouped_attention(
                layer,
                normed_B1D,
                cos_B1D,
                sin_B1D,
                prompt_cache,
                response_cache,
                t,
                self.prompt_bias_U11S,
                self.group_size,
                self.slot_B,
            )
            hidden_B1D = hidden_B1D + mlp(layer, layer.post_attention_norm(hidden_B1D))
        return final_logits(self.model, hidden_B1D[:, 0])


class StaticCacheDecoder:
    """Prefill and one-token steps of a Llama / Qwen2 model over a preallocated K/V cache."""

    def __init__(
        self,
        model: PreTrainedModel,
        layers: list[LayerWeights],
        prompt_ids_BS: torch.Tensor,
        prompt_mask_BS: torch.Tensor,
        max_new_tokens: int,
    ) -> None:
        batch, width = prompt_ids_BS.shape
        length = width + max_new_tokens
        self.model, self.layers, self.width = model, layers, width
        self.prompt_ids_BS, self.prompt_mask_BS = prompt_ids_BS, prompt_mask_BS
        weight = model.get_input_embeddings().weight
        self.caches = [empty_cache(batch, length, layer, weight) for layer in layers]
        self.cos_BLD, self.sin_BLD = rope_tables(model, prompt_mask_BS, max_new_tokens)
        self.key_mask_BL = torch.cat(
            [prompt_mask_BS, torch.ones(batch, max_new_tokens, dtype=torch.bool, device=weight.device)], dim=1
        )

    def logits(self, hidden_BD: torch.Tensor) -> torch.Tensor:
        return final_logits(self.model, hidden_BD)

    def select(self, keep_A: torch.Tensor, t: int) -> None:
        """Decode only the rows ``keep_A`` (positions among the rows decoded so far) from now on; cache columns [0, S
        + t) are kept."""
        self.caches = [
            (kept_columns(k, keep_A, self.width + t), kept_columns(v, keep_A, self.width + t)) for k, v in self.caches
        ]
        self.cos_BLD, self.sin_BLD = self.cos_BLD[keep_A], self.sin_BLD[keep_A]
        self.key_mask_BL = self.key_mask_BL[keep_A]

    def prefill(self) -> torch.Tensor:
        """Run the prompts (one per row; groups go to :class:`GroupedCacheDecoder`); -> [B, V] logits of the first
        response token."""
        width = self.width
        hidden_BSD = self.model.get_input_embeddings()(self.prompt_ids_BS)
        hidden_BSD = decoder_layers(
            self.layers,
            hidden_BSD,
            self.cos_BLD[:, :width],
            self.sin_BLD[:, :width],
            self.caches,
            0,
            prefill_mask(self.prompt_mask_BS),
        )
        return self.logits(hidden_BSD[:, -1])

    def step(self, token_B: torch.Tensor, t: int) -> torch.Tensor:
        """Feed response token ``t`` of every row; -> [B, V] logits of token t + 1."""
        column = self.width + t
        hidden_B1D = self.model.get_input_embeddings()(token_B[:, None])
        hidden_B1D = decoder_layers(
            self.layers,
            hidden_B1D,
            self.cos_BLD[:, column : column + 1],
            self.sin_BLD[:, column : column + 1],
            self.caches,
            column,
            self.key_mask_BL[:, None, None, : column + 1],
        )
        return self.logits(hidden_B1D[:, 0])


class FixedShapeDecoder(StaticCacheDecoder):
    """:class:`StaticCacheDecoder` with every shape of a step fixed, so that a CUDA graph can replay it: the step reads
    its token and column from device tensors, writes K/V with ``index_copy_`` and attends over the whole zeroed cache
    (S + T columns) under a mask. ``capture``: record the step as a CUDA graph at its first call and replay it from
    then on (CUDA only; one graph per generation); otherwise the same arithmetic runs eagerly. The logits a step
    returns live in the graph's buffer until the next step."""

    def __init__(
        self,
        model: PreTrainedModel,
        layers: list[LayerWeights],
        prompt_ids_BS: torch.Tensor,
        prompt_mask_BS: torch.Tensor,
        max_new_tokens: int,
        *,
        capture: bool,
    ) -> None:
        super().__init__(model, layers, prompt_ids_BS, prompt_mask_BS, max_new_tokens)
        for k_BKLD, v_BKLD in self.caches:  # columns not yet written are read (weight 0): no NaN may hide there
            k_BKLD.zero_()
            v_BKLD.zero_()
        device = prompt_ids_BS.device
        self.token_B = torch.zeros(prompt_ids_BS.shape[0], dtype=torch.int64, device=device)
        self.column_1 = torch.zeros(1, dtype=torch.int64, device=device)
        self.columns_L = torch.arange(self.key_mask_BL.shape[1], device=device)
        self.capture = capture
        self.graph: Any = None
        self.logits_BV: torch.Tensor | None = None

    def fixed_step(self) -> torch.Tensor:
        """One step on the buffers ``token_B`` and ``column_1``. -> [B, V] logits."""
        column_1 = self.column_1
        hidden_B1D = self.model.get_input_embeddings()(self.token_B[:, None])
        cos_B1D, sin_B1D = self.cos_BLD.index_select(1, column_1), self.sin_BLD.index_select(1, column_1)
        mask_B11L = (self.key_mask_BL & (self.columns_L <= column_1))[:, None, None, :]
        for layer, (k_cache_BKLD, v_cache_BKLD) in zip(self.layers, self.caches):
            q_BH1D, k_BK1D, v_BK1D = project(layer, layer.input_norm(hidden_B1D), cos_B1D, sin_B1D)
            k_cache_BKLD.index_copy_(2, column_1, k_BK1D.to(k_cache_BKLD.dtype))  # under autocast: float32 keys
            v_cache_BKLD.index_copy_(2, column_1, v_BK1D.to(v_cache_BKLD.dtype))
            hidden_B1D = hidden_B1D + attend(layer, q_BH1D, k_cache_BKLD, v_cache_BKLD, mask_B11L)
            hidden_B1D = hidden_B1D + mlp(layer, layer.post_attention_norm(hidden_B1D))
        return self.logits(hidden_B1D[:, 0])

    def select(self, keep_A: torch.Tensor, t: int) -> None:
        raise NotImplementedError("a fixed-shape decoder keeps every row (no compaction)")

    def step(self, token_B: torch.Tensor, t: int) -> torch.Tensor:
        self.token_B.copy_(token_B)
        self.column_1.fill_(self.width + t)
        if not self.capture:
            return self.fixed_step()
        if self.graph is None:
            self.graph, self.logits_BV = capture_cuda_graph(self.fixed_step)
        self.graph.replay()
        return typing.cast(torch.Tensor, self.logits_BV)


def capture_cuda_graph(function: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
    """``(graph, output)``: ``function`` (idempotent on its inputs) run twice on a side stream, as capture needs, then
    recorded as a CUDA graph whose replays refill ``output``. Under autocast the capture turns autocast's cast cache
    off (a cached cast would be freed while the graph still reads it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    dtype = autocast_dtype("cuda")
    with torch.cuda.stream(stream):
        for _ in range(2):
            function()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with (
        torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None, cache_enabled=False),
        torch.cuda.graph(graph),
    ):
        output = function()
    return graph, output


@functools.cache
def _cache_keyword(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(module: torch.nn.Module, cache: DynamicCache) -> dict[str, Any]:
    """``{name: cache}`` for ``module``'s forward: ``cache=`` where the forward declares it (newer transformers), else
    ``past_key_values=`` (5.10, verl 0.9.1's ceiling, would silently ignore ``cache=``)."""
    return {_cache_keyword(type(module)): cache}


class ModelCacheDecoder:
    """The fallback: the model's own forward with a ``DynamicCache`` (any causal LM)."""

    def __init__(
        self, model: PreTrainedModel, prompt_ids_BS: torch.Tensor, prompt_mask_BS: torch.Tensor, max_new_tokens: int
    ) -> None:
        batch = prompt_ids_BS.shape[0]
        self.model, self.width = model, prompt_ids_BS.shape[1]
        self.prompt_ids_BS = prompt_ids_BS
        self.cache = DynamicCache(config=model.config)
        self.positions_BL = position_ids(prompt_mask_BS, max_new_tokens)
        ones_BT = torch.ones(batch, max_new_tokens, dtype=torch.long, device=prompt_ids_BS.device)
        self.mask_BL = torch.cat([prompt_mask_BS.long(), ones_BT], dim=1)

    def forward(self, ids_BQ: torch.Tensor, start: int) -> torch.Tensor:
        end = start + ids_BQ.shape[1]
        out = self.model(
            input_ids=ids_BQ,
            attention_mask=self.mask_BL[:, :end],
            position_ids=self.positions_BL[:, start:end],
            **cache_kwargs(self.model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()

    def prefill(self) -> torch.Tensor:
        return self.forward(self.prompt_ids_BS, 0)

    def step(self, token_B: torch.Tensor, t: int) -> torch.Tensor:
        return self.forward(token_B[:, None], self.width + t)


class Decoder(Protocol):
    def prefill(self) -> torch.Tensor: ...

    def step(self, token_B: torch.Tensor, t: int) -> torch.Tensor: ...


class CompactingDecoder(Decoder, Protocol):
    def select(self, keep_A: torch.Tensor, t: int) -> None: ...


# -------------------------------------------------------------------------------------------- The sampling loop and
# the engine

# Compaction: once a quarter of the rows still decoded have finished, the finished ones leave the batch (their K/V
# columns are copied out), never below MIN_COMPACT_ROWS rows: a matrix product of at most 3 rows takes another path in
# MKL and rounds differently (measured on this project's CPU, torch 2.13), so every row keeps the bits of the full
# batch only above that.
COMPACT_WHEN_FINISHED = 0.25
MIN_COMPACT_ROWS = 8


def compaction(finished_A: torch.Tensor) -> torch.Tensor | None:
    """The positions to keep decoding (increasing), or ``None`` to keep them all: the unfinished rows, topped up with
    the first finished ones to ``MIN_COMPACT_ROWS``, once that drops at least a quarter of the rows."""
    rows = finished_A.shape[0]
    live = rows - int(finished_A.sum())
    keep = max(live, MIN_COMPACT_ROWS)
    if rows - keep < COMPACT_WHEN_FINISHED * rows:
        return None
    order_A = torch.argsort(finished_A.to(torch.int8), stable=True)  # unfinished first, in order
    return order_A[:keep].sort().values


def sampling_loop(
    decoder: Decoder,
    params: SamplingParams,
    generator: torch.Generator,
    eos_ids: torch.Tensor,
    pad_id: int,
    *,
    compact: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens_BT, logp_BT, finished_B)``: T <= ``max_new_tokens`` steps, stopping once every row has emitted an
    EOS; after its EOS a row gets pad tokens with log-prob 0.

    ``compact`` (a decoder with ``select``): finished rows leave the batch (:func:`compaction`); every step still
    draws one uniform per row of the whole batch, so the stream and every row's tokens are the full batch's
    (``tests/rollout/test_fast.py``; docs/training.md §Threads)."""
    logits_AV = decoder.prefill()
    batch, device = logits_AV.shape[0], logits_AV.device
    tokens_BT = torch.full((batch, params.max_new_tokens), pad_id, dtype=torch.int64, device=device)
    logp_BT = torch.zeros((batch, params.max_new_tokens), dtype=torch.float32, device=device)
    finished_B = torch.zeros(batch, dtype=torch.bool, device=device)
    rows_A: torch.Tensor | None = None  # the rows the decoder still runs; None: all, in order
    steps = 0
    while True:
        if rows_A is None:
            token_B, logp_B = sample_next(logits_AV, params.temperature, params.top_k, params.top_p, generator)
            tokens_BT[:, steps] = token_B.masked_fill(finished_B, pad_id)
            logp_BT[:, steps] = logp_B.masked_fill(finished_B, 0.0)
            finished_B |= torch.isin(tokens_BT[:, steps], eos_ids)
        else:
            u_A1 = None if params.temperature == 0 else uniforms(batch, generator, device)[rows_A]
            token_A, logp_A = sample_next(logits_AV, params.temperature, params.top_k, params.top_p, generator, u_A1)
            done_A = finished_B[rows_A]
            token_A = token_A.masked_fill(done_A, pad_id)
            tokens_BT[rows_A, steps] = token_A
            logp_BT[rows_A, steps] = logp_A.masked_fill(done_A, 0.0)
            finished_B[rows_A] = done_A | torch.isin(token_A, eos_ids)
        steps += 1
        if steps == params.max_new_tokens or bool(finished_B.all()):
            break
        if compact:
            keep_A = compaction(finished_B if rows_A is None else finished_B[rows_A])
            if keep_A is not None:
                typing.cast(CompactingDecoder, decoder).select(keep_A, steps - 1)
                rows_A = keep_A if rows_A is None else rows_A[keep_A]
        token_A = tokens_BT[:, steps - 1] if rows_A is None else tokens_BT[rows_A, steps - 1]
        logits_AV = decoder.step(token_A, steps - 1)
    return tokens_BT[:, :steps], logp_BT[:, :steps], finished_B


@contextlib.contextmanager
def eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """Eval mode (no dropout) for the duration; the previous mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def pad_columns(tensor_BT: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """``tensor_BT`` extended on the right with ``value`` to ``width`` columns."""
    return F.pad(tensor_BT, (0, width - tensor_BT.shape[1]), value=value)


class FastEngine(PromptEngine):
    """:class:`~tokenbalance.rollout.base.RolloutEngine` with a preallocated KV cache.

    Args:
        model: a Hugging Face causal LM (its device and dtype are used); Llama and Qwen2 run on the static-cache
            decoder, others on the model's forward with a ``DynamicCache``.
        tokenizer: supplies the pad id (required) and the EOS id.
        eos_token_ids: ids that end a response; default as in ``HFGenerateEngine``.
        max_batch_size: at most this many prompts at once (bounds cache memory; outputs depend on it). ``None``: all.
        path: ``"auto"`` (static when supported), ``"static"`` (``ValueError`` if unsupported) or ``"model"``.
        compact: let finished rows leave the batch on the static path (:func:`sampling_loop`). ``None``: only at one
            CPU torch thread, where every token stays bit-identical (docs/training.md §Threads); ``False`` never;
            ``True`` always (same distribution, not the same bits).
        cuda_graph: decode with every step's shapes fixed (:class:`FixedShapeDecoder`: one row per response, no
            prompt sharing, no compaction), on CUDA replaying each step as a CUDA graph; static path only. ``None``:
            on CUDA devices; ``True`` on a CPU runs the fixed-shape step eagerly (what its CPU tests check)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        eos_token_ids: Iterable[int] | None = None,
        max_batch_size: int | None = None,
        path: str = "auto",
        compact: bool | None = None,
        cuda_graph: bool | None = None,
    ) -> None:
        super().__init__(model, tokenizer, eos_token_ids=eos_token_ids)
        self.compact, self.cuda_graph = compact, cuda_graph
        if max_batch_size is not None and (
            isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1
        ):
            raise ValueError(f"max_batch_size must be None or an integer >= 1, got {max_batch_size!r}")
        if cuda_graph is not None and not isinstance(cuda_graph, bool):
            raise ValueError(f"cuda_graph must be None, True or False, got {cuda_graph!r}")
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        problem = static_path_problem(model)
        if path == "static" and problem is not None:
            raise ValueError(f"the static-cache decoder does not support {problem}; use path='auto' or 'model'")
        self.max_batch_size = max_batch_size
        self.path = "static" if path != "model" and problem is None else "model"

    def fixed_shapes(self, device: torch.device) -> bool:
        """Whether the steps run on :class:`FixedShapeDecoder` (the ``cuda_graph`` argument; static path only)."""
        if self.path != "static":
            return False
        return device.type == "cuda" if self.cuda_graph is None else self.cuda_graph

    def compacts(self, device: torch.device) -> bool:
        """Whether finished rows leave the batch (the ``compact`` argument; static path only, not fixed shapes)."""
        if self.path != "static" or self.fixed_shapes(device):
            return False
        if self.compact is None:
            return device.type == "cpu" and torch.get_num_threads() == 1
        return self.compact

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, *, n: int = 1) -> Generation:
        """P prompts, ``n`` samples each, drawn as ``sampling`` says -> a :class:`Generation` of P x n rows,
        prompt-major (n > 1 on the static path: grouped decoding)."""
        model = self.model
        prompt_ids_BS, prompt_mask_BS, device = self.padded_prompts(prompt_ids, sampling, n)
        eos_ids = torch.tensor(self.eos_token_ids, device=device)
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
        rows = prompt_ids_BS.shape[0]
        chunk = max(n, (self.max_batch_size or rows) // n * n)  # whole groups per sub-batch
        pieces = []
        with eval_mode(model), torch.no_grad():
            layers = layer_weights(model, autocast_dtype(device.type)) if self.path == "static" else []
            for start in range(0, rows, chunk):
                ids_BS, mask_BS = prompt_ids_BS[start : start + chunk], prompt_mask_BS[start : start + chunk]
                if self.fixed_shapes(device):
                    decoder: Decoder = FixedShapeDecoder(
                        model, layers, ids_BS, mask_BS, sampling.max_new_tokens, capture=device.type == "cuda"
                    )
                elif self.path == "static" and n > 1:
                    decoder = GroupedCacheDecoder(model, layers, ids_BS, mask_BS, sampling.max_new_tokens, n)
                elif self.path == "static":
                    decoder = StaticCacheDecoder(model, layers, ids_BS, mask_BS, sampling.max_new_tokens)
                else:
                    decoder = ModelCacheDecoder(model, ids_BS, mask_BS, sampling.max_new_tokens)
                pieces.append(
                    sampling_loop(
                        decoder, sampling, generator, eos_ids, self.pad_token_id, compact=self.compacts(device)
                    )
                )
        width = max(tokens_BT.shape[1] for tokens_BT, _, _ in pieces)
        response_ids_BT = torch.cat([pad_columns(tokens, width, self.pad_token_id) for tokens, _, _ in pieces])
        sampler_logp_BT = torch.cat([pad_columns(logp, width, 0.0) for _, logp, _ in pieces])
        finished_B = torch.cat([finished for _, _, finished in pieces])
        response_mask_BT = mask_through_first_eos(response_ids_BT, eos_ids)
        return self.generation(
            prompt_ids_BS, prompt_mask_BS, response_ids_BT, response_mask_BT, sampler_logp_BT, finished_B, n
        )
