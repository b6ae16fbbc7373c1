"""A Llama / Qwen2 decoder's arithmetic written out by hand, for the fast engine's decoders: the layers' weights fused
(q/k/v, gate/up) and optionally cast once, RoPE, attention over a preallocated K/V cache (also the grouped form that
reads each prompt's columns once per group), the SwiGLU MLP and the final logits. Which models it can run:
:func:`static_path_problem`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

STATIC_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # frequencies fixed at init


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
