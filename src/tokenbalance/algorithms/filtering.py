"""DAPO dynamic sampling (Yu et al. 2025, arXiv 2503.14476, §3.2): train only on groups whose rewards are not all
equal.

The pure decisions on given rewards and the :class:`DynamicSamplingConfig`; the runner's rollout loop calls them.
Unlike verl (which raises), ``on_shortfall="train"`` (default) trains on the groups it has when the cap is reached and
reports the shortfall. docs/methods.md §9."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tokenbalance.algorithms import _checks as check
from tokenbalance.algorithms._checks import param

__all__ = [
    "DynamicSamplingConfig",
    "dynamic_sampling_metrics",
    "filter_values",
    "informative_groups",
    "informative_rows",
    "select_informative",
]

FILTER_METRICS = ("reward", "correct")
SHORTFALL_RULES = ("train", "error")


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: must be an int >= {low}, got {value!r}")


@dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO dynamic sampling (docs/methods.md §9), carried by a :class:`Method`."""

    enabled: bool = param(
        False,
        "drop groups whose values (``metric``) are all equal and sample more prompts until the step has "
        "``target`` informative groups. Off by default (the AR-Lopti reference does not filter); on in "
        "the NTHR paper presets.",
    )
    target_groups: int | None = param(
        None,
        "informative groups per step; ``None`` (default) = the run's prompts per step, so a step trains "
        "on as many groups as without filtering (verl: ``data.train_batch_size``).",
    )
    max_extra_rounds: int = param(
        9,
        "rollout rounds allowed after the first one of a step (>= 0; 0 = filter only). Default 9: ten "
        "generation batches in all, verl's DAPO recipes' ``max_num_gen_batches=10``.",
    )
    metric: str = param(
        "reward",
        'the value compared within a group. ``"reward"`` (default; verl\'s default metric): the outcome '
        'reward, so exactly the zero-advantage groups go. ``"correct"`` (the DAPO recipes\' '
        "``metric=acc``): correctness, keeping groups with 0 < #correct < G; on graded rewards (K&K) it "
        "also drops all-wrong groups with different format scores.",
    )
    on_shortfall: str = param(
        "train",
        'when ``max_extra_rounds`` are spent short of the target: ``"train"`` (default) on the '
        'informative groups collected, or ``"error"`` (verl\'s behaviour).',
    )

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"dynamic_sampling.enabled: must be a bool, got {self.enabled!r}")
        if self.target_groups is not None:
            _check_int("dynamic_sampling.target_groups", self.target_groups, 1)
        _check_int("dynamic_sampling.max_extra_rounds", self.max_extra_rounds, 0)
        check.choice("dynamic_sampling.metric", self.metric, FILTER_METRICS)
        check.choice("dynamic_sampling.on_shortfall", self.on_shortfall, SHORTFALL_RULES)

    @property
    def max_rounds(self) -> int:
        """Rollout rounds a step may take in all (1 when disabled)."""
        return 1 + self.max_extra_rounds if self.enabled else 1

    def target(self, prompts_per_step: int) -> int:
        """Informative groups a step needs: ``target_groups``, or ``prompts_per_step`` when None."""
        _check_int("prompts_per_step", prompts_per_step, 1)
        return prompts_per_step if self.target_groups is None else self.target_groups

    def wants_another_round(self, kept_groups: int, target: int, rounds_done: int) -> bool:
        """Whether the step samples again (enabled, short of ``target``, rounds left); ``ValueError`` when the rounds
        are spent short of the target and ``on_shortfall="error"``."""
        _check_int("kept_groups", kept_groups, 0)
        _check_int("target", target, 1)
        _check_int("rounds_done", rounds_done, 1)
        if not self.enabled or kept_groups >= target:
            return False
        if rounds_done < self.max_rounds:
            return True
        if self.on_shortfall == "error":
            raise ValueError(
                f"dynamic sampling: {kept_groups} informative group(s) of {target} after {rounds_done} rollout "
                f"round(s) (dynamic_sampling.max_extra_rounds={self.max_extra_rounds}); the prompts are too easy "
                "or too hard for the policy: raise max_extra_rounds or set on_shortfall='train'"
            )
        return False


def filter_values(config: DynamicSamplingConfig, rewards: Tensor, correct: Tensor | None = None) -> Tensor:
    """The values ``config.metric`` compares: the rewards, or ``correct`` (bool, same shape, required for
    ``metric="correct"``) as floats."""
    if not isinstance(config, DynamicSamplingConfig):
        raise ValueError(f"config: expected a DynamicSamplingConfig, got {type(config).__name__}")
    if config.metric == "reward":
        return rewards
    if correct is None:
        raise ValueError("correct: required by dynamic_sampling.metric='correct'")
    if correct.dtype != torch.bool:
        raise ValueError(f"correct: expected a bool tensor, got {correct.dtype}")
    check.shape("correct", correct, tuple(rewards.shape))
    return correct.double()


@torch.no_grad()
def informative_groups(values_PG: Tensor) -> Tensor:
    """[P] bool: rows of ``values_PG`` ([P, G] finite rewards or 0/1 correctness) whose G values are not all equal, or
    G = 1."""
    check.ndim("values_PG", values_PG, 2, "PG")
    check.finite("values_PG", values_PG.detach())
    values = values_PG.detach()
    if values.shape[1] <= 1:
        return torch.ones(values.shape[0], dtype=torch.bool, device=values.device)
    return (values != values[:, :1]).any(dim=1)


@torch.no_grad()
def informative_rows(values_B: Tensor, group_ids_B: Tensor) -> Tensor:
    """[B] bool: rows whose group (by ``group_ids_B``) is informative (:func:`informative_groups`), any group sizes."""
    check.ndim("values_B", values_B, 1, "B")
    check.shape("group_ids_B", group_ids_B, tuple(values_B.shape))
    if group_ids_B.dtype.is_floating_point or group_ids_B.dtype == torch.bool:
        raise ValueError(f"group_ids_B: expected an integer dtype (int64), got {group_ids_B.dtype}")
    check.finite("values_B", values_B.detach())
    values = values_B.detach()
    _, inverse = torch.unique(group_ids_B.detach(), return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    low = torch.full((groups,), float("inf"), dtype=values.dtype, device=values.device)
    low = low.scatter_reduce(0, inverse, values, "amin")
    high = torch.full((groups,), float("-inf"), dtype=values.dtype, device=values.device)
    high = high.scatter_reduce(0, inverse, values, "amax")
    size = torch.zeros(groups, dtype=torch.long, device=values.device).scatter_add(0, inverse, torch.ones_like(inverse))
    return ((high > low) | (size == 1))[inverse]


def select_informative(informative_P: Tensor, kept_groups: int, target: int) -> Tensor:
    """[K] int64 ascending indices of the first informative groups of a round (``informative_P``), K <= ``target -
    kept_groups``: a step never trains on more than ``target`` groups (verl trims the same way)."""
    check.ndim("informative_P", informative_P, 1, "P")
    if informative_P.dtype != torch.bool:
        raise ValueError(f"informative_P: expected a bool tensor, got {informative_P.dtype}")
    _check_int("kept_groups", kept_groups, 0)
    _check_int("target", target, 1)
    indices = informative_P.nonzero(as_tuple=True)[0]
    return indices[: max(target - kept_groups, 0)]


def dynamic_sampling_metrics(
    rounds: int, groups_drawn: int, groups_informative: int, groups_kept: int, target: int
) -> dict[str, float]:
    """``sampling/*`` metrics of one step: ``rounds``, ``groups_drawn``, ``informative_frac`` (informative / drawn),
    ``groups_kept`` and ``shortfall`` (target - kept, 0 when met)."""
    for name, value, low in (
        ("rounds", rounds, 1),
        ("groups_drawn", groups_drawn, 0),
        ("groups_informative", groups_informative, 0),
        ("groups_kept", groups_kept, 0),
        ("target", target, 1),
    ):
        _check_int(name, value, low)
    if groups_informative > groups_drawn or groups_kept > min(groups_informative, target):
        raise ValueError(
            f"dynamic sampling counts: need kept <= min(informative, target) and informative <= drawn, got "
            f"drawn={groups_drawn}, informative={groups_informative}, kept={groups_kept}, target={target}"
        )
    return {
        "sampling/rounds": float(rounds),
        "sampling/groups_drawn": float(groups_drawn),
        "sampling/informative_frac": groups_informative / groups_drawn if groups_drawn else 0.0,
        "sampling/groups_kept": float(groups_kept),
        "sampling/shortfall": float(target - groups_kept),
    }
