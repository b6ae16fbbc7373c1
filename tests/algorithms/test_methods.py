"""Presets, the composition, list-methods and bad-input messages."""

import pytest
import torch

from tests.algorithms.helpers import make_batch, passes_for
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import KLConfig, Method, build_update_passes, passes_from_advantages
from tokenbalance.algorithms.presets import METHOD_PRESETS, get_method
from tokenbalance.algorithms.weights import ARConfig
from tokenbalance.cli import main

REQUIRED = [
    "grpo",
    "reinforce_pp",
    "ar",
    "lopti",
    "ar_lopti",
    "tr_grpo",
    "nthr",
    "reinforce_pp_ar",
    "reinforce_pp_lopti",
    "reinforce_pp_ar_lopti",
    "reinforce_pp_tr_grpo",
    "reinforce_pp_nthr",
]

PAPER_PRESETS = {
    # name: (estimator, ar alpha, lopti eta, nthr beta, recommended temperature)
    "arlopti_kk_fig4_grpo": ("grpo", None, None, None, 0.7),
    "arlopti_kk_fig4_ar": ("grpo", 0.3, None, None, 0.7),
    "arlopti_kk_fig4_lopti": ("grpo", None, 0.5, None, 0.7),
    "arlopti_kk_fig4_ar_lopti": ("grpo", 0.3, 0.5, None, 0.7),
    "arlopti_kk_tab7_reinforce_pp": ("reinforce_pp", None, None, None, 0.7),
    "arlopti_kk_tab7_reinforce_pp_ar_lopti": ("reinforce_pp", 0.1, 0.5, None, 0.7),
    "arlopti_math_tab1_grpo": ("grpo", None, None, None, None),
    "arlopti_math_tab1_ar": ("grpo", 0.1, None, None, None),
    "arlopti_math_tab1_lopti": ("grpo", None, 0.5, None, None),
    "arlopti_math_tab1_ar_lopti": ("grpo", 0.1, 0.5, None, None),
    "nthr_math_tab2_grpo": ("grpo", None, None, None, 1.0),
    "nthr_math_tab2_nthr": ("grpo", None, None, 1.0, 1.0),
    "nthr_r1distill_tab7_grpo": ("grpo", None, None, None, 0.6),
    "nthr_r1distill_tab7_nthr": ("grpo", None, None, 0.0, 0.6),
}


def test_required_presets_exist_with_citations():
    for name in REQUIRED:
        method = get_method(name)
        assert method.name == name and method.citations and method.description
    assert set(REQUIRED) <= set(METHOD_PRESETS.names())


def test_preset_hyper_parameters_follow_the_papers():
    assert get_method("ar").ar.alpha == 0.3 and get_method("ar").ar.intercept == pytest.approx(0.7)
    assert get_method("ar_lopti").lopti.eta == 0.5 and get_method("ar_lopti").ar.alpha == 0.3
    assert get_method("reinforce_pp_ar_lopti").ar.alpha == 0.1
    assert get_method("reinforce_pp").advantage.estimator == "reinforce_pp"
    assert get_method("nthr").nthr.beta == 1.0 and get_method("nthr").nthr.eta == "2|0.5-p|"
    assert get_method("tr_grpo").tr_grpo.placement == "loss_multiplier"
    assert get_method("tr_grpo_literal").tr_grpo.placement == "ratio_in_clip"
    grpo = get_method("grpo")
    assert (grpo.clip.eps_low, grpo.clip.eps_high, grpo.clip.dual_clip_c) == (0.2, 0.24, 10.0)
    assert (grpo.kl.estimator, grpo.kl.coef, grpo.kl.log_ratio_clamp) == ("k3", 0.001, 5.0)


@pytest.mark.parametrize("name", REQUIRED)
def test_every_preset_builds_passes_and_a_loss(name):
    method = get_method(name)
    batch = make_batch(3)
    passes, metrics = passes_for(method, batch)
    assert len(passes) == (2 if method.lopti else 1)
    assert "adv/mean" in metrics
    out = pass_loss(method, passes[0], batch.logp(), batch.old_logp_BT, batch.ref_logp_BT)
    out.loss.backward()
    assert torch.isfinite(out.loss) and batch.theta_BTV.grad.abs().sum() > 0
    assert {"loss/policy", "loss/kl", "loss/total", "clip/frac"} <= set(out.metrics)


def test_kl_in_reward_changes_the_advantages():
    batch = make_batch(3, binary=False)
    plain = get_method("reinforce_pp")
    in_reward = plain.replace(kl=KLConfig(coef=0.5, estimator="k1", placement="reward"))
    (p1,), _ = passes_for(plain, batch)
    (p2,), _ = passes_for(in_reward, batch)
    assert not torch.allclose(p1.advantages_BT, p2.advantages_BT)
    assert not in_reward.needs_ref_logp or in_reward.kl.placement == "reward"


def test_list_methods_prints_every_preset_with_hyper_parameters(capsys):
    assert main(["list-methods"]) == 0
    out = capsys.readouterr().out
    for name in REQUIRED:
        assert f"\n{name}: " in f"\n{out}"
    assert "alpha=0.3" in out and "eta=0.5" in out and "arXiv 2505.12929" in out and "arXiv 2505.18830" in out
    assert main(["list-methods", "nthr"]) == 0
    assert capsys.readouterr().out.startswith("nthr: GRPO + Negative Token Hidden Reward")


def test_unknown_method_lists_valid_names(capsys):
    with pytest.raises(ValueError, match="unknown method 'gpro'; valid names: .*grpo"):
        get_method("gpro")
    assert main(["list-methods", "gpro"]) == 2
    assert "unknown method 'gpro'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Method(loss_agg_mode="mean"), "loss_agg_mode: unknown value 'mean'"),
        (lambda: get_method("grpo").replace(max_response_len=0), "max_response_len: must be in"),
        (lambda: KLConfig(estimator="k5"), "kl.estimator: unknown value 'k5'"),
        (lambda: KLConfig(placement="everywhere"), "kl.placement: unknown value 'everywhere'"),
        (lambda: get_method("grpo").advantage.__class__(estimator="ppo"), "advantage.estimator: unknown value 'ppo'"),
    ],
)
def test_bad_configuration(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_missing_inputs_are_named():
    batch = make_batch(0)
    with pytest.raises(ValueError, match="nthr_inputs: required by method 'nthr'"):
        build_update_passes(get_method("nthr"), batch.scores_B, batch.group_ids_B, batch.mask_BT, batch.old_logp_BT)
    (grpo_pass,), _ = passes_for(get_method("grpo"), batch)
    with pytest.raises(ValueError, match="ref_logp_BT: required by method 'grpo'"):
        pass_loss(get_method("grpo"), grpo_pass, batch.logp(), batch.old_logp_BT)
    with pytest.raises(ValueError, match=r"old_logp_BT: expected shape \(8, 7\), got \(8, 6\)"):
        build_update_passes(
            get_method("grpo"), batch.scores_B, batch.group_ids_B, batch.mask_BT, batch.old_logp_BT[:, :6]
        )


@pytest.mark.parametrize("prob_source", ["old", "current_detached"])
def test_ar_negative_advantage_weight_acts_on_both_probability_paths(prob_source):
    """One group, A = (+1, -1), pi = 0.5 (old = current, ratio 1), alpha 0.2, neg_adv_weight 0.5.

    w = 0.2 * 0.5 + 0.8 = 0.9, so the effective advantages are (0.9, -0.9 * 0.5 = -0.45); the
    token-mean loss is -(0.9 - 0.45) / 2 = -0.225 and d loss / d logp = -A_eff / 2 = (-0.45, 0.225).
    """
    ar = ARConfig(alpha=0.2, neg_adv_weight=0.5, prob_source=prob_source)
    method = get_method("grpo").replace(ar=ar, kl=KLConfig(placement="none"))
    mask = torch.ones(2, 1, dtype=torch.bool)
    old = torch.full((2, 1), 0.5, dtype=torch.float64).log()
    (update_pass,), _ = passes_from_advantages(method, torch.tensor([[1.0], [-1.0]], dtype=torch.float64), mask, old)
    logp = old.clone().requires_grad_(True)
    out = pass_loss(method, update_pass, logp, old)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert out.loss.item() == pytest.approx(-0.225, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-0.45], [0.225]], dtype=torch.float64), atol=1e-12, rtol=0)
    if prob_source == "current_detached":  # the probability weight waits for the loss; the sign factor does not
        torch.testing.assert_close(update_pass.advantages_BT, torch.tensor([[1.0], [-0.5]], dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(PAPER_PRESETS))
def test_paper_presets_follow_their_tables(name):
    estimator, alpha, eta, beta, temperature = PAPER_PRESETS[name]
    method = get_method(name)
    assert method.name == name and method.citations and method.description
    assert method.advantage.estimator == estimator and method.recommended_temperature == temperature
    assert (method.ar.alpha if method.ar else None) == alpha
    assert (method.lopti.eta if method.lopti else None) == eta
    assert (method.nthr.beta if method.nthr else None) == beta
    assert method.tr_grpo is None
    if name.startswith("nthr_"):  # the NTHR paper's runs: clip 0.2, KL 1e-4, dynamic sampling
        assert (method.clip.eps_low, method.clip.eps_high) == (0.2, 0.2)
        assert (method.kl.coef, method.kl.placement) == (1e-4, "loss")
        assert method.dynamic_sampling.enabled
        assert method.nthr is None or (method.nthr.eta, method.nthr.positives) == ("2|0.5-p|", "correct")
        assert method.description.startswith("NTHR paper, ")
    else:  # the AR-Lopti K&K scripts' base, no filtering
        base = get_method(estimator)
        assert (method.clip, method.kl, method.loss_agg_mode) == (base.clip, base.kl, base.loss_agg_mode)
        assert not method.dynamic_sampling.enabled
        assert method.description.startswith("AR-Lopti paper, ")


def test_short_presets_are_the_k_and_k_figure_4_rows_without_dynamic_sampling():
    for short, paper in (("ar", "arlopti_kk_fig4_ar"), ("ar_lopti", "arlopti_kk_fig4_ar_lopti")):
        a, b = get_method(short), get_method(paper)
        assert (a.ar, a.lopti, a.clip, a.kl) == (b.ar, b.lopti, b.clip, b.kl)
    assert not any(get_method(name).dynamic_sampling.enabled for name in REQUIRED)


@pytest.mark.parametrize("name", sorted(PAPER_PRESETS))
def test_every_paper_preset_builds_passes_and_a_loss(name):
    method = get_method(name)
    batch = make_batch(3)
    passes, metrics = passes_for(method, batch)
    assert len(passes) == (2 if method.lopti else 1)
    out = pass_loss(method, passes[0], batch.logp(), batch.old_logp_BT, batch.ref_logp_BT)
    assert torch.isfinite(out.loss)


def test_list_methods_prints_paper_presets_and_the_tr_grpo_caveat(capsys):
    assert main(["list-methods"]) == 0
    out = capsys.readouterr().out
    for name in PAPER_PRESETS:
        assert f"\n{name}: " in f"\n{out}"
    assert main(["list-methods", "nthr_r1distill_tab7_nthr"]) == 0
    out = capsys.readouterr().out
    assert "dynamic_sampling: enabled=True" in out and "recommended rollout temperature: 0.6" in out
    assert "kl: k3 x 0.0001" in out
    for name in ("tr_grpo", "tr_grpo_literal", "reinforce_pp_tr_grpo"):
        assert main(["list-methods", name]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert "UNVERIFIED" in first and "TR-GRPO-like" in first


@pytest.mark.parametrize("name", REQUIRED)
def test_every_preset_keeps_its_tensors_on_the_inputs_device(name):
    # A factory call without device= lands on the default device: with the default set to "meta",
    # such a call meets the CPU inputs and fails here, as it failed on a GPU (cuda inputs, CPU
    # default) in scripts/gpu_check.sh's first run.
    method = get_method(name)
    batch = make_batch(3)
    expected, _ = passes_for(method, batch)
    expected_loss = pass_loss(method, expected[0], batch.logp(), batch.old_logp_BT, batch.ref_logp_BT).loss
    with torch.device("meta"):
        passes, _ = passes_for(method, batch)
        loss = pass_loss(method, passes[0], batch.logp(), batch.old_logp_BT, batch.ref_logp_BT).loss
    for got, want in zip(passes, expected, strict=True):
        assert got.advantages_BT.device.type == "cpu"
        assert torch.equal(got.advantages_BT, want.advantages_BT)
    assert loss.device.type == "cpu" and torch.equal(loss, expected_loss)
