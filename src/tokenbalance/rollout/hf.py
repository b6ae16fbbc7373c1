"""Rollouts with ``transformers``' ``model.generate`` (any Hugging Face causal LM, CPU or one GPU).

    engine = HFGenerateEngine(model, tokenizer)
    gen = engine.generate(prompt_ids, SamplingParams(max_new_tokens=256, temperature=1.0, seed=step))

The reference engine: the exact distribution asked for, per-token sampler log-probs, a forked RNG; docs/training.md
("Rollout engines")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tokenbalance.rollout.base import Generation, SamplingParams


class SampledTokenLogProbs(LogitsProcessor):
    """Records ``log_softmax(scores)`` at each sampled token (must be the last processor; returns ``scores``
    unchanged). Step t's token is known only at step t + 1, so one step stays pending; :meth:`finish` reads the last."""

    def __init__(self) -> None:
        self.pending_logp_BV: torch.Tensor | None = None
        self.sampled_logp: list[torch.Tensor] = []  # T tensors of shape [B]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._take(input_ids[:, -1])
        self.pending_logp_BV = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _take(self, sampled_B: torch.Tensor) -> None:
        if self.pending_logp_BV is not None:
            self.sampled_logp.append(self.pending_logp_BV.gather(1, sampled_B[:, None]).squeeze(1))
            self.pending_logp_BV = None

    def finish(self, sequences_BL: torch.Tensor) -> torch.Tensor:
        """[B, T] float32 log-probs, T = the number of steps taken."""
        self._take(sequences_BL[:, -1])
        return torch.stack(self.sampled_logp, dim=1)


def sampling_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """Temperature, top-k, top-p (in ``generate``'s own order), only those that change anything."""
    if params.greedy:
        return []
    processors: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        processors.append(TopKLogitsWarper(top_k=params.top_k))
    if params.top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=params.top_p))
    return processors


def left_pad(prompt_ids: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids_BS, mask_BS)``: int64 prompts right-aligned in a [B, max length] batch, bool mask."""
    width = max(len(prompt) for prompt in prompt_ids)
    ids_BS = torch.full((len(prompt_ids), width), pad_id, dtype=torch.int64)
    mask_BS = torch.zeros((len(prompt_ids), width), dtype=torch.bool)
    for row, prompt in enumerate(prompt_ids):
        if prompt:
            ids_BS[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
            mask_BS[row, width - len(prompt) :] = True
    return ids_BS.to(device), mask_BS.to(device)


def mask_through_first_eos(response_ids_BT: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: true up to and including the first token in ``eos_ids``, false after it."""
    is_eos_BT = torch.isin(response_ids_BT, eos_ids).long()
    eos_before_BT = is_eos_BT.cumsum(dim=1) - is_eos_BT
    return eos_before_BT == 0


def check_prompts(
    prompt_ids: list[list[int]], *, max_new_tokens: int, max_positions: int | None, vocab_size: int
) -> None:
    """``ValueError`` for an empty batch, an empty prompt, a token id outside the vocabulary or a prompt longer than
    ``max_positions - max_new_tokens``."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty: give at least one prompt")
    limit = None if max_positions is None else max_positions - max_new_tokens
    for index, prompt in enumerate(prompt_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty (a prompt needs at least one token)")
        if limit is not None and len(prompt) > limit:
            raise ValueError(
                f"prompt {index} has {len(prompt)} tokens, more than the limit of {limit} "
                f"(max_position_embeddings {max_positions} - max_new_tokens {max_new_tokens})"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {index} has a token id outside the vocabulary [0, {vocab_size})")


@contextlib.contextmanager
def generation_mode(model: PreTrainedModel, neutral_config: GenerationConfig) -> Iterator[None]:
    """Eval mode and a neutral ``generation_config`` for the duration; both restored afterwards."""
    was_training, saved_config = model.training, model.generation_config
    model.eval()
    model.generation_config = neutral_config
    try:
        yield
    finally:
        model.generation_config = saved_config
        model.train(was_training)


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG (of ``device`` too, for CUDA) inside a fork: the global state is restored."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(seed)
        yield


class PromptEngine:
    """What every engine here shares: the pad / EOS ids and the checked, left-padded prompt batch. Each engine's
    ``generate(prompt_ids, sampling, *, n=1)`` is the :class:`~tokenbalance.rollout.base.RolloutEngine` protocol's."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set one, e.g. tokenizer.pad_token = tokenizer.eos_token")
        self.model = model
        self.pad_token_id: int = tokenizer.pad_token_id
        self.eos_token_ids: tuple[int, ...] = resolve_eos_ids(model, tokenizer, eos_token_ids)

    def padded_prompts(self, prompt_ids: list[list[int]], params: SamplingParams, n: int = 1):
        """Validate the prompts against the model, repeat each ``n`` times (prompt-major) and left-pad them on its
        device: ``(prompt_ids_BS, prompt_mask_BS, device)``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n (samples per prompt) must be an integer >= 1, got {n!r}")
        model = self.model
        check_prompts(
            prompt_ids,
            max_new_tokens=params.max_new_tokens,
            max_positions=getattr(model.config, "max_position_embeddings", None),
            vocab_size=model.get_input_embeddings().num_embeddings,
        )
        device = model.get_input_embeddings().weight.device
        repeated = [ids for ids in prompt_ids for _ in range(n)]
        prompt_ids_BS, prompt_mask_BS = left_pad(repeated, self.pad_token_id, device)
        return prompt_ids_BS, prompt_mask_BS, device

    def generation(
        self,
        prompt_ids_BS: torch.Tensor,
        prompt_mask_BS: torch.Tensor,
        response_ids_BT: torch.Tensor,
        response_mask_BT: torch.Tensor,
        sampler_logp_BT: torch.Tensor,
        finished_B: torch.Tensor,
        group_size: int = 1,
    ) -> Generation:
        """The :class:`Generation`, with pad ids and log-prob 0 after each row's first EOS."""
        return Generation(
            prompt_ids_BS=prompt_ids_BS,
            prompt_mask_BS=prompt_mask_BS,
            response_ids_BT=response_ids_BT.masked_fill(~response_mask_BT, self.pad_token_id),
            response_mask_BT=response_mask_BT,
            sampler_logp_BT=sampler_logp_BT.masked_fill(~response_mask_BT, 0.0),
            finished_B=finished_B,
            group_size=group_size,
        )


class HFGenerateEngine(PromptEngine):
    """:class:`~tokenbalance.rollout.base.RolloutEngine` on ``model.generate``.

    Args:
        model: a Hugging Face causal LM (its device is used).
        tokenizer: supplies the pad id (required) and the EOS id.
        eos_token_ids: ids that end a response; default: the tokenizer's EOS plus those of the model's generation
            config (Qwen instruct models stop at ``<|im_end|>`` too)."""

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, *, n: int = 1) -> Generation:
        """P prompts, ``n`` samples each, drawn as ``sampling`` says -> a :class:`Generation` of P x n rows,
        prompt-major."""
        model = self.model
        prompt_ids_BS, prompt_mask_BS, device = self.padded_prompts(prompt_ids, sampling, n)
        recorder = SampledTokenLogProbs()
        processors = LogitsProcessorList([*sampling_processors(sampling), recorder])
        config = self.generation_config(sampling)
        neutral = GenerationConfig(pad_token_id=self.pad_token_id, eos_token_id=list(self.eos_token_ids))
        with generation_mode(model, neutral), seeded(sampling.seed, device), torch.no_grad():
            sequences_BL = model.generate(
                input_ids=prompt_ids_BS,
                attention_mask=prompt_mask_BS.long(),
                generation_config=config,
                logits_processor=processors,
            )
        response_ids_BT = sequences_BL[:, prompt_ids_BS.shape[1] :]
        eos_ids = torch.tensor(self.eos_token_ids, device=device)
        response_mask_BT = mask_through_first_eos(response_ids_BT, eos_ids)
        finished_B = (torch.isin(response_ids_BT, eos_ids) & response_mask_BT).any(dim=1)
        sampler_logp_BT = recorder.finish(sequences_BL)
        return self.generation(
            prompt_ids_BS, prompt_mask_BS, response_ids_BT, response_mask_BT, sampler_logp_BT, finished_B, n
        )

    def generation_config(self, params: SamplingParams) -> GenerationConfig:
        """``generate``'s config: sampling or greedy, no warpers of its own (ours are processors)."""
        sampling = {} if params.greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            num_beams=1,
            pad_token_id=self.pad_token_id,
            eos_token_id=list(self.eos_token_ids),
            use_cache=True,
            **sampling,
        )


def resolve_eos_ids(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Iterable[int] | None
) -> tuple[int, ...]:
    """The explicit ``eos_token_ids``, else the tokenizer's EOS plus the generation config's."""
    if eos_token_ids is not None:
        ids = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
    else:
        configured = getattr(model.generation_config, "eos_token_id", None)
        configured = [] if configured is None else [configured] if isinstance(configured, int) else configured
        tokenizer_eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        ids = tuple(dict.fromkeys([*tokenizer_eos, *configured]))
    if not ids:
        raise ValueError("no EOS token: the tokenizer has none and eos_token_ids was not given")
    return ids
