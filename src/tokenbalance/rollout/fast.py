"""Rollouts for small models with a preallocated KV cache and a hand-written decode loop.

    engine = FastEngine(model, tokenizer)
    gen = engine.generate(prompt_ids, SamplingParams(max_new_tokens=256, temperature=1.0, seed=step))

Same interface and output as :class:`~tokenbalance.rollout.hf.HFGenerateEngine`, faster on small Llama / Qwen2 models
(it runs their decoder layers itself; other models use their own cached forward). What it does, reproduces bit for bit
and its speed: docs/training.md ("Rollout engines")."""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tokenbalance.rollout.base import Generation, SamplingParams
from tokenbalance.rollout.decoders import (
    CompactingDecoder,
    Decoder,
    FixedShapeDecoder,
    GroupedCacheDecoder,
    ModelCacheDecoder,
    StaticCacheDecoder,
)
from tokenbalance.rollout.hf import PromptEngine, mask_through_first_eos
from tokenbalance.rollout.layers import autocast_dtype, layer_weights, static_path_problem
from tokenbalance.rollout.sampling import sample_next, uniforms

PATHS = ("auto", "static", "model")

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
