"""Shared pieces of the ``cuda`` tests: the device, tiny models, a full-forward reference sampler,
the frequency test, dtype-derived tolerances and a task whose reward varies on a random model."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2ForCausalLM

from tests.models.helpers import kk_tokenizer
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import TinyModelConfig, build_tiny_model, save_policy, train_tokenizer
from tokenbalance.models.tiny import hf_config, special_token_ids
from tokenbalance.rollout.sampling import sample_next
from tokenbalance.tasks import ScoreResult, TaskExample, get_task, register_task, unregister_task
from tokenbalance.tasks.kk import tokenizer_corpus

DEVICE_ENV = "TOKENBALANCE_GPU_CHECK_DEVICE"
NO_EOS = [10**6]  # an id no model here can sample: every row runs its full budget

# Qwen2 with grouped-query attention and q/k/v biases: the family of the Qwen2.5 models.
TINY_QWEN2 = TinyModelConfig(
    arch="qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
)


def device_problem() -> str | None:
    """Why the ``cuda`` tests cannot run here (``None`` when they can)."""
    name = os.environ.get(DEVICE_ENV, "cuda")
    if name == "cpu":
        return None
    if not name.startswith("cuda"):
        return f"{DEVICE_ENV}={name!r}: expected cuda, cuda:N or cpu"
    if not torch.cuda.is_available():
        return (
            "needs a CUDA GPU (torch.cuda.is_available() is False); `bash scripts/gpu_check.sh` runs these on a "
            f"GPU machine, {DEVICE_ENV}=cpu runs them on the CPU"
        )
    return None


def check_device() -> torch.device:
    return torch.device(os.environ.get(DEVICE_ENV, "cuda"))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------
# Tolerances from the dtype

# Two evaluations of the same logits in a dtype (a cached decode step and a full forward: other
# kernels, other summation orders) differ by a few units of its machine epsilon at the logits'
# scale; a log-softmax moves by at most twice the largest logit change. These are the units allowed,
# per dtype: float32 as tests/tolerances.py's default; bfloat16 with a 4x margin over the worst
# difference seen on a CPU over 6,000 tokens of a 2-layer model (never measured on a GPU yet).
LOGIT_ULPS = {torch.float32: 64, torch.bfloat16: 8, torch.float16: 8}


def logit_atol(dtype: torch.dtype, logits: torch.Tensor) -> float:
    """The allowed difference of a log-prob computed in ``dtype`` from logits like ``logits``."""
    scale = float(logits.detach().abs().amax()) if logits.numel() else 1.0
    return 2 * LOGIT_ULPS[dtype] * torch.finfo(dtype).eps * max(scale, 1.0)


# --------------------------------------------------------------------------------------------
# Models


def random_weights(model, std: float, seed: int = 0):
    """Replace every weight but the norms by N(0, std^2) draws: peaked, varied next-token
    distributions (a freshly initialised model is near-uniform)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * std)
    return model


def small_vocab_model(vocab_size: int = 16, std: float = 0.2):
    """A float32 Qwen2 (GQA, biases) over a ``vocab_size``-token vocabulary, on the CPU, eval mode.

    The vocabulary is the model's only: prompts are ids in [2, vocab_size) and the K&K tokenizer
    supplies just the pad (0) and EOS (1) ids. With 16 tokens every sampled token falls in a bin of
    the frequency test with a large expected count."""
    token_ids = special_token_ids(kk_tokenizer())
    architecture = hf_config(TINY_QWEN2, vocab_size, token_ids)
    architecture._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(architecture)
    model.generation_config = GenerationConfig(**token_ids)
    return random_weights(model, std).eval()


def tiny_policy(path: Path) -> Path:
    """A tiny Qwen2 policy with the K&K tokenizer (compact template), saved to ``path``."""
    tokenizer = train_tokenizer(list(tokenizer_corpus(people=(2, 3), count=40, template="compact")))
    return save_policy(build_tiny_model(TINY_QWEN2, tokenizer, seed=0), tokenizer, path)


# --------------------------------------------------------------------------------------------
# The reference: a sampler that runs the full forward (no cache) at every step


def left_padded(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


@torch.no_grad()
def reference_sample(
    model, prompts: list[list[int]], pad_id: int, *, max_new_tokens: int, temperature: float, top_k=0, top_p=1.0, seed
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens_BT, logp_BT)``: every step runs the model's full forward over the left-padded
    prompts + the tokens so far and calls ``sample_next`` on the last logits with a generator of
    the model's device seeded with ``seed`` (the random stream ``FastEngine`` uses). No EOS."""
    device = model.get_input_embeddings().weight.device
    ids, mask = left_padded(prompts, pad_id, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens, logps = [], []
    for _ in range(max_new_tokens):
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(ids, attention_mask=mask, position_ids=position_ids).logits[:, -1]
        token, logp = sample_next(logits, temperature, top_k, top_p, generator)
        tokens.append(token)
        logps.append(logp)
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(tokens, 1), torch.stack(logps, 1)


# --------------------------------------------------------------------------------------------
# The frequency test


def rank_chi_square(probs_NV: torch.Tensor, tokens_N: torch.Tensor) -> tuple[float, int, float]:
    """Pearson's chi-square of N sampled tokens against the N distributions they were drawn from.

    Each draw is binned by the rank of its token under its own reference distribution (0 = the
    most probable); bin r expects ``sum_n probs_sorted[n, r]`` draws. Ranks instead of token ids
    keep the test sharp when the distribution changes from draw to draw (a wrong temperature or
    position shows as too many or too few top-ranked tokens). Bins expecting fewer than 5 draws
    are merged. Draws from a sum of different categorical distributions make the statistic at
    most chi-square distributed (the test is conservative). Returns (statistic, degrees of
    freedom, p-value).
    """
    probs = probs_NV.double().cpu()
    tokens = tokens_N.cpu()
    order = probs.argsort(dim=-1, descending=True, stable=True)
    rank_N = (order == tokens[:, None]).int().argmax(dim=-1)
    expected = probs.gather(1, order).sum(dim=0)
    observed = torch.bincount(rank_N, minlength=probs.shape[1]).double()
    large = expected >= 5
    if not large.all():
        expected = torch.cat([expected[large], expected[~large].sum()[None]])
        observed = torch.cat([observed[large], observed[~large].sum()[None]])
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = expected.numel() - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2)))
    return statistic, dof, p_value


# --------------------------------------------------------------------------------------------
# A reward that varies on a random policy, and the trainer's config for one step


PARITY_TASK = "gpu_check_parity"


class ParityTask(type(get_task("kk"))):  # type: ignore[misc]
    """K&K prompts; reward 1 (the maximum: "correct") when the decoded response has an even number
    of characters, else 0. A random tiny policy then gets mixed groups, nonzero advantages and
    correct rows for NTHR to anchor on (the K&K reward is constant on it). Registered as
    ``data.task=gpu_check_parity`` by :func:`parity_task_registered`."""

    name = PARITY_TASK
    max_reward = 1.0

    def score(self, response: str, example: TaskExample) -> ScoreResult:
        even = float(len(response) % 2 == 0)
        return ScoreResult(even, {"correct": even})


@contextlib.contextmanager
def parity_task_registered() -> Iterator[str]:
    register_task(PARITY_TASK, ParityTask, replace=True)
    try:
        yield PARITY_TASK
    finally:
        unregister_task(PARITY_TASK)


STEP_RUN = [
    f"data.task={PARITY_TASK}",
    "data.eval_count=4",
    "data.rl_count=16",
    "data.train_difficulties=[2]",
    "data.eval_difficulties=[2]",
    "rollout.prompts_per_step=2",
    "rollout.group_size=8",  # a group has equal rewards with probability 2 / 2**8: advantages are nonzero
    "rollout.max_new_tokens=12",
    "optim.mini_batch_size=8",
    "optim.micro_batch_size=4",
    "optim.lr=0.01",
    "optim.weight_decay=0.0",  # the weights then move only through the gradient
    "train.steps=1",
    "train.eval_every=0",
    "train.save_every=1",
    "train.threads=1",
    "output.progress=false",
]


def step_config(policy_dir: Path, device: torch.device, dtype: str, method: str, *extra: str) -> RunConfig:
    """A one-step run of ``method`` on the parity task (registered first) at ``dtype`` on ``device``."""
    return apply_overrides(
        RunConfig(),
        [
            *STEP_RUN,
            f"model.path={policy_dir}",
            f"model.dtype={dtype}",
            f"train.device={device}",
            f"train.method={method}",
            *extra,
        ],
    )
