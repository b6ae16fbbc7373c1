"""The update phase of one RL step: the method's passes, mini-batches and micro-batches.

:func:`run_update` takes one :class:`UpdateSpec`: per pass and contiguous mini-batch one optimizer step, the gradient
accumulated over micro-batches. Loss denominators, skipped non-finite steps, the shared first forward and the metrics'
pooling: docs/training.md ("One RL step", step 6); the gradient share's norms: docs/metrics.md."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from tokenbalance.algorithms.aggregate import token_coefficients
from tokenbalance.algorithms.logit_grad import logit_grad_sq
from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.algorithms.methods import Method
from tokenbalance.trainer.distributed import DistContext, sum_gradients, sum_normaliser
from tokenbalance.trainer.logprobs import (
    PackedSequences,
    ResponseLogprobs,
    checkpointing,
    micro_batches,
    response_logprobs,
    row_chunks,
    step_weight_casts,
)
from tokenbalance.trainer.precision import PLAIN_FORWARD, ForwardSettings
from tokenbalance.types import LossNormaliser, UpdatePass


@dataclass(frozen=True, kw_only=True)
class UpdateSettings:
    """How a run's updates run, fixed by its config (the trainer's ``StepSettings`` is one).

    Attributes:
        temperature: the log-prob (= sampling) temperature.
        mini_batch_rows: rows per optimizer step (per rank); micro_batch_rows: rows per forward and backward.
        grad_clip: the pre-clip gradient norm's limit.
        token_mean_scope: ``"mini_batch"`` (one denominator, summed over ranks) or ``"micro_batch"``.
        group_by_length: micro-batches of rows of similar length
            (:func:`~tokenbalance.trainer.logprobs.micro_batches`).
        forward_settings: every forward's autocast type and output-layer chunks.
        grad_share: record the per-token squared logit-gradient norms (:class:`UpdateRecord`)."""

    temperature: float
    mini_batch_rows: int
    micro_batch_rows: int
    grad_clip: float
    token_mean_scope: str
    group_by_length: bool = False
    forward_settings: ForwardSettings = PLAIN_FORWARD
    grad_share: bool = False


class UpdateBatch(Protocol):
    """The rows an update trains on (B sequences, T response tokens): the trainer's
    :class:`~tokenbalance.trainer.batch.RolloutBatch` once it has its log-probs, or :class:`UpdateRows`."""

    @property
    def packed(self) -> PackedSequences: ...

    @property
    def old_logp_BT(self) -> torch.Tensor:
        """[B, T] old-policy log-probs (no gradient)."""
        ...

    @property
    def ref_logp_BT(self) -> torch.Tensor | None:
        """[B, T] reference log-probs when the method has a KL term."""
        ...


@dataclass(frozen=True)
class UpdateRows:
    """An :class:`UpdateBatch` given as its tensors (a probe's rows, a test's batch)."""

    packed: PackedSequences
    old_logp_BT: torch.Tensor
    ref_logp_BT: torch.Tensor | None = None


@dataclass(frozen=True)
class UpdateSpec:
    """One step's update: ``method``'s ``passes`` over ``batch`` as ``settings`` say. ``first_forward``: the old
    policy's forward of all rows with gradient (:func:`reusable_first_forward`), used as the first micro-batch's when
    that holds every row, otherwise dropped."""

    method: Method
    passes: Sequence[UpdatePass]
    batch: UpdateBatch
    settings: UpdateSettings
    first_forward: ResponseLogprobs | None = None


@dataclass(frozen=True)
class UpdateRecord:
    """What one step's update did.

    Attributes:
        metrics: averaged ``loss/*``, ``clip/*``, ``optim/*`` (and ``pass/<name>/*``) metrics.
        clipped_BT: [B, T] bool, where the PPO clip acted in any pass (read by the bucket statistics).
        logit_grad_sq_BT: [B, T] float64 with ``grad_share`` (else ``None``): each token's ||dL/dz||^2 at the log-prob
            temperature, summed over the backward passes its terms entered, from autograd at the accumulation scale.
        unit_logit_grad_sq_BT: [B, T] float64 with ``grad_share`` (else ``None``): c^2 ||e_o - pi||^2, c the token's
            weight in its pass's aggregation (:func:`~tokenbalance.algorithms.aggregate.token_coefficients`): the norm
            per unit advantage at ratio 1, no clip, no token weight."""

    metrics: dict[str, float]
    clipped_BT: torch.Tensor
    logit_grad_sq_BT: torch.Tensor | None = None
    unit_logit_grad_sq_BT: torch.Tensor | None = None


class LogitGradTrace:
    """Accumulates :class:`UpdateRecord`'s two per-token squared norms over an update's micro-batches."""

    def __init__(self, like_BT: torch.Tensor) -> None:
        self.logit_grad_sq_BT = torch.zeros(like_BT.shape, dtype=torch.float64, device=like_BT.device)
        self.unit_logit_grad_sq_BT = torch.zeros_like(self.logit_grad_sq_BT)

    def add(
        self,
        rows: slice | torch.Tensor,
        current: ResponseLogprobs,
        micro_pass: UpdatePass,
        method: Method,
        normaliser: LossNormaliser,
        scale: float,
    ) -> None:
        """One micro-batch after its backward: ``current.logp_BT.grad`` is dL/d log p (scaled)."""
        if current.sum_sq_probs_BT is None:
            raise ValueError("grad_share: the update's forward must return sum_sq_probs_BT")
        dlogp_BT = current.logp_BT.grad
        if dlogp_BT is not None:  # squared in float64, as the sums are kept
            self.logit_grad_sq_BT[rows] += logit_grad_sq(dlogp_BT.double(), current.logp_BT, current.sum_sq_probs_BT)
        coef_BT = token_coefficients(
            micro_pass.policy_mask_BT,
            method.policy_agg_mode,
            normaliser=normaliser.policy,
            denominator_mask_BT=micro_pass.normaliser_mask_BT,
            max_response_len=method.max_response_len,
        ).to(current.logp_BT.device)
        self.unit_logit_grad_sq_BT[rows] += logit_grad_sq(coef_BT * scale, current.logp_BT, current.sum_sq_probs_BT)


def rows_with_terms(
    rows: slice | torch.Tensor, micro_pass: UpdatePass, update_pass: UpdatePass
) -> tuple[slice | torch.Tensor | None, UpdatePass]:
    """The rows of ``rows`` holding a token of the pass (policy, KL or entropy term) and the pass restricted to them:
    ``rows`` itself when all do, an index tensor when some do, ``None`` when none do (exact: the others' terms are
    zero)."""
    active_B = (micro_pass.policy_mask_BT.bool() | micro_pass.kl_entropy_mask_BT.bool()).any(dim=1)
    count = int(active_B.sum())
    if count == active_B.numel():
        return rows, micro_pass
    if count == 0:
        return None, micro_pass
    if isinstance(rows, slice):
        index = torch.nonzero(active_B).squeeze(1) + rows.start
    else:
        index = rows[active_B.to(rows.device)]
    return index, update_pass.select_rows(index)


def zero_missing_gradients(params: list[torch.Tensor]) -> None:
    """Give parameters without a gradient (every micro-batch skipped) a zero one."""
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)


def update_forward(
    policy,
    packed: PackedSequences,
    method: Method,
    settings: UpdateSettings,
    *,
    with_hidden: bool = False,
    trim_padding: bool = False,
) -> ResponseLogprobs:
    """The update's forward of ``packed``'s rows: train mode, with gradient, the entropy always (with gradient only
    under an entropy bonus), sum_j pi_j^2 with ``settings.grad_share``; ``with_hidden`` adds the detached hidden
    states; ``trim_padding`` as in :func:`~tokenbalance.trainer.logprobs.response_logprobs`."""
    policy.train()
    return response_logprobs(
        policy,
        packed,
        temperature=settings.temperature,
        with_entropy=True,
        with_hidden=with_hidden,
        entropy_grad=method.entropy_coeff != 0,
        with_sum_sq_probs=settings.grad_share,
        trim_padding=trim_padding,
        forward_settings=settings.forward_settings,
    )


def trains_like_it_evaluates(policy) -> bool:
    """No dropout anywhere (modules or attention), so a train-mode forward equals an eval-mode one."""
    config = getattr(policy, "config", None)
    if any(float(getattr(config, key, 0.0) or 0.0) > 0 for key in ("attention_dropout", "dropout", "hidden_dropout")):
        return False
    return not any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in policy.modules())


def reusable_first_forward(method: Method, policy, rows: int, settings: UpdateSettings) -> bool:
    """Whether the old-policy forward of a batch of ``rows`` rows can be the update's first forward: one pass, the
    whole batch one micro-batch of one mini-batch, no activation checkpointing and no dropout (then it computes the
    same bits as the no-gradient forward). Whether that pass then runs every row is checked when it runs."""
    return (
        len(method.pass_names) == 1
        and rows <= settings.micro_batch_rows
        and rows <= settings.mini_batch_rows
        and torch.is_grad_enabled()
        and not checkpointing(policy)
        and trains_like_it_evaluates(policy)
    )


def run_update(spec: UpdateSpec, policy, optimizer: torch.optim.Optimizer, ctx: DistContext) -> UpdateRecord:
    """Execute ``spec.passes`` in order on ``policy`` with ``optimizer`` over ``ctx``'s ranks (:class:`UpdateRecord`).

    With several passes each also reports ``pass/<name>/...``; ``loss/*`` are summed over passes (Lopti's passes are
    partial sums of one loss), other metrics averaged weighted by each pass's token count."""
    method, passes, settings = spec.method, spec.passes, spec.settings
    old_logp_BT, first_forward = spec.batch.old_logp_BT, spec.first_forward
    params = [p for p in policy.parameters() if p.requires_grad]
    num_rows = old_logp_BT.shape[0]
    totals: dict[str, float] = defaultdict(float)
    pass_tokens = [float(p.policy_mask_BT.sum()) for p in passes]
    token_total = sum(pass_tokens) or 1.0
    grad_norms: list[float] = []
    skipped = 0
    clipped_BT = torch.zeros(old_logp_BT.shape, dtype=torch.bool, device=old_logp_BT.device)
    trace = LogitGradTrace(old_logp_BT) if settings.grad_share else None
    policy.train()
    for update_pass, tokens in zip(passes, pass_tokens):
        pass_sums: dict[str, float] = defaultdict(float)
        pass_counts: dict[str, int] = defaultdict(int)
        for mini in row_chunks(num_rows, settings.mini_batch_rows):
            mini_pass = update_pass.select_rows(mini)
            normaliser = None
            if settings.token_mean_scope == "mini_batch":
                normaliser = sum_normaliser(pass_normaliser(method, mini_pass), ctx)
            optimizer.zero_grad(set_to_none=True)
            micro_runs = mini_batch_backward(
                spec, policy, update_pass, mini, normaliser, first_forward, trace, clipped_BT
            )
            first_forward = None  # the policy moves now
            zero_missing_gradients(params)  # as the backward of a zero loss: AdamW still steps every parameter
            mini_metrics: dict[str, float] = defaultdict(float)
            for metrics, scale in micro_runs:
                for key, value in metrics.items():
                    # losses add up as the gradient does (times 1 / micro-batches in the micro-batch scope); fractions
                    # average over the micro-batches that ran
                    weight = scale if key.startswith("loss/") else 1.0 / len(micro_runs)
                    mini_metrics[key] += value * weight
            # micro-batch scope: every rank's loss is already a mean, so ranks average
            sum_gradients(params, ctx, scale=1.0 if normaliser is not None else 1.0 / ctx.world_size)
            norm = float(torch.nn.utils.clip_grad_norm_(params, settings.grad_clip))
            grad_norms.append(norm)
            if math.isfinite(norm):
                optimizer.step()
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            for key, value in mini_metrics.items():
                pass_sums[key] += value
                pass_counts[key] += 1
        pass_means = {k: pass_sums[k] / pass_counts[k] for k in pass_sums}
        for key, value in pass_means.items():
            if len(passes) > 1:
                totals[f"pass/{update_pass.name}/{key}"] = value
            if key.startswith("loss/"):
                totals[key] += value
            else:
                totals[key] += value * tokens / token_total
    finite = [n for n in grad_norms if math.isfinite(n)]
    totals["optim/grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
    totals["optim/steps"] = float(len(grad_norms) - skipped)
    totals["optim/skipped_steps"] = float(skipped)
    return UpdateRecord(
        metrics=dict(totals),
        clipped_BT=clipped_BT,
        logit_grad_sq_BT=None if trace is None else trace.logit_grad_sq_BT,
        unit_logit_grad_sq_BT=None if trace is None else trace.unit_logit_grad_sq_BT,
    )


def mini_batch_backward(
    spec: UpdateSpec,
    policy,
    update_pass: UpdatePass,
    mini: slice,
    normaliser,
    first_forward: ResponseLogprobs | None,
    trace: LogitGradTrace | None,
    clipped_BT: torch.Tensor,
) -> list[tuple[dict[str, float], float]]:
    """The forward and backward of every micro-batch of rows ``mini`` of ``update_pass``: their gradients add up in
    the parameters' ``.grad``, where the PPO clip acted is or-ed into ``clipped_BT``, and ``trace`` (if any) records
    the logit gradients. Returns each micro-batch's metrics with its loss scale. ``normaliser``: the mini-batch's
    token-mean denominator (``None``: each micro-batch's own, its loss scaled by 1 / micro-batches);
    ``first_forward``: the forward a micro-batch of every row uses instead of its own."""
    method, settings, batch = spec.method, spec.settings, spec.batch
    num_rows = batch.old_logp_BT.shape[0]
    micro_slices = micro_batches(
        batch.packed, mini, settings.micro_batch_rows, group_by_length=settings.group_by_length
    )
    micro_runs = []
    # one conversion of the weights for all micro-batches; the region ends before the optimizer step
    with step_weight_casts(policy, settings.forward_settings):
        for rows in micro_slices:
            micro_pass = update_pass.select_rows(rows)
            scale = 1.0
            micro_normaliser = normaliser
            if micro_normaliser is None:  # over all rows of the micro-batch, skipped ones included
                micro_normaliser = pass_normaliser(method, micro_pass)
                scale = 1.0 / len(micro_slices)
            active, micro_pass = rows_with_terms(rows, micro_pass, update_pass)
            if active is None:
                continue  # no token of this pass here: its loss and gradient are zero
            if first_forward is not None and isinstance(active, slice) and active == slice(0, num_rows):
                current = first_forward  # the old policy's forward of these rows, with gradient
            else:
                current = update_forward(
                    policy, batch.packed.rows(active), method, settings, trim_padding=settings.group_by_length
                )
            first_forward = None  # only ever the first micro-batch's
            if trace is not None and current.logp_BT.requires_grad:
                current.logp_BT.retain_grad()
            out = pass_loss(
                method,
                micro_pass,
                current.logp_BT,
                batch.old_logp_BT[active],
                None if batch.ref_logp_BT is None else batch.ref_logp_BT[active],
                current.entropy_BT,
                normaliser=micro_normaliser,
            )
            (out.loss * scale).backward()
            if trace is not None:
                trace.add(active, current, micro_pass, method, micro_normaliser, scale)
            if out.clipped_BT is not None:
                clipped_BT[active] |= out.clipped_BT
            micro_runs.append((out.metrics, scale))
    return micro_runs
