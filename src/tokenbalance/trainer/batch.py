"""One RL step's batch, built once and passed down: P prompts x G responses with rewards, groups, old / reference
log-probs and (for NTHR) hidden states.

:func:`sample_batch` samples and scores; :func:`with_logprobs` adds the log-probs; :func:`update_inputs` makes the
method's update passes. The trainer and ``diagnose`` both build here, so groups are never rediscovered from rows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from tokenbalance.algorithms.methods import Method, NTHRInputs, build_update_passes
from tokenbalance.rollout.base import Generation, RolloutEngine, SamplingParams
from tokenbalance.tasks.base import ScoreResult, Task, TaskExample
from tokenbalance.trainer.evaluate import full_reward
from tokenbalance.trainer.logprobs import (
    PackedSequences,
    ResponseLogprobs,
    batched_response_logprobs,
    pack_sequences,
)
from tokenbalance.trainer.precision import PLAIN_FORWARD, ForwardSettings
from tokenbalance.trainer.scoring import decode_responses, score_responses
from tokenbalance.types import UpdatePass


@dataclass(frozen=True)
class RolloutBatch:
    """P prompts x G responses, rows prompt-major (row ``p * G + g`` answers prompt ``p``).

    Attributes:
        examples_P: the prompts' task examples; group_ids_P: [P] int64 prompt ids (unique within a step; the groups).
        generation: the engine's output, B = P x G rows.
        packed: prompt + response as model input on the training device, shared prompts marked (``packed.prompt_B``).
        texts_B: decoded responses (up to the EOS, special tokens kept); results_B: their scores.
        rewards_B: [B] float32 on the training device; max_reward: the task's maximum (``correct_B`` is derived).
        old: old-policy log-probs (entropy, hidden states when asked); ``None`` until :func:`with_logprobs`.
        ref_logp_BT: reference-policy log-probs when the method has a KL term."""

    examples_P: list[TaskExample]
    group_ids_P: torch.Tensor
    generation: Generation
    packed: PackedSequences
    texts_B: list[str]
    results_B: list[ScoreResult]
    rewards_B: torch.Tensor
    max_reward: float
    old: ResponseLogprobs | None = None
    ref_logp_BT: torch.Tensor | None = None

    @property
    def group_size(self) -> int:
        return self.generation.group_size

    @property
    def group_ids_B(self) -> torch.Tensor:
        """[B] int64 group id of each row (its prompt's)."""
        return self.group_ids_P.to(self.rewards_B.device).repeat_interleave(self.group_size)

    @property
    def mask_BT(self) -> torch.Tensor:
        """[B, T] bool response mask, on the training device."""
        return self.packed.attention_mask_BL[:, self.packed.prompt_len :].bool()

    @property
    def tokens_BT(self) -> torch.Tensor:
        """[B, T] int64 sampled response tokens, on the training device."""
        return self.packed.input_ids_BL[:, self.packed.prompt_len :]

    @property
    def correct_B(self) -> torch.Tensor:
        """[B] bool, reward equal to the task's maximum."""
        return self.rewards_B == self.max_reward

    @property
    def rewards_PG(self) -> torch.Tensor:
        return self.rewards_B.view(-1, self.group_size)

    @property
    def old_logp_BT(self) -> torch.Tensor:
        """[B, T] old-policy log-probs (``ValueError`` before :func:`with_logprobs`)."""
        return self.old_logprobs.logp_BT

    @property
    def entropy_BT(self) -> torch.Tensor | None:
        """[B, T] old-policy entropy, when the old log-prob pass computed it."""
        return self.old_logprobs.entropy_BT

    @property
    def old_logprobs(self) -> ResponseLogprobs:
        """The old-policy log-probs (``ValueError`` before :func:`with_logprobs`)."""
        if self.old is None:
            raise ValueError("the batch has no old log-probs yet (call with_logprobs first)")
        return self.old


def packed_on(generation: Generation, device: torch.device) -> PackedSequences:
    """The generation's prompts + responses as model input on ``device``, groups marked."""
    return pack_sequences(
        generation.prompt_ids_BS.to(device),
        generation.prompt_mask_BS.to(device),
        generation.response_ids_BT.to(device),
        generation.response_mask_BT.to(device),
        generation.prompt_B,
    )


def sample_batch(
    engine: RolloutEngine,
    tokenizer,
    task: Task,
    examples_P: list[TaskExample],
    prompt_ids_P: list[list[int]],
    group_ids_P: torch.Tensor,
    *,
    group_size: int,
    sampling: SamplingParams,
    device: torch.device,
) -> RolloutBatch:
    """Sample ``group_size`` responses to each prompt and score them (no log-probs yet)."""
    generation = engine.generate(prompt_ids_P, sampling, n=group_size)
    texts = decode_responses(
        tokenizer, generation.response_ids_BT, generation.response_mask_BT, set(engine.eos_token_ids)
    )
    examples_B = [example for example in examples_P for _ in range(group_size)]
    results = score_responses(task, texts, examples_B)
    rewards_B = torch.tensor([r.reward for r in results], dtype=torch.float32, device=device)
    packed = packed_on(generation, device)
    return RolloutBatch(
        examples_P=list(examples_P),
        group_ids_P=group_ids_P,
        generation=generation,
        packed=packed,
        texts_B=texts,
        results_B=results,
        rewards_B=rewards_B,
        max_reward=full_reward(task),
    )


def _pad_columns(tensor: torch.Tensor, width: int, value, *, left: bool = False) -> torch.Tensor:
    missing = width - tensor.shape[1]
    if missing == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (missing, 0) if left else (0, missing), value=value)


def merge_groups(selections: list[tuple[RolloutBatch, torch.Tensor]], pad_token_id: int) -> RolloutBatch:
    """One batch of the groups ``idx_P`` of each ``(batch, idx_P)``, in order (rounds of DAPO dynamic sampling).
    Prompts are re-padded on the left, responses on the right; no log-probs yet. A single selection of all its groups
    is returned as it is."""
    if len(selections) == 1 and selections[0][1].numel() == len(selections[0][0].examples_P):
        return selections[0][0]
    G = selections[0][0].group_size
    rows = [(b, (idx_P.to(torch.long)[:, None] * G + torch.arange(G)).reshape(-1)) for b, idx_P in selections]
    width_S = max(b.generation.prompt_ids_BS.shape[1] for b, _ in rows)
    width_T = max(b.generation.response_ids_BT.shape[1] for b, _ in rows)

    def gathered(field: str, width: int, value, left: bool = False) -> torch.Tensor:
        parts = [getattr(b.generation, field)[r.to(getattr(b.generation, field).device)] for b, r in rows]
        return torch.cat([_pad_columns(t, width, value, left=left) for t in parts])

    sampler = all(b.generation.sampler_logp_BT is not None for b, _ in rows)
    generation = Generation(
        prompt_ids_BS=gathered("prompt_ids_BS", width_S, pad_token_id, left=True),
        prompt_mask_BS=gathered("prompt_mask_BS", width_S, False, left=True),
        response_ids_BT=gathered("response_ids_BT", width_T, pad_token_id),
        response_mask_BT=gathered("response_mask_BT", width_T, False),
        sampler_logp_BT=gathered("sampler_logp_BT", width_T, 0.0) if sampler else None,
        finished_B=torch.cat([b.generation.finished_B[r.to(b.generation.finished_B.device)] for b, r in rows]),
        group_size=G,
    )
    device = selections[0][0].rewards_B.device
    return RolloutBatch(
        examples_P=[b.examples_P[int(p)] for b, idx_P in selections for p in idx_P],
        group_ids_P=torch.cat([b.group_ids_P[idx_P.to(b.group_ids_P.device)] for b, idx_P in selections]),
        generation=generation,
        packed=packed_on(generation, device),
        texts_B=[b.texts_B[int(i)] for b, r in rows for i in r],
        results_B=[b.results_B[int(i)] for b, r in rows for i in r],
        rewards_B=torch.cat([b.rewards_B[r.to(device)] for b, r in rows]),
        max_reward=selections[0][0].max_reward,
    )


def with_logprobs(
    batch: RolloutBatch,
    *,
    policy: PreTrainedModel,
    reference: PreTrainedModel | None,
    method: Method,
    temperature: float,
    micro_batch: int,
    with_entropy: bool,
    sampler_logprobs: bool = False,
    old_forward: ResponseLogprobs | None = None,
    group_by_length: bool = False,
    forward_settings: ForwardSettings = PLAIN_FORWARD,
) -> RolloutBatch:
    """The batch with old-policy log-probs (a no-grad forward; with ``sampler_logprobs`` the sampler's own, unless
    NTHR needs hidden states) and reference log-probs under a KL term. ``old_forward``: the update's forward already
    run; its detached values (same bits) are used. ``group_by_length`` / ``forward_settings``: as in the update."""
    if old_forward is not None:
        old = ResponseLogprobs(
            logp_BT=old_forward.logp_BT.detach(),
            entropy_BT=old_forward.entropy_BT.detach() if with_entropy and old_forward.entropy_BT is not None else None,
            hidden_BTD=old_forward.hidden_BTD if method.needs_hidden_states else None,
        )
        if with_entropy and old.entropy_BT is None:
            raise ValueError("old_forward: the forward computed no entropy")
        if method.needs_hidden_states and old.hidden_BTD is None:
            raise ValueError("old_forward: the forward returned no hidden states")
    elif sampler_logprobs and not method.needs_hidden_states:
        sampled_BT = batch.generation.sampler_logp_BT
        if sampled_BT is None:
            raise ValueError("rollout.old_logprobs='sampler': the rollout engine returned no log-probs")
        old = ResponseLogprobs(logp_BT=sampled_BT.to(batch.rewards_B.device))  # 0 after each row's EOS
    else:
        old = batched_response_logprobs(
            policy,
            batch.packed,
            temperature=temperature,
            micro_batch=micro_batch,
            with_hidden=method.needs_hidden_states,
            with_entropy=with_entropy,
            group_by_length=group_by_length,
            forward_settings=forward_settings,
        )
    ref_logp_BT = None
    if method.needs_ref_logp:
        if reference is None:
            raise ValueError(f"method {method.name!r} has a KL term: a reference policy is required")
        ref_logp_BT = batched_response_logprobs(
            reference,
            batch.packed,
            temperature=temperature,
            micro_batch=micro_batch,
            group_by_length=group_by_length,
            forward_settings=forward_settings,
        ).logp_BT
    return dataclasses.replace(batch, old=old, ref_logp_BT=ref_logp_BT)


def update_inputs(
    method: Method,
    batch: RolloutBatch,
    *,
    policy: PreTrainedModel,
    temperature: float,
    rows: torch.Tensor | slice | None = None,
) -> tuple[list[UpdatePass], dict[str, float]]:
    """The method's update passes on the batch (advantages, token weights, schedule) and the metrics of building them;
    ``rows`` (whole groups) restricts them to part of the batch."""
    old = batch.old_logprobs
    sel = slice(None) if rows is None else rows
    nthr = None
    if method.needs_hidden_states:
        if old.hidden_BTD is None:
            raise ValueError(f"method {method.name!r} needs the old policy's hidden states")
        head = policy.get_output_embeddings()
        nthr = NTHRInputs.from_output_layer(
            head, batch.tokens_BT[sel], old.hidden_BTD[sel], temperature, max_reward=batch.max_reward
        )
    ref_logp_BT = None if batch.ref_logp_BT is None else batch.ref_logp_BT[sel]
    return build_update_passes(
        method,
        batch.rewards_B[sel],
        batch.group_ids_B[sel],
        batch.mask_BT[sel],
        old.logp_BT[sel],
        ref_logp_BT,
        nthr,
        batch.correct_B[sel] if method.token_rule is not None else None,  # what a token rule may read
    )
