"""Update schedules: which tokens each optimizer pass trains on.

:func:`single_pass` (every valid token), :func:`split_passes` (two disjoint token sets) and :func:`lopti_passes` (Yang
et al. 2025, arXiv 2505.12929, Algorithm 1: low-probability tokens first, then high). Differs from the reference: the
indicator is ANDed with the response mask explicitly (the reference relies on padding having p = 1), and the order is
a named option (``high_first``) instead of a negative threshold. :func:`random_split_passes` is the step-count
control: Lopti's two passes over a random halving of the tokens instead of the probability split. docs/methods.md §4
has the rest."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import masked_fill_invalid, param
from tokenbalance.types import UpdatePass

LOPTI_ORDERS = ("low_first", "high_first")
LOPTI_THRESHOLD_MODES = ("prob", "quantile")


@dataclass(frozen=True)
class LoptiConfig:
    """Lopti hyper-parameters (docs/methods.md §4)."""

    eta: float = param(
        0.5,
        'probability threshold in (0, 1); tokens with p_old < eta are "low". Paper 0.5 (Figure 4, Tables '
        "1 and 7); the released Lopti-only script uses 0.4.",
    )
    order: str = param(
        "low_first",
        '``"low_first"`` (the method) or ``"high_first"`` (the order-reversal ablation, the reference\'s '
        "negative eta).",
    )
    threshold_mode: str = param(
        "prob",
        '``"prob"`` (threshold eta) or ``"quantile"`` (threshold = the ``portion`` quantile of the '
        "batch's valid-token probabilities; the reference's eta = 0 \"portion\" mode).",
    )
    portion: float | None = param(None, 'quantile in (0, 1) for ``"quantile"`` mode.')
    renormalize_per_stage: bool = param(
        False,
        "divide each pass by its own token count instead of all valid tokens (not the reference; changes "
        "the step size).",
    )
    strict_less: bool = param(True, "``p < eta`` (reference) or ``p <= eta`` (the paper's I(pi <= eta)).")

    def __post_init__(self) -> None:
        check.in_range("lopti.eta", self.eta, 0.0, 1.0, low_open=True, high_open=True)
        check.choice("lopti.order", self.order, LOPTI_ORDERS)
        check.choice("lopti.threshold_mode", self.threshold_mode, LOPTI_THRESHOLD_MODES)
        if self.threshold_mode == "quantile":
            if self.portion is None:
                raise ValueError("lopti.portion: required (in (0, 1)) when threshold_mode='quantile'")
            check.in_range("lopti.portion", self.portion, 0.0, 1.0, low_open=True, high_open=True)


SINGLE_PASS_NAME = "all"


def lopti_pass_names(config: LoptiConfig) -> tuple[str, str]:
    """Lopti's pass names in execution order (known before any tensor is seen)."""
    return ("lopti_low", "lopti_high") if config.order == "low_first" else ("lopti_high", "lopti_low")


def _check_pass_inputs(advantages_BT: torch.Tensor, response_mask_BT: torch.Tensor) -> torch.Tensor:
    check.ndim("advantages_BT", advantages_BT, 2, "BT")
    check.shape("response_mask_BT", response_mask_BT, tuple(advantages_BT.shape))
    check.finite("advantages_BT", advantages_BT, response_mask_BT)
    return response_mask_BT.bool()


def single_pass(advantages_BT: torch.Tensor, response_mask_BT: torch.Tensor) -> list[UpdatePass]:
    """One pass over every valid token."""
    mask_BT = _check_pass_inputs(advantages_BT, response_mask_BT)
    return [
        UpdatePass(
            name=SINGLE_PASS_NAME,
            advantages_BT=masked_fill_invalid(advantages_BT.detach(), mask_BT),
            policy_mask_BT=mask_BT,
            kl_entropy_mask_BT=mask_BT,
            normaliser_mask_BT=mask_BT,
        )
    ]


def split_passes(
    advantages_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    first_BT: torch.Tensor,
    names: tuple[str, str],
    *,
    renormalize_per_pass: bool = False,
) -> list[UpdatePass]:
    """Two passes over disjoint tokens: the valid tokens of ``first_BT`` first, the other valid tokens second (Lopti,
    a token rule's split). Each pass masks its advantages and its KL / entropy terms; the denominators count all valid
    tokens unless ``renormalize_per_pass``."""
    mask_BT = _check_pass_inputs(advantages_BT, response_mask_BT)
    check.shape("first_BT", first_BT, tuple(mask_BT.shape))
    first_BT = first_BT.bool() & mask_BT
    adv_BT = masked_fill_invalid(advantages_BT.detach(), mask_BT)
    passes = []
    for name, stage_BT in zip(names, (first_BT, mask_BT & ~first_BT)):
        passes.append(
            UpdatePass(
                name=name,
                advantages_BT=masked_fill_invalid(adv_BT, stage_BT),
                policy_mask_BT=stage_BT,
                kl_entropy_mask_BT=stage_BT,
                normaliser_mask_BT=stage_BT if renormalize_per_pass else mask_BT,
            )
        )
    return passes


def lopti_low_mask(
    old_logp_BT: torch.Tensor, response_mask_BT: torch.Tensor, config: LoptiConfig
) -> tuple[torch.Tensor, float]:
    """The low-probability indicator (valid tokens only) and the threshold used."""
    mask_BT = response_mask_BT.bool()
    check.shape("old_logp_BT", old_logp_BT, tuple(mask_BT.shape))
    check.finite("old_logp_BT", old_logp_BT, mask_BT)
    prob_BT = torch.exp(masked_fill_invalid(old_logp_BT.detach(), mask_BT))
    threshold = config.eta
    if config.threshold_mode == "quantile":
        valid = prob_BT[mask_BT].double()
        portion = float(config.portion) if config.portion is not None else 0.0  # set in quantile mode
        threshold = float(torch.quantile(valid, portion).item()) if valid.numel() else 0.0
    low_BT = prob_BT < threshold if config.strict_less else prob_BT <= threshold
    return low_BT & mask_BT, threshold


def lopti_passes(
    advantages_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    config: LoptiConfig,
) -> tuple[list[UpdatePass], dict[str, float]]:
    """Lopti's two passes (Algorithm 1), low-probability tokens first (last with ``order="high_first"``), from
    ``advantages_BT`` (AR-reweighted if on) and ``old_logp_BT`` at the log-prob temperature. Returns the passes and
    ``lopti/threshold`` (eta or the quantile value), ``lopti/low_token_frac`` (the reference's ``sep_portion``)."""
    mask_BT = response_mask_BT.bool()  # split_passes checks the inputs
    low_BT, threshold = lopti_low_mask(old_logp_BT, mask_BT, config)
    low_first = config.order == "low_first"
    passes = split_passes(
        advantages_BT,
        mask_BT,
        low_BT if low_first else mask_BT & ~low_BT,
        lopti_pass_names(config),
        renormalize_per_pass=config.renormalize_per_stage,
    )
    valid = float(mask_BT.sum().item())
    metrics = {
        "lopti/threshold": float(threshold),
        "lopti/low_token_frac": float(low_BT.sum().item()) / valid if valid else 0.0,
    }
    return passes, metrics


RANDOM_SPLIT_PASS_NAMES = ("random_first", "random_second")


@dataclass(frozen=True)
class RandomSplitConfig:
    """The step-count control (docs/methods.md §4.1): two optimizer passes, as Lopti takes, over a random split of the
    valid tokens that ignores their probability. Not a method of any paper: it separates "a second Adam step per
    batch" from "isolating the low-probability tokens"."""

    fraction: float = param(
        0.5, "the probability that a valid token goes to the first pass (0.5: the batch randomly halved)."
    )
    seed: int = param(
        0,
        "mixed with the batch's own digest (its old log-probs' bytes and mask) into the generator that draws the "
        "halves: the same batch gets the same halves on every run and runner.",
    )

    def __post_init__(self) -> None:
        check.in_range("random_split.fraction", self.fraction, 0.0, 1.0, low_open=True, high_open=True)
        check.in_range("random_split.seed", self.seed, 0, 2**31 - 1)


def random_first_mask(
    old_logp_BT: torch.Tensor, response_mask_BT: torch.Tensor, config: RandomSplitConfig
) -> torch.Tensor:
    """[B, T] bool: each valid token independently in the first pass with probability ``config.fraction``, drawn by a
    CPU generator seeded from ``config.seed`` and the batch's digest (the bytes of ``old_logp_BT`` at valid positions
    and of the mask), so the draw is reproducible and independent of each token's probability."""
    mask_BT = response_mask_BT.bool()
    check.shape("old_logp_BT", old_logp_BT, tuple(mask_BT.shape))
    digest = hashlib.sha256(str(config.seed).encode())
    digest.update(mask_BT.detach().to("cpu").contiguous().numpy().tobytes())
    valid = old_logp_BT.detach().to("cpu", torch.float32)[mask_BT.to("cpu")].contiguous()
    digest.update(valid.numpy().tobytes())
    generator = torch.Generator().manual_seed(int.from_bytes(digest.digest()[:8], "little") & (2**63 - 1))
    draw_BT = torch.rand(tuple(mask_BT.shape), generator=generator)
    return (draw_BT < config.fraction).to(mask_BT.device) & mask_BT


def random_split_passes(
    advantages_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    config: RandomSplitConfig,
) -> tuple[list[UpdatePass], dict[str, float]]:
    """Two passes over a random split of the valid tokens (:func:`random_first_mask`), each normalised by all valid
    tokens as Lopti's are: together they hold GRPO's one pass, token for token. Returns the passes and
    ``random_split/first_token_frac``."""
    mask_BT = response_mask_BT.bool()
    first_BT = random_first_mask(old_logp_BT, mask_BT, config)
    passes = split_passes(advantages_BT, mask_BT, first_BT, RANDOM_SPLIT_PASS_NAMES)
    valid = float(mask_BT.sum().item())
    return passes, {"random_split/first_token_frac": float(first_BT.sum().item()) / valid if valid else 0.0}
