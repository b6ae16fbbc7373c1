"""The fast engine's decoders: each runs the prompts once (``prefill``) and then one token per row (``step``), returning
[B, V] float32 logits. :class:`StaticCacheDecoder` (a preallocated K/V cache), :class:`GroupedCacheDecoder` (one cache
of each prompt for its group), :class:`FixedShapeDecoder` (fixed shapes, replayed as a CUDA graph on CUDA) and the
fallback :class:`ModelCacheDecoder` (the model's own forward with a ``DynamicCache``)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from tokenbalance.rollout.layers import (
    LayerWeights,
    attend,
    autocast_dtype,
    decoder_layers,
    empty_cache,
    final_logits,
    grouped_attention,
    kept_columns,
    mlp,
    position_ids,
    prefill_mask,
    project,
    rope_tables,
)


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
