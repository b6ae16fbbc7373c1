"""Log-probabilities of sampled responses under a causal LM, at the log-prob temperature.

The prompt (left-padded) and the response (right-padded) are concatenated into one sequence;
position ids follow the attention mask so left padding does not shift positions. Only the
response positions go through the output layer, so the [B, T, V] logits are the only
vocabulary-sized tensor. Old, reference and current log-probs all use ``logits / temperature``
(the reference's convention, docs/methods.md §1).

For NTHR the same pass returns the last-layer hidden states (after the final norm, the input of
``lm_head``) at the positions that predict each response token.

Shared prompts: a GRPO batch holds every prompt G times, and :class:`PackedSequences` says which
rows share a prompt (``prompt_B``, from the batch's group structure; nothing compares token rows).
With ``share_prompts`` (the default) the decoder runs once per prompt, its key/value cache is
indexed out to every row (autograd sums the rows' gradients back), and only the responses run per
row. On the embedded default that
removes half of the tokens from every forward and backward; the log-probs and gradients equal the
one-pass forward's up to float rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from tokenbalance.algorithms.logit_grad import sum_sq_probs
from tokenbalance.algorithms.surrogate import entropy_and_sum_sq_probs, entropy_from_logits
from tokenbalance.rollout.fast import cache_kwargs


@dataclass(frozen=True)
class PackedSequences:
    """Prompt + response as model input. ``prompt_len`` = S; responses occupy the last T columns.

    ``prompt_B`` ([B] int64, optional) numbers each row's prompt: rows with the same number hold
    the same prompt (a GRPO group) and share its forward. ``None``: every row its own prompt.
    """

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
    """``logp_BT`` (float32, or float64 for a float64 model; with gradient if the pass had it), optional ``entropy_BT``, ``hidden_BTD``,
    ``sum_sq_probs_BT`` (sum_j pi_j^2 of each position's distribution, detached: the logit-gradient norm's
    one extra quantity, :mod:`tokenbalance.algorithms.logit_grad`)."""

    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None = None
    hidden_BTD: torch.Tensor | None = None
    sum_sq_probs_BT: torch.Tensor | None = None


def checkpointing(model) -> bool:
    """Whether activation (gradient) checkpointing is on: the model then refuses a K/V cache in
    training. transformers 5.23 renamed ``is_gradient_checkpointing`` (now deprecated, with a warning)
    to ``is_activation_checkpointing``; 5.10 has only the old name."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def shared_prompt_rows(packed: PackedSequences) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(first_U, inverse_B)`` from ``packed.prompt_B``: ``first_U`` [U] the first row of each
    prompt (in ascending prompt number), ``inverse_B`` [B] each row's index among them, so
    ``rows[first_U][inverse_B]`` is each row's prompt. ``None`` when no two rows share a prompt."""
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


def response_logprobs(
    model,
    packed: PackedSequences,
    *,
    temperature: float,
    with_entropy: bool = False,
    with_hidden: bool = False,
    entropy_grad: bool = False,
    with_sum_sq_probs: bool = False,
    share_prompts: bool = True,
) -> ResponseLogprobs:
    """Log-probs of the response tokens under ``model`` at ``temperature``.

    Runs the decoder over prompt + response (each distinct prompt once with ``share_prompts``),
    then the output layer on the T positions that predict response tokens (columns P-1 .. P+T-2).
    Gradient flows when autograd is enabled; the entropy carries gradient only with
    ``entropy_grad`` (an entropy bonus in the loss), otherwise it is computed detached (logged only).
    ``with_sum_sq_probs`` adds sum_j pi_j^2 per position (detached), from the entropy's float32
    softmax when both are asked for on float32 logits, otherwise from the log-softmax above.
    """
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0 for log-probs, got {temperature}")
    shared = shared_prompt_rows(packed) if share_prompts and not checkpointing(model) else None
    hidden_BTD = full_sequence_hidden(model, packed) if shared is None else shared_prompt_hidden(model, packed, *shared)
    logits_BTV = model.get_output_embeddings()(hidden_BTD)
    logits_BTV = logits_BTV.to(torch.promote_types(logits_BTV.dtype, torch.float32)) / temperature
    targets_BT = packed.input_ids_BL[:, packed.prompt_len :]
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    logp_BT = logp_BTV.gather(-1, targets_BT[..., None]).squeeze(-1)
    entropy_BT = sum_sq_BT = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            if with_sum_sq_probs and logits_BTV.dtype == torch.float32:  # from the entropy's own softmax
                entropy_BT, sum_sq_BT = entropy_and_sum_sq_probs(logits_BTV)
            else:
                entropy_BT = entropy_from_logits(logits_BTV)
    if with_sum_sq_probs and sum_sq_BT is None:
        sum_sq_BT = sum_sq_probs(logp_BTV)
    return ResponseLogprobs(
        logp_BT=logp_BT,
        entropy_BT=entropy_BT,
        hidden_BTD=hidden_BTD.detach() if with_hidden else None,
        sum_sq_probs_BT=sum_sq_BT,
    )


@torch.no_grad()
def batched_response_logprobs(
    model,
    packed: PackedSequences,
    *,
    temperature: float,
    micro_batch: int,
    with_hidden: bool = False,
    with_entropy: bool = False,
    share_prompts: bool = True,
) -> ResponseLogprobs:
    """No-grad log-probs (and hidden states, entropies) over the whole batch, ``micro_batch`` rows at a time.

    ``with_entropy`` returns the per-token entropy of the same distribution (the bucket statistics
    of :mod:`tokenbalance.diagnostics` use the old policy's).
    """
    was_training = model.training
    model.eval()
    try:
        parts = [
            response_logprobs(
                model,
                packed.rows(slice(start, start + micro_batch)),
                temperature=temperature,
                with_hidden=with_hidden,
                with_entropy=with_entropy,
                share_prompts=share_prompts,
            )
            for start in range(0, packed.input_ids_BL.shape[0], micro_batch)
        ]
    finally:
        model.train(was_training)

    def joined(name: str) -> torch.Tensor:
        return torch.cat([getattr(p, name) for p in parts])

    return ResponseLogprobs(
        logp_BT=joined("logp_BT"),
        entropy_BT=joined("entropy_BT") if with_entropy else None,
        hidden_BTD=joined("hidden_BTD") if with_hidden else None,
    )
