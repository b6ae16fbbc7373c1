"""The low-probability gradient share: bucket shares of per-token quantities, the update's record of
squared logit-gradient norms (equal to autograd's gradient with respect to the logits, free of any
effect on the update), and a training run that logs them."""

from __future__ import annotations

import math

import pytest
import torch

from tests.diagnostics.test_training_diagnostics import train_records
from tests.models.helpers import tiny_model
from tests.tolerances import assert_close_in
from tests.trainer.conftest import replace_section
from tests.trainer.test_loop import undocumented
from tests.trainer.test_update_skip import ROWS, fixed_batch
from tokenbalance.algorithms.methods import KLConfig, build_update_passes
from tokenbalance.algorithms.presets import apply_method_overrides, get_method
from tokenbalance.diagnostics.buckets import bucket_shares
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import batched_response_logprobs
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, run_update

EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)


def test_bucket_shares_by_hand():
    old_logp_BT = torch.tensor([[0.1, 0.3, 0.6, 0.9, 0.2]]).log()
    mask_BT = torch.tensor([[True, True, True, True, False]])
    values = {
        "grad_share": torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]]),  # the masked 100 is never read
        "token_frac": mask_BT,
        "none": torch.zeros(1, 5),
    }
    shares = bucket_shares(old_logp_BT, mask_BT, values, EDGES)
    assert [shares[f"diag/bucket{b}/grad_share"] for b in range(4)] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert [shares[f"diag/bucket{b}/token_frac"] for b in range(4)] == [0.25] * 4
    assert all(math.isnan(shares[f"diag/bucket{b}/none"]) for b in range(4))  # nothing to share
    quantile = bucket_shares(old_logp_BT, mask_BT, values, (0.0, 0.5, 1.0), mode="quantile", prefix="x/")
    assert quantile["x/bucket0/grad_share"] == pytest.approx(0.3) and quantile["x/bucket1/token_frac"] == 0.5


def update(method, *, temperature=1.0, micro=ROWS, mini=ROWS, grad_share=True, logits_hook=None, dtype=torch.float64):
    """One update of a fresh tiny policy on the fixed batch; the record and the policy."""
    packed, mask, scores, groups = fixed_batch()
    policy = tiny_model("llama").to(dtype).train()
    old = batched_response_logprobs(policy, packed, temperature=temperature, micro_batch=ROWS).logp_BT
    ref = old + 0.05 * torch.sin(torch.arange(old.numel(), dtype=old.dtype)).view_as(old)  # KL gradient != 0
    passes, _ = build_update_passes(method, scores, groups, mask, old, ref)
    handle = policy.get_output_embeddings().register_forward_hook(logits_hook) if logits_hook else None
    record = run_update(
        UpdateSpec(
            method,
            passes,
            UpdateRows(packed, old, ref),
            UpdateSettings(
                temperature=temperature,
                mini_batch_rows=mini,
                micro_batch_rows=micro,
                grad_clip=1e9,
                token_mean_scope="mini_batch",
                grad_share=grad_share,
            ),
        ),
        policy,
        torch.optim.SGD(policy.parameters(), lr=0.1),
        DistContext(),
    )
    if handle is not None:
        handle.remove()
    return record, policy, mask, old


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # float32: sum_j pi_j^2 from the entropy's pass
def test_record_equals_autograd_norm_of_the_gradient_wrt_the_logits(dtype):
    """One forward + backward: ||dL/dz||^2 per token, z = logits / temperature, from the head's output."""
    temperature = 0.7
    outputs = []

    def keep_logits(_module, _args, logits):
        logits.retain_grad()
        outputs.append(logits)

    record, _, mask, _ = update(get_method("tr_grpo"), temperature=temperature, logits_hook=keep_logits, dtype=dtype)
    (logits_BTV,) = outputs
    autograd_BT = (temperature * logits_BTV.grad.norm(dim=-1)).square()  # dL/dz = temperature * dL/dlogits
    assert float(autograd_BT[mask].min()) > 0 and float(autograd_BT[~mask].abs().max()) == 0.0
    scale = float(autograd_BT.max())  # relative to the largest: squared norms are far below 1
    assert_close_in(record.logit_grad_sq_BT / scale, autograd_BT / scale, dtype)
    assert record.unit_logit_grad_sq_BT is not None and float(record.unit_logit_grad_sq_BT[~mask].abs().max()) == 0


def test_the_record_changes_nothing_and_does_not_depend_on_accumulation():
    method = apply_method_overrides(get_method("ar_lopti"), {"lopti.eta": 0.002})  # both passes non-empty
    traced, traced_policy, mask, _ = update(method, micro=2)
    plain, plain_policy, _, _ = update(method, micro=2, grad_share=False)
    assert plain.logit_grad_sq_BT is None and plain.unit_logit_grad_sq_BT is None
    assert traced.metrics == plain.metrics and torch.equal(traced.clipped_BT, plain.clipped_BT)
    for a, b in zip(traced_policy.parameters(), plain_policy.parameters()):
        assert torch.equal(a, b)
    # one micro-batch per mini-batch: the same per-token values (global token-mean normaliser)
    whole, _, _, _ = update(method, micro=ROWS)
    assert_close_in(traced.logit_grad_sq_BT, whole.logit_grad_sq_BT, torch.float64)
    assert_close_in(traced.unit_logit_grad_sq_BT, whole.unit_logit_grad_sq_BT, torch.float64)
    assert bool((traced.unit_logit_grad_sq_BT[mask] > 0).all())  # every valid token in exactly one pass


def test_before_equals_after_for_grpo_at_ratio_one_and_ar_moves_the_share():
    """GRPO without KL on one mini-batch: the update's g is the estimator's advantage (ratio 1, no clip),
    so the two shares agree; AR scales low-probability tokens down, so their share drops."""
    from tokenbalance.algorithms.methods import compute_advantages

    packed, mask, scores, groups = fixed_batch()

    def shares(method):
        record, _, _, old = update(method)
        adv_BT = compute_advantages(method, scores, groups, mask)
        values = {
            "grad_share": record.logit_grad_sq_BT,
            "grad_share_before": adv_BT.double().square() * record.unit_logit_grad_sq_BT,
        }
        return bucket_shares(old, mask, values, EDGES, mode="quantile")

    grpo = shares(get_method("grpo").replace(kl=KLConfig(placement="none")))
    for b in range(4):
        assert grpo[f"diag/bucket{b}/grad_share"] == pytest.approx(grpo[f"diag/bucket{b}/grad_share_before"], rel=1e-9)
    ar = shares(apply_method_overrides(get_method("ar"), {"ar.alpha": 0.9}).replace(kl=KLConfig(placement="none")))
    assert ar["diag/bucket0/grad_share"] < ar["diag/bucket0/grad_share_before"]
    assert ar["diag/bucket3/grad_share"] > ar["diag/bucket3/grad_share_before"]
    assert sum(ar[f"diag/bucket{b}/grad_share"] for b in range(4)) == pytest.approx(1.0)


def test_training_run_logs_the_gradient_shares(small_config, mixed_rewards):
    replace_section(small_config, "train", steps=2)
    train, records = train_records(small_config)
    assert undocumented(records) == set()
    for record in train:
        for name in ("grad_share", "grad_share_before"):
            shares = [record[f"diag/bucket{b}/{name}"] for b in range(4)]
            assert all(0.0 <= s <= 1.0 for s in shares) and sum(shares) == pytest.approx(1.0)
    replace_section(small_config, "diagnostics", grad_share=False)
    small_config.output.run_dir += "-off"
    (first, _), _ = train_records(small_config)
    assert "diag/bucket0/token_frac" in first and not [k for k in first if "grad_share" in k]
