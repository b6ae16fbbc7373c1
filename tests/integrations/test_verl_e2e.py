"""verl 0.9's own trainer end to end on CPU with tokenbalance registered (four launches).

Each launch is ``python -m tokenbalance.integrations.verl.main`` (verl's ``main_ppo`` after our
config check): Ray driver, TaskRunner, FSDP2 actor / reference workers over gloo, TransferQueue,
verl's agent loop and reward loop, the rollout (the test-only ``hf_cpu`` backend of
``tests/integrations/verl_cpu``) and the naive weight sync after every step. The policy is a
random tiny Llama; the reward (``verl_cpu/reward.py``) varies between samples, so advantages
are not zero. Launches (timings in docs/verl.md):

* ``lopti``: ``tokenbalance_lopti`` trainer + ``tokenbalance_ar`` loss, two data-parallel ranks,
  3 steps, validation at steps 2 and 3, checkpoints at steps 2 and 3;
* ``resume``: the same configuration resumed from the step-2 checkpoint for step 3, which must
  reproduce the first launch's step 3 (model, optimizer, data position and step restored);
* ``verl_grpo`` / ``tokenbalance_grpo``: verl's ``grpo`` estimator + ``vanilla`` loss on one rank
  against ours on two data-parallel ranks, 2 steps each from the same weights and seeds: equal
  metrics up to float32 rounding (the rollout's samples do not depend on the rank count).

Marked ``slow`` (minutes); not deselected by default, so ``pytest -q`` (CI) runs them. In CI a
missing verl fails instead of skipping.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integrations.verl_cpu.stack import require_verl_stack

require_verl_stack("the verl end-to-end tests")

from tests.integrations.verl_cpu.launch import VOCABULARY, VerlRun, cpu_overrides, prepare_inputs, run_verl
from tests.tolerances import assert_close_in, dtype_atol

pytestmark = pytest.mark.slow

POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
TOKENBALANCE_LOSS_CONFIG = f"{POLICY_LOSS}._target_=tokenbalance.integrations.verl.config.TokenBalancePolicyLossConfig"
LAUNCH_TIMEOUT_S = 480  # a wrong Ray CPU count hangs silently; several times a normal launch (docs/verl.md)
LOPTI = [
    "trainer.v1.trainer_mode=tokenbalance_lopti",
    "algorithm.adv_estimator=tokenbalance_grpo",
    f"{POLICY_LOSS}.loss_mode=tokenbalance_ar",
    TOKENBALANCE_LOSS_CONFIG,
    f"+{POLICY_LOSS}.ar_alpha=0.3",
    # eta near the probabilities actually seen: a random policy puts about 1/V on every token
    f"+{POLICY_LOSS}.lopti_eta={1 / VOCABULARY}",
    "trainer.test_freq=2",
]
NTHR_SETTINGS = "trainer.v1.tokenbalance_nthr"
NTHR = [
    "trainer.v1.trainer_mode=tokenbalance_nthr",
    "algorithm.adv_estimator=tokenbalance_grpo",
    f"{POLICY_LOSS}.loss_mode=tokenbalance_grpo",
    TOKENBALANCE_LOSS_CONFIG,
    # the test reward (a letter share) never reaches its maximum, so no response is "correct":
    # anchor on the responses with a positive advantage instead
    f"+{NTHR_SETTINGS}.positives=advantage_sign",
    f"+{NTHR_SETTINGS}.beta=0.0",  # the paper's R1-distill value: select tokens with a positive score
    f"+{NTHR_SETTINGS}.eta=0.5",
]
VERL_GRPO = ["algorithm.adv_estimator=grpo", f"{POLICY_LOSS}.loss_mode=vanilla"]
TOKENBALANCE_GRPO = [
    "algorithm.adv_estimator=tokenbalance_grpo",
    f"{POLICY_LOSS}.loss_mode=tokenbalance_grpo",
    TOKENBALANCE_LOSS_CONFIG,
]
# quantities both GRPO launches log; rollouts, rewards and advantages first, then the update
GRPO_KEYS = (
    "critic/score/mean",
    "critic/advantages/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "response_length/mean",
    "actor/entropy",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "rollout_corr/training_log_ppl",
)
PASSES = ("lopti_low", "lopti_high")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    """A module-wide directory with the tiny model and the K&K files (``root``, ``model``, ``train``, ``val``)."""
    root = tmp_path_factory.mktemp("verl_cpu")
    return {"root": root, **prepare_inputs(root / "inputs")}


def launch(workspace: dict[str, Path], name: str, overrides: list[str], *, ranks: int = 1, steps: int = 2) -> VerlRun:
    """One verl launch in ``<root>/<name>``; fails the test with the log's tail if it did not exit 0."""
    run_dir = workspace["root"] / name
    run = run_verl(
        cpu_overrides(workspace, run_dir, ranks=ranks, steps=steps) + overrides, run_dir, timeout_s=LAUNCH_TIMEOUT_S
    )
    print(f"verl launch {name}: exit {run.returncode}, {run.wall_s:.0f} s wall, {ranks} rank(s), up to step {steps}")
    assert run.returncode == 0, f"verl launch {name!r} failed (exit {run.returncode}):\n{run.log_tail}"
    return run


@pytest.fixture(scope="module")
def lopti_runs(workspace) -> tuple[VerlRun, VerlRun, Path]:
    """The two-rank Lopti launch (3 steps) and its resumption from the step-2 checkpoint."""
    first = launch(workspace, "lopti", [*LOPTI, "trainer.save_freq=2"], ranks=2, steps=3)
    checkpoint = workspace["root"] / "lopti" / "checkpoints" / "global_step_2"
    resume = [*LOPTI, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"]
    resumed = launch(workspace, "resume", resume, ranks=2, steps=3)
    return first, resumed, checkpoint


@pytest.fixture(scope="module")
def grpo_runs(workspace) -> tuple[VerlRun, VerlRun]:
    """verl's GRPO on one rank, ours on two, 2 steps each."""
    verl_run = launch(workspace, "verl_grpo", VERL_GRPO)
    return verl_run, launch(workspace, "tokenbalance_grpo", TOKENBALANCE_GRPO, ranks=2)


@pytest.fixture(scope="module")
def nthr_run(workspace) -> VerlRun:
    """The NTHR trainer on two data-parallel ranks, 2 steps."""
    return launch(workspace, "nthr", NTHR, ranks=2)


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def assert_rollout_matches_actor(metrics: dict[str, float]) -> None:
    """The rollout's log-probs equal the actor's on the same tokens (the weight sync happened)."""
    atol = dtype_atol(torch.float32, metrics["rollout_corr/training_log_ppl"])
    for key in ("rollout_corr/log_ppl_diff_max", "rollout_corr/log_ppl_diff_min"):
        assert abs(metrics[key]) <= atol, f"{key} = {metrics[key]} > {atol}: rollout weights differ from the actor's"


def test_lopti_on_two_ranks_trains_validates_and_checkpoints(lopti_runs):
    run, _, checkpoint = lopti_runs
    assert sorted(run.steps) == [1, 2, 3]
    for step, metrics in run.steps.items():
        for name in PASSES:
            norm = metrics[f"actor/grad_norm/{name}"]
            assert finite(norm) and norm > 0, f"step {step}: pass {name} has gradient norm {norm}"
            assert finite(metrics[f"actor/pg_loss/{name}"])
        assert 0 < metrics["actor/tokenbalance/lopti/low_token_frac"] < 1, step
        assert metrics["actor/tokenbalance/lopti/threshold"] == pytest.approx(1 / VOCABULARY)
        assert finite(metrics["actor/pg_loss"]) and finite(metrics["actor/tokenbalance/loss/kl"])
        assert metrics["critic/advantages/max"] > 0 > metrics["critic/advantages/min"], step
        assert metrics["actor/tokenbalance/adv_weighted/abs_mean"] < metrics["actor/tokenbalance/adv/abs_mean"]
        assert_rollout_matches_actor(metrics)
        # the high pass sees the policy after the low pass's optimizer step
        assert metrics["actor/tokenbalance/policy/ratio_mean/lopti_high"] != 1.0
        assert metrics["actor/tokenbalance/policy/ratio_mean/lopti_low"] == pytest.approx(1.0, abs=1e-6)
    for step in (2, 3):
        assert any(key.startswith("val-core/") for key in run.steps[step]), f"no validation metrics at step {step}"
    shards = sorted(path.name for path in (checkpoint / "actor").glob("model_world_size_2_rank_*.pt"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]


def test_resumed_run_continues_at_step_3_as_the_uninterrupted_run(lopti_runs):
    """Model, optimizer, data position and step come back from the checkpoint: step 3 is the same.

    Compared: quantities of the whole batch (rewards, advantages, entropy, the log-probs' perplexity,
    validation) and the per-pass losses and gradient norms, which are sums over micro-batches and
    ranks. The high pass's loss and gradient norm are taken after the low pass's optimizer step,
    so they also check the restored optimizer state. Not compared: metrics verl averages over
    micro-batches (``ppo_kl``, the low-token fraction, ``tokenbalance/adv/*``), which depend on
    which samples share a micro-batch, and that follows the order in which concurrent rollouts
    finish.
    """
    first, resumed, _ = lopti_runs
    assert sorted(resumed.steps) == [3]
    expected, actual = first.steps[3], resumed.steps[3]
    keys = [
        *(f"actor/{key}/{name}" for key in ("grad_norm", "pg_loss") for name in PASSES),
        "actor/tokenbalance/loss/kl",
        "actor/entropy",
        "critic/score/mean",
        "critic/advantages/mean",
        "critic/advantages/max",
        "rollout_corr/training_log_ppl",
        *(key for key in expected if key.startswith("val-core/")),
    ]
    for key in keys:
        assert_close_in(torch.tensor(actual[key]), torch.tensor(expected[key]), torch.float32, msg=f"step 3 {key}")


def test_verl_grpo_and_vanilla_equal_tokenbalance_grpo_end_to_end(grpo_runs):
    """Same start, seeds and data: verl's own GRPO (one rank) and ours (two ranks) log the same numbers."""
    verl_run, ours_run = grpo_runs
    assert sorted(verl_run.steps) == sorted(ours_run.steps) == [1, 2]
    for step in (1, 2):
        expected, actual = verl_run.steps[step], ours_run.steps[step]
        assert expected["critic/advantages/max"] > 0 > expected["critic/advantages/min"], step
        assert expected["actor/grad_norm"] > 0, step
        assert_rollout_matches_actor(actual)
        for key in GRPO_KEYS:
            assert_close_in(
                torch.tensor(actual[key]), torch.tensor(expected[key]), torch.float32, msg=f"step {step} {key}"
            )


def test_nthr_trainer_down_weights_negative_tokens_and_the_update_uses_them(nthr_run):
    """NTHR's weights from verl's old-log-prob hidden states: some negative tokens at eta, every
    positive token at 1, and the stored advantages (verl's metric of them, the update's input) weighted."""
    assert sorted(nthr_run.steps) == [1, 2]
    for step, metrics in nthr_run.steps.items():
        nthr = {key.removeprefix("tokenbalance/nthr/"): value for key, value in metrics.items() if "/nthr/" in key}
        print(f"step {step}: " + ", ".join(f"{key} {value:.4g}" for key, value in sorted(nthr.items())))
        assert metrics["critic/advantages/max"] > 0 > metrics["critic/advantages/min"], step
        assert nthr["mixed_groups"] >= 1 and nthr["eta_mean"] == 0.5, step
        assert 0 < nthr["selected_frac"] <= 1, step
        assert nthr["neg_weight_min"] == 0.5 and 0.5 <= nthr["neg_weight_mean"] < 1, step
        assert nthr["pos_weight_min"] == nthr["pos_weight_max"] == 1.0, step
        assert nthr["adv_weighted_mean"] > nthr["adv_mean"], step  # negative advantages shrank
        assert_close_in(
            torch.tensor(metrics["critic/advantages/mean"]),
            torch.tensor(nthr["adv_weighted_mean"]),
            torch.float32,
            msg=f"step {step}: verl's stored advantages are the weighted ones",
        )
        assert finite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0, step
        assert_rollout_matches_actor(metrics)
        timings = {key: metrics[key] for key in ("timing_s/step", "timing_s/old_log_prob", "timing_s/adv")}
        timings["timing_s/tokenbalance_nthr"] = metrics["timing_s/tokenbalance_nthr"]
        print(f"step {step}: " + ", ".join(f"{key} {value:.3f}" for key, value in timings.items()))
