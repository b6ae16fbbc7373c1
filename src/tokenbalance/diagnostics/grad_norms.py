"""Policy-gradient norm restricted to each probability bucket (AR-Lopti paper, Figure 1 d): the method's policy loss
with advantages outside the bucket at 0 (denominator: all valid probe tokens; KL and entropy off), at the old policy
on one probe batch; no optimizer step, ``.grad`` restored. docs/metrics.md ("Gradient norm per bucket")."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

import torch

from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import Method
from tokenbalance.types import LossNormaliser, UpdatePass

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def parameter_group(name: str) -> str:
    """Group label of a parameter: ``layer<i>`` for decoder layer i, ``embed``, ``head`` or ``other`` (final norm and
    anything else)."""
    match = _LAYER.search(name)
    if match:
        return f"layer{int(match.group(1))}"
    if "embed" in name or name.endswith(("wte.weight", "wpe.weight")):
        return "embed"
    if "lm_head" in name:
        return "head"
    return "other"


def gradient_free_method(method: Method) -> Method:
    """The method with its KL and entropy terms switched off (the policy term alone)."""
    return method.replace(kl=dataclasses.replace(method.kl, coef=0.0), entropy_coeff=0.0)


def grouped_norms(named_grads: Sequence[tuple[str, torch.Tensor | None]]) -> tuple[float, dict[str, float]]:
    """Total L2 norm and the L2 norm of each parameter group (missing gradients count as 0)."""
    squares: dict[str, float] = {}
    for name, grad in named_grads:
        group = parameter_group(name)
        value = 0.0 if grad is None else float(grad.detach().double().square().sum())
        squares[group] = squares.get(group, 0.0) + value
    total = math.sqrt(sum(squares.values()))
    return total, {group: math.sqrt(value) for group, value in squares.items()}


def bucket_gradient_norms(
    *,
    method: Method,
    named_params: Sequence[tuple[str, torch.nn.Parameter]],
    logp_fn: Callable[[slice], torch.Tensor],
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    masks: dict[str, torch.Tensor],
    micro_batch_rows: int,
    normaliser: LossNormaliser | None = None,
    reduce_grads: Callable[[list[torch.nn.Parameter]], None] | None = None,
    per_layer: bool = True,
    keep_grads: bool = False,
    prefix: str = "diag/grad_norm/",
) -> tuple[dict[str, float], dict[str, list[torch.Tensor]]]:
    """Norms of the policy gradient restricted to each token set in ``masks`` (label -> [B, T] bool).

    Args:
        method: its KL / entropy terms dropped; clip and current-policy weights (TR-GRPO) kept.
        logp_fn: ``rows -> [rows, T]`` current log-probs with gradient.
        old_logp_BT, advantages_BT, mask_BT: the probe batch (the update's advantages, after AR / NTHR).
        normaliser: the loss denominators; default all valid probe tokens.
        reduce_grads: sums gradients over data-parallel ranks (once per label).
        per_layer: also each parameter group's norm (:func:`parameter_group`).
        keep_grads: also return each label's gradient (detached, in parameter order).

    Returns:
        ``{prefix + label: norm, prefix + label + "/" + group: norm}`` (and with ``keep_grads`` ``{label:
        [gradients]}``); every ``.grad`` as before the call."""
    loss_method = gradient_free_method(method)
    valid_BT = mask_BT.bool()
    params = [p for _, p in named_params]
    names = [n for n, _ in named_params]
    num_rows = valid_BT.shape[0]
    if normaliser is None:
        tokens = float(valid_BT.sum())
        normaliser = LossNormaliser(policy=tokens, regulariser=tokens)
    saved = [p.grad for p in params]
    metrics: dict[str, float] = {}
    kept: dict[str, list[torch.Tensor]] = {}
    try:
        for label, select_BT in masks.items():
            select_BT = select_BT.bool() & valid_BT
            full_pass = UpdatePass(
                name=label,
                advantages_BT=torch.where(select_BT, advantages_BT.detach(), torch.zeros_like(advantages_BT)),
                policy_mask_BT=select_BT,
                kl_entropy_mask_BT=select_BT,
                normaliser_mask_BT=valid_BT,
            )
            for p in params:
                p.grad = None
            for start in range(0, num_rows, micro_batch_rows):
                rows = slice(start, min(start + micro_batch_rows, num_rows))
                logp_BT = logp_fn(rows)
                out = pass_loss(
                    loss_method, full_pass.select_rows(rows), logp_BT, old_logp_BT[rows], normaliser=normaliser
                )
                out.loss.backward()
            if reduce_grads is not None:
                reduce_grads(params)
            total, groups = grouped_norms([(n, p.grad) for n, p in zip(names, params)])
            metrics[prefix + label] = total
            if per_layer:
                for group, value in sorted(groups.items()):
                    metrics[f"{prefix}{label}/{group}"] = value
            if keep_grads:
                kept[label] = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]
    finally:
        for p, grad in zip(params, saved):
            p.grad = grad
    return metrics, kept


def probe_rows(num_rows: int, probe: int, seed: int) -> torch.Tensor:
    """Sorted indices of a seeded sample of ``probe`` rows (all rows when ``probe`` is 0 or too large)."""
    if probe <= 0 or probe >= num_rows:
        return torch.arange(num_rows)
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_rows, generator=generator)[:probe].sort().values
