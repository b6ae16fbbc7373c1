"""The verl loss's normaliser scope: verl 0.9.1's mini-batch token count (default) or the AR-Lopti
fork's masked mean per micro-batch divided by the accumulation steps (``policy_loss.token_mean_scope``).

The fork's objective is computed here from verl's own pieces: its ``vanilla`` loss and ``agg_loss``
on each micro-batch alone (no global batch info: the micro-batch's own token count), divided by the
number of micro-batches, averaged over data-parallel ranks.
"""

from __future__ import annotations

import pytest
import torch

verl = pytest.importorskip("verl")

from verl.trainer.ppo import core_algos
from verl.workers.config import PolicyLossConfig

from tests.integrations.test_verl_integration import (  # float64_default: autouse, every test in float64
    actor_config,
    float64_default,  # noqa: F401
    make_batch,
)
from tests.tolerances import dtype_atol
from tokenbalance.algorithms.advantages import grpo_advantages
from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig
from tokenbalance.integrations.verl.losses import lopti_pass_loss, policy_loss, scoped_batch_info

ATOL = dtype_atol(torch.float64)
MICRO_ROWS = 2


def scoped_config(scope: str, rows_per_rank: int, dp_size: int, tokens: int, method=None, **actor):
    config = actor_config(TokenBalancePolicyLossConfig(token_mean_scope=scope, method=method), **actor)
    config.global_batch_info.update(dp_size=dp_size, batch_num_tokens=tokens, global_batch_size=rows_per_rank * dp_size)
    return config


def our_loss(batch, advantages_BT, scope: str, rows, *, dp_size=1, tokens=None, with_kl=False):
    """verl's ppo_loss on the micro-batch ``rows``: our policy loss, then verl's KL term from the
    (possibly scoped) global batch info our loss leaves in the config."""
    config = scoped_config(
        scope, len(batch["mask"]), dp_size, int(batch["mask"].sum()) if tokens is None else tokens, use_kl_loss=with_kl
    )
    mask = batch["mask"][rows]
    loss, _ = policy_loss(batch["old"][rows], batch["logp"][rows], advantages_BT[rows], mask, "token-mean", config)
    if with_kl:
        kl = core_algos.kl_penalty(batch["logp"][rows], batch["ref"][rows], "low_var_kl")
        loss = loss + 0.001 * core_algos.agg_loss(kl, mask, "token-mean", **config.global_batch_info)
    return loss


def fork_micro_loss(batch, advantages_BT, rows, micro_batches: int, *, with_kl=False):
    """The fork's: verl's vanilla loss (+ KL) as a masked mean over the micro-batch alone / accumulation."""
    vanilla = actor_config(PolicyLossConfig(loss_mode="vanilla"))
    mask = batch["mask"][rows]
    loss, _ = core_algos.get_policy_loss_fn("vanilla")(
        batch["old"][rows], batch["logp"][rows], advantages_BT[rows], mask, "token-mean", vanilla
    )
    if with_kl:
        kl = core_algos.kl_penalty(batch["logp"][rows], batch["ref"][rows], "low_var_kl")
        loss = loss + 0.001 * core_algos.agg_loss(kl, mask, "token-mean")
    return loss / micro_batches


def micro_slices(rows: int):
    return [slice(start, start + MICRO_ROWS) for start in range(0, rows, MICRO_ROWS)]


@pytest.mark.parametrize("with_kl", [False, True])
def test_micro_batch_scope_is_the_forks_mean_of_micro_batch_token_means(with_kl):
    batch = make_batch(seed=3)  # ragged lengths 6, 3, 5, 1, 4, 6, 2, 5
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    slices = micro_slices(len(batch["mask"]))
    ours = sum(our_loss(batch, advantages_BT, "micro_batch", rows, with_kl=with_kl) for rows in slices)
    fork = sum(fork_micro_loss(batch, advantages_BT, rows, len(slices), with_kl=with_kl) for rows in slices)
    torch.testing.assert_close(ours, fork, rtol=0, atol=ATOL)
    verl_default = sum(our_loss(batch, advantages_BT, "mini_batch", rows, with_kl=with_kl) for rows in slices)
    assert abs(float(verl_default - fork)) > 100 * ATOL  # unequal lengths: the two normalisers differ


def test_the_two_scopes_agree_when_every_response_has_the_same_length():
    batch = make_batch(seed=4)
    batch["mask"] = torch.ones_like(batch["mask"])
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    for rows in micro_slices(len(batch["mask"])):
        micro = our_loss(batch, advantages_BT, "micro_batch", rows, with_kl=True)
        mini = our_loss(batch, advantages_BT, "mini_batch", rows, with_kl=True)
        torch.testing.assert_close(micro, mini, rtol=0, atol=ATOL)


def test_with_two_ranks_the_ranks_average_is_the_mean_over_all_micro_batches():
    batch = make_batch(seed=5)
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    ranks = [slice(0, 4), slice(4, 8)]
    per_rank = []
    for rank in ranks:
        rank_batch = {key: value[rank] for key, value in batch.items() if key in ("mask", "logp", "old", "ref")}
        loss = sum(
            our_loss(rank_batch, advantages_BT[rank], "micro_batch", rows, dp_size=2, tokens=int(batch["mask"].sum()))
            for rows in micro_slices(4)
        )
        per_rank.append(loss)
    data_parallel_mean = sum(per_rank) / len(ranks)  # what FSDP's gradient average does
    fork = sum(fork_micro_loss(batch, advantages_BT, rows, 4) for rows in micro_slices(8))  # 4 micro-batches
    torch.testing.assert_close(data_parallel_mean, fork, rtol=0, atol=ATOL)


def test_lopti_passes_add_up_to_the_single_pass_loss_under_either_scope():
    batch = make_batch(seed=6)
    advantages_BT = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    rows = slice(2, 4)
    for scope in ("mini_batch", "micro_batch"):
        config = scoped_config(scope, 8, 1, int(batch["mask"].sum()), method="lopti")
        passes = sum(
            lopti_pass_loss(
                config, name, batch["logp"][rows], batch["old"][rows], advantages_BT[rows], batch["mask"][rows]
            )[0]
            for name in ("lopti_low", "lopti_high")
        )
        single = our_loss(batch, advantages_BT, scope, rows)
        torch.testing.assert_close(passes, single, rtol=0, atol=ATOL)


def test_scoped_counts_and_refusal():
    mask_BT = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    info = {"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 16}
    assert scoped_batch_info(info, mask_BT, "mini_batch") == info
    # 8 rows per rank / 2 here = 4 accumulation steps; agg_loss multiplies by dp_size 2 again
    assert scoped_batch_info(info, mask_BT, "micro_batch") == {
        **info,
        "batch_num_tokens": 24.0,
        "global_batch_size": 16.0,
    }
    with pytest.raises(ValueError, match=r"policy_loss.token_mean_scope: unknown value 'rank'"):
        TokenBalancePolicyLossConfig(token_mean_scope="rank")
