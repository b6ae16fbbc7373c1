"""Log-probabilities of sampled responses under a causal LM, at the log-prob temperature.

Prompt (left-padded) and response (right-padded) run as one sequence; only response positions go through the output
layer (plus the last hidden states for NTHR). ``ForwardSettings.share_prompts`` runs each prompt of a group once
(:class:`PackedSequences`); ``trim_padding`` stops at the rows' longest response. docs/training.md ("One RL step")."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from tokenbalance.algorithms.logit_grad import sum_sq_probs
from tokenbalance.algorithms.surrogate import entropy_and_sum_sq_probs, entropy_from_logits
from tokenbalance.rollout.decoders import cache_kwargs
from tokenbalance.trainer.precision import PLAIN_FORWARD, ForwardSettings, forward_precision, weight_casts_kept


@dataclass(frozen=True)
class PackedSequences:
    """Prompt + response as model input: ``prompt_len`` = S, responses in the last T columns. ``prompt_B`` ([B] int64
    or ``None``): rows with the same number hold the same prompt (a GRPO group) and share its forward."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    position_ids_BL: torch.Tensor
    prompt_len: int
    prompt_B: torch.Tensor | None = None

    def rows(self, rows) -> PackedSequences:
        return PackedSequences(
            self.input_ids_BL[rows],
            self.attention_mask_BL[rows],
            self.position_ids_BL[rows],
            self.prompt_len,
            None if self.prompt_B is None else self.prompt_B[rows],
        )

    def response_lengths_B(self) -> torch.Tensor:
        """[B] int64: each row's response length (its real response columns, EOS included)."""
        return self.attention_mask_BL[:, self.prompt_len :].long().sum(dim=1)

    def without_trailing_padding(self) -> PackedSequences:
        """The same rows cut after the longest response among them (itself when none is shorter)."""
        width = self.input_ids_BL.shape[1] - self.prompt_len
        longest = int(self.response_lengths_B().max()) if width and self.input_ids_BL.shape[0] else width
        if longest >= width:
            return self
        end = self.prompt_len + longest
        return PackedSequences(
            self.input_ids_BL[:, :end],
            self.attention_mask_BL[:, :end],
            self.position_ids_BL[:, :end],
            self.prompt_len,
            self.prompt_B,
        )


def row_chunks(num_rows: int, size: int, start: int = 0) -> list[slice]:
    """Rows ``start .. num_rows - 1`` as consecutive slices of at most ``size`` rows."""
    return [slice(first, min(first + size, num_rows)) for first in range(start, num_rows, size)]


def micro_batches(
    packed: PackedSequences, rows: slice, size: int, *, group_by_length: bool
) -> list[slice] | list[torch.Tensor]:
    """``rows`` (a contiguous range) cut into micro-batches of at most ``size``: slices, or with ``group_by_length``
    index tensors in stable order of response length (each forward stops at its own longest response; only rounding
    changes)."""
    count = rows.stop - rows.start
    if not group_by_length or count <= size:
        return row_chunks(rows.stop, size, start=rows.start)
    lengths = packed.response_lengths_B()[rows]
    order = torch.argsort(lengths, stable=True) + rows.start
    return [order[chunk] for chunk in row_chunks(count, size)]


def pack_sequences(
    prompt_ids_BS, prompt_mask_BS, response_ids_BT, response_mask_BT, prompt_B: torch.Tensor | None = None
) -> PackedSequences:
    """Concatenate left-padded prompts and right-padded responses ([B, S + T]); ``prompt_B`` as in
    :class:`PackedSequences` (e.g. ``Generation.prompt_B``)."""
    input_ids = torch.cat([prompt_ids_BS, response_ids_BT], dim=1)
    attention = torch.cat([prompt_mask_BS.bool(), response_mask_BT.bool()], dim=1)
    positions = (attention.long().cumsum(dim=1) - 1).clamp(min=0)
    if prompt_B is not None:
        prompt_B = prompt_B.to(input_ids.device)
    return PackedSequences(input_ids, attention.long(), positions, prompt_ids_BS.shape[1], prompt_B)


@dataclass(frozen=True)
class ResponseLogprobs:
    """``logp_BT`` (float32, or float64 for a float64 model; with gradient if the pass had it), optional
    ``entropy_BT``, ``hidden_BTD``, ``sum_sq_probs_BT`` (sum_j pi_j^2 of each position's distribution, detached: the
    logit-gradient norm's one extra quantity, :mod:`tokenbalance.algorithms.logit_grad`)."""

    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None = None
    hidden_BTD: torch.Tensor | None = None
    sum_sq_probs_BT: torch.Tensor | None = None


def checkpointing(model) -> bool:
    """Whether activation (gradient) checkpointing is on: the model then refuses a K/V cache in training. transformers
    5.23 renamed ``is_gradient_checkpointing`` (now deprecated, with a warning) to ``is_activation_checkpointing``;
    5.10 has only the old name."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def shared_prompt_rows(packed: PackedSequences) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first_U, inverse_B)`` from ``packed.prompt_B``: ``first_U`` [U] the first row of each prompt (in ascending
    prompt number), ``inverse_B`` [B] each row's index among them, so ``rows[first_U][inverse_B]`` is each row's
    prompt. ``None`` when no two rows share a prompt."""
    if packed.prompt_B is None:
        return None
    prompt_B = packed.prompt_B
    distinct_U, inverse_B = torch.unique(prompt_B, return_inverse=True)
    rows = prompt_B.shape[0]
    if distinct_U.shape[0] == rows:
        return None
    first_U = torch.full((distinct_U.shape[0],), rows, dtype=torch.long, device=prompt_B.device)
    first_U = first_U.scatter_reduce(0, inverse_B, torch.arange(rows, device=prompt_B.device), reduce="amin")
    return first_U, inverse_B


def shared_prompt_hidden(
    model, packed: PackedSequences, first_U: torch.Tensor, inverse_B: torch.Tensor
) -> torch.Tensor:
    """[B, T, D] hidden states predicting the response tokens, the prompts run once each (see module doc)."""
    decoder = model.get_decoder()
    P = packed.prompt_len
    cache = DynamicCache(config=model.config)
    prompt_USD = decoder(
        input_ids=packed.input_ids_BL[first_U, :P],
        attention_mask=packed.attention_mask_BL[first_U, :P],
        position_ids=packed.position_ids_BL[first_U, :P],
        **cache_kwargs(decoder, cache),
        use_cache=True,
    ).last_hidden_state
    cache.batch_select_indices(inverse_B)  # every row gets its prompt's keys and values
    response_BTD = decoder(
        input_ids=packed.input_ids_BL[:, P:],
        attention_mask=packed.attention_mask_BL,
        position_ids=packed.position_ids_BL[:, P:],
        **cache_kwargs(decoder, cache),
        use_cache=True,
    ).last_hidden_state
    return torch.cat([prompt_USD[inverse_B, -1:], response_BTD[:, :-1]], dim=1)


def full_sequence_hidden(model, packed: PackedSequences) -> torch.Tensor:
    """[B, T, D] hidden states predicting the response tokens, from one pass over prompt + response."""
    hidden_BLD = model.get_decoder()(
        input_ids=packed.input_ids_BL,
        attention_mask=packed.attention_mask_BL,
        position_ids=packed.position_ids_BL,
        use_cache=False,
    ).last_hidden_state
    P = packed.prompt_len
    T = packed.input_ids_BL.shape[1] - P
    return hidden_BLD[:, P - 1 : P - 1 + T]


HeadOutputs = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


@dataclass(frozen=True)
class HeadOptions:
    """What :func:`head_logprobs` computes (the arguments of :func:`response_logprobs` of that name)."""

    temperature: float
    compute_dtype: torch.dtype | None
    with_entropy: bool
    entropy_grad: bool
    with_sum_sq_probs: bool
    cache_weights: bool = True


def head_logprobs(
    head: torch.nn.Module, hidden_BTD: torch.Tensor, targets_BT: torch.Tensor, options: HeadOptions
) -> HeadOutputs:
    """``(logp_BT, entropy_BT, sum_sq_probs_BT)`` of ``targets_BT`` from the hidden states predicting them: the output
    layer under ``compute_dtype``'s autocast, logits upcast to at least float32 and divided by ``temperature``,
    log-softmax; the entropy and sum_j pi_j^2 when asked. Any leading shape in place of [B, T]."""
    with forward_precision(head, options.compute_dtype, cache_weights=options.cache_weights):
        logits_BTV = head(hidden_BTD)
    logits_BTV = logits_BTV.to(torch.promote_types(logits_BTV.dtype, torch.float32)) / options.temperature
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    logp_BT = logp_BTV.gather(-1, targets_BT[..., None]).squeeze(-1)
    entropy_BT = sum_sq_BT = None
    if options.with_entropy:
        with torch.set_grad_enabled(options.entropy_grad and torch.is_grad_enabled()):
            if options.with_sum_sq_probs and logits_BTV.dtype == torch.float32:  # from the entropy's own softmax
                entropy_BT, sum_sq_BT = entropy_and_sum_sq_probs(logits_BTV)
            else:
                entropy_BT = entropy_from_logits(logits_BTV)
    if options.with_sum_sq_probs and sum_sq_BT is None:
        sum_sq_BT = sum_sq_probs(logp_BTV)
    return logp_BT, entropy_BT, sum_sq_BT


def chunked_head_logprobs(
    head: torch.nn.Module, hidden_BTD: torch.Tensor, targets_BT: torch.Tensor, chunk_tokens: int, options: HeadOptions
) -> HeadOutputs:
    """:func:`head_logprobs` over ``chunk_tokens`` positions at a time (at most one chunk's [chunk, V] logits exist);
    with a gradient each chunk is checkpointed (logits recomputed in the backward). Equal to the whole up to matmul
    rounding. Under autocast each chunk converts the weight afresh: one copy shared by every chunk would add their
    gradients in the compute type (:func:`~tokenbalance.trainer.precision.weight_casts_kept`)."""
    options = replace(options, cache_weights=False)
    B, T, D = hidden_BTD.shape
    hidden_ND, targets_N = hidden_BTD.reshape(B * T, D), targets_BT.reshape(B * T)
    keep = torch.is_grad_enabled() and hidden_ND.requires_grad

    def run(hidden_CD: torch.Tensor, targets_C: torch.Tensor) -> HeadOutputs:
        return head_logprobs(head, hidden_CD, targets_C, options)

    parts: list[HeadOutputs] = []
    for start in range(0, B * T, chunk_tokens):
        piece = (hidden_ND[start : start + chunk_tokens], targets_N[start : start + chunk_tokens])
        parts.append(checkpoint(run, *piece, use_reentrant=False) if keep else run(*piece))

    def joined(index: int) -> torch.Tensor | None:
        values = [part[index] for part in parts]
        present = [v for v in values if v is not None]
        if len(present) < len(values):
            return None
        return torch.cat(present).view(B, T) if present else hidden_BTD.new_zeros(B, T, dtype=torch.float32)

    logp_BT = joined(0)
    assert logp_BT is not None
    return logp_BT, joined(1), joined(2)


def response_logprobs(
    model,
    packed: PackedSequences,
    *,
    temperature: float,
    with_entropy: bool = False,
    with_hidden: bool = False,
    entropy_grad: bool = False,
    with_sum_sq_probs: bool = False,
    trim_padding: bool = False,
    forward_settings: ForwardSettings = PLAIN_FORWARD,
) -> ResponseLogprobs:
    """Log-probs of the response tokens under ``model`` at ``temperature`` (columns P-1 .. P+T-2 predict them).

    Gradient flows when autograd is on; the entropy carries it only with ``entropy_grad``. ``with_sum_sq_probs``:
    sum_j pi_j^2 per position, detached. ``trim_padding``: stop at the rows' longest response, zeros after.
    ``forward_settings``: autocast type of decoder and output layer (:mod:`tokenbalance.trainer.precision`; the
    log-softmax is float32 either way), the output layer's chunk size, and whether each distinct prompt runs once."""
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0 for log-probs, got {temperature}")
    width = packed.input_ids_BL.shape[1] - packed.prompt_len
    if trim_padding:
        packed = packed.without_trailing_padding()
    sharing = forward_settings.share_prompts and not checkpointing(model)
    shared = shared_prompt_rows(packed) if sharing else None
    with forward_precision(model, forward_settings.compute_dtype):
        hidden_BTD = (
            full_sequence_hidden(model, packed) if shared is None else shared_prompt_hidden(model, packed, *shared)
        )
    targets_BT = packed.input_ids_BL[:, packed.prompt_len :]
    head_options = HeadOptions(
        temperature, forward_settings.compute_dtype, with_entropy, entropy_grad, with_sum_sq_probs
    )
    head = model.get_output_embeddings()
    if forward_settings.chunk_tokens:
        logp_BT, entropy_BT, sum_sq_BT = chunked_head_logprobs(
            head, hidden_BTD, targets_BT, forward_settings.chunk_tokens, head_options
        )
    else:
        logp_BT, entropy_BT, sum_sq_BT = head_logprobs(head, hidden_BTD, targets_BT, head_options)
    missing = width - logp_BT.shape[1]  # trailing padding columns not run: zeros there

    def full_width(values: torch.Tensor, *, hidden: bool = False) -> torch.Tensor:
        if not missing:
            return values
        return torch.nn.functional.pad(values, (0, 0, 0, missing) if hidden else (0, missing))

    return ResponseLogprobs(
        logp_BT=full_width(logp_BT),
        entropy_BT=None if entropy_BT is None else full_width(entropy_BT),
        hidden_BTD=full_width(hidden_BTD.detach(), hidden=True) if with_hidden else None,
        sum_sq_probs_BT=None if sum_sq_BT is None else full_width(sum_sq_BT),
    )


def step_weight_casts(model, settings: ForwardSettings):
    """:func:`~tokenbalance.trainer.precision.weight_casts_kept` as ``settings`` ask, off under activation
    checkpointing (its backward recomputes forwards): the region of one step's micro-batches, the log-probs' or an
    optimizer step's."""
    keep = settings.keep_weight_casts and not checkpointing(model)
    return weight_casts_kept(model, settings.compute_dtype, keep=keep)


@torch.no_grad()
def batched_response_logprobs(
    model,
    packed: PackedSequences,
    *,
    temperature: float,
    micro_batch: int,
    with_hidden: bool = False,
    with_entropy: bool = False,
    group_by_length: bool = False,
    forward_settings: ForwardSettings = PLAIN_FORWARD,
) -> ResponseLogprobs:
    """No-grad log-probs (and hidden states, entropies) of the whole batch, ``micro_batch`` rows at a time
    (:func:`micro_batches`); ``with_entropy`` adds the per-token entropy (the bucket statistics use the old policy's).
    """
    rows = packed.input_ids_BL.shape[0]
    chunks = micro_batches(packed, slice(0, rows), micro_batch, group_by_length=group_by_length)
    was_training = model.training
    model.eval()
    try:
        with step_weight_casts(model, forward_settings):
            parts = [
                response_logprobs(
                    model,
                    packed.rows(chunk),
                    temperature=temperature,
                    with_hidden=with_hidden,
                    with_entropy=with_entropy,
                    trim_padding=group_by_length,
                    forward_settings=forward_settings,
                )
                for chunk in chunks
            ]
    finally:
        model.train(was_training)
    grouped = [chunk for chunk in chunks if isinstance(chunk, torch.Tensor)]  # rows in order of length
    restore = torch.argsort(torch.cat(grouped)) if grouped else None  # back to the batch's row order

    def joined(name: str) -> torch.Tensor:
        values = torch.cat([getattr(p, name) for p in parts])
        return values if restore is None else values[restore.to(values.device)]

    return ResponseLogprobs(
        logp_BT=joined("logp_BT"),
        entropy_BT=joined("entropy_BT") if with_entropy else None,
        hidden_BTD=joined("hidden_BTD") if with_hidden else None,
    )
