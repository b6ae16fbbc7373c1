"""A reference RL loop: GRPO + Advantage Reweighting + Lopti on one page.

Trains a small Hugging Face causal LM with verifiable rewards on the toy task of docs/tasks.md,
reversing a word spelt with spaces (``reverse: s u n =`` -> `` n u s``). Every formula comes from
the algorithm core, ``tokenbalance.algorithms``; the rest is plain PyTorch and ``transformers``:
sampling, padding, the log-prob gather, an SFT warm start, the optimizer. One RL step
(:func:`rl_step`, with the stages of :func:`update_passes`):

    prompts -> G sampled responses each -> rewards -> GRPO advantages -> AR reweighting
    -> Lopti's two passes (low-probability tokens first, then the rest)
    -> for each pass: log-probs, clipped surrogate + KL, aggregate, backward, optimizer step

``tokenbalance train`` runs the same numbers inside its machinery (mini- and micro-batches, shared
prompt forwards, checkpoints, diagnostics, data parallelism); tests/examples/test_reference_loop.py
checks that this file and the trainer compute the same passes, losses and update on one batch.
The equations, their sources and where the code differs from the papers: docs/methods.md.

    python examples/reference_loop.py                          # a tiny Llama built locally, CPU
    python examples/reference_loop.py --steps 60 --group-size 8 --alpha 0.3 --eta 0.5
    python examples/reference_loop.py --model /path/to/Qwen2.5-0.5B-Instruct --sft-steps 0 --lr 1e-6 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import random
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from tokenbalance.algorithms import (
    ARConfig,
    ClipConfig,
    KLConfig,
    LoptiConfig,
    advantage_reweight,
    aggregate,
    clipped_surrogate,
    grpo_advantages,
    kl_penalty,
    lopti_passes,
)
from tokenbalance.models import TinyModelConfig, build_tiny_model, train_tokenizer

# The base every preset shares (docs/methods.md §7; `tokenbalance list-methods ar_lopti`): PPO clip
# with clip-higher and dual clip; a k3 KL to the reference policy as a loss term.
CLIP = ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=10.0)
KL = KLConfig(coef=0.001, estimator="k3", log_ratio_clamp=5.0)


# ---- the task: reverse a word (a verifiable reward with partial credit) -------------------------
def make_problems(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` (prompt, target) pairs: a word of 3 to 5 letters from a-p, spelt with spaces."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(3, 5))) for _ in range(count)]
    return [(f"reverse: {' '.join(word)} =", " " + " ".join(reversed(word))) for word in words]


def reward(response: str, target: str) -> float:
    """1 for the exact answer, else half the share of letters in place (examples/reverse/rewards.py)."""
    got, want = response.split(), target.split()
    return 1.0 if got == want else 0.5 * sum(a == b for a, b in zip(got, want)) / len(want)


# ---- glue: sampling, padding, log-probs --------------------------------------------------------
@dataclass
class Batch:
    """P prompts x G responses, B = P * G rows, a prompt's G rows adjacent."""

    prompt_ids_BS: torch.Tensor  # [B, S] left-padded prompts
    prompt_mask_BS: torch.Tensor  # [B, S] 1 on prompt tokens
    response_ids_BT: torch.Tensor  # [B, T] right-padded responses
    response_mask_BT: torch.Tensor  # [B, T] bool: tokens up to and including the first EOS
    scores_B: torch.Tensor  # [B] float32 rewards
    group_ids_B: torch.Tensor  # [B] int64: which prompt a row answers


@torch.no_grad()
def sample(policy, tokenizer, prompts_B: list[str], max_new_tokens: int, temperature: float | None):
    """One response per prompt (``temperature=None``: greedy). Returns the padded prompts, the
    responses with pad after the first EOS, and the response mask (EOS included)."""
    encoded = tokenizer(prompts_B, return_tensors="pt", padding=True, padding_side="left").to(policy.device)
    prompt_ids_BS, prompt_mask_BS = encoded.input_ids, encoded.attention_mask
    greedy = {"do_sample": False}
    sampled = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}  # untruncated
    policy.eval()
    ids_BL = policy.generate(
        input_ids=prompt_ids_BS,
        attention_mask=prompt_mask_BS,
        max_new_tokens=max_new_tokens,
        **(greedy if temperature is None else sampled),
    )
    response_ids_BT = ids_BL[:, prompt_ids_BS.shape[1] :]
    eos_BT = (response_ids_BT == tokenizer.eos_token_id).long()
    response_mask_BT = (eos_BT.cumsum(dim=1) - eos_BT) == 0  # no EOS before this position
    return (
        prompt_ids_BS,
        prompt_mask_BS,
        response_ids_BT.masked_fill(~response_mask_BT, tokenizer.pad_token_id),
        response_mask_BT,
    )


def rollout(policy, tokenizer, problems_P: list[tuple[str, str]], args, seed: int) -> Batch:
    """G samples for each of the P prompts at the rollout temperature, and their rewards."""
    torch.manual_seed(seed)
    G = args.group_size
    prompts_B = [prompt for prompt, _ in problems_P for _ in range(G)]
    prompt_ids_BS, prompt_mask_BS, response_ids_BT, response_mask_BT = sample(
        policy, tokenizer, prompts_B, args.max_new_tokens, args.temperature
    )
    texts_B = tokenizer.batch_decode(response_ids_BT, skip_special_tokens=True)
    targets_B = [target for _, target in problems_P for _ in range(G)]
    scores_B = torch.tensor([reward(text, target) for text, target in zip(texts_B, targets_B)], device=policy.device)
    group_ids_B = torch.arange(len(problems_P), device=policy.device).repeat_interleave(G)
    return Batch(prompt_ids_BS, prompt_mask_BS, response_ids_BT, response_mask_BT, scores_B, group_ids_B)


def response_logprobs(model, batch: Batch, temperature: float) -> torch.Tensor:
    """[B, T] float32 log pi(token | prefix) of every response token at ``logits / temperature``
    (docs/methods.md §1), 0 after the response; carries gradient when autograd is on."""
    ids_BL = torch.cat([batch.prompt_ids_BS, batch.response_ids_BT], dim=1)
    attention_BL = torch.cat([batch.prompt_mask_BS, batch.response_mask_BT.long()], dim=1)
    positions_BL = (attention_BL.cumsum(dim=1) - 1).clamp(min=0)  # left padding shifts no position
    T = batch.response_ids_BT.shape[1]
    # logits of the last T + 1 positions; position t predicts token t + 1, so the first T of them
    # predict the response tokens
    output = model(ids_BL, attention_mask=attention_BL, position_ids=positions_BL, logits_to_keep=T + 1)
    logits_BTV = output.logits[:, :-1].float() / temperature
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    logp_BT = logp_BTV.gather(-1, batch.response_ids_BT.unsqueeze(-1)).squeeze(-1)
    return logp_BT.masked_fill(~batch.response_mask_BT, 0.0)


# ---- the algorithm: one RL step ----------------------------------------------------------------
def update_passes(batch: Batch, old_logp_BT: torch.Tensor, args):
    """Rewards -> GRPO advantages -> AR weights -> Lopti's passes (all from the old policy)."""
    mask_BT = batch.response_mask_BT
    # GRPO: A = (s - mean of the group) / (std of the group + 1e-6), the same on every token
    advantages_BT = grpo_advantages(batch.scores_B, batch.group_ids_B, mask_BT)
    # AR: A <- (alpha * p_old + 1 - alpha) * A, less weight on low-probability tokens
    advantages_BT = advantage_reweight(advantages_BT, old_logp_BT, mask_BT, ARConfig(alpha=args.alpha))
    # Lopti: the tokens with p_old < eta in a first pass, the others in a second; both passes
    # divide by all valid tokens, so together they hold one GRPO loss (docs/methods.md §4)
    return lopti_passes(advantages_BT, old_logp_BT, mask_BT, LoptiConfig(eta=args.eta))


def rl_step(policy, reference, optimizer, batch: Batch, args) -> dict[str, float]:
    """Old and reference log-probs, the passes, then one optimizer step per pass; the metrics."""
    with torch.no_grad():
        policy.eval()
        old_logp_BT = response_logprobs(policy, batch, args.temperature)  # the policy that sampled
        ref_logp_BT = response_logprobs(reference, batch, args.temperature)  # the KL anchor
    passes, metrics = update_passes(batch, old_logp_BT, args)
    policy.train()
    for update_pass in passes:  # lopti_low, then lopti_high
        logp_BT = response_logprobs(policy, batch, args.temperature)  # after the previous pass's step
        # per token: -A * ratio, clipped (PPO, clip-higher, dual clip); k3 KL to the reference
        surrogate = clipped_surrogate(logp_BT, old_logp_BT, update_pass.advantages_BT, batch.response_mask_BT, CLIP)
        kl_BT = kl_penalty(
            logp_BT, ref_logp_BT, batch.response_mask_BT, KL.estimator, log_ratio_clamp=KL.log_ratio_clamp
        )
        # token-mean: the sum over this pass's tokens / the number of tokens in normaliser_mask_BT
        denominator = {"denominator_mask_BT": update_pass.normaliser_mask_BT}
        policy_loss = aggregate(surrogate.loss_BT, update_pass.policy_mask_BT, "token-mean", **denominator)
        kl_loss = aggregate(kl_BT, update_pass.kl_entropy_mask_BT, "token-mean", **denominator)
        loss = policy_loss + KL.coef * kl_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.grad_clip)
        optimizer.step()
        clipped = surrogate.clipped_BT[update_pass.policy_mask_BT]  # where the PPO clip acted
        metrics |= {
            f"{update_pass.name}/loss": loss.item(),
            f"{update_pass.name}/kl": kl_loss.item(),
            f"{update_pass.name}/clip_frac": clipped.float().mean().nan_to_num().item(),
            f"{update_pass.name}/grad_norm": grad_norm.item(),
        }
    return metrics | {
        "reward": batch.scores_B.mean().item(),
        "response_len": batch.response_mask_BT.sum(1).float().mean().item(),
    }


# ---- the policy, its warm start, evaluation ----------------------------------------------------
def build_policy(args, problems: list[tuple[str, str]]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A tiny Llama and a byte-level BPE tokenizer trained here on the task's text (nothing is
    downloaded), or the model of a local Hugging Face directory (``--model``)."""
    tokenizer: PreTrainedTokenizerBase
    if args.model is None:
        tokenizer = train_tokenizer([prompt + target for prompt, target in problems], vocab_size=300)
        sizes = TinyModelConfig(hidden_size=args.hidden_size, num_layers=args.layers, num_heads=4)
        policy = build_tiny_model(sizes, tokenizer, seed=args.seed)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    # sample from the temperature-scaled distribution only, not a checkpoint's top-k / top-p / penalties
    policy.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    return policy.to(args.device), tokenizer


def sft_warm_start(policy, tokenizer, problems: list[tuple[str, str]], args) -> None:
    """Cross-entropy on the targets (prompt tokens not trained), so that sampled answers start to
    differ in reward within a group: the signal GRPO needs."""
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.sft_lr)
    rng = random.Random(args.seed)
    policy.train()
    for _ in range(args.sft_steps):
        chosen = rng.sample(problems, args.sft_batch)
        prompts = tokenizer([p for p, _ in chosen], return_tensors="pt", padding=True, padding_side="left")
        targets = tokenizer(
            [t + tokenizer.eos_token for _, t in chosen], return_tensors="pt", padding=True, padding_side="right"
        )
        device = policy.device
        batch = Batch(  # the targets as responses, to reuse response_logprobs
            prompts.input_ids.to(device),
            prompts.attention_mask.to(device),
            targets.input_ids.to(device),
            targets.attention_mask.bool().to(device),
            torch.zeros(len(chosen), device=device),
            torch.arange(len(chosen), device=device),
        )
        logp_BT = response_logprobs(policy, batch, temperature=1.0)
        loss = -logp_BT.sum() / batch.response_mask_BT.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def evaluate(policy, tokenizer, problems: list[tuple[str, str]], args) -> float:
    """Mean reward of greedy answers."""
    *_, response_ids_BT, _ = sample(policy, tokenizer, [p for p, _ in problems], args.max_new_tokens, None)
    texts = tokenizer.batch_decode(response_ids_BT, skip_special_tokens=True)
    return sum(reward(text, target) for text, (_, target) in zip(texts, problems)) / len(problems)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="GRPO + Advantage Reweighting + Lopti on one page")
    add = parser.add_argument
    add("--model", default=None, help="local Hugging Face causal-LM directory (default: a tiny Llama built here)")
    add("--device", default="cpu")
    add("--seed", type=int, default=0)
    add("--steps", type=int, default=40, help="RL steps")
    add("--prompts", type=int, default=16, help="prompts per RL step, P")
    add("--group-size", type=int, default=8, help="samples per prompt, G")
    add("--max-new-tokens", type=int, default=12)
    add("--temperature", type=float, default=1.0, help="rollout and log-prob temperature")
    add("--lr", type=float, default=1e-4, help="RL learning rate (AdamW)")
    add("--grad-clip", type=float, default=1.0)
    add("--alpha", type=float, default=0.3, help="AR slope: weight alpha * p + 1 - alpha")
    add("--eta", type=float, default=0.5, help="Lopti threshold: p < eta in the first pass")
    add("--sft-steps", type=int, default=150, help="warm-start steps before RL (0: none)")
    add("--sft-batch", type=int, default=32)
    add("--sft-lr", type=float, default=3e-3, help="warm-start learning rate (the tiny model's)")
    add("--hidden-size", type=int, default=64, help="tiny model width")
    add("--layers", type=int, default=2, help="tiny model depth")
    add("--eval-count", type=int, default=100, help="held-out prompts scored before and after RL")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Warm start, then ``--steps`` RL steps; returns the policy, the reference and each step's metrics."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    train, held_out = make_problems(2000, args.seed), make_problems(args.eval_count, args.seed + 1)
    policy, tokenizer = build_policy(args, train)
    sft_warm_start(policy, tokenizer, train, args)
    reference = copy.deepcopy(policy).requires_grad_(False)  # the KL anchor: where RL starts
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    print(f"held-out greedy reward before RL: {evaluate(policy, tokenizer, held_out, args):.3f}")
    history = []
    for step in range(args.steps):
        problems_P = [train[(step * args.prompts + i) % len(train)] for i in range(args.prompts)]
        batch = rollout(policy, tokenizer, problems_P, args, seed=args.seed * 100_003 + step)
        history.append(rl_step(policy, reference, optimizer, batch, args))
        m = history[-1]
        print(
            f"step {step:3d}  reward {m['reward']:.3f}  p < eta: {m['lopti/low_token_frac']:.0%} of tokens  "
            f"loss low {m['lopti_low/loss']:+.4f} high {m['lopti_high/loss']:+.4f}  kl {m['lopti_high/kl']:.2g}"
        )
    print(f"held-out greedy reward after RL: {evaluate(policy, tokenizer, held_out, args):.3f}")
    return {"policy": policy, "reference": reference, "tokenizer": tokenizer, "history": history}


if __name__ == "__main__":
    main()
