"""NTHR on verl: its settings, its launch checks, and one step's weighted advantages.

NTHR (docs/methods.md §6) is the ``tokenbalance_nthr`` trainer (:mod:`.nthr_trainer`): verl's old-log-prob
forward also returns the response tokens' last-layer hidden states (:mod:`.nthr_worker`); after verl's
estimator, :func:`nthr_advantages` runs our trainer's ``nthr_token_weights`` on the whole batch, and the loss
runs unchanged (ours with the method's other stages, or verl's). Settings: the method's NTHR stage
(``policy_loss.method=nthr``, ``policy_loss.overrides.nthr.*``), then ``+trainer.v1.tokenbalance_nthr.<key>``
(an NTHRConfig field, or ``max_reward``: by default our reward's maximum). docs/verl.md, "NTHR on verl".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from tokenbalance.algorithms.methods import NTHRInputs
from tokenbalance.algorithms.nthr import NTHRConfig, nthr_correct, nthr_token_weights
from tokenbalance.checks import check_range
from tokenbalance.integrations.verl.advantages import group_ids_from_index
from tokenbalance.integrations.verl.names import NTHR_HIDDEN_FIELD, NTHR_TRAINER
from tokenbalance.integrations.verl.reward import FUNCTION_MAX_REWARD, REWARD_PATH

SECTION = f"trainer.v1.{NTHR_TRAINER}"
MAX_REWARD = "max_reward"
STRATEGIES = ("fsdp2",)
# what the trainer reads back from TransferQueue after verl's advantages (uid: the prompt group)
BATCH_FIELDS = ("responses", "response_mask", "old_log_probs", "advantages", "rm_scores", "uid", NTHR_HIDDEN_FIELD)


@dataclasses.dataclass(frozen=True)
class NTHRSettings:
    """NTHR's hyper-parameters and the reward of a correct response (None: not known)."""

    config: NTHRConfig
    max_reward: float | None


def reward_maximum(reward_function: Mapping | None) -> float | None:
    """The reward of a correct response when ``reward.custom_reward_function`` is ours, else None."""
    if not reward_function or str(reward_function.get("path")) != REWARD_PATH:
        return None
    kwargs = dict(reward_function.get("reward_kwargs") or {})
    if kwargs.get("reward") is not None:
        return float(kwargs.get("max_reward", FUNCTION_MAX_REWARD))
    from tokenbalance.tasks import DEFAULT_TASK, get_task

    return float(get_task(kwargs.get("task", DEFAULT_TASK)).max_reward)


def nthr_settings(
    section: Mapping | None, reward_function: Mapping | None = None, base: NTHRConfig | None = None
) -> NTHRSettings:
    """The settings: the method's NTHR stage ``base`` (None: NTHR's defaults) with the keys of
    ``trainer.v1.tokenbalance_nthr`` (``section``) on top; errors name the key."""
    values = dict(section or {})
    valid = [field.name for field in dataclasses.fields(NTHRConfig)] + [MAX_REWARD]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ValueError(f"{SECTION}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    max_reward = values.pop(MAX_REWARD, None)
    try:
        config = dataclasses.replace(base or NTHRConfig(), **values)
        if max_reward is not None:
            check_range(MAX_REWARD, max_reward)
            max_reward = float(max_reward)
    except ValueError as error:
        raise ValueError(f"{SECTION}.{error}") from None
    if max_reward is None:
        max_reward = reward_maximum(reward_function)
    if config.positives == "correct" and config.correct_threshold is None and max_reward is None:
        raise ValueError(
            f"{SECTION}.{MAX_REWARD}: NTHR's positives='correct' (the default) needs the reward of a correct "
            f"response; set +{SECTION}.{MAX_REWARD}=..., or +{SECTION}.correct_threshold=..., or "
            f"+{SECTION}.positives=advantage_sign"
        )
    return NTHRSettings(config, max_reward)


def check_nthr_launch(select: Callable[..., Any], base: NTHRConfig | None = None) -> NTHRSettings:
    """Raise ``ValueError`` naming the key when the ``tokenbalance_nthr`` trainer cannot run this launch.

    ``select(dotted_key, default)`` reads the composed config. The hidden states come from verl's
    old-log-prob forward through a decoder hook of the FSDP2 engine, whole (one sequence-parallel
    rank), so that forward must run (no rollout-correction bypass) on FSDP2 without Ulysses.
    """
    strategy = str(select("actor_rollout_ref.actor.strategy", "fsdp"))
    if strategy not in STRATEGIES:
        raise ValueError(
            f"actor_rollout_ref.actor.strategy={strategy!r}: the {NTHR_TRAINER} trainer reads the hidden states "
            f"and the output layer of verl's FSDP2 engine only (tested on CPU); set actor_rollout_ref.actor.strategy="
            f"fsdp2 and actor_rollout_ref.ref.strategy=fsdp2"
        )
    for key in (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
    ):
        if int(select(key, 1) or 1) > 1:
            raise ValueError(
                f"{key}={select(key, 1)}: the {NTHR_TRAINER} trainer needs each sequence's hidden states on one "
                "rank (verl gathers only log-probs and entropy across Ulysses ranks); set it to 1"
            )
    if bool(select("algorithm.rollout_correction.bypass_mode", False)):
        raise ValueError(
            f"algorithm.rollout_correction.bypass_mode=True: the {NTHR_TRAINER} trainer takes the hidden states from "
            "verl's old-log-prob forward, which bypass mode skips; set it to False"
        )
    return nthr_settings(select(SECTION, None), select("reward.custom_reward_function", None), base)


def weight_metrics(weights_BT: torch.Tensor, advantages_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """``nthr/neg_weight_{min,mean}`` over the valid tokens with a negative advantage,
    ``nthr/pos_weight_{min,max}`` over those with a positive one (1.0 where there are none), and
    the token mean of the advantages before and after the weights, ``nthr/adv_mean`` and
    ``nthr/adv_weighted_mean`` (verl's ``critic/advantages/mean`` of the stored advantages, when verl
    added no padding samples to the batch)."""
    valid = advantages_BT[mask_BT].double()
    out = {
        "nthr/adv_mean": float(valid.mean()) if valid.numel() else 0.0,
        "nthr/adv_weighted_mean": float((valid * weights_BT[mask_BT].double()).mean()) if valid.numel() else 0.0,
    }
    for sign, names in (("neg", ("min", "mean")), ("pos", ("min", "max"))):
        tokens = mask_BT & (advantages_BT < 0 if sign == "neg" else advantages_BT > 0)
        values = weights_BT[tokens].double()
        for name in names:
            out[f"nthr/{sign}_weight_{name}"] = float(getattr(values, name)()) if values.numel() else 1.0
    return out


@torch.no_grad()
def nthr_advantages(
    data, head: torch.nn.Linear, settings: NTHRSettings, temperature: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """One step's NTHR-weighted advantages, as verl stores them, and the ``nthr/*`` metrics.

    Args:
        data: verl's batch read back from TransferQueue (:data:`BATCH_FIELDS`): jagged
            ``[B, response]`` tensors, the old policy's jagged ``[B, response, D]`` hidden states
            under ``NTHR_HIDDEN_FIELD`` and the per-response ``uid``.
        head: the old policy's output layer (``lm_head``, full weight).
        settings: :func:`nthr_settings`.
        temperature: the log-prob temperature (verl: the rollout's).

    Returns:
        The jagged ``[B, response]`` advantages x NTHR weights, and ``nthr_token_weights``' metrics
        plus :func:`weight_metrics`.
    """
    from verl.workers.utils.padding import response_to_nested

    response_mask = data["response_mask"]
    padded = data.select(*(key for key in BATCH_FIELDS if key != "uid")).to_padded_tensor()
    mask_BT = padded["response_mask"].bool()
    advantages_BT = padded["advantages"]
    config = settings.config
    correct_B = None
    if config.positives == "correct":
        correct_B = nthr_correct(padded["rm_scores"].sum(dim=-1), config, settings.max_reward)
    inputs = NTHRInputs.from_output_layer(
        head, padded["responses"], padded[NTHR_HIDDEN_FIELD], temperature, correct_B=correct_B
    )
    weights_BT, metrics = nthr_token_weights(
        advantages_BT,
        mask_BT,
        group_ids_from_index(list(data["uid"]), mask_BT.shape[0]),
        inputs.tokens_BT,
        padded["old_log_probs"],
        inputs.hidden_BTD,
        inputs.unembed_VD,
        config,
        temperature=temperature,
        unembed_bias_V=inputs.unembed_bias_V,
        correct_B=inputs.correct_B,
    )
    metrics.update(weight_metrics(weights_BT, advantages_BT, mask_BT))
    return response_to_nested(advantages_BT * weights_BT, response_mask), metrics
