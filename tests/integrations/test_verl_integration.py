"""tokenbalance inside verl: registry round trips, equality with our core and with verl's own
losses / advantages, the Lopti pass schedule, launch validation, plugin discovery, K&K reward.

All comparisons use float64 and verl's real config classes (``ActorConfig``, ``AlgoConfig``).
The Lopti test here drives :func:`run_update_passes` (the function the trainer's
``_update_actor`` calls) with a mini-batch loop on a tiny torch model and checks it against our
core's schedule step for step; the trainer class itself and ``lopti_ppo_loss`` on verl's nested
micro-batches are tested in ``test_verl_lopti_trainer.py``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl")

from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig

from tests.tolerances import assert_close_in, dtype_atol
from tokenbalance.algorithms.advantages import discounted_returns, grpo_advantages, reinforce_pp_advantages
from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.algorithms.methods import (
    AdvantageConfig,
    KLConfig,
    Method,
    build_update_passes,
    compute_advantages,
    passes_from_advantages,
)
from tokenbalance.algorithms.presets import get_method
from tokenbalance.algorithms.surrogate import ClipConfig
from tokenbalance.integrations.verl.config import (
    TokenBalancePolicyLossConfig,
    lopti_config,
)
from tokenbalance.integrations.verl.lopti import lopti_pass_names, run_update_passes
from tokenbalance.integrations.verl.losses import lopti_pass_loss
from tokenbalance.integrations.verl.names import (
    ADVANTAGE_ESTIMATORS,
    LOPTI_TRAINER,
    POLICY_LOSS_CONFIG_TARGET,
    POLICY_LOSS_NAMES,
    SYNC_TRAINER,
    UPDATE_PASS_KEY,
)
from tokenbalance.integrations.verl.reward import compute_score
from tokenbalance.integrations.verl.validation import validate_launch

CLIP = ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=10.0, log_ratio_clamp=20.0)  # verl's clamp


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def float64_default():
    """Exact comparisons in float64; the default dtype is restored for the other test modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def make_batch(seed: int = 0, rows: int = 8, length: int = 6):
    """Two groups of four responses with ragged lengths; old log-probs far enough from the
    current ones that clipping and dual clipping act."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 5, 1, 4, 6, 2, 5])[:rows]
    mask_BT = torch.arange(length)[None, :] < lengths[:, None]
    logp_BT = -torch.rand(rows, length, generator=gen) * 2.0
    old_BT = logp_BT + (torch.rand(rows, length, generator=gen) - 0.5) * 0.9
    old_BT[2, 0] = logp_BT[2, 0] - 3.0  # ratio e^3 > c = 10 on a negative-advantage token: dual clip
    old_BT[0, 1] = logp_BT[0, 1] - 3.0  # and a large ratio on a positive one
    ref_BT = logp_BT + (torch.rand(rows, length, generator=gen) - 0.5) * 0.4
    scores_B = torch.tensor([3.0, -0.5, -3.0, 3.0, -1.0, -1.0, 3.0, -3.0])[:rows]
    group_ids_B = torch.arange(rows) // 4
    uids = np.array([f"uid-{int(g)}" for g in group_ids_B], dtype=object)
    token_rewards_BT = torch.zeros(rows, length)
    token_rewards_BT[torch.arange(rows), lengths - 1] = scores_B
    return {
        "mask": mask_BT,
        "logp": logp_BT,
        "old": old_BT,
        "ref": ref_BT,
        "scores": scores_B,
        "groups": group_ids_B,
        "uids": uids,
        "token_rewards": token_rewards_BT,
    }


def actor_config(policy_loss, *, use_kl_loss=False, batch=None, **overrides) -> ActorConfig:
    """A real verl ActorConfig with the AR-Lopti K&K clip settings and verl's global batch info."""
    values = {
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.24,
        "clip_ratio_c": 10.0,
        "kl_loss_type": "low_var_kl",
        "kl_loss_coef": 0.001,
    }
    values.update(overrides)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_micro_batch_size_per_gpu=2,
        use_kl_loss=use_kl_loss,
        policy_loss=policy_loss,
        **values,
    )
    if batch is not None:
        config.global_batch_info.update(
            dp_size=1, batch_num_tokens=int(batch["mask"].sum()), global_batch_size=batch["mask"].shape[0]
        )
    return config


def core_method(preset: str, kl: KLConfig | None = None) -> Method:
    """Our preset with verl's clamps; the KL term off unless given (verl's ppo_loss adds it)."""
    return get_method(preset).replace(clip=CLIP, kl=kl or KLConfig(placement="none"))


def grad_of(loss, tensor):
    (grad,) = torch.autograd.grad(loss, tensor)
    return grad


# --------------------------------------------------------------------------- (a) our loss via verl's registry


@pytest.mark.parametrize(
    "loss_mode, preset",
    [("tokenbalance_grpo", "grpo"), ("tokenbalance_ar", "ar"), ("tokenbalance_tr_grpo", "tr_grpo")],
)
def test_registered_loss_through_verl_registry_equals_core_pass_loss(loss_mode, preset):
    batch = make_batch()
    method = core_method(preset)
    passes, _ = build_update_passes(method, batch["scores"], batch["groups"], batch["mask"], batch["old"])
    advantages_BT = compute_advantages(method, batch["scores"], batch["groups"], batch["mask"])
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode=loss_mode), batch=batch)

    logp_verl = batch["logp"].clone().requires_grad_(True)
    loss_fn = core_algos.get_policy_loss_fn(loss_mode)
    verl_loss, metrics = loss_fn(
        old_log_prob=batch["old"],
        log_prob=logp_verl,
        advantages=advantages_BT,
        response_mask=batch["mask"],
        loss_agg_mode="token-mean",
        config=config,
        rollout_is_weights=None,
    )
    logp_core = batch["logp"].clone().requires_grad_(True)
    core = pass_loss(method, passes[0], logp_core, batch["old"])

    assert metrics["actor/pg_clipfrac"] > 0 and metrics["actor/pg_clipfrac_lower"] > 0  # clipping acted
    torch.testing.assert_close(verl_loss, core.loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(verl_loss, logp_verl), grad_of(core.loss, logp_core), rtol=0, atol=1e-12)
    assert abs(metrics["actor/pg_clipfrac"] - core.metrics["clip/frac"]) < 1e-12
    if preset != "grpo":  # the token weights change the loss: the comparison is not vacuous
        grpo_passes, _ = build_update_passes(
            core_method("grpo"), batch["scores"], batch["groups"], batch["mask"], batch["old"]
        )
        grpo_loss = pass_loss(core_method("grpo"), grpo_passes[0], batch["logp"], batch["old"]).loss
        assert abs(grpo_loss.item() - core.loss.item()) > 1e-4


def test_registered_loss_uses_global_normaliser_across_micro_batches():
    batch = make_batch()
    method = core_method("ar")
    advantages_BT = compute_advantages(method, batch["scores"], batch["groups"], batch["mask"])
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode="tokenbalance_ar", ar_alpha=0.3), batch=batch)
    loss_fn = core_algos.get_policy_loss_fn("tokenbalance_ar")
    parts = [
        loss_fn(
            batch["old"][rows], batch["logp"][rows], advantages_BT[rows], batch["mask"][rows], "token-mean", config
        )[0]
        for rows in (slice(0, 3), slice(3, 8))
    ]
    whole, _ = loss_fn(batch["old"], batch["logp"], advantages_BT, batch["mask"], "token-mean", config)
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=0, atol=1e-12)


def test_ar_current_detached_applies_neg_adv_weight_through_verl_config():
    """``ar_prob_source=current_detached`` with ``ar_neg_adv_weight=0.5`` from verl's config: the loss
    is GRPO's on A * (0.3 pi_current + 0.7) * (0.5 where A <= 0), pi_current detached."""
    from tokenbalance.algorithms.weights import ARConfig, ar_token_weights

    batch = make_batch()
    policy_loss = TokenBalancePolicyLossConfig(
        loss_mode="tokenbalance_ar", ar_alpha=0.3, ar_prob_source="current_detached", ar_neg_adv_weight=0.5
    )
    config = actor_config(policy_loss, batch=batch)
    grpo = core_method("grpo")
    advantages_BT = compute_advantages(grpo, batch["scores"], batch["groups"], batch["mask"])
    assert bool((advantages_BT[batch["mask"]] < 0).any())
    loss_fn = core_algos.get_policy_loss_fn("tokenbalance_ar")
    logp_verl = batch["logp"].clone().requires_grad_(True)
    verl_loss, _ = loss_fn(batch["old"], logp_verl, advantages_BT, batch["mask"], "token-mean", config)

    weights_BT = ar_token_weights(batch["logp"], batch["mask"], ARConfig(alpha=0.3))
    expected_adv = advantages_BT * weights_BT * torch.where(advantages_BT > 0, 1.0, 0.5)
    (grpo_pass,), _ = build_update_passes(grpo, batch["scores"], batch["groups"], batch["mask"], batch["old"])
    manual_pass = dataclasses.replace(grpo_pass, advantages_BT=expected_adv)
    logp_core = batch["logp"].clone().requires_grad_(True)
    expected = pass_loss(grpo, manual_pass, logp_core, batch["old"]).loss
    torch.testing.assert_close(verl_loss, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(verl_loss, logp_verl), grad_of(expected, logp_core), rtol=0, atol=1e-12)
    unweighted = dataclasses.replace(policy_loss, ar_neg_adv_weight=None)
    plain_config = actor_config(unweighted, batch=batch)
    plain, _ = loss_fn(batch["old"], batch["logp"], advantages_BT, batch["mask"], "token-mean", plain_config)
    assert abs(plain.item() - verl_loss.item()) > 1e-4  # the factor acts


# --------------------------------------------------------------------------- (b) verl's own maths where they coincide


def test_verl_vanilla_loss_equals_core_grpo_loss_and_gradient():
    batch = make_batch(seed=1)
    method = core_method("grpo")
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    passes, _ = build_update_passes(method, batch["scores"], batch["groups"], batch["mask"], batch["old"])
    config = actor_config(PolicyLossConfig(loss_mode="vanilla"), batch=batch)
    logp_verl = batch["logp"].clone().requires_grad_(True)
    verl_loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        batch["old"], logp_verl, advantages_BT, batch["mask"], "token-mean", config, None
    )
    logp_core = batch["logp"].clone().requires_grad_(True)
    core = pass_loss(method, passes[0], logp_core, batch["old"])
    assert metrics["actor/pg_clipfrac_lower"] > 0
    torch.testing.assert_close(verl_loss, core.loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(verl_loss, logp_verl), grad_of(core.loss, logp_core), rtol=0, atol=1e-12)
    # verl computes its fractions in float32
    assert abs(metrics["actor/pg_clipfrac"] - core.metrics["clip/frac"]) < 1e-6
    assert abs(metrics["actor/pg_clipfrac_lower"] - core.metrics["clip/dual_frac"]) < 1e-6


def test_verl_grpo_and_reinforce_pp_advantages_equal_ours():
    batch = make_batch(seed=2)
    verl_grpo, _ = core_algos.compute_grpo_outcome_advantage(
        batch["token_rewards"].clone(), batch["mask"].double(), batch["uids"], epsilon=1e-6
    )
    ours = grpo_advantages(batch["scores"], batch["groups"], batch["mask"], eps=1e-6)
    torch.testing.assert_close(verl_grpo, ours, rtol=0, atol=1e-12)
    assert ours.abs().max() > 0.5

    verl_rpp, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        batch["token_rewards"], batch["mask"].double(), config=AlgoConfig(gamma=1.0)
    )
    # same formula (unbiased batch variance, eps 1e-8), summed in a different order
    torch.testing.assert_close(
        verl_rpp, reinforce_pp_advantages(batch["token_rewards"], batch["mask"]), rtol=0, atol=1e-9
    )


def gapped_batch():
    """Multi-turn responses as verl's agent loop masks them: response, tool output (mask 0),
    response, padding; rewards on the last valid token, and stray values under the mask."""
    mask_BT = torch.tensor(
        [
            [1, 1, 0, 0, 1, 1, 0],
            [1, 0, 1, 0, 1, 0, 0],
            [1, 1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 0, 0, 0],
        ]
    )
    rewards_BT = torch.zeros(4, 7)
    rewards_BT[0, 5], rewards_BT[1, 4], rewards_BT[2, 6], rewards_BT[3, 1] = 1.0, -0.5, 0.25, 2.0
    rewards_BT[0, 2] = 3.0  # at a masked position: ignored by both verl and us
    return rewards_BT, mask_BT


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_on_gapped_masks_equals_verls(gamma):
    """verl carries the return across masked positions; our verl estimator must too (the AR-Lopti
    fork's restart, ``gaps="restart"``, gives every token before the last gap a return of 0)."""
    rewards_BT, mask_BT = gapped_batch()
    verl_adv, verl_returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        rewards_BT, mask_BT.double(), config=AlgoConfig(gamma=gamma)
    )
    estimator = core_algos.get_adv_estimator_fn("tokenbalance_reinforce_pp")
    ours_adv, ours_returns = estimator(
        token_level_rewards=rewards_BT, response_mask=mask_BT.double(), config=AlgoConfig(gamma=gamma), index=None
    )
    assert_close_in(ours_returns, verl_returns, torch.float64, msg="returns")
    # verl's masked_mean divides by (M + 1e-8): a relative change below 1e-8 of the whitening
    # statistics, on top of float64 rounding (a wrong return at a gap moves advantages by > 0.1)
    atol = dtype_atol(torch.float64, verl_adv.abs().max()) + 4e-8 * float(verl_adv.abs().max())
    torch.testing.assert_close(ours_adv, verl_adv, rtol=0, atol=atol)
    assert verl_returns[0, 0] != 0  # the reward after the gap reaches the first turn
    direct = reinforce_pp_advantages(rewards_BT, mask_BT, gamma=gamma, gaps="carry")
    torch.testing.assert_close(direct, verl_adv, rtol=0, atol=atol)
    assert (reinforce_pp_advantages(rewards_BT, mask_BT, gamma=gamma) - verl_adv).abs().max() > 0.1
    fork_returns = discounted_returns(rewards_BT, mask_BT, gamma, gaps="restart")
    assert fork_returns[0, :2].tolist() == [0.0, 0.0]


# --------------------------------------------------------------------------- (c) registered estimators


@pytest.mark.parametrize("name", list(ADVANTAGE_ESTIMATORS))
def test_registered_estimators_equal_compute_advantages(name):
    batch = make_batch(seed=3)
    estimator = core_algos.get_adv_estimator_fn(name)
    advantages_BT, returns_BT = estimator(
        token_level_rewards=batch["token_rewards"],
        response_mask=batch["mask"].double(),
        config=AlgoConfig(gamma=1.0),
        index=batch["uids"],
    )
    method = Method(advantage=AdvantageConfig(estimator=ADVANTAGE_ESTIMATORS[name]), kl=KLConfig(placement="none"))
    expected_BT = compute_advantages(method, batch["scores"], batch["groups"], batch["mask"])
    torch.testing.assert_close(advantages_BT, expected_BT, rtol=0, atol=1e-12)
    assert expected_BT.abs().max() > 0.1
    assert returns_BT.shape == advantages_BT.shape


# --------------------------------------------------------------------------- (d) the Lopti schedule


@dataclasses.dataclass
class BatchHandle:
    """Stands in for verl's KVBatchMeta (keys into the stored batch + extra_info)."""

    keys: list
    extra_info: dict


class TinyPolicy(torch.nn.Module):
    """logits = h W^T on fixed features; log-probs of fixed sampled tokens ([B, T])."""

    def __init__(self, features_BTD, tokens_BT, vocab=5, seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight_VD = torch.nn.Parameter(torch.randn(vocab, features_BTD.shape[-1], generator=gen) * 2.0)
        self.features_BTD, self.tokens_BT = features_BTD, tokens_BT

    def forward(self, rows):
        logits_BTV = self.features_BTD[rows] @ self.weight_VD.T
        return torch.log_softmax(logits_BTV, -1).gather(-1, self.tokens_BT[rows, :, None]).squeeze(-1)


def tiny_setup():
    batch = make_batch(seed=4)
    gen = torch.Generator().manual_seed(5)
    features_BTD = torch.randn(8, 6, 3, generator=gen)
    policy = TinyPolicy(features_BTD, torch.zeros(8, 6, dtype=torch.long))
    with torch.no_grad():  # sample half the tokens as the argmax so both Lopti groups are populated
        greedy_BT = (features_BTD @ policy.weight_VD.T).argmax(-1)
        random_BT = torch.randint(0, 5, (8, 6), generator=gen)
        policy.tokens_BT = torch.where(torch.arange(6)[None, :] % 2 == 0, greedy_BT, random_BT)
        old_BT = policy(slice(None)).detach()
    return batch, policy, old_BT


MINI_BATCHES = [slice(0, 4), slice(4, 8)]
MICRO_BATCHES = {0: [slice(0, 2), slice(2, 4)], 4: [slice(4, 6), slice(6, 8)]}


def test_lopti_schedule_runs_two_passes_one_step_per_mini_batch_and_matches_core():
    batch, policy, old_BT = tiny_setup()
    ref_BT = old_BT + 0.05
    mask_BT = batch["mask"]
    advantages_BT, _ = core_algos.get_adv_estimator_fn("tokenbalance_grpo")(
        token_level_rewards=batch["token_rewards"], response_mask=mask_BT.double(), index=batch["uids"]
    )
    policy_loss = TokenBalancePolicyLossConfig(loss_mode="tokenbalance_ar", ar_alpha=0.3, lopti_eta=0.5)
    config = actor_config(policy_loss, use_kl_loss=True)
    start = policy.weight_VD.detach().clone()

    # verl side: the schedule function with a verl-like mini-batch loop and our verl loss
    optimizer = torch.optim.SGD(policy.parameters(), lr=2.0)
    steps, verl_losses = [], []

    def update_once(pass_batch):
        name = pass_batch.extra_info[UPDATE_PASS_KEY]
        for mini in MINI_BATCHES:
            optimizer.zero_grad()
            config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask_BT[mini].sum()), global_batch_size=4)
            total = 0.0
            for micro in MICRO_BATCHES[mini.start]:
                loss, _ = lopti_pass_loss(
                    config,
                    name,
                    policy(micro),
                    old_BT[micro],
                    advantages_BT[micro],
                    mask_BT[micro],
                    ref_log_prob=ref_BT[micro],
                )
                loss.backward()
                total += loss.item()
            optimizer.step()
            steps.append(name)
            verl_losses.append(total)
        return {"actor/pg_loss": sum(verl_losses[-2:]), "actor/grad_norm": 1.0}

    handle = BatchHandle(keys=["a"], extra_info={"temperature": 0.7})
    metrics = run_update_passes(update_once, handle, lopti_pass_names(lopti_config(policy_loss)))
    assert steps == ["lopti_low", "lopti_low", "lopti_high", "lopti_high"]
    assert handle.extra_info == {"temperature": 0.7}  # the stored batch is never modified
    assert set(metrics) >= {"actor/pg_loss", "actor/pg_loss/lopti_low", "actor/pg_loss/lopti_high"}
    assert abs(metrics["actor/pg_loss"] - sum(verl_losses)) < 1e-12
    verl_weight = policy.weight_VD.detach().clone()

    # core side: build_update_passes + pass_normaliser + pass_loss, the same optimizer schedule
    with torch.no_grad():
        policy.weight_VD.copy_(start)
    method = get_method("ar_lopti").replace(clip=CLIP, kl=KLConfig(coef=0.001, estimator="k3", log_ratio_clamp=20.0))
    passes, lopti_metrics = build_update_passes(method, batch["scores"], batch["groups"], mask_BT, old_BT)
    assert 0.1 < lopti_metrics["lopti/low_token_frac"] < 0.9
    optimizer = torch.optim.SGD(policy.parameters(), lr=2.0)
    core_losses = []
    for update_pass in passes:
        for mini in MINI_BATCHES:
            optimizer.zero_grad()
            normaliser = pass_normaliser(method, update_pass.select_rows(mini))
            total = 0.0
            for micro in MICRO_BATCHES[mini.start]:
                out = pass_loss(
                    method,
                    update_pass.select_rows(micro),
                    policy(micro),
                    old_BT[micro],
                    ref_logp_BT=ref_BT[micro],
                    normaliser=normaliser,
                )
                out.loss.backward()
                total += out.loss.item()
            optimizer.step()
            core_losses.append(total)

    np.testing.assert_allclose(verl_losses, core_losses, rtol=0, atol=1e-12)
    torch.testing.assert_close(verl_weight, policy.weight_VD.detach(), rtol=0, atol=1e-12)
    assert (verl_weight - start).abs().max() > 1e-3  # the steps moved the policy


def test_lopti_passes_add_up_to_verl_single_pass_loss_with_kl():
    """At fixed parameters, the two pass losses sum to verl's vanilla loss + verl's own KL term."""
    batch = make_batch(seed=6)
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    config = actor_config(
        TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo", lopti_eta=0.5), use_kl_loss=True, batch=batch
    )
    logp = batch["logp"].clone().requires_grad_(True)
    lopti_total = sum(
        lopti_pass_loss(config, name, logp, batch["old"], advantages_BT, batch["mask"], ref_log_prob=batch["ref"])[0]
        for name in ("lopti_low", "lopti_high")
    )
    logp_verl = batch["logp"].clone().requires_grad_(True)
    vanilla = actor_config(PolicyLossConfig(loss_mode="vanilla"), batch=batch)
    pg, _ = core_algos.get_policy_loss_fn("vanilla")(
        batch["old"], logp_verl, advantages_BT, batch["mask"], "token-mean", vanilla
    )
    kl = core_algos.agg_loss(
        core_algos.kl_penalty(logp_verl, batch["ref"], "low_var_kl"),
        batch["mask"],
        "token-mean",
        **vanilla.global_batch_info,
    )
    verl_total = pg + 0.001 * kl
    torch.testing.assert_close(lopti_total, verl_total, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(lopti_total, logp), grad_of(verl_total, logp_verl), rtol=0, atol=1e-12)


def test_lopti_pass_loss_reports_the_low_token_share():
    batch = make_batch(seed=7)
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo", lopti_eta=0.3), batch=batch)
    _, metrics = lopti_pass_loss(config, "lopti_low", batch["logp"], batch["old"], advantages_BT, batch["mask"])
    low = float((batch["mask"] & (batch["old"].exp() < 0.3)).sum())
    assert 0 < low < float(batch["mask"].sum())
    assert metrics["tokenbalance/lopti/low_token_frac"] == pytest.approx(low / float(batch["mask"].sum()))
    assert metrics["tokenbalance/lopti/threshold"] == 0.3


def bound_shares_by_hand(method, batch, advantages_BT, normaliser):
    """The verl metric recomputed: 2 g^2 (1 - p)^2 with g from autograd of our pass loss, bucket shares."""
    from tokenbalance.algorithms.aggregate import token_coefficients
    from tokenbalance.diagnostics.buckets import bucket_shares

    passes, _ = passes_from_advantages(method, advantages_BT, batch["mask"], batch["old"])
    logp = batch["logp"].clone().requires_grad_(True)
    g_BT = grad_of(pass_loss(method, passes[0], logp, batch["old"], normaliser=normaliser).loss, logp)
    c_BT = token_coefficients(batch["mask"], "token-mean", normaliser=normaliser.policy)
    one_minus_p_sq = (1 - batch["logp"].exp()).square()
    values = {
        "grad_share_bound": 2 * g_BT.square() * one_minus_p_sq,
        "grad_share_before_bound": 2 * (advantages_BT * c_BT).square() * one_minus_p_sq,
    }
    return bucket_shares(batch["old"], batch["mask"], values, prefix="tokenbalance/diag/")


@pytest.mark.parametrize("loss_mode, preset", [("tokenbalance_grpo", "grpo"), ("tokenbalance_ar", "ar")])
def test_registered_loss_reports_the_bound_gradient_share(loss_mode, preset):
    from tokenbalance.types import LossNormaliser

    batch = make_batch(seed=3)
    advantages_BT = compute_advantages(core_method(preset), batch["scores"], batch["groups"], batch["mask"])
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode=loss_mode), batch=batch)
    logp = batch["logp"].clone().requires_grad_(True)
    _, metrics = core_algos.get_policy_loss_fn(loss_mode)(
        batch["old"], logp, advantages_BT, batch["mask"], "token-mean", config
    )
    tokens = float(batch["mask"].sum())
    expected = bound_shares_by_hand(core_method(preset), batch, advantages_BT, LossNormaliser(tokens, tokens))
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    for stat in ("grad_share_bound", "grad_share_before_bound", "token_frac"):
        shares = [metrics[f"tokenbalance/diag/bucket{b}/{stat}"] for b in range(4)]
        assert sum(shares) == pytest.approx(1.0) and max(shares) < 1.0  # spread over several buckets
    # GRPO (ratio != 1 here, clipping acts): the update's share differs from the estimator's alone
    assert metrics["tokenbalance/diag/bucket0/grad_share_bound"] != pytest.approx(
        metrics["tokenbalance/diag/bucket0/grad_share_before_bound"]
    )
    # without gradient through the log-probs (a no-grad evaluation) nothing is reported
    _, no_grad = core_algos.get_policy_loss_fn(loss_mode)(
        batch["old"], batch["logp"], advantages_BT, batch["mask"], "token-mean", config
    )
    assert not [key for key in no_grad if "/diag/" in key]


def test_a_micro_batch_without_gradient_reports_zero_shares_for_verls_mean():
    batch = make_batch(seed=3)
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo"), batch=batch)
    logp = batch["logp"].clone().requires_grad_(True)
    zeros_BT = torch.zeros_like(batch["logp"])  # every group uniform: no advantage anywhere
    _, metrics = core_algos.get_policy_loss_fn("tokenbalance_grpo")(
        batch["old"], logp, zeros_BT, batch["mask"], "token-mean", config
    )
    assert [metrics[f"tokenbalance/diag/bucket{b}/grad_share_bound"] for b in range(4)] == [0.0] * 4
    assert sum(metrics[f"tokenbalance/diag/bucket{b}/token_frac"] for b in range(4)) == pytest.approx(1.0)


def test_lopti_pass_loss_reports_each_pass_gradient_share():
    batch = make_batch(seed=7)
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    config = actor_config(
        TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo", lopti_eta=0.25), use_kl_loss=True, batch=batch
    )
    shares = {}
    for name in ("lopti_low", "lopti_high"):
        logp = batch["logp"].clone().requires_grad_(True)
        _, metrics = lopti_pass_loss(
            config, name, logp, batch["old"], advantages_BT, batch["mask"], ref_log_prob=batch["ref"]
        )
        shares[name] = [metrics[f"tokenbalance/diag/bucket{b}/grad_share_bound"] for b in range(4)]
        before = [metrics[f"tokenbalance/diag/bucket{b}/grad_share_before_bound"] for b in range(4)]
        assert sum(shares[name]) == pytest.approx(1.0) and sum(before) == pytest.approx(1.0)
    # the low pass (p < 0.25) is bucket 0: its gradient is all there, the high pass's none of it
    assert shares["lopti_low"][0] == pytest.approx(1.0) and shares["lopti_high"][0] == 0.0


# --------------------------------------------------------------------------- (e) validation and NTHR


def launch_config(**overrides):
    config = OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "tokenbalance_grpo"},
            "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync"}},
            "actor_rollout_ref": {
                "actor": {"policy_loss": {"_target_": POLICY_LOSS_CONFIG_TARGET, "loss_mode": "tokenbalance_ar"}}
            },
        }
    )
    for key, value in overrides.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def test_nthr_as_a_loss_or_an_estimator_is_rejected_naming_its_trainer():
    """NTHR runs as the tokenbalance_nthr trainer (its launch checks: test_verl_nthr.py)."""
    for key, value in [
        ("actor_rollout_ref.actor.policy_loss.loss_mode", "tokenbalance_nthr"),
        ("algorithm.adv_estimator", "tokenbalance_nthr"),
    ]:
        with pytest.raises(ValueError, match="NTHR is not a policy loss or an advantage estimator on verl"):
            validate_launch(launch_config(**{key: value}))
    with pytest.raises(ValueError, match=r"loss_mode='tokenbalance_nthr'.*trainer_mode=tokenbalance_nthr"):
        TokenBalancePolicyLossConfig(loss_mode="tokenbalance_nthr")


def test_bad_values_and_names_fail_naming_the_field():
    with pytest.raises(ValueError, match=r"policy_loss\.ar_alpha: must be in \[0\.0, 1\.0\], got 1\.5"):
        TokenBalancePolicyLossConfig(loss_mode="tokenbalance_ar", ar_alpha=1.5)
    with pytest.raises(ValueError, match=r"policy_loss\.lopti_eta: must be in \(0\.0, 1\.0\)"):
        TokenBalancePolicyLossConfig(lopti_eta=1.0)
    with pytest.raises(ValueError, match=r"unknown key\(s\) ar_alpah; valid: .*ar_alpha"):
        validate_launch(launch_config(**{"actor_rollout_ref.actor.policy_loss.ar_alpah": 0.2}))
    with pytest.raises(ValueError, match="unknown tokenbalance loss 'tokenbalance_arr'"):
        TokenBalancePolicyLossConfig(loss_mode="tokenbalance_arr")
    with pytest.raises(ValueError, match="unknown tokenbalance estimator 'tokenbalance_gpro'"):
        validate_launch(launch_config(**{"algorithm.adv_estimator": "tokenbalance_gpro"}))
    with pytest.raises(ValueError, match=r"_target_=None: the tokenbalance_ar loss reads"):
        validate_launch(launch_config(**{"actor_rollout_ref.actor.policy_loss._target_": None}))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.clip_ratio_c: must be in \(1\.0, inf\], got 0\.5"):
        core_algos.get_policy_loss_fn("tokenbalance_grpo")(
            *(torch.zeros(1, 2),) * 3,
            torch.ones(1, 2, dtype=torch.bool),
            "token-mean",
            actor_config(TokenBalancePolicyLossConfig(), clip_ratio_c=0.5),
        )


def test_lopti_settings_need_the_lopti_trainer():
    with pytest.raises(ValueError, match=f"lopti_eta is set but the update runs a single pass.*{LOPTI_TRAINER}"):
        validate_launch(launch_config(**{"actor_rollout_ref.actor.policy_loss.lopti_eta": 0.4}))
    with pytest.raises(ValueError, match="needs a tokenbalance loss"):
        validate_launch(
            launch_config(
                **{"trainer.v1.trainer_mode": LOPTI_TRAINER, "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla"}
            )
        )
    batch = make_batch()
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo", lopti_eta=0.4), batch=batch)
    with pytest.raises(ValueError, match="runs a single pass"):
        core_algos.get_policy_loss_fn("tokenbalance_grpo")(
            batch["old"], batch["logp"], batch["old"], batch["mask"], "token-mean", config
        )
    validate_launch(launch_config())  # a valid config passes


# --------------------------------------------------------------------------- (f) plugin discovery, reward


def test_import_verl_alone_registers_our_names_through_the_entry_point():
    code = (
        "import sys, verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as P, ADV_ESTIMATOR_REGISTRY as A\n"
        "print('tokenbalance.integrations.verl.plugin' in sys.modules)\n"
        "print(','.join(sorted(k for k in P if k.startswith('tokenbalance'))))\n"
        "print(','.join(sorted(k for k in A if k.startswith('tokenbalance'))))\n"
        "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY as T\n"
        f"print(T['{LOPTI_TRAINER}'].__module__, T['{LOPTI_TRAINER}'].__mro__[1].__name__)\n"
        f"print(T['{SYNC_TRAINER}'].__module__, T['{SYNC_TRAINER}'].__mro__[1].__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded, losses, estimators, trainer, sync_trainer = result.stdout.strip().splitlines()[-5:]
    assert loaded == "True"
    assert trainer == "tokenbalance.integrations.verl.lopti TokenBalanceSyncTrainer"
    assert sync_trainer == "tokenbalance.integrations.verl.stop PPOTrainerSync"
    assert losses.split(",") == sorted(POLICY_LOSS_NAMES)
    assert estimators.split(",") == sorted(ADVANTAGE_ESTIMATORS)


def test_kk_reward_scores_a_response_as_the_reference():
    from tokenbalance.tasks import get_task

    example = get_task("kk").examples("test", difficulty=3, count=1)[0]
    answer = example.ground_truth["solution_text_format"]
    good = compute_score("kk_logic3", f" I reason.</think>\n<answer>\n{answer}\n</answer>", example.ground_truth)
    assert good == {"score": 3.0, "format_ok": 1.0, "answer_parsed": 1.0, "correct": 1.0}
    bad = compute_score("kk_logic3", "<think>no</think> nothing", example.ground_truth)
    assert bad["score"] == -3.0
    with pytest.raises(ValueError, match="'gsm8k' is not a row of task 'kk'"):
        compute_score("gsm8k", "x", example.ground_truth)
    # another registered task through the same hook (its reward reads the response alone)
    assert compute_score("arith", "so \\boxed{12}", "12", task="arith")["score"] == 1.0
    assert compute_score("arith", "so \\boxed{13}", "12", task="arith")["score"] == 0.0


# --------------------------------------------------------------------------- (g) the method: a preset and overrides


def test_a_preset_and_overrides_give_the_loss_the_deprecated_fields_gave():
    from tokenbalance.integrations.verl.config import method_from_actor_config

    batch = make_batch()
    new = TokenBalancePolicyLossConfig(
        method="ar", overrides={"ar": {"alpha": 0.25, "prob_source": "current_detached"}}
    )
    with pytest.warns(FutureWarning, match=r"overrides.ar.alpha=0.25 \+.*overrides.ar.prob_source=current_detached"):
        old = TokenBalancePolicyLossConfig(
            loss_mode="tokenbalance_ar", ar_alpha=0.25, ar_prob_source="current_detached"
        )
    advantages_BT = compute_advantages(core_method("grpo"), batch["scores"], batch["groups"], batch["mask"])
    losses = []
    for policy_loss in (new, old):
        config = actor_config(policy_loss, batch=batch)
        losses.append(
            core_algos.get_policy_loss_fn(policy_loss.loss_mode)(
                batch["old"], batch["logp"], advantages_BT, batch["mask"], "token-mean", config
            )[0]
        )
        assert method_from_actor_config(config, with_regularisers=False).ar == get_method("ar").ar.__class__(
            alpha=0.25, prob_source="current_detached"
        )
    assert losses[0].item() == losses[1].item()
    dotted = TokenBalancePolicyLossConfig(
        method="ar", overrides={"ar.alpha": 0.25, "ar.prob_source": "current_detached"}
    )
    assert method_from_actor_config(actor_config(dotted), with_regularisers=False).ar.alpha == 0.25


def test_every_setting_verl_does_not_hold_comes_from_the_method():
    """A token-level stage reaches verl's loss through the method alone: every Method field verl has
    no key for is the resolved method's (so a new stage needs no change here)."""
    from tokenbalance.algorithms.presets import resolve_method
    from tokenbalance.integrations.verl.config import method_from_actor_config
    from tokenbalance.integrations.verl.names import VERL_OWNED

    overrides = {"ar.alpha": 0.2, "ar.tau": 0.5, "tr_grpo.mu": 0.3, "lopti.eta": 0.3, "lopti.order": "high_first"}
    policy_loss = TokenBalancePolicyLossConfig(method="ar_lopti", overrides=overrides)
    ours = method_from_actor_config(actor_config(policy_loss), with_regularisers=True, with_lopti=True)
    resolved = resolve_method("ar_lopti", overrides)
    verls = {*VERL_OWNED, "nthr"}  # NTHR: the tokenbalance_nthr trainer's, before the loss
    for field in dataclasses.fields(ours):
        if field.name not in verls:
            assert getattr(ours, field.name) == getattr(resolved, field.name), field.name
    assert ours.clip == CLIP and ours.kl.coef == 0.001  # verl's keys


def test_a_wrong_method_fails_naming_the_key_as_written():
    key = "actor_rollout_ref.actor.policy_loss"
    for policy_loss, match in [
        (dict(method="arr"), rf"^{key}.method: unknown method 'arr'; .*\(did you mean 'ar'\?\)$"),
        (dict(method="ar", overrides={"ar": {"alph": 0.2}}), rf"^{key}.overrides.ar.alph: unknown field 'alph'"),
        (dict(overrides={"lopti.eta": 1.5}), rf"^{key}.overrides.lopti.eta: must be in \(0.0, 1.0\), got 1.5$"),
        (
            dict(method="ar", overrides={"clip.eps_high": 0.3}),
            rf"^{key}.overrides.clip.eps_high: verl holds .*clip_ratio_high",
        ),
        (dict(loss_mode="tokenbalance_xyz"), "unknown tokenbalance loss 'tokenbalance_xyz'; valid: tokenbalance"),
    ]:
        with pytest.raises(ValueError, match=match):
            TokenBalancePolicyLossConfig(**policy_loss)


def test_the_launch_needs_the_trainer_and_the_estimator_the_method_needs():
    new_form = {"actor_rollout_ref.actor.policy_loss.loss_mode": "tokenbalance"}
    method = "actor_rollout_ref.actor.policy_loss.method"
    with pytest.raises(ValueError, match=rf"method='ar_lopti' runs Lopti's two passes.*trainer_mode={LOPTI_TRAINER}"):
        validate_launch(launch_config(**new_form, **{method: "ar_lopti"}))
    validate_launch(launch_config(**new_form, **{method: "ar_lopti", "trainer.v1.trainer_mode": LOPTI_TRAINER}))
    with pytest.raises(
        ValueError, match="method='nthr' weights the advantages with NTHR.*trainer_mode=tokenbalance_nthr"
    ):
        validate_launch(launch_config(**new_form, **{method: "nthr"}))
    with pytest.raises(ValueError, match="set algorithm.adv_estimator=tokenbalance_reinforce_pp"):
        validate_launch(launch_config(**new_form, **{method: "reinforce_pp_ar"}))
    with pytest.raises(
        ValueError, match="method and .overrides are run by our loss only; set .*loss_mode=tokenbalance"
    ):
        validate_launch(launch_config(**{"actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla", method: "ar"}))
