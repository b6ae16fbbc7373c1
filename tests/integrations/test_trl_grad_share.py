"""The gradient share is the same metric in the TRL subclass and in our trainer's update on one batch.

TRL side: ``compute_loss`` on the hand-built inputs of ``test_trl_equivalence`` (TRL's fused head,
asked for ``log_sum_sq_probs``). Our side: ``run_update`` with ``grad_share`` on one
mini-batch of one micro-batch, the shares computed as the trainer's diagnostics do. TRL's kernel
runs the log-softmax in float32 at temperature 0.1, which bounds the agreement (as in
``test_trl_equivalence``).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tests.integrations.test_trl_equivalence import (
    LOGSOFTMAX_DTYPE,
    TEMPERATURE,
    OurSide,
    make_trainer,
    method_case,
    sampled_batch,
    tokenizer,  # noqa: F401 - pytest fixture
)
from tests.tolerances import dtype_atol
from tokenbalance.diagnostics.buckets import bucket_shares
from tokenbalance.diagnostics.edges import DEFAULT_EDGES
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, run_update
from tokenbalance.types import LossNormaliser

pytestmark = pytest.mark.usefixtures("trl_offline")

BUCKETS = len(DEFAULT_EDGES) - 1


def our_shares(ours: OurSide, policy, batch) -> dict[str, float]:
    B = ours.mask_BT.shape[0]
    our_policy = copy.deepcopy(policy)
    record = run_update(
        UpdateSpec(
            ours.method,
            ours.passes,
            UpdateRows(ours.packed, ours.old.logp_BT, ours.ref_logp_BT),
            UpdateSettings(
                temperature=TEMPERATURE,
                mini_batch_rows=B,
                micro_batch_rows=B,
                grad_clip=1e9,
                token_mean_scope="mini_batch",
                grad_share=True,
            ),
        ),
        our_policy,
        torch.optim.SGD(our_policy.parameters(), lr=0.0),
        DistContext(),
    )
    advantages_BT = ours.advantages_B[:, None].expand_as(ours.mask_BT).double()  # GRPO's outcome advantage
    values = {
        "token_frac": ours.mask_BT,
        "grad_share": record.logit_grad_sq_BT,
        "grad_share_before": advantages_BT.square() * record.unit_logit_grad_sq_BT,
    }
    return bucket_shares(ours.old.logp_BT, ours.mask_BT, values, DEFAULT_EDGES)


@pytest.mark.parametrize("name", ["grpo", "ar", "tr_grpo"])
def test_trl_and_our_trainer_log_the_same_gradient_shares(name, tokenizer, tmp_path):  # noqa: F811
    method = method_case(name)
    trainer = make_trainer(method, tokenizer, tmp_path, loss_type="dapo")
    policy = trainer.model
    batch = sampled_batch(policy, tokenizer)
    ours = OurSide(trainer.balance_method, policy, batch)
    expected = our_shares(ours, policy, batch)

    trainer._step = 0
    trainer.compute_loss(trainer.model, ours.trl_inputs(batch, with_old_logp=False)).backward()
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items() if key.startswith("diag/")}
    assert set(logged) == set(expected)  # exact names: TRL's head gave sum_j pi_j^2
    occupied = [b for b in range(BUCKETS) if expected[f"diag/bucket{b}/token_frac"] > 0]
    assert len(occupied) >= 2  # the batch's tokens spread over buckets: the shares are not trivially 1
    atol = dtype_atol(LOGSOFTMAX_DTYPE)  # shares in [0, 1]
    for key, value in expected.items():
        assert math.isfinite(value) and abs(logged[key] - value) <= atol, (key, logged[key], value)
    for stat in ("grad_share", "grad_share_before"):
        assert sum(logged[f"diag/bucket{b}/{stat}"] for b in range(BUCKETS)) == pytest.approx(1.0)
    if name == "ar":  # AR scales the low-probability tokens down: their share drops
        low = occupied[0]
        assert logged[f"diag/bucket{low}/grad_share"] < logged[f"diag/bucket{low}/grad_share_before"]


def test_without_the_fused_heads_sum_of_squares_trl_logs_the_bound(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(method_case("grpo"), tokenizer, tmp_path)
    batch = sampled_batch(trainer.model, tokenizer)
    ours = OurSide(trainer.balance_method, trainer.model, batch)
    inputs = ours.trl_inputs(batch, with_old_logp=False)
    logp_BT, _, _ = trainer._policy_forward(trainer.model, inputs)
    update_pass = ours.passes[0]
    loss = (logp_BT * ours.mask_BT).sum()

    shares = trainer._grad_shares(
        loss,
        logp_BT,
        None,
        logp_BT.detach(),
        ours.mask_BT,
        ours.advantages_B[:, None].expand_as(ours.mask_BT),
        update_pass,
        LossNormaliser(1.0, 1.0),
    )
    assert {k.split("/")[-1] for k in shares} == {"token_frac", "grad_share_bound", "grad_share_before_bound"}
    # g = 1 on every valid token: the bound's shares are those of (1 - p)^2
    one_minus_p_sq = (1 - logp_BT.detach().exp()).square()
    expected = bucket_shares(logp_BT.detach(), ours.mask_BT, {"grad_share_bound": one_minus_p_sq}, DEFAULT_EDGES)
    for key, value in expected.items():
        assert shares[key] == pytest.approx(value, rel=1e-9)


def test_grad_share_off_logs_nothing(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(method_case("grpo"), tokenizer, tmp_path)
    trainer.grad_share_edges = None  # the constructor's grad_share_edges=None
    batch = sampled_batch(trainer.model, tokenizer)
    ours = OurSide(trainer.balance_method, trainer.model, batch)
    trainer._step = 0
    trainer.compute_loss(trainer.model, ours.trl_inputs(batch, with_old_logp=False)).backward()
    assert not [key for key in trainer._metrics["train"] if key.startswith("diag/")]
