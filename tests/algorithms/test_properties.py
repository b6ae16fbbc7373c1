"""Property test: on any valid input no function returns NaN or Inf.

Valid inputs include fully masked rows, groups of size one, groups whose rewards are all equal,
extreme (but finite) log-probs and a whole batch without a single valid token.
"""

import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenbalance.algorithms.advantages import OUTCOME_ESTIMATORS
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import NTHRInputs, build_update_passes
from tokenbalance.algorithms.presets import METHOD_PRESETS, get_method


@st.composite
def rl_batches(draw):
    group_size = draw(st.integers(1, 4))
    groups = draw(st.integers(1, 3))
    B, T, V, D = groups * group_size, draw(st.integers(1, 5)), draw(st.integers(2, 6)), 3
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lengths = torch.randint(0, T + 1, (B,), generator=gen)  # 0 = a fully masked row
    if draw(st.booleans()):
        lengths[:] = 0
    mask = torch.arange(T)[None] < lengths[:, None]
    reward_kind = draw(st.sampled_from(["binary", "equal", "kk", "gaussian"]))
    if reward_kind == "binary":
        scores = torch.randint(0, 2, (B,), generator=gen).float()
    elif reward_kind == "equal":
        scores = torch.full((B,), 3.0)
    elif reward_kind == "kk":
        scores = torch.tensor([3.0, -0.5, -1.0, -3.0])[torch.randint(0, 4, (B,), generator=gen)]
    else:
        scores = torch.randn(B, generator=gen) * 100
    scale = draw(st.sampled_from([1.0, 10.0, 40.0]))  # large scales give probabilities of ~0 and ~1
    logits = lambda: torch.randn(B, T, V, generator=gen) * scale  # noqa: E731
    tokens = torch.randint(0, V, (B, T), generator=gen)
    gather = lambda z: torch.log_softmax(z, -1).gather(-1, tokens[..., None]).squeeze(-1)  # noqa: E731
    theta = logits().requires_grad_(True)
    return dict(
        theta=theta,
        tokens=tokens,
        mask=mask,
        scores=scores,
        group_ids=torch.arange(groups).repeat_interleave(group_size),
        old=gather(logits()),
        ref=gather(logits()),
        hidden=torch.randn(B, T, D, generator=gen) * scale,
        unembed=torch.randn(V, D, generator=gen),
        gather=gather,
    )


def assert_finite_metrics(metrics):
    bad = {k: v for k, v in metrics.items() if not torch.isfinite(torch.tensor(float(v)))}
    assert not bad, bad


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=rl_batches(),
    name=st.sampled_from(METHOD_PRESETS.names()),
    mode=st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
)
def test_every_preset_is_finite_on_valid_inputs(batch, name, mode):
    method = get_method(name).replace(loss_agg_mode=mode, entropy_coeff=0.01)
    extras = None
    if method.nthr:
        best = float(batch["scores"].max()) if batch["scores"].numel() else 1.0  # the "task maximum" of the draw
        extras = NTHRInputs(batch["tokens"], batch["hidden"], batch["unembed"], max_reward=best)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # singleton-group warning
        passes, metrics = build_update_passes(
            method, batch["scores"], batch["group_ids"], batch["mask"], batch["old"], batch["ref"], extras
        )
    assert_finite_metrics(metrics)
    logp_BTV = torch.log_softmax(batch["theta"], -1)
    entropy = -(logp_BTV.exp() * logp_BTV).sum(-1)
    total = 0.0
    for update_pass in passes:
        assert torch.isfinite(update_pass.advantages_BT).all()
        out = pass_loss(method, update_pass, batch["gather"](batch["theta"]), batch["old"], batch["ref"], entropy)
        assert torch.isfinite(out.loss)
        assert_finite_metrics(out.metrics)
        total = total + out.loss
    (grad,) = torch.autograd.grad(total, batch["theta"], allow_unused=True)
    assert grad is None or torch.isfinite(grad).all()


@settings(max_examples=40, deadline=None)
@given(
    batch=rl_batches(),
    estimator=st.sampled_from(OUTCOME_ESTIMATORS.names()),
    singleton=st.sampled_from(["reference", "zero"]),
)
def test_outcome_estimators_are_finite(batch, estimator, singleton):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adv = OUTCOME_ESTIMATORS.get(estimator)(batch["scores"], batch["group_ids"], batch["mask"], singleton=singleton)
    assert torch.isfinite(adv).all()
    assert (adv[~batch["mask"]] == 0).all()
