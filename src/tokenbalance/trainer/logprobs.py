"""Log-probabilities of sampled responses under a causal LM, at the log-prob temperature.

The prompt (left-padded) and the response (right-padded) are concatenated into one sequence;
position ids follow the attention mask so left padding does not shift positions. Only the
response positions go through the output layer, so the [B, T, V] logits are the only
vocabulary-sized tensor. Old, reference and current log-probs all use ``logits / temperature``
(the reference's convention, docs/methods.md §1).

For NTHR the same pass returns the last-layer hidden states (after the final norm, the input of
``lm_head``) at the positions that predict each response token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenbalance.algorithms.surrogate import entropy_from_logits


@dataclass(frozen=True)
class PackedSequences:
    """Prompt + response as model input. ``prompt_len`` = P; responses occupy the last T columns."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    position_ids_BL: torch.Tensor
    prompt_len: int

    def rows(self, rows) -> PackedSequences:
        return PackedSequences(self.input_ids_BL[rows], self.attention_mask_BL[rows],
                               self.position_ids_BL[rows], self.prompt_len)


def pack_sequences(prompt_ids_BP, prompt_mask_BP, response_ids_BT, response_mask_BT) -> PackedSequences:
    """Concatenate left-padded prompts and right-padded responses ([B, P + T])."""
    input_ids = torch.cat([prompt_ids_BP, response_ids_BT], dim=1)
    attention = torch.cat([prompt_mask_BP.bool(), response_mask_BT.bool()], dim=1)
    positions = (attention.long().cumsum(dim=1) - 1).clamp(min=0)
    return PackedSequences(input_ids, attention.long(), positions, prompt_ids_BP.shape[1])


@dataclass(frozen=True)
class ResponseLogprobs:
    """``logp_BT`` (float32, with gradient if the pass had it), optional ``entropy_BT``, ``hidden_BTD``."""

    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None = None
    hidden_BTD: torch.Tensor | None = None


def response_logprobs(
    model,
    packed: PackedSequences,
    *,
    temperature: float,
    with_entropy: bool = False,
    with_hidden: bool = False,
) -> ResponseLogprobs:
    """Log-probs of the response tokens under ``model`` at ``temperature``.

    Runs the decoder once over prompt + response, then the output layer on the T positions that
    predict response tokens (columns P-1 .. P+T-2). Gradient flows when autograd is enabled.
    """
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0 for log-probs, got {temperature}")
    decoder = model.get_decoder()
    hidden_BLD = decoder(
        input_ids=packed.input_ids_BL,
        attention_mask=packed.attention_mask_BL,
        position_ids=packed.position_ids_BL,
        use_cache=False,
    ).last_hidden_state
    P = packed.prompt_len
    T = packed.input_ids_BL.shape[1] - P
    hidden_BTD = hidden_BLD[:, P - 1 : P - 1 + T]
    logits_BTV = model.get_output_embeddings()(hidden_BTD).float() / temperature
    targets_BT = packed.input_ids_BL[:, P:]
    logp_BT = torch.log_softmax(logits_BTV, dim=-1).gather(-1, targets_BT[..., None]).squeeze(-1)
    return ResponseLogprobs(
        logp_BT=logp_BT,
        entropy_BT=entropy_from_logits(logits_BTV) if with_entropy else None,
        hidden_BTD=hidden_BTD.detach() if with_hidden else None,
    )


@torch.no_grad()
def batched_response_logprobs(model, packed: PackedSequences, *, temperature: float, micro_batch: int,
                              with_hidden: bool = False, with_entropy: bool = False) -> ResponseLogprobs:
    """No-grad log-probs (and hidden states, entropies) over the whole batch, ``micro_batch`` rows at a time.

    ``with_entropy`` returns the per-token entropy of the same distribution (the bucket statistics
    of :mod:`tokenbalance.diagnostics` use the old policy's).
    """
    was_training = model.training
    model.eval()
    try:
        parts = [
            response_logprobs(model, packed.rows(slice(start, start + micro_batch)),
                              temperature=temperature, with_hidden=with_hidden, with_entropy=with_entropy)
            for start in range(0, packed.input_ids_BL.shape[0], micro_batch)
        ]
    finally:
        model.train(was_training)
    return ResponseLogprobs(
        logp_BT=torch.cat([p.logp_BT for p in parts]),
        entropy_BT=torch.cat([p.entropy_BT for p in parts]) if with_entropy else None,
        hidden_BTD=torch.cat([p.hidden_BTD for p in parts]) if with_hidden else None,
    )
