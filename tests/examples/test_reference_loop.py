"""examples/reference_loop.py: its formulas are the trainer's, its Lopti passes split the tokens
low probability first, a short run is reproducible and trains, and it imports only the core."""

import ast
import copy
import importlib.util
import statistics
import sys
from pathlib import Path

import pytest
import torch

from tests.tolerances import assert_close_in
from tokenbalance.algorithms import build_update_passes, get_method
from tokenbalance.trainer.distributed import DistContext
from tokenbalance.trainer.logprobs import pack_sequences, response_logprobs
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, run_update

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reference_loop.py"
SMALL = ["--hidden-size", "32", "--layers", "2", "--sft-batch", "16", "--max-new-tokens", "8"]
ALLOWED_PROJECT = ("tokenbalance.algorithms", "tokenbalance.models", "tokenbalance.tasks")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("reference_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the dataclass looks its module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(example):
    """A tiny policy after a short warm start (so the old probabilities straddle eta), its frozen
    copy as the reference, and a hand-made batch of 2 prompts x 3 responses."""
    torch.set_num_threads(1)
    args = example.parse_args([*SMALL, "--sft-steps", "80"])
    problems = example.make_problems(400, seed=0)
    torch.manual_seed(0)
    policy, tokenizer = example.build_policy(args, problems)
    example.sft_warm_start(policy, tokenizer, problems, args)
    reference = copy.deepcopy(policy).requires_grad_(False)
    eos = tokenizer.eos_token
    rows = [  # (prompt, target, response): exact, one letter in place, none; exact, two, cut off (no EOS)
        ("reverse: a b c =", " c b a", " c b a" + eos),
        ("reverse: a b c =", " c b a", " c a b" + eos),
        ("reverse: a b c =", " c b a", " b" + eos),
        ("reverse: d e f g =", " g f e d", " g f e d" + eos),
        ("reverse: d e f g =", " g f e d", " g f d e" + eos),
        ("reverse: d e f g =", " g f e d", " a a a a a a"),
    ]
    prompts = tokenizer([p for p, _, _ in rows], return_tensors="pt", padding=True, padding_side="left")
    responses = tokenizer([r for _, _, r in rows], return_tensors="pt", padding=True, padding_side="right")
    texts = tokenizer.batch_decode(responses.input_ids, skip_special_tokens=True)
    scores_B = torch.tensor([example.reward(text, target) for text, (_, target, _) in zip(texts, rows)])
    batch = example.Batch(
        prompts.input_ids,
        prompts.attention_mask,
        responses.input_ids,
        responses.attention_mask.bool(),
        scores_B,
        torch.tensor([0, 0, 0, 1, 1, 1]),
    )
    return args, policy, reference, batch


def test_the_hand_made_rewards(setup):
    _, _, _, batch = setup
    assert torch.equal(batch.scores_B, torch.tensor([1.0, 0.5 / 3, 0.0, 1.0, 0.25, 0.0]))


def test_the_hyper_parameters_are_the_ar_lopti_presets(example):
    method, args = get_method("ar_lopti"), example.parse_args([])
    assert (method.clip, method.kl) == (example.CLIP, example.KL)
    assert method.ar == example.ARConfig(alpha=args.alpha)
    assert method.lopti == example.LoptiConfig(eta=args.eta)
    assert (method.advantage.estimator, method.loss_agg_mode, method.entropy_coeff) == ("grpo", "token-mean", 0.0)


def test_log_probs_equal_the_trainers(example, setup):
    args, policy, _, batch = setup
    with torch.no_grad():
        ours_BT = example.response_logprobs(policy, batch, args.temperature)
        packed = pack_sequences(
            batch.prompt_ids_BS, batch.prompt_mask_BS, batch.response_ids_BT, batch.response_mask_BT, batch.group_ids_B
        )
        theirs_BT = response_logprobs(policy, packed, temperature=args.temperature).logp_BT
    mask_BT = batch.response_mask_BT
    assert_close_in(ours_BT[mask_BT], theirs_BT[mask_BT], torch.float32, msg="log-probs")
    assert bool((ours_BT[~mask_BT] == 0).all())


def test_lopti_passes_partition_the_tokens_low_probability_first(example, setup):
    args, policy, _, batch = setup
    with torch.no_grad():
        old_logp_BT = example.response_logprobs(policy, batch, args.temperature)
    passes, metrics = example.update_passes(batch, old_logp_BT, args)
    low, high = passes
    mask_BT, prob_BT = batch.response_mask_BT, old_logp_BT.exp()
    assert (low.name, high.name) == ("lopti_low", "lopti_high")
    assert bool(low.policy_mask_BT.any()) and bool(high.policy_mask_BT.any()), "the warm start should split them"
    assert not bool((low.policy_mask_BT & high.policy_mask_BT).any())
    assert torch.equal(low.policy_mask_BT | high.policy_mask_BT, mask_BT)
    assert bool((prob_BT[low.policy_mask_BT] < args.eta).all()) and bool(
        (prob_BT[high.policy_mask_BT] >= args.eta).all()
    )
    assert torch.equal(low.normaliser_mask_BT, mask_BT) and torch.equal(high.normaliser_mask_BT, mask_BT)
    assert metrics["lopti/low_token_frac"] == float(low.policy_mask_BT.sum()) / float(mask_BT.sum())

    # the advantages by hand: (s - group mean) / (group std + 1e-6), times alpha * p + 1 - alpha
    scores = batch.scores_B.tolist()
    grpo_B = []
    for group in (scores[:3], scores[3:]):
        grpo_B += [(s - statistics.mean(group)) / (statistics.stdev(group) + 1e-6) for s in group]
    expected_BT = torch.tensor(grpo_B)[:, None] * (args.alpha * prob_BT + 1 - args.alpha) * mask_BT
    assert_close_in(low.advantages_BT + high.advantages_BT, expected_BT, torch.float32, msg="advantages")


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps each step's (clipped) gradients."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        self.grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
        return super().step(closure)


def test_one_step_equals_the_trainers_update(example, setup):
    """The example's rl_step and the trainer's path (build_update_passes of the ar_lopti preset,
    run_update over one mini-batch) on the same batch: the same passes, per-pass losses,
    gradients and parameters after both passes."""
    args, policy, reference, batch = setup
    ours, theirs = copy.deepcopy(policy), copy.deepcopy(policy)
    our_optimizer = RecordingSGD(ours.parameters(), lr=0.5)
    their_optimizer = RecordingSGD(theirs.parameters(), lr=0.5)
    with torch.no_grad():
        old_logp_BT = example.response_logprobs(policy, batch, args.temperature)
        ref_logp_BT = example.response_logprobs(reference, batch, args.temperature)
    method, mask_BT = get_method("ar_lopti"), batch.response_mask_BT
    passes, pass_metrics = build_update_passes(
        method, batch.scores_B, batch.group_ids_B, mask_BT, old_logp_BT, ref_logp_BT
    )
    our_passes, our_pass_metrics = example.update_passes(batch, old_logp_BT, args)
    assert our_pass_metrics.items() <= pass_metrics.items()
    for our_pass, their_pass in zip(our_passes, passes, strict=True):
        assert our_pass.name == their_pass.name
        for field in ("policy_mask_BT", "kl_entropy_mask_BT", "normaliser_mask_BT"):
            assert torch.equal(getattr(our_pass, field), getattr(their_pass, field)), field
        assert_close_in(our_pass.advantages_BT, their_pass.advantages_BT, torch.float32, msg="advantages")

    metrics = example.rl_step(ours, reference, our_optimizer, batch, args)
    packed = pack_sequences(
        batch.prompt_ids_BS, batch.prompt_mask_BS, batch.response_ids_BT, mask_BT, batch.group_ids_B
    )
    settings = UpdateSettings(
        temperature=args.temperature,
        mini_batch_rows=len(mask_BT),
        micro_batch_rows=len(mask_BT),
        grad_clip=args.grad_clip,
        token_mean_scope="mini_batch",
    )
    spec = UpdateSpec(method, passes, UpdateRows(packed, old_logp_BT, ref_logp_BT), settings)
    record = run_update(spec, theirs, their_optimizer, DistContext())
    for name in ("lopti_low", "lopti_high"):
        ours_loss = torch.tensor(metrics[f"{name}/loss"])
        theirs_loss = torch.tensor(record.metrics[f"pass/{name}/loss/total"])
        assert_close_in(ours_loss, theirs_loss, torch.float32, msg=f"{name} loss")
        assert_close_in(
            torch.tensor(metrics[f"{name}/kl"]), torch.tensor(record.metrics[f"pass/{name}/loss/kl"]), torch.float32
        )
    assert metrics["lopti_low/loss"] != 0.0 and metrics["lopti_high/loss"] != 0.0
    assert len(our_optimizer.grads) == len(their_optimizer.grads) == 2  # one step per pass
    for step, (our_grads, their_grads) in enumerate(zip(our_optimizer.grads, their_optimizer.grads)):
        assert any(bool(g.any()) for g in our_grads)
        for ours_g, theirs_g in zip(our_grads, their_grads, strict=True):
            assert_close_in(ours_g, theirs_g, torch.float32, msg=f"gradient of pass {step}")
    for ours_p, theirs_p in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert_close_in(ours_p, theirs_p, torch.float32, msg="parameters after the update")


def test_a_short_run_is_reproducible_and_trains(example):
    argv = [*SMALL, "--sft-steps", "30", "--steps", "2", "--prompts", "4", "--group-size", "4", "--eval-count", "8"]
    first, second = example.main(argv), example.main(argv)
    assert first["history"] == second["history"]
    for a, b in zip(first["policy"].parameters(), second["policy"].parameters(), strict=True):
        assert torch.equal(a, b)
    moved = [
        float((p - r).detach().abs().max())
        for p, r in zip(first["policy"].parameters(), first["reference"].parameters(), strict=True)
    ]
    assert max(moved) > 0.0, "RL left every parameter where the warm start put it"
    for metrics in first["history"]:
        assert 0.0 <= metrics["reward"] <= 1.0
        assert metrics["lopti_low/grad_norm"] > 0.0 or metrics["lopti_high/grad_norm"] > 0.0


def test_it_imports_only_the_algorithm_core_models_and_tasks():
    roots = set(sys.stdlib_module_names) | {"torch", "transformers"}
    imported = []
    for node in ast.walk(ast.parse(EXAMPLE.read_text())):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            imported.append(node.module or "")
    assert "tokenbalance.algorithms" in imported
    bad = [
        name
        for name in imported
        if not (name.split(".")[0] in roots or any(name == p or name.startswith(p + ".") for p in ALLOWED_PROJECT))
    ]
    assert not bad, f"examples/reference_loop.py imports {bad}: only the core, models and tasks"
