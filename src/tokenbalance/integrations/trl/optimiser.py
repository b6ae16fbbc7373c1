"""The optimiser settings of the paper each method comes from, as ``GRPOConfig`` fields.

TRL's defaults (linear LR decay, weight decay 0) are not the papers': the AR-Lopti K&K scripts use
AdamW, lr 1e-6, betas (0.9, 0.999), weight decay 0.01, a constant schedule without warmup and grad
clip 1.0. :func:`grpo_config_for_method` sets these as defaults (a field you pass wins); what a paper
does not state is the AR-Lopti scripts' value, named as such (table and sources: docs/trl.md).
"""

from __future__ import annotations

import dataclasses

from tokenbalance.algorithms.methods import Method
from tokenbalance.checks import check_choice

OPTIMISER_CHOICES = ("paper", "trl")


@dataclasses.dataclass(frozen=True)
class PaperOptimiser:
    """``GRPOConfig`` optimiser fields of one paper's runs, where they come from, and which of them
    the paper does not state (those are the AR-Lopti K&K scripts' values)."""

    source: str
    fields: dict[str, object]
    unstated: tuple[str, ...] = ()


AR_LOPTI_FIELDS: dict[str, object] = {
    "learning_rate": 1e-6,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "weight_decay": 0.01,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "max_grad_norm": 1.0,
}
AR_LOPTI_OPTIMISER = PaperOptimiser(
    "AR-Lopti K&K scripts (ppo_trainer.yaml, train_kklogic_*.sh): AdamW, constant schedule",
    AR_LOPTI_FIELDS,
)
NTHR_OPTIMISER = PaperOptimiser(
    "NTHR paper, training details: lr 1e-6 (5e-7 for its 0.5B model)",
    AR_LOPTI_FIELDS,
    unstated=tuple(key for key in AR_LOPTI_FIELDS if key != "learning_rate"),
)
NTHR_PAPER_PREFIX = "nthr_"
"""The presets of the NTHR paper's own runs (``nthr_math_*``, ``nthr_r1distill_*``)."""


def paper_optimiser(method: Method) -> PaperOptimiser:
    """The optimiser of the paper ``method`` comes from: the NTHR paper's runs for its presets, the
    AR-Lopti K&K scripts for every other method (every base preset, TR-GRPO's included, is on their base;
    the TR-GRPO reviews say its setup follows AR-Lopti)."""
    return NTHR_OPTIMISER if method.name.startswith(NTHR_PAPER_PREFIX) else AR_LOPTI_OPTIMISER


def optimiser_fields(method: Method, optimiser: str) -> dict[str, object]:
    """The optimiser defaults of ``grpo_config_for_method``: the paper's (``"paper"``) or none, TRL's
    own defaults (``"trl"``)."""
    check_choice("optimiser", optimiser, OPTIMISER_CHOICES)
    return dict(paper_optimiser(method).fields) if optimiser == "paper" else {}
