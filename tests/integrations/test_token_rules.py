"""A token rule from outside the package trains in all three runners (docs/methods.md §10).

The user's files live in a temporary directory: ``rules.py`` is the 80/20 high-entropy example of
docs/methods.md, run exactly as printed there; ``more_rules.py`` holds a ``passes`` weight
(1 - p_old), a zero and a unit weight and a split. They are named the way a user names them,
``FILE.py:RULE`` or ``MODULE:RULE`` (the directory on ``sys.path``), never imported by the test
itself. Our trainer trains on the user's prompt file with a reward of theirs from the same file
(``data.reward``), so that the advantages are not all zero. Each part skips when its host (TRL,
verl) is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.tasks.reward_modules import EVAL_ROWS, TRAIN_ROWS, write_jsonl
from tests.trainer.conftest import SMALL_RUN, tiny_policy_dir  # noqa: F401 - pytest fixture
from tests.trainer.test_loop import undocumented
from tokenbalance.algorithms.presets import apply_method_overrides, get_method
from tokenbalance.algorithms.token_rules import TOKEN_RULES
from tokenbalance.config import RunConfig, apply_overrides, load_config
from tokenbalance.diagnostics.sinks import read_metrics
from tokenbalance.models import load_policy
from tokenbalance.trainer.runner import run_training

DOCS = Path(__file__).resolve().parents[2] / "docs" / "methods.md"
MORE_RULES = '''
import torch

from tokenbalance.algorithms import TokenInputs, register_token_rule


@register_token_rule("surprise", stage="passes")
def surprise(inputs: TokenInputs) -> torch.Tensor:
    """1 - p_old: more weight on the unlikely tokens."""
    return 1.0 - inputs.old_prob_BT


@register_token_rule("no_gradient", stage="loss")
def no_gradient(inputs: TokenInputs) -> torch.Tensor:
    return torch.zeros_like(inputs.advantages_BT)


@register_token_rule("unit", stage="loss")
def unit(inputs: TokenInputs) -> torch.Tensor:
    return torch.ones_like(inputs.advantages_BT)


@register_token_rule("late_first", stage="passes", output="split")
def late_first(inputs: TokenInputs) -> torch.Tensor:
    return inputs.position_BT >= 2


def odd_length(response, **row):
    """The user's reward (data.reward): responses of odd length win, so a group's rewards differ."""
    return float(len(response) % 2)
'''


def docs_example() -> str:
    """The python block after the ``token-rule-example`` marker of docs/methods.md."""
    after_marker = DOCS.read_text().split("<!-- token-rule-example", 1)[1]
    return after_marker.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    """``{rule: FILE.py:RULE}`` plus ``"module:surprise"``-style names; the registry as it was after."""
    saved = dict(TOKEN_RULES._items)
    root = tmp_path_factory.mktemp("user_code")
    (root / "rules.py").write_text(docs_example())
    (root / "more_rules.py").write_text(MORE_RULES)
    write_jsonl(root / "train.jsonl", TRAIN_ROWS)
    write_jsonl(root / "test.jsonl", EVAL_ROWS)
    sys.path.insert(0, str(root))
    specs = {"high_entropy": f"{root}/rules.py:high_entropy", "root": str(root)}
    for name in ("surprise", "no_gradient", "unit", "late_first"):
        specs[name] = f"{root}/more_rules.py:{name}"
        specs[f"module:{name}"] = f"more_rules:{name}"
    yield specs
    sys.path.remove(str(root))
    sys.modules.pop("more_rules", None)
    TOKEN_RULES._items.clear()
    TOKEN_RULES._items.update(saved)


def test_the_docs_example_is_10_to_20_lines_and_loads_from_its_file(rules):
    assert 10 <= len([line for line in docs_example().splitlines() if line.strip()]) <= 20
    rule = get_method(rules["high_entropy"]).token_rule
    assert (rule.name, rule.stage, rule.needs, rule.spec) == (
        "high_entropy",
        "loss",
        ("entropy",),
        rules["high_entropy"],
    )


# ---- (a) our trainer ------------------------------------------------------------------------------------


@pytest.fixture
def policy_dir(request):
    """The trainer tests' tiny policy (``tests/trainer/conftest.py``, one per session)."""
    return request.getfixturevalue("tiny_policy_dir")


def run(rules, policy_dir, tmp_path, name: str, *overrides: str):
    """Two steps (SMALL_RUN) on the user's prompts with their reward."""
    root = rules["root"]
    data = [
        f"data.train_file={root}/train.jsonl",
        f"data.eval_file={root}/test.jsonl",
        f"data.reward={root}/more_rules.py:odd_length",
        "data.prompt_column=question",
    ]
    run_options = [o for o in SMALL_RUN if not o.startswith("data.")]
    config = apply_overrides(RunConfig(), [*run_options, *data, f"model.path={policy_dir}", *overrides])
    config.output.run_dir = str(tmp_path / name)
    run_dir = run_training(config, log=lambda *_: None)
    return run_dir, [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def test_our_trainer_trains_the_docs_rule_named_by_its_file(rules, policy_dir, tmp_path):
    run_dir, train = run(rules, policy_dir, tmp_path, "entropy", f"train.method={rules['high_entropy']}")
    assert [r["step"] for r in train] == [1, 2] and max(r["adv/abs_mean"] for r in train) > 0.1
    for record in train:  # the top 20% of each micro-batch's valid tokens keep their weight
        assert 0.55 <= record["token_rule/w_zero_frac"] <= 0.85
        assert record["token_rule/w_mean"] == pytest.approx(1.0 - record["token_rule/w_zero_frac"])
    assert undocumented(read_metrics(run_dir / "metrics.jsonl")) == set()
    saved = load_config(run_dir / "config.yaml")
    assert saved.train.method == rules["high_entropy"] and saved.method().token_rule.name == "high_entropy"
    initial, _ = load_policy(policy_dir)
    trained, _ = load_policy(run_dir / "checkpoints" / "step_000002" / "model")
    assert max((a - b).abs().max().item() for a, b in zip(initial.parameters(), trained.parameters())) > 1e-4


def numbers(record: dict) -> dict:
    """A train record without its clock readings and the rule's own metrics."""
    return {k: v for k, v in record.items() if not k.startswith(("timing/", "throughput/")) and "token_rule/" not in k}


def test_our_trainer_unit_rule_is_bit_identical_and_a_zero_rule_has_no_policy_loss(rules, policy_dir, tmp_path):
    """A rule of unit weights changes nothing (loss, metrics, weights, bit for bit); a zero rule
    leaves no policy term. The rule is added to a preset with ``method.token_rule``."""
    unit = f"method.token_rule={rules['unit']}"
    runs = {
        name: run(rules, policy_dir, tmp_path, name, "train.method=ar_lopti", *extra)
        for name, extra in (("preset", ()), ("unit", (unit,)))
    }
    assert [numbers(r) for r in runs["unit"][1]] == [numbers(r) for r in runs["preset"][1]]
    assert all(r["token_rule/w_mean"] == 1.0 for r in runs["unit"][1])
    final = [load_policy(run_dir / "checkpoints" / "step_000002" / "model")[0] for run_dir, _ in runs.values()]
    assert all(torch.equal(a, b) for a, b in zip(final[0].parameters(), final[1].parameters()))
    _, zero = run(rules, policy_dir, tmp_path, "zero", f"train.method={rules['module:no_gradient']}", "train.steps=1")
    assert zero[0]["adv/abs_mean"] > 0.1 and zero[0]["loss/policy"] == 0.0 and zero[0]["token_rule/w_zero_frac"] == 1.0


# ---- (b) the TRL subclass -------------------------------------------------------------------------------


@pytest.mark.usefixtures("trl_offline")
def test_trl_loss_with_the_docs_rule_equals_ours(rules, tmp_path):
    pytest.importorskip("trl")
    from tests.integrations.test_trl_equivalence import (
        LOGSOFTMAX_DTYPE,
        OurSide,
        assert_close_grads,
        make_trainer,
        sampled_batch,
        trl_loss_and_grads,
    )
    from tests.integrations.test_trl_support import tiny_policy_dir as trl_policy_dir
    from tests.tolerances import dtype_atol

    tokenizer = load_policy(trl_policy_dir())[1]
    trainer = make_trainer(rules["high_entropy"], tokenizer, tmp_path)  # the TRL option: method="FILE.py:RULE"
    assert trainer.balance_method.token_rule.name == "high_entropy"
    batch = sampled_batch(trainer.model, tokenizer)
    ours = OurSide(trainer.balance_method, trainer.model, batch)
    our_loss, our_grads = ours.pass_loss_and_grads(trainer.model, 0)
    trl_loss, trl_grads = trl_loss_and_grads(trainer, ours.trl_inputs(batch, with_old_logp=False), step=0)
    assert abs(float(trl_loss) - float(our_loss)) <= dtype_atol(LOGSOFTMAX_DTYPE, float(our_loss))
    assert_close_grads(our_grads, trl_grads)
    assert 0.5 < trainer._metrics["train"]["token_rule/w_zero_frac"][-1] < 1.0


@pytest.mark.usefixtures("trl_offline")
@pytest.mark.parametrize("name, passes", [("module:surprise", 1), ("late_first", 2)])
def test_trl_subclass_trains_a_rule(rules, tmp_path, name, passes):
    pytest.importorskip("trl")
    from tests.integrations.test_trl_support import tiny_policy_dir as trl_policy_dir
    from tokenbalance.integrations.trl.smoke import run_method

    result = run_method(rules[name], trl_policy_dir(), tmp_path, steps=2, max_completion_length=12)
    assert result["optimizer_steps"] == 2 * passes and result["parameter_change"] > 0
    keys = set(result["metric_keys"])
    assert ("token_rule/w_mean" if passes == 1 else "token_rule/first_frac") in keys
    if passes == 2:
        assert {"pass/late_first_first/loss/policy", "pass/late_first_second/loss/policy"} <= keys


# ---- (c) the verl plugin's functions -------------------------------------------------------------------


@pytest.fixture
def verl_batch():
    """test_verl_integration's float64 batch and a real verl ActorConfig factory."""
    pytest.importorskip("verl")
    from tests.integrations import test_verl_integration as verl_tests

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    batch = verl_tests.make_batch()
    from tokenbalance.algorithms.advantages import grpo_advantages

    batch["adv"] = grpo_advantages(batch["scores"], batch["groups"], batch["mask"])
    yield batch, verl_tests.actor_config
    torch.set_default_dtype(previous)


def verl_policy_loss(batch, actor_config, log_prob, **fields):
    from verl.trainer.ppo import core_algos

    from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig

    loss_mode = fields.pop("loss_mode", "tokenbalance_grpo")
    config = actor_config(TokenBalancePolicyLossConfig(loss_mode=loss_mode, **fields), batch=batch)
    return core_algos.get_policy_loss_fn(loss_mode)(
        batch["old"], log_prob, batch["adv"], batch["mask"], "token-mean", config, None
    )


def test_verl_registered_loss_applies_a_rule_by_hand(rules, verl_batch):
    """At ratio 1 the token-mean loss is -sum(A (1 - p_old)) / N and its gradient -A (1 - p_old) / N."""
    batch, actor_config = verl_batch
    mask, old = batch["mask"], batch["old"]
    log_prob = old.clone().requires_grad_(True)
    loss, _ = verl_policy_loss(batch, actor_config, log_prob, token_rule=rules["surprise"])
    weighted = torch.where(mask, batch["adv"] * (1.0 - old.exp()), 0.0)
    tokens = float(mask.sum())
    torch.testing.assert_close(loss, -weighted.sum() / tokens, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(loss, log_prob)
    torch.testing.assert_close(grad, -weighted / tokens, rtol=0, atol=1e-12)

    # away from ratio 1, with AR from the loss mode too: the same as our core's method with the rule
    from tokenbalance.algorithms.loss import pass_loss
    from tokenbalance.algorithms.methods import KLConfig, passes_from_advantages
    from tokenbalance.algorithms.surrogate import ClipConfig

    log_prob = batch["logp"].clone().requires_grad_(True)
    loss, _ = verl_policy_loss(batch, actor_config, log_prob, loss_mode="tokenbalance_ar", token_rule=rules["surprise"])
    method = apply_method_overrides(get_method("ar"), {"token_rule": rules["surprise"]}).replace(
        clip=ClipConfig(eps_low=0.2, eps_high=0.24, dual_clip_c=10.0, log_ratio_clamp=20.0),
        kl=KLConfig(placement="none"),
    )
    (update_pass,), _ = passes_from_advantages(method, batch["adv"], mask, old)
    torch.testing.assert_close(loss, pass_loss(method, update_pass, batch["logp"], old).loss, rtol=0, atol=1e-12)

    log_prob = batch["logp"].clone().requires_grad_(True)
    loss, _ = verl_policy_loss(batch, actor_config, log_prob, token_rule=rules["module:no_gradient"])
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert float(loss.detach()) == 0.0 and not bool(grad.any())


def test_verl_entropy_rule_runs_in_the_lopti_loss_and_is_refused_elsewhere(rules, verl_batch):
    from tokenbalance.integrations.verl.config import TokenBalancePolicyLossConfig
    from tokenbalance.integrations.verl.losses import lopti_pass_loss

    batch, actor_config = verl_batch
    mask = batch["mask"]
    entropy = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3)) * 2.0
    hand_mask = entropy >= torch.quantile(entropy[mask].float(), 0.8).double()
    assert 0 < int((hand_mask & mask).sum()) < int(mask.sum())

    def lopti_loss(advantages, **fields):
        config = actor_config(
            TokenBalancePolicyLossConfig(loss_mode="tokenbalance_grpo", lopti_eta=0.5, **fields),
            batch=batch,
            use_kl_loss=True,
            calculate_entropy=True,
        )
        return sum(
            lopti_pass_loss(config, name, batch["logp"], batch["old"], advantages, mask, batch["ref"], entropy)[0]
            for name in ("lopti_low", "lopti_high")
        )

    with_rule = lopti_loss(batch["adv"], token_rule=rules["high_entropy"])
    by_hand = lopti_loss(batch["adv"] * hand_mask)  # the rule's weights are the top-20% entropy mask
    torch.testing.assert_close(with_rule, by_hand, rtol=0, atol=1e-12)
    assert abs(float(with_rule - lopti_loss(batch["adv"]))) > 1e-4

    with pytest.raises(ValueError, match="needs the entropy, which verl 0.9.1 does not pass to a registered policy"):
        verl_policy_loss(batch, actor_config, batch["logp"], token_rule=rules["high_entropy"])
    config = actor_config(
        TokenBalancePolicyLossConfig(lopti_eta=0.5, token_rule=rules["high_entropy"]), batch=batch, use_kl_loss=True
    )
    with pytest.raises(ValueError, match=r"policy_loss\.token_rule: .*calculate_entropy=True"):
        lopti_pass_loss(config, "lopti_low", batch["logp"], batch["old"], batch["adv"], mask, batch["ref"], entropy)
    with pytest.raises(ValueError, match="splits the tokens into two passes; verl runs only Lopti's passes"):
        TokenBalancePolicyLossConfig(token_rule=rules["late_first"])


def test_the_grid_and_verl_launch_validation_name_the_rule(rules):
    from tokenbalance.ablate.grid import grid_method
    from tokenbalance.ablate.verl.grid import verl_launch

    row = grid_method(rules["surprise"])  # tokenbalance ablate --methods FILE.py:RULE
    assert (row.key, row.label, row.preset, row.baseline) == ("surprise", "surprise", rules["surprise"], "grpo")
    launch = verl_launch(get_method(rules["surprise"]))
    assert ("METHOD", rules["surprise"]) in launch.env and launch.overrides == ()
    entropy_rule = get_method(rules["high_entropy"])
    assert "verl 0.9.1 does not pass to a registered policy loss" in verl_launch(entropy_rule)
    with_lopti = verl_launch(apply_method_overrides(entropy_rule, {"lopti.eta": 0.5}))
    assert "actor_rollout_ref.actor.calculate_entropy=True" in with_lopti.overrides
    assert "splits the tokens" in verl_launch(get_method(rules["late_first"]))
    assert "registered in this process only" in verl_launch(get_method("surprise"))  # by name, no spec

    pytest.importorskip("verl")
    from tests.integrations.test_verl_integration import launch_config
    from tokenbalance.integrations.verl.names import LOPTI_TRAINER
    from tokenbalance.integrations.verl.validation import validate_launch

    rule_key = "actor_rollout_ref.actor.policy_loss.token_rule"
    validate_launch(launch_config(**{rule_key: rules["surprise"]}))
    with pytest.raises(ValueError, match="token_rule: token rule 'high_entropy' .* needs the entropy"):
        validate_launch(launch_config(**{rule_key: rules["high_entropy"]}))
    lopti = {rule_key: rules["high_entropy"], "trainer.v1.trainer_mode": LOPTI_TRAINER}
    with pytest.raises(ValueError, match="calculate_entropy=True"):
        validate_launch(launch_config(**lopti))
    with pytest.raises(ValueError, match=r"token_rule='nope.py:x': .*nope.py: no such file"):
        validate_launch(launch_config(**{rule_key: "nope.py:x"}))
