"""The update phase of one RL step: run the method's passes, mini-batches and micro-batches.

For each pass (one for GRPO, two for Lopti) and each contiguous mini-batch: one optimizer step,
with the gradient accumulated over micro-batches. The loss denominators are the mini-batch's
(summed over ranks: the paper's global token-mean) or, with ``token_mean_scope="micro_batch"``,
each micro-batch's with the loss divided by the number of micro-batches (the reference code).
The pre-clip gradient norm is logged; a non-finite norm skips the step (the reference does not).

With ``grad_share`` the record also holds each token's squared logit-gradient norm, from autograd's
dL/d log p of every micro-batch's own backward (``retain_grad``; no extra backward) and the forward's
sum_j pi_j^2 (:mod:`tokenbalance.algorithms.logit_grad`), for the diagnostics' gradient shares.

The old policy's forward as the update's first: before the first optimizer step the policy *is*
the old policy, so when the whole batch is one micro-batch of one mini-batch of a single pass
(the defaults; not Lopti, whose first pass runs only some rows), the loop runs
:func:`update_forward` once, with gradient, takes the old log-probs from it (detached) and hands
it to :func:`run_update_passes` as ``first_forward`` (:func:`reusable_first_forward` says when).
That saves one forward per step and changes no bit: the forward with gradient computes the same
values as the no-gradient one (``tests/trainer/test_first_forward.py``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from tokenbalance.algorithms.aggregate import token_coefficients
from tokenbalance.algorithms.logit_grad import softmax_grad_sq
from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.trainer.distributed import DistContext, sum_gradients, sum_normaliser
from tokenbalance.trainer.logprobs import (
    PackedSequences,
    ResponseLogprobs,
    checkpointing,
    micro_batches,
    response_logprobs,
    row_chunks,
)
from tokenbalance.trainer.precision import PLAIN_FORWARD, ForwardSettings
from tokenbalance.types import LossNormaliser, UpdatePass


@dataclass(frozen=True)
class UpdateRecord:
    """What one step's update did.

    Attributes:
        metrics: averaged ``loss/*``, ``clip/*``, ``optim/*`` (and ``pass/<name>/*``) metrics.
        clipped_BT: [B, T] bool, the tokens where the PPO clip acted in any pass (what the
            diagnostics' bucket statistics read after the update; nothing recomputes the surrogate).
        logit_grad_sq_BT: [B, T] float64, with ``grad_share``: each token's ||dL/dz||^2 (z its
            position's logits at the log-prob temperature) summed over the backward passes its
            loss terms entered (one: Lopti's passes hold disjoint tokens), g = dL/d log p from
            autograd as the loss was scaled for accumulation; 0 where no term. ``None`` without.
        unit_logit_grad_sq_BT: [B, T] float64, with ``grad_share``: c^2 ||e_o - pi||^2 at the
            forward of the token's policy term, c its weight in the pass's policy aggregation
            (:func:`~tokenbalance.algorithms.aggregate.token_coefficients`, times the accumulation
            scale): the squared logit-gradient norm per unit advantage at ratio 1, no clip and no
            token weight. Times an advantage squared it is that advantage's norm. ``None`` without.
    """

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
        method,
        normaliser: LossNormaliser,
        scale: float,
    ) -> None:
        """One micro-batch after its backward: ``current.logp_BT.grad`` is dL/d log p (scaled)."""
        if current.sum_sq_probs_BT is None:
            raise ValueError("grad_share: the update's forward must return sum_sq_probs_BT")
        geometry_BT = softmax_grad_sq(current.logp_BT, current.sum_sq_probs_BT).double()
        dlogp_BT = current.logp_BT.grad
        if dlogp_BT is not None:
            self.logit_grad_sq_BT[rows] += dlogp_BT.double().square() * geometry_BT
        coef_BT = token_coefficients(
            micro_pass.policy_mask_BT,
            method.policy_agg_mode,
            normaliser=normaliser.policy,
            denominator_mask_BT=micro_pass.normaliser_mask_BT,
            max_response_len=method.max_response_len,
        ).to(geometry_BT.device)
        self.unit_logit_grad_sq_BT[rows] += (coef_BT * scale).square() * geometry_BT


def rows_with_terms(
    rows: slice | torch.Tensor, micro_pass: UpdatePass, update_pass: UpdatePass
) -> tuple[slice | torch.Tensor | None, UpdatePass]:
    """The rows of ``rows`` holding at least one token of the pass (policy, KL or entropy term), and
    the pass restricted to them: ``rows`` itself when all do, an index tensor when some do, ``None``
    when none do. Skipping the others is exact: their loss terms and gradients are zero (Lopti's
    low-probability pass often covers a minority of the rows)."""
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
    *,
    method,
    temperature: float,
    grad_share: bool,
    with_hidden: bool = False,
    trim_padding: bool = False,
    forward_settings: ForwardSettings = PLAIN_FORWARD,
) -> ResponseLogprobs:
    """The update's forward of ``packed``'s rows: train mode, with gradient, the entropy always
    (with gradient only under an entropy bonus), sum_j pi_j^2 with ``grad_share``; ``with_hidden``
    adds the (detached) hidden states, which changes nothing else; ``trim_padding`` stops at the
    rows' longest response (:func:`~tokenbalance.trainer.logprobs.response_logprobs`); ``forward_settings``
    its autocast type and output-layer chunks."""
    policy.train()
    return response_logprobs(
        policy,
        packed,
        temperature=temperature,
        with_entropy=True,
        with_hidden=with_hidden,
        entropy_grad=method.entropy_coeff != 0,
        with_sum_sq_probs=grad_share,
        trim_padding=trim_padding,
        forward_settings=forward_settings,
    )


def trains_like_it_evaluates(policy) -> bool:
    """No dropout anywhere (modules or attention), so a train-mode forward equals an eval-mode one."""
    config = getattr(policy, "config", None)
    if any(float(getattr(config, key, 0.0) or 0.0) > 0 for key in ("attention_dropout", "dropout", "hidden_dropout")):
        return False
    return not any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in policy.modules())


def reusable_first_forward(method, policy, *, rows: int, micro_batch_rows: int, mini_batch_rows: int) -> bool:
    """Whether the old-policy forward of a batch of ``rows`` rows can be the update's first forward
    (module docstring): one pass, the whole batch one micro-batch of one mini-batch, no activation
    checkpointing and no dropout. Whether that pass then runs every row is checked when it runs."""
    return (
        len(method.pass_names) == 1
        and rows <= micro_batch_rows
        and rows <= mini_batch_rows
        and torch.is_grad_enabled()
        and not checkpointing(policy)
        and trains_like_it_evaluates(policy)
    )


def run_update_passes(
    *,
    method,
    passes: list[UpdatePass],
    policy,
    optimizer: torch.optim.Optimizer,
    packed: PackedSequences,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    temperature: float,
    mini_batch_rows: int,
    micro_batch_rows: int,
    grad_clip: float,
    token_mean_scope: str,
    ctx: DistContext,
    grad_share: bool = False,
    first_forward: ResponseLogprobs | None = None,
    group_by_length: bool = False,
    forward_settings: ForwardSettings = PLAIN_FORWARD,
) -> UpdateRecord:
    """Execute ``passes`` in order; returns the metrics and where the clip acted (:class:`UpdateRecord`);
    with ``grad_share`` also the per-token squared logit-gradient norms.

    ``first_forward``: :func:`update_forward` of all rows, run before any step (the old policy's
    forward, module docstring); used as the first micro-batch's forward when that micro-batch holds
    every row, otherwise dropped.

    ``group_by_length``: a mini-batch of several micro-batches is cut into micro-batches of rows of
    similar response length (:func:`~tokenbalance.trainer.logprobs.micro_batches`), each forward
    stopping at its own longest response; the same loss and gradient up to float rounding.

    ``forward_settings``: every forward's autocast type (``model.autocast``; the loss, the backward's
    accumulation into the float32 parameters' gradients and the step stay float32) and output-layer
    chunks (``optim.logit_chunk_tokens``).

    Per-pass metrics are also reported as ``pass/<name>/...`` when there is more than one pass;
    ``loss/*`` values are summed over passes (Lopti's passes are partial sums of one loss); other
    metrics (fractions, ratios) are averaged over passes weighted by each pass's token count.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    num_rows = old_logp_BT.shape[0]
    totals: dict[str, float] = defaultdict(float)
    pass_tokens = [float(p.policy_mask_BT.sum()) for p in passes]
    token_total = sum(pass_tokens) or 1.0
    grad_norms: list[float] = []
    skipped = 0
    clipped_BT = torch.zeros(old_logp_BT.shape, dtype=torch.bool, device=old_logp_BT.device)
    trace = LogitGradTrace(old_logp_BT) if grad_share else None
    policy.train()
    for update_pass, tokens in zip(passes, pass_tokens):
        pass_sums: dict[str, float] = defaultdict(float)
        pass_counts: dict[str, int] = defaultdict(int)
        for mini in row_chunks(num_rows, mini_batch_rows):
            mini_pass = update_pass.select_rows(mini)
            micro_slices = micro_batches(packed, mini, micro_batch_rows, group_by_length=group_by_length)
            normaliser = None
            if token_mean_scope == "mini_batch":
                normaliser = sum_normaliser(pass_normaliser(method, mini_pass), ctx)
            optimizer.zero_grad(set_to_none=True)
            micro_runs = []
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
                        policy,
                        packed.rows(active),
                        method=method,
                        temperature=temperature,
                        grad_share=trace is not None,
                        trim_padding=group_by_length,
                        forward_settings=forward_settings,
                    )
                first_forward = None  # only ever the first micro-batch's
                if trace is not None and current.logp_BT.requires_grad:
                    current.logp_BT.retain_grad()
                out = pass_loss(
                    method,
                    micro_pass,
                    current.logp_BT,
                    old_logp_BT[active],
                    None if ref_logp_BT is None else ref_logp_BT[active],
                    current.entropy_BT,
                    normaliser=micro_normaliser,
                )
                (out.loss * scale).backward()
                if trace is not None:
                    trace.add(active, current, micro_pass, method, micro_normaliser, scale)
                if out.clipped_BT is not None:
                    clipped_BT[active] |= out.clipped_BT
                micro_runs.append((out.metrics, scale))
            first_forward = None  # the policy moves now
            zero_missing_gradients(params)  # as the backward of a zero loss: AdamW still steps every parameter
            mini_metrics: dict[str, float] = defaultdict(float)
            for metrics, scale in micro_runs:
                for key, value in metrics.items():
                    # losses add up as the gradient does (times 1 / micro-batches in the micro-batch
                    # scope); fractions average over the micro-batches that ran
                    weight = scale if key.startswith("loss/") else 1.0 / len(micro_runs)
                    mini_metrics[key] += value * weight
            # micro-batch scope: every rank's loss is already a mean, so ranks average
            sum_gradients(params, ctx, scale=1.0 if normaliser is not None else 1.0 / ctx.world_size)
            norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
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
