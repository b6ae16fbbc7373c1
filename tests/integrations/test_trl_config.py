"""TRL integration: config mapping, refusals with reasons, the version guard, the K&K reward adapter."""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest

from tests.integrations.test_trl_support import tiny_policy_dir
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.presets import apply_method_overrides, get_method
from tokenbalance.integrations.trl import (
    TaskReward,
    TokenBalanceGRPOTrainer,
    check_config,
    grpo_config_for_method,
    method_fields,
    task_prompt_dataset,
    unsupported_reason,
)
from tokenbalance.integrations.trl.config import config_method, trainer_method
from tokenbalance.integrations.trl.optimiser import (
    AR_LOPTI_FIELDS,
    AR_LOPTI_OPTIMISER,
    NTHR_OPTIMISER,
    optimiser_fields,
    paper_optimiser,
)
from tokenbalance.integrations.trl.rewards import task_prompt_rows
from tokenbalance.integrations.versions import HostVersionError
from tokenbalance.models import load_policy
from tokenbalance.tasks.kk.templates import reference_response

pytestmark = pytest.mark.usefixtures("trl_offline")

PRESETS = ("grpo", "ar", "tr_grpo", "lopti", "ar_lopti", "nthr", "tr_grpo_literal")
BASE = {
    "output_dir": "unused",
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "use_cpu": True,
    "report_to": "none",
    "max_completion_length": 16,
}


def config(method, **changes):
    return grpo_config_for_method(method, **{**BASE, **changes})


@pytest.mark.parametrize("name", PRESETS)
def test_presets_map_onto_a_consistent_config(name):
    method = get_method(name)
    args = config(name)
    check_config(method, args)
    assert (args.epsilon, args.epsilon_high) == (0.2, 0.24)
    assert args.beta == 0.001 and args.loss_type == "dapo" and args.scale_rewards == "group"
    assert args.use_bias_correction_kl is False and args.importance_sampling_level == "token"
    assert args.num_iterations == (2 if method.lopti else 1)


def test_token_mean_may_use_the_per_micro_batch_scope():
    assert config("ar", loss_type="bnpo").loss_type == "bnpo"
    with pytest.raises(ValueError, match="loss_type='grpo' does not aggregate like method 'ar'"):
        config("ar", loss_type="grpo")


def test_dr_grpo_aggregation_maps_to_trl_dr_grpo():
    method = get_method("grpo").replace(loss_agg_mode="seq-mean-token-sum-norm")
    assert method_fields(method)["loss_type"] == "dr_grpo"
    with pytest.raises(ValueError, match="GRPOConfig.max_completion_length=16"):
        check_config(method.replace(max_response_len=32), config(method))


@pytest.mark.parametrize(
    ("field", "value"), [("beta", 0.0), ("epsilon", 0.3), ("scale_rewards", "batch"), ("num_iterations", 3)]
)
def test_conflicting_field_is_named(field, value):
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}="):
        config("ar", **{field: value})


def test_a_hand_made_config_that_contradicts_the_method_is_rejected_at_construction():
    from trl import GRPOConfig

    args = GRPOConfig(**BASE)  # TRL defaults: beta 0, epsilon_high = epsilon = 0.2
    with pytest.raises(ValueError, match="GRPOConfig.epsilon_high=0.2 does not fit method 'ar'"):
        TokenBalanceGRPOTrainer(str(tiny_policy_dir()), None, args, method="ar")
    with pytest.raises(ValueError, match="args: required"):
        TokenBalanceGRPOTrainer(str(tiny_policy_dir()), None, None, method="ar")


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        (get_method("reinforce_pp"), "advantage.estimator='reinforce_pp'"),
        (get_method("grpo").replace(kl=get_method("grpo").kl.__class__(placement="reward")), "KL in the reward"),
        (
            apply_method_overrides(get_method("lopti"), {"lopti": LoptiConfig(threshold_mode="quantile", portion=0.5)}),
            "quantile threshold",
        ),
        (apply_method_overrides(get_method("lopti"), {"lopti.renormalize_per_stage": True}), "renormalize_per_stage"),
        (apply_method_overrides(get_method("nthr"), {"lopti.eta": 0.5}), "combines NTHR and Lopti"),
        (get_method("grpo").replace(policy_loss_agg_mode="seq-mean-token-mean"), "one loss_type"),
        (get_method("grpo").replace(loss_agg_mode="seq-mean-token-sum"), "has no TRL loss_type"),
        (apply_method_overrides(get_method("grpo"), {"dynamic_sampling.enabled": True}), "DAPO dynamic sampling"),
    ],
)
def test_methods_trl_cannot_run_are_refused_with_the_reason(method, reason):
    assert reason in unsupported_reason(method)
    with pytest.raises(ValueError, match=reason):
        grpo_config_for_method(method, **BASE)


@pytest.mark.parametrize(
    ("method", "changes", "field"),
    [
        ("nthr", {"steps_per_generation": 2}, "steps_per_generation"),
        ("nthr", {"num_iterations": 2}, "num_iterations"),
        ("lopti", {"num_iterations": 3}, "num_iterations"),
        (
            "lopti",
            {"gradient_accumulation_steps": 2, "steps_per_generation": 3, "per_device_train_batch_size": 4},
            "steps_per_generation",
        ),
    ],
)
def test_schedules_the_method_cannot_follow_are_refused(method, changes, field):
    from trl import GRPOConfig

    fields = {**method_fields(get_method(method)), **BASE, **changes}
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}="):
        check_config(get_method(method), GRPOConfig(**fields))


def test_lopti_with_epochs_uses_two_trl_iterations_per_epoch():
    assert config("lopti", iterations_per_pass=2).num_iterations == 4


def test_import_fails_clearly_outside_the_tested_trl_range(monkeypatch):
    import tokenbalance.integrations.trl as integration

    real_version = importlib.metadata.version
    monkeypatch.delenv("TOKENBALANCE_SKIP_HOST_CHECK", raising=False)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.12.0" if name == "trl" else real_version(name))
    try:
        with pytest.raises(HostVersionError, match=r"trl 1.12.0 is installed.*trl>=1.15,<1.17"):
            importlib.reload(integration)
    finally:
        monkeypatch.undo()
        importlib.reload(integration)


def test_task_reward_scores_prompt_plus_completion_with_special_tokens_kept():
    _, tokenizer = load_policy(tiny_policy_dir())
    row = task_prompt_rows(1, difficulty=2, template="compact")[0]
    good = reference_response(row["ground_truth"]["solution_text_format"])
    ids = [tokenizer(text)["input_ids"] + [tokenizer.eos_token_id] for text in (good, " nonsense")]
    reward = TaskReward(tokenizer)
    assert reward.__name__ == "kk" and reward.max_reward == 3.0
    scores = reward([row["prompt"]] * 2, ["ignored", "ignored"], ids, ground_truth=[row["ground_truth"]] * 2)
    assert scores == [3.0, -3.0]
    assert TaskReward()([row["prompt"]], [good], None, ground_truth=[row["ground_truth"]]) == [3.0]
    with pytest.raises(ValueError, match="'ground_truth' column"):
        reward([row["prompt"]], [good], None)
    assert set(task_prompt_dataset(3, difficulty=2).column_names) == {"prompt", "ground_truth"}
    # another registered task through the same reward: arith's answers are boxed numbers
    arith = task_prompt_rows(2, task="arith")
    answers = [f"so \\boxed{{{r['ground_truth']}}}" for r in arith]
    assert TaskReward(task="arith")(
        [r["prompt"] for r in arith], answers, None, ground_truth=[r["ground_truth"] for r in arith]
    ) == [1.0, 1.0]


def test_the_method_travels_with_the_config():
    from trl import GRPOConfig

    for name in ("ar", "tr_grpo", "nthr"):  # each shares every GRPOConfig field with GRPO
        args = config(name)
        assert config_method(args) == get_method(name) != get_method("grpo")
        assert trainer_method(None, args) == get_method(name)  # method= left out: the config's
        assert trainer_method(name, args) == get_method(name)
        with pytest.raises(ValueError, match=f"method='grpo', but args was built for method '{name}'"):
            trainer_method("grpo", args)
    plain = GRPOConfig(**{**BASE, "epsilon_high": 0.28, "beta": 0.001})  # built without us: GRPO by default
    assert config_method(plain) is None and trainer_method(None, plain) == get_method("grpo")


def zero_reward(prompts, completions, **kwargs):
    return [0.0] * len(completions)


def test_a_trainer_built_without_method_trains_the_configs():
    from tokenbalance.integrations.trl.rewards import task_prompt_dataset

    data = {"train_dataset": task_prompt_dataset(2, difficulty=2, template="compact")}
    trainer = TokenBalanceGRPOTrainer(str(tiny_policy_dir()), zero_reward, config("ar"), **data)
    assert trainer.balance_method == get_method("ar")
    with pytest.raises(ValueError, match="args was built for method 'ar'"):
        TokenBalanceGRPOTrainer(str(tiny_policy_dir()), zero_reward, config("ar"), method="grpo", **data)


def test_the_config_takes_overrides_as_every_runner_does():
    args = config("lopti", method_overrides={"lopti.eta": 0.3})
    assert config_method(args) == apply_method_overrides(get_method("lopti"), {"lopti.eta": 0.3})
    assert config_method(args).lopti.eta == 0.3
    with pytest.raises(ValueError, match=r"^method.lopti.etaa: unknown field 'etaa'"):
        config("lopti", method_overrides={"lopti.etaa": 0.3})


def test_a_trainer_takes_method_overrides_as_our_trainer_does():
    args = config("lopti")
    tuned = apply_method_overrides(get_method("lopti"), {"lopti.eta": 0.3})
    assert trainer_method(None, args, {"lopti.eta": 0.3}) == tuned  # on top of the config's method
    assert trainer_method("lopti", args, {"lopti.eta": 0.3}) == tuned
    assert trainer_method(None, config("grpo"), {"ar.alpha": 0.2}).ar.alpha == 0.2
    with pytest.raises(ValueError, match=r"^method_overrides.lopti.etaa: unknown field 'etaa'"):
        trainer_method(None, args, {"lopti.etaa": 0.3})


@pytest.mark.parametrize("name", ("grpo", "ar", "lopti", "ar_lopti", "tr_grpo", "nthr", "reinforce_pp_ar"))
def test_method_configs_carry_the_ar_lopti_scripts_optimiser(name):
    if name.startswith("reinforce_pp"):  # TRL cannot run it; the table still names its paper
        assert optimiser_fields(get_method(name), "paper") == AR_LOPTI_FIELDS
        return
    args = config(name)
    assert (args.learning_rate, args.weight_decay, args.warmup_steps) == (1e-6, 0.01, 0)
    assert (args.adam_beta1, args.adam_beta2, args.max_grad_norm) == (0.9, 0.999, 1.0)
    assert str(args.lr_scheduler_type.value) == "constant"


def test_nthr_paper_runs_take_its_learning_rate_and_name_what_it_does_not_state():
    method = get_method("nthr_math_tab2_nthr")
    assert paper_optimiser(method) is NTHR_OPTIMISER and NTHR_OPTIMISER.fields["learning_rate"] == 1e-6
    assert "learning_rate" not in NTHR_OPTIMISER.unstated and "weight_decay" in NTHR_OPTIMISER.unstated
    assert paper_optimiser(get_method("nthr")) is AR_LOPTI_OPTIMISER  # the base preset: the K&K scripts' base


def test_a_field_given_wins_over_the_papers_and_trl_keeps_its_own_defaults():
    args = config("ar", learning_rate=5e-7, lr_scheduler_type="cosine")
    assert args.learning_rate == 5e-7 and str(args.lr_scheduler_type.value) == "cosine"
    assert args.weight_decay == 0.01
    trl_defaults = config("ar", optimiser="trl")
    assert str(trl_defaults.lr_scheduler_type.value) == "linear" and trl_defaults.weight_decay == 0.0
    with pytest.raises(ValueError, match="optimiser: unknown value 'adam'"):
        config("ar", optimiser="adam")
