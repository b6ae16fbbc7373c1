"""What a rollout engine returns (:class:`Generation`), what it is asked (:class:`SamplingParams`) and the
:class:`RolloutEngine` protocol.

Token ids in, token ids out: the trainer tokenises prompts once and decodes responses itself. One flat frozen record
per batch (unlike verl's ``DataProto``), shapes in the names (``_B`` responses, ``_P`` prompt, ``_T`` response
tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch.

    Attributes:
        max_new_tokens: response budget per prompt (>= 1).
        temperature: softmax temperature (>= 0); 0 means greedy decoding.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep only the k most likely tokens (>= 0); 0 disables it.
        seed: seeds the sampler; the same seed and inputs give the same output on CPU."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One batch of responses, on the engine's device; no tensor carries gradient.

    Attributes:
        prompt_ids_BS: [B, S] int64 prompts, left-padded with the pad id.
        prompt_mask_BS: [B, S] bool, true on real prompt tokens.
        response_ids_BT: [B, T] int64 sampled tokens, pad id after the first EOS; T <= ``max_new_tokens``.
        response_mask_BT: [B, T] bool, true up to and including the first EOS.
        sampler_logp_BT: [B, T] float32 log-prob of each sampled token under the distribution it was drawn from (after
            temperature, top-k, top-p; greedy: the untempered log-softmax); 0 where masked. ``None`` if unavailable.
        finished_B: [B] bool, the response ended with an EOS within the budget.
        group_size: G: rows ``p * G .. p * G + G - 1`` answer prompt ``p``; 1 when every row has its own."""

    prompt_ids_BS: torch.Tensor
    prompt_mask_BS: torch.Tensor
    response_ids_BT: torch.Tensor
    response_mask_BT: torch.Tensor
    sampler_logp_BT: torch.Tensor | None
    finished_B: torch.Tensor
    group_size: int = 1

    def __post_init__(self) -> None:
        batch, prompt_len = self.prompt_ids_BS.shape
        if self.group_size < 1 or batch % self.group_size:
            raise ValueError(f"group_size={self.group_size} must be >= 1 and divide the batch of {batch} rows")
        response_shape = self.response_ids_BT.shape
        checks = [
            ("prompt_mask_BS", self.prompt_mask_BS, (batch, prompt_len), torch.bool),
            ("response_mask_BT", self.response_mask_BT, response_shape, torch.bool),
            ("finished_B", self.finished_B, (batch,), torch.bool),
            ("response_ids_BT", self.response_ids_BT, (batch, response_shape[-1]), torch.int64),
            ("prompt_ids_BS", self.prompt_ids_BS, (batch, prompt_len), torch.int64),
        ]
        if self.sampler_logp_BT is not None:
            checks.append(("sampler_logp_BT", self.sampler_logp_BT, response_shape, torch.float32))
        for name, tensor, shape, dtype in checks:
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                raise ValueError(
                    f"{name} must be {dtype} of shape {tuple(shape)}, got {tensor.dtype} {tuple(tensor.shape)}"
                )

    @property
    def batch_size(self) -> int:
        return self.prompt_ids_BS.shape[0]

    @property
    def prompt_B(self) -> torch.Tensor:
        """[B] int64 index of each row's prompt among the P prompts asked for (``row // G``)."""
        return torch.arange(self.batch_size, device=self.prompt_ids_BS.device) // self.group_size

    @property
    def response_lengths_B(self) -> torch.Tensor:
        """[B] int64 number of response tokens, the EOS included."""
        return self.response_mask_BT.sum(dim=1)

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids_BL, attention_mask_BL)`` of prompt + response (L = S + T) for a log-prob pass; position ids are
        ``attention_mask.cumsum(-1) - 1``."""
        ids = torch.cat([self.prompt_ids_BS, self.response_ids_BT], dim=1)
        mask = torch.cat([self.prompt_mask_BS, self.response_mask_BT], dim=1)
        return ids, mask

    def response_token_lists(self) -> list[list[int]]:
        """Each response's valid ids (the EOS included), ready to decode."""
        return [row[mask].tolist() for row, mask in zip(self.response_ids_BT, self.response_mask_BT)]


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples responses to tokenised prompts.

    ``generate`` takes P unpadded prompts, one :class:`SamplingParams` and ``n`` (G, as vLLM's ``n``) and returns a
    :class:`Generation` of P x n rows, prompt-major (row ``p * n + g``), ``group_size = n``. ``temperature == 0`` is
    greedy; the same ``seed`` and inputs give the same output on the same device and software versions."""

    eos_token_ids: tuple[int, ...]
    pad_token_id: int

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, *, n: int = 1) -> Generation: ...
