"""Each token-level method reduces exactly to GRPO at its neutral setting (loss and gradient).

Lopti's two passes, evaluated at the same parameters, add up to the single GRPO pass (methods
spec §4.4): the numerators partition the tokens and both passes divide by all valid tokens.
"""

import pytest
import torch

from tests.algorithms.helpers import loss_and_grad, make_batch, passes_for, total_loss_fn
from tokenbalance.algorithms.aggregate import AGG_MODES, aggregate
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.nthr import NTHRConfig
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.presets import get_method
from tokenbalance.algorithms.surrogate import clipped_surrogate
from tokenbalance.algorithms.weights import ARConfig, TRGRPOConfig, ar_token_weights, tr_grpo_token_weights

GRPO = get_method("grpo").replace(entropy_coeff=0.01)
UNIT_TR = dict(lower=1.0, upper=1.0, warn_degenerate=False)


def assert_same_loss_and_grad(method, reference=GRPO, seed=0, **batch_kw):
    batch = make_batch(seed, **batch_kw)
    loss, grad = loss_and_grad(batch, total_loss_fn(method, batch))
    ref_loss, ref_grad = loss_and_grad(batch, total_loss_fn(reference, batch))
    assert loss.item() == pytest.approx(ref_loss.item(), abs=1e-12)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=0)
    assert grad.abs().sum() > 0  # the comparison is not vacuous


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "variant",
    [
        GRPO.replace(ar=ARConfig(alpha=0.0)),
        GRPO.replace(ar=ARConfig(alpha=0.0, prob_source="current_detached")),
        GRPO.replace(tr_grpo=TRGRPOConfig(**UNIT_TR)),
        GRPO.replace(tr_grpo=TRGRPOConfig(placement="ratio_in_clip", weight_kl=True, **UNIT_TR)),
        GRPO.replace(tr_grpo=TRGRPOConfig(prob_source="old", **UNIT_TR)),
        GRPO.replace(nthr=NTHRConfig(eta=1.0)),
        GRPO.replace(nthr=NTHRConfig(eta=1.0, beta=float("-inf"))),
        GRPO.replace(nthr=NTHRConfig(eta=1.0, positives="advantage_sign")),
        GRPO.replace(nthr=NTHRConfig(eta=1.0, correct_threshold=0.5)),
        GRPO.replace(ar=ARConfig(alpha=0.0, prob_source="current_detached", neg_adv_weight=1.0)),
    ],
    ids=[
        "ar_alpha0",
        "ar_current_alpha0",
        "tr_unit",
        "tr_unit_literal",
        "tr_unit_old",
        "nthr_eta1",
        "nthr_eta1_all",
        "nthr_eta1_sign",
        "nthr_eta1_threshold",
        "ar_current_alpha0_unit_neg",
    ],
)
def test_neutral_settings_reduce_to_grpo(variant, seed):
    assert_same_loss_and_grad(variant, seed=seed)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("order", ["low_first", "high_first"])
def test_lopti_passes_at_same_parameters_sum_to_grpo(mode, order):
    grpo = GRPO.replace(loss_agg_mode=mode)
    lopti = grpo.replace(lopti=LoptiConfig(eta=0.5, order=order))
    batch = make_batch(2, groups=3)
    passes, metrics = passes_for(lopti, batch)
    assert len(passes) == 2 and 0 < metrics["lopti/low_token_frac"] < 1
    assert_same_loss_and_grad(lopti, reference=grpo, seed=2, groups=3)


def test_lopti_kl_terms_partition():
    grpo = get_method("grpo")
    lopti = grpo.replace(lopti=LoptiConfig(eta=0.15))
    batch = make_batch(4)
    passes, _ = passes_for(lopti, batch)
    (single,), _ = passes_for(grpo, batch)
    logp = batch.logp().detach()
    kl = [pass_loss(lopti, p, logp, batch.old_logp_BT, batch.ref_logp_BT).metrics["loss/kl"] for p in passes]
    full = pass_loss(grpo, single, logp, batch.old_logp_BT, batch.ref_logp_BT).metrics["loss/kl"]
    assert sum(kl) == pytest.approx(full, abs=1e-12) and min(kl) > 0


def test_lopti_per_stage_renormalisation_changes_the_loss():
    lopti = GRPO.replace(lopti=LoptiConfig(eta=0.5, renormalize_per_stage=True))
    batch = make_batch(2, groups=3)
    loss, _ = loss_and_grad(batch, total_loss_fn(lopti, batch))
    ref, _ = loss_and_grad(batch, total_loss_fn(GRPO, batch))
    assert abs(loss.item() - ref.item()) > 1e-6


def test_ar_is_a_per_token_loss_weight_with_identical_clipping():
    """AR (w > 0) == multiplying the per-token GRPO surrogate by w; clip decisions unchanged."""
    method = GRPO.replace(ar=ARConfig(alpha=0.3), kl=GRPO.kl.__class__(placement="none"), entropy_coeff=0.0)
    batch = make_batch(5)
    (ar_pass,), _ = passes_for(method, batch)
    (grpo_pass,), _ = passes_for(GRPO, batch)
    weights = ar_token_weights(batch.old_logp_BT, batch.mask_BT, method.ar)

    def manual(logp_BT, _entropy):
        out = clipped_surrogate(logp_BT, batch.old_logp_BT, grpo_pass.advantages_BT, batch.mask_BT, method.clip)
        return aggregate(out.loss_BT * weights, batch.mask_BT)

    def via_method(logp_BT, _entropy):
        return pass_loss(method, ar_pass, logp_BT, batch.old_logp_BT).loss

    torch.testing.assert_close(loss_and_grad(batch, via_method), loss_and_grad(batch, manual), atol=1e-12, rtol=0)
    logp = batch.logp().detach()
    clip_ar = clipped_surrogate(logp, batch.old_logp_BT, ar_pass.advantages_BT, batch.mask_BT, method.clip).clipped_BT
    clip_grpo = clipped_surrogate(
        logp, batch.old_logp_BT, grpo_pass.advantages_BT, batch.mask_BT, method.clip
    ).clipped_BT
    assert torch.equal(clip_ar, clip_grpo) and clip_grpo.any()


def test_tr_grpo_loss_multiplier_equals_advantage_scaling():
    config = TRGRPOConfig(prob_source="old")
    method = GRPO.replace(tr_grpo=config, entropy_coeff=0.0)
    batch = make_batch(6)
    (grpo_pass,), _ = passes_for(GRPO, batch)
    weights = tr_grpo_token_weights(batch.old_logp_BT, batch.mask_BT, config)
    assert weights.max() > 1.0  # non-trivial weights
    scaled = grpo_pass.__class__(
        grpo_pass.name,
        grpo_pass.advantages_BT * weights,
        grpo_pass.policy_mask_BT,
        grpo_pass.kl_entropy_mask_BT,
        grpo_pass.normaliser_mask_BT,
    )
    plain = GRPO.replace(entropy_coeff=0.0)

    def tr(logp_BT, _e):
        return pass_loss(method, grpo_pass, logp_BT, batch.old_logp_BT, batch.ref_logp_BT).loss

    def by_advantage(logp_BT, _e):
        return pass_loss(plain, scaled, logp_BT, batch.old_logp_BT, batch.ref_logp_BT).loss

    torch.testing.assert_close(loss_and_grad(batch, tr), loss_and_grad(batch, by_advantage), atol=1e-12, rtol=0)
