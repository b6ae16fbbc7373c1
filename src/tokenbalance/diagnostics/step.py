"""The per-step diagnostics of a training run (``diagnostics`` config section), logged under ``diag/``.

The trainer calls three hooks of :class:`StepDiagnostics` in each RL step:

* :meth:`~StepDiagnostics.before_update` (after the passes are built, before any optimizer step):
  the per-bucket gradient norms every ``grad_norm_every`` steps (opt-in; one forward + backward per
  bucket and one for all tokens over a probe of ``grad_norm_rows`` responses);
* :meth:`~StepDiagnostics.on_micro_batch` (inside the update, per micro-batch): the per-token clip
  flags, recomputed from the micro-batch's detached log-probs with the method's clip (elementwise,
  no extra forward);
* :meth:`~StepDiagnostics.after_update`: the bucket statistics (default on: old log-probs, the
  update's advantages, the clip flags and the old-policy entropy of the old log-prob pass; no
  extra forward) and the LLD monitor (opt-in; one no-grad forward over the correct responses of
  mixed groups).

Model access goes through a ``score_fn(index_R) -> [R, T] log-probs`` callable the trainer passes
in, so this module imports only torch and the algorithm core. Time spent here is logged as
``timing/diag_s`` (the old-policy entropy is computed inside ``timing/logprob_s``). How each
measurement differs from the papers is said in its module (buckets, grad_norms, lld).

    tokenbalance train --set diagnostics.grad_norm_every=10 --set diagnostics.lld=true
    tokenbalance plot runs/RUN
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from tokenbalance.algorithms.surrogate import clipped_surrogate
from tokenbalance.algorithms.weights import tr_grpo_token_weights
from tokenbalance.diagnostics.buckets import bucket_masks, bucket_token_stats, check_bucket_edges
from tokenbalance.diagnostics.grad_norms import bucket_gradient_norms, probe_rows
from tokenbalance.diagnostics.lld import lld_rows, lld_stats
from tokenbalance.types import LossNormaliser, UpdatePass


def token_clip_flags(method, update_pass: UpdatePass, logp_BT: torch.Tensor, old_logp_BT: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: where the PPO clip acts for ``update_pass`` at the current log-probs.

    The same test as :func:`~tokenbalance.algorithms.loss.pass_loss` (``clip/frac``): AR and
    TR-GRPO loss-multiplier weights are positive, so only TR-GRPO's ratio placement changes which
    tokens clip, and it is reproduced here.
    """
    policy_BT = update_pass.policy_mask_BT.bool()
    valid_BT = policy_BT | update_pass.kl_entropy_mask_BT.bool() | update_pass.normaliser_mask_BT.bool()
    ratio_weight_BT = None
    tr = method.tr_grpo
    if tr is not None and tr.placement != "loss_multiplier":
        source_BT = logp_BT if tr.prob_source == "current" else old_logp_BT
        ratio_weight_BT = tr_grpo_token_weights(source_BT, valid_BT, tr)
    out = clipped_surrogate(
        logp_BT.detach(), old_logp_BT, update_pass.advantages_BT, valid_BT, method.clip, ratio_weight_BT=ratio_weight_BT
    )
    return out.clipped_BT & policy_BT


def update_advantages(passes: list[UpdatePass], mask_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantages each token is updated with (its pass's; 0 if in none) and the union of policy masks."""
    adv_BT = torch.zeros(mask_BT.shape, dtype=passes[0].advantages_BT.dtype, device=mask_BT.device)
    policy_BT = torch.zeros_like(mask_BT, dtype=torch.bool)
    for update_pass in passes:
        select = update_pass.policy_mask_BT.bool()
        adv_BT = torch.where(select, update_pass.advantages_BT, adv_BT)
        policy_BT |= select
    return adv_BT, policy_BT


class StepDiagnostics:
    """Diagnostics of one RL step; build a new one per step (it holds the step's clip flags)."""

    def __init__(self, config, method, step: int, *, seed: int = 0) -> None:
        self.config = config
        self.method = method
        self.step = step
        self.seed = seed
        self.edges = check_bucket_edges(config.bucket_edges)
        self.clipped_BT: torch.Tensor | None = None
        self._old_logp_BT: torch.Tensor | None = None
        self.seconds = 0.0

    @property
    def wants_entropy(self) -> bool:
        """Whether the old log-prob pass should also return the old-policy entropy."""
        return bool(self.config.bucket_stats)

    @property
    def measures_grad_norms(self) -> bool:
        every = self.config.grad_norm_every
        return bool(every) and self.step % every == 0

    def before_update(
        self,
        passes: list[UpdatePass],
        old_logp_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        *,
        policy: torch.nn.Module,
        score_fn: Callable[[torch.Tensor], torch.Tensor],
        micro_batch_rows: int,
        reduce_grads: Callable[[list], None] | None = None,
        reduce_normaliser: Callable[[LossNormaliser], LossNormaliser] | None = None,
    ) -> dict[str, float]:
        """Start collecting clip flags; the per-bucket gradient norms on the steps that measure them."""
        start = time.perf_counter()
        self._old_logp_BT = old_logp_BT
        if self.config.bucket_stats:
            self.clipped_BT = torch.zeros(mask_BT.shape, dtype=torch.bool, device=mask_BT.device)
        metrics: dict[str, float] = {}
        if self.measures_grad_norms:
            index = probe_rows(mask_BT.shape[0], self.config.grad_norm_rows, self.seed).to(mask_BT.device)
            adv_BT, policy_BT = update_advantages(passes, mask_BT.bool())
            probe_mask = mask_BT.bool()[index]
            probe_old = old_logp_BT[index]
            masks = {"all": policy_BT[index]}
            for b, bucket_BT in enumerate(bucket_masks(probe_old, probe_mask, self.edges)):
                masks[f"bucket{b}"] = bucket_BT & policy_BT[index]
            tokens = float(probe_mask.sum())
            normaliser = LossNormaliser(policy=tokens, regulariser=tokens)
            if reduce_normaliser is not None:
                normaliser = reduce_normaliser(normaliser)
            was_training = policy.training
            policy.train()
            try:
                norms, _ = bucket_gradient_norms(
                    method=self.method,
                    named_params=[(n, p) for n, p in policy.named_parameters() if p.requires_grad],
                    logp_fn=lambda rows: score_fn(index[rows]),
                    old_logp_BT=probe_old,
                    advantages_BT=adv_BT[index],
                    mask_BT=probe_mask,
                    masks=masks,
                    micro_batch_rows=micro_batch_rows,
                    normaliser=normaliser,
                    reduce_grads=reduce_grads,
                    per_layer=self.config.grad_norm_per_layer,
                )
            finally:
                policy.train(was_training)
            metrics.update(norms)
            metrics["diag/grad_norm/probe_tokens"] = normaliser.policy
        self.seconds += time.perf_counter() - start
        return metrics

    def on_micro_batch(self, rows: slice | torch.Tensor, micro_pass: UpdatePass, logp_BT: torch.Tensor) -> None:
        """Record where the clip acted in this micro-batch (called by ``run_update_passes``)."""
        if self.clipped_BT is None or self._old_logp_BT is None:
            return
        start = time.perf_counter()
        flags = token_clip_flags(self.method, micro_pass, logp_BT, self._old_logp_BT[rows])
        self.clipped_BT[rows] |= flags
        self.seconds += time.perf_counter() - start

    def after_update(
        self,
        passes: list[UpdatePass],
        old_logp_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        *,
        entropy_BT: torch.Tensor | None,
        correct_B: torch.Tensor,
        group_ids_B: torch.Tensor,
        score_fn: Callable[[torch.Tensor], torch.Tensor],
    ) -> dict[str, float]:
        """Bucket statistics and the LLD monitor; returns the ``diag/*`` metrics of the step."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.config.bucket_stats:
            adv_BT, _ = update_advantages(passes, mask_BT.bool())
            metrics.update(
                bucket_token_stats(
                    old_logp_BT,
                    adv_BT,
                    mask_BT,
                    self.edges,
                    clipped_BT=self.clipped_BT,
                    entropy_BT=entropy_BT,
                    mode=self.config.bucket_mode,
                )
            )
        if self.config.lld:
            rows = lld_rows(correct_B.to(mask_BT.device), group_ids_B.to(mask_BT.device))
            if rows.numel():
                with torch.no_grad():
                    new_logp = score_fn(rows)
                metrics.update(
                    lld_stats(
                        new_logp,
                        old_logp_BT[rows],
                        mask_BT[rows],
                        group_ids_B.to(rows.device)[rows],
                        epsilon=self.config.lld_epsilon,
                    )
                )
            else:
                metrics.update(lld_stats(old_logp_BT[:0], old_logp_BT[:0], mask_BT[:0], group_ids_B[:0]))
        self.seconds += time.perf_counter() - start
        metrics["timing/diag_s"] = self.seconds
        return metrics
