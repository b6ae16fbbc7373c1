"""Mixed precision (``model.autocast``, ``trainer/precision.py``): every forward of a step in
bfloat16 while the weights, gradients and AdamW state stay float32; log-probs within bfloat16
rounding of float32's; and the refusal of a bfloat16-stored policy whose updates would round away."""

import contextlib
import dataclasses
import math

import pytest
import torch

from tests.tolerances import assert_close_in, dtype_atol
from tests.trainer.conftest import SMALL_RUN
from tokenbalance.config import RunConfig, apply_overrides
from tokenbalance.models import TinyModelConfig, build_tiny_model, load_policy, save_policy, train_tokenizer
from tokenbalance.tasks.kk import tokenizer_corpus
from tokenbalance.trainer import precision
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import batched_response_logprobs, pack_sequences, response_logprobs
from tokenbalance.trainer.loop import prepare_training, rl_step
from tokenbalance.trainer.precision import ForwardSettings

# The logits of a forward under bfloat16 autocast: every matrix product rounds its inputs and its
# output to bfloat16 (relative eps / 2 = 2^-8 each, eps = 2^-7 as torch.finfo gives it), and the
# errors of the few products along a path mostly cancel in the residual stream, so a logit moves by
# about one eps at its magnitude or less; log p = z - logsumexp(z) moves by at most twice the
# largest logit change. 2 eps leaves a wide margin (the tiny policy's log-probs moved by 0.1 eps,
# a 4-layer, 128-wide one's by 0.4 eps) and still fails on any error of a float32 computation
# that would matter (a wrong token or position moves log p by a whole unit).
LOGIT_ULPS = 2


def test_bfloat16_spacing_and_the_lost_update():
    assert precision.spacing(torch.bfloat16, 0.02) == 2.0**-13  # 1.2e-4: the example
    assert precision.spacing(torch.float32, 1.0) == 2.0**-23
    assert precision.lost_update(torch.bfloat16, 1e-6, 0.02)  # lr 1e-6 on |w| 0.02: w + step == w
    assert not precision.lost_update(torch.bfloat16, 1e-4, 0.02)  # above half the spacing: it lands
    assert not precision.lost_update(torch.bfloat16, 1e-6, 0.0)  # no weights to judge by


def test_a_bfloat16_policy_that_cannot_move_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"model.dtype=bfloat16 with optim.lr=1e-06.*model.autocast=bfloat16"):
        precision.check_update_resolution(torch.bfloat16, 1e-6, 0.02)
    precision.check_update_resolution(torch.float32, 1e-9, 0.02)  # float32 weights: never refused
    precision.check_update_resolution(torch.bfloat16, 1e-3, 0.02)


def test_typical_weight_magnitude_is_the_median_matrix_mean():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with torch.no_grad():
        for layer, value in zip(model, (0.1, 0.02, 3.0)):
            layer.weight.fill_(value)
            layer.bias.fill_(100.0)  # vectors do not count
    assert precision.typical_weight_magnitude(model) == pytest.approx(0.1)


def test_prepare_training_refuses_a_frozen_bfloat16_policy(tiny_policy_dir, tmp_path):
    config = apply_overrides(RunConfig(), [*SMALL_RUN, f"model.path={tiny_policy_dir}", "optim.lr=1e-7"])
    policy, tokenizer = load_policy(tiny_policy_dir, dtype=torch.bfloat16)
    device = torch.device("cpu")
    with pytest.raises(ValueError, match="model.autocast=bfloat16"):
        prepare_training(config, tmp_path, policy, tokenizer, device, DistContext(device=device))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.autocast=float16"], "model.autocast=float16: float16 needs a gradient scaler"),
        (["model.dtype=bfloat16", "model.autocast=bfloat16"], "needs model.dtype=float32"),
    ],
)
def test_autocast_settings_that_cannot_apply_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(RunConfig(), overrides)


def random_packed(vocab: int, rows: int = 4, prompt_len: int = 5, response_len: int = 7):
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (rows, prompt_len), generator=generator)
    response = torch.randint(3, vocab, (rows, response_len), generator=generator)
    response_mask = torch.ones_like(response)
    response_mask[0, 4:] = 0  # a shorter response
    return pack_sequences(prompt, torch.ones_like(prompt), response, response_mask)


def test_log_probs_under_bfloat16_autocast_are_float32_within_bfloat16_rounding(tiny_policy_dir):
    policy, _ = load_policy(tiny_policy_dir)
    packed = random_packed(policy.config.vocab_size)
    with torch.no_grad():
        exact = response_logprobs(policy, packed, temperature=1.0, with_entropy=True)
        mixed = response_logprobs(
            policy, packed, temperature=1.0, with_entropy=True, forward_settings=ForwardSettings(torch.bfloat16)
        )
        logits = policy(input_ids=packed.input_ids_BL, attention_mask=packed.attention_mask_BL).logits
    assert mixed.logp_BT.dtype == torch.float32 and mixed.entropy_BT is not None
    assert mixed.entropy_BT.dtype == torch.float32
    tolerance = 2 * dtype_atol(torch.bfloat16, float(logits.abs().max()), LOGIT_ULPS)
    assert float((mixed.logp_BT - exact.logp_BT).abs().max()) <= tolerance
    assert not torch.equal(mixed.logp_BT, exact.logp_BT)  # bfloat16 really ran


def test_a_step_under_autocast_keeps_float32_weights_gradients_and_optimizer_state(tiny_policy_dir, tmp_path):
    config = apply_overrides(RunConfig(), [*SMALL_RUN, f"model.path={tiny_policy_dir}", "model.autocast=bfloat16"])
    policy, tokenizer = load_policy(tiny_policy_dir)
    device = torch.device("cpu")
    parts = prepare_training(config, tmp_path, policy, tokenizer, device, DistContext(device=device))
    head_dtypes: list[torch.dtype] = []
    hook = policy.get_output_embeddings().register_forward_hook(lambda m, i, out: head_dtypes.append(out.dtype))
    grad_dtypes: set[torch.dtype] = set()
    for param in policy.parameters():
        param.register_hook(lambda grad: grad_dtypes.add(grad.dtype))
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    try:
        metrics = rl_step(parts, 0)
    finally:
        hook.remove()
    # every forward of the step (rollout, log-probs, update) computed its logits in bfloat16
    assert head_dtypes and set(head_dtypes) == {torch.bfloat16}
    assert grad_dtypes == {torch.float32}
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    state = parts.state.optimizer.state
    assert state and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in state.values())
    assert any(not torch.equal(p.detach(), before[n]) for n, p in policy.named_parameters())
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))


def test_autocast_leaves_the_embedded_policy_cache_key_alone():
    from tokenbalance.trainer.embedded import embedded_key

    assert embedded_key(apply_overrides(RunConfig(), ["model.autocast=bfloat16"])) == embedded_key(RunConfig())


def test_the_sft_command_refuses_autocast(tiny_policy_dir, tmp_path, capsys):
    from tokenbalance.cli import main

    status = main(["sft", "--model", str(tiny_policy_dir), "--set", "model.autocast=bfloat16", "--out", str(tmp_path)])
    assert status == 2 and "model.autocast=bfloat16: the SFT computes in float32" in capsys.readouterr().err


def test_autocast_warns_where_the_cpu_emulates_bfloat16(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(precision, "native_bfloat16", lambda device: device.type != "cpu")
    assert "slower than float32" in (precision.slow_autocast_warning(torch.bfloat16, cpu) or "")
    assert precision.slow_autocast_warning(torch.bfloat16, cuda) is None
    assert precision.slow_autocast_warning(None, cpu) is None
    monkeypatch.setattr(precision, "native_bfloat16", lambda device: True)
    assert precision.slow_autocast_warning(torch.bfloat16, cpu) is None


@pytest.fixture(scope="module")
def untied_policy_dir(tmp_path_factory):
    """The tiny policy with its own output layer: each weight then receives one gradient per backward."""
    path = tmp_path_factory.mktemp("policy") / "untied"
    tokenizer = train_tokenizer(list(tokenizer_corpus(people=(2, 3), count=40, template="compact")))
    config = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, tie_word_embeddings=False)
    save_policy(build_tiny_model(config, tokenizer, seed=0), tokenizer, path)
    return path


def stepped_policy(
    policy_dir, run_dir, extra: list[str], *, keep_weight_casts: bool
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The weights and metrics after one RL step under bfloat16 autocast: 8 rows in micro-batches of 2; the methods'
    KL term (0.001, every preset here) runs the reference policy too. ``keep_weight_casts`` False: every forward
    converts the weights again, as before :func:`~tokenbalance.trainer.precision.weight_casts_kept` existed."""
    config = apply_overrides(RunConfig(), [*SMALL_RUN, f"model.path={policy_dir}", "model.autocast=bfloat16", *extra])
    policy, tokenizer = load_policy(policy_dir)
    device = torch.device("cpu")
    parts = prepare_training(config, run_dir, policy, tokenizer, device, DistContext(device=device))
    forward = dataclasses.replace(parts.settings.forward_settings, keep_weight_casts=keep_weight_casts)
    parts.settings = dataclasses.replace(parts.settings, forward_settings=forward)
    metrics = rl_step(parts, 0)
    return {name: p.detach().clone() for name, p in policy.named_parameters()}, metrics


def step_both_ways(policy_dir, tmp_path, extra: list[str]):
    """:func:`stepped_policy` with the weight casts kept, then with every forward converting them."""
    kept = stepped_policy(policy_dir, tmp_path / "kept", extra, keep_weight_casts=True)
    return kept, stepped_policy(policy_dir, tmp_path / "each", extra, keep_weight_casts=False)


def same_values(a: dict[str, float], b: dict[str, float], skip: tuple[str, ...]) -> bool:
    """Equal metrics (NaN equal to NaN), those starting with ``skip`` (wall-clock ones) left out."""
    keys = [k for k in a if not k.startswith(skip)]
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in keys)


WALL_CLOCK = ("timing/", "throughput/")


@pytest.mark.parametrize(
    "extra",
    [["train.method=grpo"], ["train.method=lopti"], ["train.method=grpo", "optim.logit_chunk_tokens=5"]],
    ids=["grpo", "lopti-two-passes", "chunked-output-layer"],
)
def test_keeping_the_weight_casts_changes_no_bit_of_a_step(untied_policy_dir, tmp_path, extra):
    # mini-batches of 4 rows (Lopti: and a second pass), so several optimizer steps: the forwards after the first
    # must see the moved weights, not copies kept from before it
    (kept_weights, kept_metrics), (weights, metrics) = step_both_ways(
        untied_policy_dir, tmp_path, ["optim.mini_batch_size=4", *extra]
    )
    assert metrics["optim/steps"] >= 2.0
    assert kept_weights.keys() == weights.keys()
    changed = [name for name in weights if not torch.equal(kept_weights[name], weights[name])]
    assert changed == []  # and every weight got its gradient through the kept copy
    assert same_values(kept_metrics, metrics, WALL_CLOCK)


def test_the_setting_reaches_the_log_probs_and_the_update(untied_policy_dir, tmp_path):
    # the output layer's weight converted in a whole step, kept and not (8 rows in micro-batches of 2): the old
    # policy's 4 forwards convert it once when kept (3 saved), the update's 2 mini-batches of 2 once each (2 saved);
    # the rollout and the frozen reference convert it alike both ways
    head_shape = list(load_policy(untied_policy_dir)[0].get_output_embeddings().weight.shape)
    counts = {}
    for keep in (True, False):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profile:
            stepped_policy(untied_policy_dir, tmp_path / str(keep), ["train.method=grpo"], keep_weight_casts=keep)
        counts[keep] = sum(
            1 for e in profile.events() if e.name == "aten::_to_copy" and e.input_shapes[:1] == [head_shape]
        )
    assert counts[False] - counts[True] == 3 + 2


def test_a_tied_output_layer_sums_its_two_gradients_in_another_order(tiny_policy_dir, tmp_path):
    # The tied matrix gets a gradient from the embedding lookup (float32) and one through the output layer's kept
    # copy. That copy's autograd node dates from the first micro-batch, so later backwards reach it after the
    # embedding's and add the two in the other order: the same sums up to float32 rounding. One optimizer step
    # (GRPO, one mini-batch), so every forward sees the same weights both ways.
    (kept_weights, kept_metrics), (weights, metrics) = step_both_ways(
        tiny_policy_dir, tmp_path, ["train.method=grpo", "optim.mini_batch_size=8"]
    )
    tied = "model.embed_tokens.weight"
    assert metrics["optim/steps"] == 1.0
    assert [n for n in weights if n != tied and not torch.equal(kept_weights[n], weights[n])] == []
    # AdamW's step is lr * m / sqrt(v): a relative rounding change in the gradient moves it by about lr * eps, far
    # below one spacing of the weight, so the weight lands at most a few spacings of float32 away
    assert_close_in(kept_weights[tied], weights[tied], torch.float32, ulps=4)
    assert same_values(kept_metrics, metrics, (*WALL_CLOCK, "optim/grad_norm"))


def head_weight_casts(policy, packed, forwards: int, region) -> int:
    """How many times ``forwards`` no-grad forwards under bfloat16 autocast inside ``region`` convert the output
    layer's weight (``aten::_to_copy`` of a tensor of its shape)."""
    head_shape = list(policy.get_output_embeddings().weight.shape)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profile:
        with torch.no_grad(), region:
            for _ in range(forwards):
                response_logprobs(policy, packed, temperature=1.0, forward_settings=ForwardSettings(torch.bfloat16))
    return sum(1 for e in profile.events() if e.name == "aten::_to_copy" and e.input_shapes[:1] == [head_shape])


def test_kept_casts_convert_a_weight_once_for_all_forwards_inside(tiny_policy_dir):
    policy, _ = load_policy(tiny_policy_dir)
    packed = random_packed(policy.config.vocab_size)
    assert head_weight_casts(policy, packed, 3, contextlib.nullcontext()) == 3
    assert head_weight_casts(policy, packed, 3, precision.weight_casts_kept(policy, torch.bfloat16)) == 1
    # the region's end dropped its copy: the next region converts again
    assert head_weight_casts(policy, packed, 2, precision.weight_casts_kept(policy, torch.bfloat16)) == 1


def test_kept_casts_keep_nothing_off_autocast_or_when_told_not_to(tiny_policy_dir):
    policy, _ = load_policy(tiny_policy_dir)
    packed = random_packed(policy.config.vocab_size)
    assert head_weight_casts(policy, packed, 2, precision.weight_casts_kept(policy, None)) == 2
    assert head_weight_casts(policy, packed, 2, precision.weight_casts_kept(policy, torch.bfloat16, keep=False)) == 2


@pytest.mark.parametrize("chunk_tokens", [0, 5], ids=["whole-output-layer", "chunked-output-layer"])
@pytest.mark.parametrize("policy_fixture", ["tiny_policy_dir", "untied_policy_dir"], ids=["tied", "untied"])
def test_a_reference_stored_in_the_compute_type_gives_the_same_log_probs(policy_fixture, chunk_tokens, request):
    policy, _ = load_policy(request.getfixturevalue(policy_fixture))
    packed = random_packed(policy.config.vocab_size, rows=6)
    settings = ForwardSettings(torch.bfloat16, chunk_tokens=chunk_tokens)
    converting, stored = precision.frozen_copy(policy, None), precision.frozen_copy(policy, torch.bfloat16)
    logps = [
        batched_response_logprobs(model, packed, temperature=0.7, micro_batch=2, forward_settings=settings).logp_BT
        for model in (converting, stored)
    ]
    assert torch.equal(logps[0], logps[1])  # autocast's per-forward conversion is the same rounding, made once
    assert not stored.training and not any(p.requires_grad for p in stored.parameters())
    types = {name: p.dtype for name, p in stored.named_parameters(remove_duplicate=False)}
    assert types["lm_head.weight"] == types["model.layers.0.self_attn.q_proj.weight"] == torch.bfloat16
    assert types["model.embed_tokens.weight"] == types["model.norm.weight"] == torch.float32
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # the policy itself untouched
    counts = [head_weight_casts(model, packed, 2, contextlib.nullcontext()) for model in (converting, stored)]
    assert counts == [2, 0]


def test_a_reference_off_autocast_is_a_plain_frozen_copy(tiny_policy_dir):
    policy, _ = load_policy(tiny_policy_dir)
    copied = precision.frozen_copy(policy, None)
    assert {p.dtype for p in copied.parameters()} == {torch.float32}
    assert not copied.training and not any(p.requires_grad for p in copied.parameters())
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), copied.parameters(), strict=True))
    assert copied.get_output_embeddings().weight is copied.get_input_embeddings().weight  # still tied
