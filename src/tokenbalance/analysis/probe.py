"""A probe batch for the offline diagnostics and the grid's Figure 1: a policy and one fresh batch of its rollouts
with old log-probs (its own reference), built from the run's setup (:func:`tokenbalance.run.setup.prepare`) with the
device, threads and policy a run of the same config would, the first ``prompts`` of its prompt stream sampled and
scored as a training step does."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tokenbalance.algorithms.methods import Method
from tokenbalance.config import RunConfig
from tokenbalance.run.setup import RunSetup
from tokenbalance.tasks.base import Task, TaskExample
from tokenbalance.trainer.batch import RolloutBatch, update_inputs
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import ResponseLogprobs, batched_response_logprobs
from tokenbalance.trainer.precision import ForwardSettings, forward_precision
from tokenbalance.trainer.step_policy import StepPolicy
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, run_update
from tokenbalance.types import UpdatePass

PROBE_SEED_SALT = 97  # the probe's sampling seed: derive_seed(train.seed, 0, 0, 97)


@dataclass(frozen=True)
class ProbeBatch:
    """A policy, its config, method and task, and one batch of its rollouts with old log-probs (B = P x G rows)."""

    config: RunConfig
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    method: Method
    rollout: RolloutBatch
    task: Task

    @property
    def temperature(self) -> float:
        return self.config.rollout.temperature

    @property
    def micro_batch_rows(self) -> int:
        return self.config.optim.micro_batch_size

    @property
    def forward_settings(self) -> ForwardSettings:
        return ForwardSettings.from_config(self.config, self.device)

    @property
    def mask_BT(self) -> torch.Tensor:
        return self.rollout.mask_BT

    @property
    def scores_B(self) -> torch.Tensor:
        return self.rollout.rewards_B

    @property
    def group_ids_B(self) -> torch.Tensor:
        return self.rollout.group_ids_B

    @property
    def correct_B(self) -> torch.Tensor:
        return self.rollout.correct_B

    @property
    def old(self) -> ResponseLogprobs:
        return self.rollout.old_logprobs

    @property
    def texts_B(self) -> list[str]:
        return self.rollout.texts_B

    @property
    def examples_B(self) -> list[TaskExample]:
        return [e for e in self.rollout.examples_P for _ in range(self.rollout.group_size)]

    def access(self) -> StepPolicy:
        """The policy as one step's diagnostics see it, on this process alone."""
        return StepPolicy(
            self.model,
            self.rollout.packed,
            self.temperature,
            self.micro_batch_rows,
            DistContext(device=self.device),
            self.forward_settings,
        )


def probe_batch(
    config: RunConfig,
    *,
    prompts: int,
    group_size: int | None = None,
    with_hidden: bool = False,
    log=print,
    setup: RunSetup | None = None,
) -> ProbeBatch:
    """Sample ``group_size`` (default ``rollout.group_size``) responses to each of the run's first ``prompts`` prompts
    with the policy ``config`` names, score them, add old log-probs (and the last-layer hidden states with
    ``with_hidden``). The method is ``config.method()``; ``setup``: the config's, prepared here when not given."""
    from tokenbalance.rollout import make_engine
    from tokenbalance.run.setup import prepare
    from tokenbalance.trainer.batch import sample_batch, with_logprobs
    from tokenbalance.trainer.loop import StepSettings, derive_seed, prompt_order
    from tokenbalance.trainer.runner import compute_device, load_run_policy, policy_path

    group_size = group_size or config.rollout.group_size
    if prompts < 1:
        raise ValueError(f"--prompts: must be >= 1, got {prompts}")
    if group_size < 2:
        raise ValueError(f"--group-size: must be >= 2 (a group needs a baseline), got {group_size}")
    method = config.method()
    if setup is None:
        setup = prepare(config)  # data, tokenizer, prompt lengths, device: before the model loads
    pool = setup.train_examples
    if prompts > len(pool):
        raise ValueError(
            f"--prompts {prompts}: the run's training data holds only {len(pool)} prompt(s) (data.train_file or "
            f"data.rl_count); ask for at most {len(pool)}"
        )
    device = compute_device(config)
    embedded = config.model.path is None
    path = policy_path(config, device, DistContext(device=device), log, setup)
    model, tokenizer = load_run_policy(config, path, embedded=embedded, device=device, tokenizer=setup.tokenizer)
    setup = setup.with_tokenizer(tokenizer)
    order = prompt_order(len(pool), config.train.seed, 0)[:prompts]
    chosen, prompt_ids = [pool[i] for i in order], [setup.train_prompt_ids[i] for i in order]
    vocab = model.get_input_embeddings().num_embeddings
    if max(max(row) for row in prompt_ids) >= vocab:
        raise ValueError(
            f"{path}: the tokenizer produces ids beyond the model's {vocab} embedding rows; "
            "the checkpoint and the tokenizer do not match"
        )
    settings = StepSettings.from_config(config, world_size=1, device=device)
    with forward_precision(model, settings.forward_settings.compute_dtype):  # model.autocast, as the trainer's rollout
        batch = sample_batch(
            make_engine(config.rollout.engine, model, tokenizer),
            tokenizer,
            setup.task,
            chosen,
            prompt_ids,
            torch.arange(prompts),
            group_size=group_size,
            sampling=settings.sampling(derive_seed(config.train.seed, 0, 0, PROBE_SEED_SALT)),
            device=device,
        )
    batch = with_logprobs(
        batch,
        policy=model,
        reference=model,  # the probe's reference policy is the policy itself
        method=method,
        temperature=settings.temperature,
        micro_batch=settings.micro_batch_rows,
        with_entropy=False,
        forward_settings=settings.forward_settings,
    )
    if with_hidden and batch.old_logprobs.hidden_BTD is None:
        old = batched_response_logprobs(
            model,
            batch.packed,
            temperature=settings.temperature,
            micro_batch=settings.micro_batch_rows,
            with_hidden=True,
            forward_settings=settings.forward_settings,
        )
        batch = dataclasses.replace(batch, old=old)
    return ProbeBatch(config, model, tokenizer, device, method, batch, setup.task)


def method_passes(probe: ProbeBatch, method: Method, rows=None) -> tuple[list[UpdatePass], dict[str, float]]:
    """``method``'s update passes on the probe (or its ``rows``, whole groups); the reference is the policy."""
    rollout = probe.rollout
    if rollout.ref_logp_BT is None and method.needs_ref_logp:  # another method than the one sampled for
        rollout = dataclasses.replace(rollout, ref_logp_BT=rollout.old_logp_BT)
    return update_inputs(method, rollout, policy=probe.model, temperature=probe.temperature, rows=rows)


def single_update(
    probe: ProbeBatch, method: Method, passes: list[UpdatePass], optimizer: torch.optim.Optimizer, rows=None
) -> dict[str, float]:
    """One optimizer step per pass on ``rows`` (all: the whole batch), without gradient clipping."""
    rows = slice(None) if rows is None else rows
    old = probe.old.logp_BT[rows]
    batch = UpdateRows(probe.rollout.packed.rows(rows), old, old if method.needs_ref_logp else None)
    settings = UpdateSettings(
        temperature=probe.temperature,
        mini_batch_rows=old.shape[0],
        micro_batch_rows=probe.micro_batch_rows,
        grad_clip=math.inf,
        token_mean_scope="mini_batch",
        forward_settings=probe.forward_settings,
    )
    spec = UpdateSpec(method, passes, batch, settings)
    return run_update(spec, probe.model, optimizer, DistContext(device=probe.device)).metrics


def rescore(probe: ProbeBatch, rows=None) -> torch.Tensor:
    """[B, T] the policy's current log-probs of the probe's responses (or of ``rows``), without gradient."""
    with torch.no_grad():
        return probe.access().logp(slice(None) if rows is None else rows)
