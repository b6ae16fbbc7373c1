"""The per-step diagnostics of a run (``diagnostics`` section), logged under ``diag/``: the trainer calls
:meth:`StepDiagnostics.before_update` (gradient norms) and :meth:`StepDiagnostics.after_update` (bucket statistics,
gradient shares, LLD; nothing recomputed), reaching the model through :class:`PolicyAccess` and the batch through
:class:`StepBatch`. Keys and costs: docs/metrics.md."""

from __future__ import annotations

from typing import Protocol

import torch

from tokenbalance.algorithms.methods import Method, compute_advantages
from tokenbalance.diagnostics.buckets import bucket_masks, bucket_token_stats, check_bucket_edges
from tokenbalance.diagnostics.config import DiagnosticsConfig
from tokenbalance.diagnostics.grad_norms import bucket_gradient_norms, probe_rows
from tokenbalance.diagnostics.grad_share import grad_shares
from tokenbalance.diagnostics.lld import lld_rows, lld_stats
from tokenbalance.types import LossNormaliser, UpdatePass


class StepBatch(Protocol):
    """What the diagnostics read of a step's batch (B responses, T response tokens); the trainer's is
    :class:`tokenbalance.trainer.batch.RolloutBatch` once it has its old log-probs."""

    @property
    def old_logp_BT(self) -> torch.Tensor:
        """[B, T] old-policy log-probs (the sampling temperature's)."""
        ...

    @property
    def entropy_BT(self) -> torch.Tensor | None:
        """[B, T] old-policy entropy, when the old log-prob pass computed it."""
        ...

    @property
    def mask_BT(self) -> torch.Tensor:
        """[B, T] bool response mask."""
        ...

    @property
    def correct_B(self) -> torch.Tensor:
        """[B] bool, fully correct responses."""
        ...

    @property
    def group_ids_B(self) -> torch.Tensor:
        """[B] int64 group (prompt) id of each response."""
        ...

    @property
    def rewards_B(self) -> torch.Tensor:
        """[B] outcome rewards (what the method's estimator turns into advantages)."""
        ...

    @property
    def ref_logp_BT(self) -> torch.Tensor | None:
        """[B, T] reference log-probs when the method has a KL term."""
        ...


class UpdateTrace(Protocol):
    """What the diagnostics read of the update (the trainer's :class:`tokenbalance.trainer.update.UpdateRecord`)."""

    @property
    def clipped_BT(self) -> torch.Tensor | None:
        """[B, T] bool, where the PPO clip acted in any pass."""
        ...

    @property
    def logit_grad_sq_BT(self) -> torch.Tensor | None:
        """[B, T] each token's squared logit-gradient norm in the update (``None`` when not traced)."""
        ...

    @property
    def unit_logit_grad_sq_BT(self) -> torch.Tensor | None:
        """[B, T] the squared norm per unit advantage at ratio 1, no clip, no token weight."""
        ...


class PolicyAccess(Protocol):
    """What the diagnostics need from the runner: the policy, its log-probs on rows of the step's batch, and the
    data-parallel reductions. One object per step (the trainer's is
    :class:`tokenbalance.trainer.step_policy.StepPolicy`)."""

    @property
    def policy(self) -> torch.nn.Module: ...

    @property
    def micro_batch_rows(self) -> int: ...

    def logp(self, rows_R: torch.Tensor) -> torch.Tensor:
        """[R, T] current log-probs of rows ``rows_R`` of the batch; with gradient when autograd is on."""
        ...

    def sum_gradients(self, params: list) -> None:
        """Sum the parameters' gradients over data-parallel ranks, in place."""
        ...

    def sum_normaliser(self, normaliser: LossNormaliser) -> LossNormaliser:
        """The loss denominators summed over data-parallel ranks."""
        ...


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
    """Diagnostics of one RL step; build a new one per step."""

    def __init__(
        self, config: DiagnosticsConfig, method: Method, step: int, access: PolicyAccess, *, seed: int = 0
    ) -> None:
        self.config = config
        self.method = method
        self.access = access
        self.step = step
        self.seed = seed
        self.edges = check_bucket_edges(config.bucket_edges)

    @property
    def wants_entropy(self) -> bool:
        """Whether the old log-prob pass should also return the old-policy entropy."""
        return bool(self.config.bucket_stats)

    @property
    def measures_grad_norms(self) -> bool:
        every = self.config.grad_norm_every
        return bool(every) and self.step % every == 0

    def before_update(self, passes: list[UpdatePass], batch: StepBatch) -> dict[str, float]:
        """The per-bucket gradient norms, on the steps that measure them (else nothing)."""
        if not self.measures_grad_norms:
            return {}
        mask_BT = batch.mask_BT.bool()
        index = probe_rows(mask_BT.shape[0], self.config.grad_norm_rows, self.seed).to(mask_BT.device)
        adv_BT, policy_BT = update_advantages(passes, mask_BT)
        probe_mask = mask_BT[index]
        probe_old = batch.old_logp_BT[index]
        masks = {"all": policy_BT[index]}
        for b, bucket_BT in enumerate(bucket_masks(probe_old, probe_mask, self.edges)):
            masks[f"bucket{b}"] = bucket_BT & policy_BT[index]
        tokens = float(probe_mask.sum())
        normaliser = self.access.sum_normaliser(LossNormaliser(policy=tokens, regulariser=tokens))
        policy = self.access.policy
        was_training = policy.training
        policy.train()
        try:
            norms, _ = bucket_gradient_norms(
                method=self.method,
                named_params=[(n, p) for n, p in policy.named_parameters() if p.requires_grad],
                logp_fn=lambda rows: self.access.logp(index[rows]),
                old_logp_BT=probe_old,
                advantages_BT=adv_BT[index],
                mask_BT=probe_mask,
                masks=masks,
                micro_batch_rows=self.access.micro_batch_rows,
                normaliser=normaliser,
                reduce_grads=self.access.sum_gradients,
                per_layer=self.config.grad_norm_per_layer,
            )
        finally:
            policy.train(was_training)
        return norms | {"diag/grad_norm/probe_tokens": normaliser.policy}

    def after_update(self, passes: list[UpdatePass], batch: StepBatch, record: UpdateTrace) -> dict[str, float]:
        """Bucket statistics, gradient shares and the LLD monitor; returns the ``diag/*`` metrics of the step.
        ``record``: the update's (``UpdateRecord``: clip flags, squared logit-gradient norms)."""
        metrics: dict[str, float] = {}
        old_logp_BT, mask_BT = batch.old_logp_BT, batch.mask_BT
        if self.config.bucket_stats:
            adv_BT, _ = update_advantages(passes, mask_BT.bool())
            metrics.update(
                bucket_token_stats(
                    old_logp_BT,
                    adv_BT,
                    mask_BT,
                    self.edges,
                    clipped_BT=record.clipped_BT,
                    entropy_BT=batch.entropy_BT,
                    mode=self.config.bucket_mode,
                )
            )
        if (
            self.config.logs_grad_share
            and record.logit_grad_sq_BT is not None
            and record.unit_logit_grad_sq_BT is not None
        ):
            metrics.update(self.grad_shares(batch, record.logit_grad_sq_BT, record.unit_logit_grad_sq_BT))
        if self.config.lld:
            group_ids_B = batch.group_ids_B.to(mask_BT.device)
            rows = lld_rows(batch.correct_B.to(mask_BT.device), group_ids_B)
            if rows.numel():
                with torch.no_grad():
                    new_logp = self.access.logp(rows)
                metrics.update(
                    lld_stats(
                        new_logp, old_logp_BT[rows], mask_BT[rows], group_ids_B[rows], epsilon=self.config.lld_epsilon
                    )
                )
            else:
                metrics.update(lld_stats(old_logp_BT[:0], old_logp_BT[:0], mask_BT[:0], group_ids_B[:0]))
        return metrics

    def grad_shares(
        self, batch: StepBatch, logit_grad_sq_BT: torch.Tensor, unit_logit_grad_sq_BT: torch.Tensor
    ) -> dict[str, float]:
        """``diag/bucket<b>/grad_share`` and ``grad_share_before`` (docs/metrics.md), the estimator's advantages
        recomputed from the rewards."""
        mask_BT = batch.mask_BT
        base_adv_BT = compute_advantages(
            self.method, batch.rewards_B, batch.group_ids_B, mask_BT, batch.old_logp_BT, batch.ref_logp_BT
        )
        return grad_shares(
            batch.old_logp_BT,
            mask_BT,
            logit_grad_sq_BT,
            unit_logit_grad_sq_BT,
            base_adv_BT,
            self.edges,
            mode=self.config.bucket_mode,
        )
