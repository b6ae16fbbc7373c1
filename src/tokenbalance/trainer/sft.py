"""Supervised warm start: teach the response format (and some answers) before RL, on the task's ``sft_response``
(``sft.target``) to SFT examples disjoint from the held-out set (:func:`tokenbalance.run.examples.sft_pairs`). Loss
and schedule: docs/training.md ("The embedded default").

    tokenbalance sft --out runs/sft-tiny                 # embedded tiny model, CPU"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tokenbalance.config import SFTConfig
from tokenbalance.run.examples import SFTPair
from tokenbalance.trainer import sft_checkpoint
from tokenbalance.trainer.logprobs import pack_sequences, response_logprobs
from tokenbalance.trainer.progress import StepProgress


def encode_pairs(tokenizer, pairs: list[SFTPair], eos_id: int, max_prompt_tokens: int):
    prompts = tokenizer([p.prompt for p in pairs], add_special_tokens=False)["input_ids"]
    responses = tokenizer([p.response for p in pairs], add_special_tokens=False)["input_ids"]
    for i, ids in enumerate(prompts):
        if len(ids) > max_prompt_tokens:
            raise ValueError(
                f"SFT prompt {i} has {len(ids)} tokens, more than data.max_prompt_tokens={max_prompt_tokens}"
            )
    return prompts, [r + [eos_id] for r in responses]


def collate(prompts: list[list[int]], responses: list[list[int]], pad_id: int, device):
    """Left-padded prompts [B, S] and right-padded responses [B, T] with their masks."""
    P = max(len(p) for p in prompts)
    T = max(len(r) for r in responses)
    prompt_ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), P), dtype=torch.bool)
    response_ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(prompts), T), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, P - len(p) :] = torch.tensor(p)
        prompt_mask[i, P - len(p) :] = True
        response_ids[i, : len(r)] = torch.tensor(r)
        response_mask[i, : len(r)] = True
    return [t.to(device) for t in (prompt_ids, prompt_mask, response_ids, response_mask)]


def lr_at(step: int, config: SFTConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def accumulate_sft_loss(model, prompts, responses, pad_id: int, micro_batch_size: int, device) -> float:
    """Backpropagate the batch's mean response-token negative log-likelihood, ``micro_batch_size`` examples at a time
    (0: all at once); each piece's summed loss is divided by the whole batch's token count, so the gradients add up
    to the whole batch's. Returns the loss."""
    size = micro_batch_size or len(prompts)
    tokens = sum(len(r) for r in responses)  # the whole batch's response mask, summed
    total = 0.0
    for start in range(0, len(prompts), size):
        batch = collate(prompts[start : start + size], responses[start : start + size], pad_id, device)
        logp_BT = response_logprobs(model, pack_sequences(*batch), temperature=1.0).logp_BT
        loss = -(logp_BT * batch[3]).sum() / tokens
        loss.backward()
        total += float(loss.detach())
    return total


def run_sft(
    model,
    tokenizer,
    pairs: list[SFTPair],
    config: SFTConfig,
    *,
    seed: int,
    max_prompt_tokens: int,
    device,
    progress: bool = True,
    on_step=None,
    checkpoint_dir: Path | None = None,
) -> list[float]:
    """Train ``model`` in place; returns the loss of every step. With ``checkpoint_dir`` and ``config.save_every``, a
    checkpoint is written every ``save_every`` steps and the SFT continues from the newest one found there
    (:mod:`tokenbalance.trainer.sft_checkpoint`), bit for bit."""
    if not pairs:
        raise ValueError("SFT needs at least one example; check data.train_difficulties / sft.train_count")
    prompts, responses = encode_pairs(tokenizer, pairs, tokenizer.eos_token_id, max_prompt_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    start = 0
    checkpoints = checkpoint_dir if checkpoint_dir is not None and config.save_every else None
    if checkpoints is not None:
        key = sft_checkpoint.fingerprint(config.result_settings(), seed, pairs, tokenizer.get_vocab())
        start, losses = sft_checkpoint.restore(checkpoints, model, optimizer, generator, key)
    model.train()
    bar = StepProgress(config.steps, start=start, enabled=progress, description="SFT")
    with bar:
        for step in range(start, config.steps):
            rows = torch.randint(0, len(pairs), (config.batch_size,), generator=generator).tolist()
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config)
            optimizer.zero_grad(set_to_none=True)
            loss = accumulate_sft_loss(
                model,
                [prompts[i] for i in rows],
                [responses[i] for i in rows],
                tokenizer.pad_token_id,
                config.micro_batch_size,
                device,
            )
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss)
            if checkpoints is not None and (step + 1) % config.save_every == 0 and step + 1 < config.steps:
                sft_checkpoint.save(checkpoints, step + 1, model, optimizer, generator, losses, key)
            bar.advance(step + 1, {"sft/loss": losses[-1]})
            if on_step is not None:
                on_step(step + 1, losses[-1])
    model.eval()
    return losses
