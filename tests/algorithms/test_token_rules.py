"""Token rules (docs/methods.md §10): hand-computed weights and splits at both stages, the checks of
what a rule returns, registration, loading by ``MODULE:RULE`` / ``FILE.py:RULE``, and that a rule
of unit weights leaves a preset's passes and loss bit for bit as they are."""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.algorithms.conftest import assert_values
from tokenbalance.algorithms.describe import describe_presets
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import KLConfig, build_update_passes, passes_from_advantages
from tokenbalance.algorithms.presets import apply_method_overrides, get_method, rule_method
from tokenbalance.algorithms.token_rules import (
    TOKEN_RULES,
    TokenInputs,
    TokenRule,
    probe_rule,
    register_token_rule,
)

MASK_BT = torch.tensor([[True, True, False], [True, True, True]])
ADV_BT = torch.tensor([[2.0, 2.0, 0.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
OLD_LOGP_BT = torch.log(torch.tensor([[0.5, 0.25, 1.0], [0.1, 0.8, 0.4]], dtype=torch.float64))


pytestmark = pytest.mark.usefixtures("isolated_rules")  # each test registers into its own registry copy


def no_kl(method):
    return method.replace(kl=KLConfig(placement="none"))


def write_rules(tmp_path, body: str, name: str = "my_rules.py"):
    path = tmp_path / name
    header = "import torch\nfrom tokenbalance.algorithms import TokenInputs, register_token_rule\n\n"
    path.write_text(header + textwrap.dedent(body))
    return path


# ---- the two stages, by hand ------------------------------------------------------------------------


def test_passes_stage_weights_multiply_the_advantages_after_ar():
    rule = register_token_rule("one_minus_p", lambda x: 1.0 - x.old_prob_BT, stage="passes")
    method = no_kl(get_method("grpo")).replace(token_rule=rule)
    (update_pass,), metrics = passes_from_advantages(method, ADV_BT, MASK_BT, OLD_LOGP_BT)
    # A * (1 - p): 2 * 0.5, 2 * 0.75 | -1 * 0.9, -1 * 0.2, -1 * 0.6
    assert_values(update_pass.advantages_BT, [[1.0, 1.5, 0.0], [-0.9, -0.2, -0.6]])
    assert metrics["token_rule/w_mean"] == pytest.approx((0.5 + 0.75 + 0.9 + 0.2 + 0.6) / 5)
    assert metrics["adv/mean"] == pytest.approx(1.0 / 5) and metrics["adv_weighted/mean"] == pytest.approx(0.8 / 5)
    with_ar = method.replace(ar=get_method("ar").ar)  # AR first (alpha 0.3: w = 0.3 p + 0.7), then the rule
    (ar_pass,), _ = passes_from_advantages(with_ar, ADV_BT, MASK_BT, OLD_LOGP_BT)
    ar_weight = 0.3 * torch.exp(OLD_LOGP_BT) + 0.7
    expected = ADV_BT * ar_weight * (1.0 - torch.exp(OLD_LOGP_BT))
    assert_values(ar_pass.advantages_BT, torch.where(MASK_BT, expected, 0.0).tolist())


def test_loss_stage_weights_reach_the_loss_by_hand():
    """At ratio 1 (no clip), token-mean: policy loss = -sum(A w) / N and dL/dlog p = -A w / N."""
    rule = register_token_rule("by_entropy", lambda x: x.entropy_BT, stage="loss", needs=("entropy",))
    method = no_kl(get_method("grpo")).replace(token_rule=rule)
    (update_pass,), _ = passes_from_advantages(method, ADV_BT, MASK_BT, OLD_LOGP_BT)
    entropy_BT = torch.tensor([[0.5, 1.5, float("nan")], [1.0, 0.0, 2.0]], dtype=torch.float64)
    logp_BT = OLD_LOGP_BT.clone().requires_grad_(True)
    out = pass_loss(method, update_pass, logp_BT, OLD_LOGP_BT, entropy_BT=entropy_BT)
    # -(2 * 0.5 + 2 * 1.5 - 1 * 1.0 - 1 * 0.0 - 1 * 2.0) / 5 = -1 / 5
    assert float(out.loss.detach()) == pytest.approx(-0.2, abs=1e-12)
    (grad_BT,) = torch.autograd.grad(out.loss, logp_BT)
    assert_values(grad_BT, [[-0.2, -0.6, 0.0], [0.2, 0.0, 0.4]], atol=1e-12)
    assert out.metrics["token_rule/w_zero_frac"] == pytest.approx(1 / 5)


def test_a_zero_weight_rule_gives_no_policy_gradient():
    rule = register_token_rule("nothing", lambda x: torch.zeros_like(x.advantages_BT), stage="loss")
    method = no_kl(get_method("ar_lopti")).replace(token_rule=rule)
    passes, _ = passes_from_advantages(method, ADV_BT, MASK_BT, OLD_LOGP_BT)
    logp_BT = (OLD_LOGP_BT + 0.1).requires_grad_(True)
    for update_pass in passes:
        out = pass_loss(method, update_pass, logp_BT, OLD_LOGP_BT, entropy_BT=torch.zeros_like(logp_BT))
        (grad_BT,) = torch.autograd.grad(out.loss, logp_BT)
        assert float(out.loss.detach()) == 0.0 and not bool(grad_BT.any())


def test_a_split_runs_two_passes_that_add_up_to_the_single_pass():
    rule = register_token_rule("late_first", lambda x: x.position_BT >= 1, stage="passes", output="split")
    method = no_kl(get_method("grpo")).replace(token_rule=rule)
    assert method.pass_names == ("late_first_first", "late_first_second")
    passes, metrics = passes_from_advantages(method, ADV_BT, MASK_BT, OLD_LOGP_BT)
    assert [p.name for p in passes] == list(method.pass_names)
    assert_values(passes[0].policy_mask_BT.double(), [[0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    assert_values(passes[1].policy_mask_BT.double(), [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert all(torch.equal(p.normaliser_mask_BT, MASK_BT) for p in passes)
    assert metrics["token_rule/first_frac"] == pytest.approx(3 / 5)
    logp_BT = OLD_LOGP_BT + 0.05
    single, _ = passes_from_advantages(method.replace(token_rule=None), ADV_BT, MASK_BT, OLD_LOGP_BT)
    total = sum(float(pass_loss(method, p, logp_BT, OLD_LOGP_BT).loss) for p in passes)
    assert total == pytest.approx(float(pass_loss(method, single[0], logp_BT, OLD_LOGP_BT).loss), abs=1e-12)


def test_token_inputs_hold_neutral_padding_and_positions():
    seen = {}

    def spy(inputs: TokenInputs) -> torch.Tensor:
        seen["inputs"] = inputs
        return torch.ones_like(inputs.advantages_BT)

    rule = register_token_rule("spy", spy, stage="passes", needs=("group_ids", "correct"))
    nan_old = torch.where(MASK_BT, OLD_LOGP_BT, float("nan"))
    groups, correct = torch.tensor([0, 0]), torch.tensor([True, False])
    passes_from_advantages(get_method("grpo").replace(token_rule=rule), ADV_BT, MASK_BT, nan_old, groups, None, correct)
    inputs = seen["inputs"]
    assert float(inputs.old_logp_BT[0, 2]) == 0.0 and float(inputs.old_prob_BT[0, 2]) == 1.0
    assert inputs.position_BT.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert inputs.logp_BT is None and inputs.prob_BT is None and inputs.entropy_BT is None
    assert inputs.group_ids_B is groups and inputs.correct_B is correct


def test_unit_weights_leave_a_preset_bit_for_bit():
    """The machinery with neutral weights (both stages) computes exactly today's preset."""
    gen = torch.Generator().manual_seed(0)
    B, T = 8, 6
    mask_BT = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=gen)[:, None]
    old_BT = -torch.rand(B, T, generator=gen) * 3
    logp_BT = old_BT + (torch.rand(B, T, generator=gen) - 0.5) * 0.6
    ref_BT = old_BT + (torch.rand(B, T, generator=gen) - 0.5) * 0.3
    scores_B, groups_B = torch.randint(0, 2, (B,), generator=gen).double(), torch.arange(B) // 4
    entropy_BT = torch.rand(B, T, generator=gen)
    ones = {
        stage: register_token_rule(f"ones_{stage}", lambda x: torch.ones_like(x.advantages_BT), stage=stage)
        for stage in ("passes", "loss")
    }
    for preset in ("grpo", "ar_lopti", "tr_grpo"):
        base = get_method(preset)
        reference, ref_metrics = build_update_passes(base, scores_B, groups_B, mask_BT, old_BT, ref_BT)
        ref_losses = [pass_loss(base, p, logp_BT, old_BT, ref_BT, entropy_BT).loss for p in reference]
        for rule in ones.values():
            method = base.replace(token_rule=rule)
            passes, metrics = build_update_passes(method, scores_B, groups_B, mask_BT, old_BT, ref_BT)
            assert all(torch.equal(a.advantages_BT, b.advantages_BT) for a, b in zip(passes, reference))
            assert {k: v for k, v in metrics.items() if not k.startswith("token_rule/")} == ref_metrics
            losses = [pass_loss(method, p, logp_BT, old_BT, ref_BT, entropy_BT).loss for p in passes]
            assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))


# ---- what a rule returns is checked -------------------------------------------------------------------


@pytest.mark.parametrize(
    "output, returned, message",
    [
        ("weights", lambda x: 1.0, "returned 1.0; expected a [B, T] torch.Tensor"),
        ("weights", lambda x: torch.ones(2, 2, dtype=torch.float64), "returned shape (2, 2); expected [B, T] = (2, 3)"),
        ("weights", lambda x: x.response_mask_BT, "returned dtype torch.bool; weights are floats"),
        ("weights", lambda x: torch.full_like(x.advantages_BT, float("nan")), "returned nan at a valid token"),
        (
            "weights",
            lambda x: -torch.ones_like(x.advantages_BT),
            "returned -1.0 at a valid token; weights must be >= 0",
        ),
        ("split", lambda x: torch.ones_like(x.advantages_BT), "returned dtype torch.float64; a split is a bool tensor"),
    ],
)
def test_bad_output_is_one_line_naming_the_rule_and_function(output, returned, message):
    rule = register_token_rule("bad", returned, stage="passes", output=output)
    with pytest.raises(ValueError) as err:
        passes_from_advantages(get_method("grpo").replace(token_rule=rule), ADV_BT, MASK_BT, OLD_LOGP_BT)
    text = str(err.value)
    assert text.startswith("token rule 'bad' (tests.algorithms.test_token_rules.") and message in text
    assert "\n" not in text


def test_padding_values_of_the_output_are_ignored():
    def nan_at_padding(inputs):
        return torch.where(inputs.response_mask_BT, 1.0, float("nan")).double()

    rule = register_token_rule("pad", nan_at_padding, stage="passes")
    (update_pass,), _ = passes_from_advantages(
        get_method("grpo").replace(token_rule=rule), ADV_BT, MASK_BT, OLD_LOGP_BT
    )
    assert torch.equal(update_pass.advantages_BT, torch.where(MASK_BT, ADV_BT, 0.0))


def test_a_missing_input_names_it():
    rule = register_token_rule("wants_entropy", lambda x: x.entropy_BT, stage="loss", needs=("entropy",))
    method = no_kl(get_method("grpo")).replace(token_rule=rule)
    (update_pass,), _ = passes_from_advantages(method, ADV_BT, MASK_BT, OLD_LOGP_BT)
    with pytest.raises(ValueError, match="token rule 'wants_entropy' .* needs entropy_BT, which this runner"):
        pass_loss(method, update_pass, OLD_LOGP_BT, OLD_LOGP_BT)


# ---- registration and names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stage": "later"}, "stage: unknown value 'later'"),
        ({"stage": "loss", "output": "split"}, "a split chooses the update passes"),
        ({"stage": "loss", "needs": ("group_ids",)}, "needs 'group_ids', which stage 'loss' does not offer"),
        ({"stage": "passes", "needs": ("entropy",)}, "needs 'entropy', which stage 'passes' does not offer"),
    ],
)
def test_a_bad_registration_fails_naming_the_rule(kwargs, message):
    with pytest.raises(ValueError, match=message):
        register_token_rule("r", lambda x: x.advantages_BT, **kwargs)


def test_registering_again_replaces_only_the_same_function():
    def first(inputs):
        return torch.ones_like(inputs.advantages_BT)

    rule = register_token_rule("again", first, stage="passes")
    assert register_token_rule("again", first, stage="loss") is TOKEN_RULES.get("again") != rule
    with pytest.raises(ValueError, match="token rule 'again' is already registered by 'again' .*first"):
        register_token_rule("again", lambda x: x.advantages_BT, stage="passes")
    with pytest.raises(ValueError, match="token rule name: expected letters"):
        TokenRule("a:b", first, "passes")


def test_a_file_spec_registers_loads_and_keeps_its_absolute_path(tmp_path, monkeypatch):
    write_rules(
        tmp_path,
        '''
        @register_token_rule("file_rule", stage="passes")
        def file_rule(inputs: TokenInputs) -> torch.Tensor:
            """Half weight on every token."""
            return torch.full_like(inputs.advantages_BT, 0.5)

        def unregistered(inputs):
            return inputs.advantages_BT
        ''',
    )
    monkeypatch.chdir(tmp_path)
    method = get_method("my_rules.py:file_rule")
    spec = f"{tmp_path / 'my_rules.py'}:file_rule"
    assert method.name == "file_rule" and method.token_rule.spec == spec
    assert method.description == "GRPO + token rule file_rule: Half weight on every token."
    assert get_method("file_rule").token_rule.spec is None  # registered by the import, by name
    assert "token_rule: 'file_rule' (" + spec + "), stage passes" in describe_presets("my_rules.py:file_rule")
    assert "\nfile_rule: GRPO + token rule file_rule" in describe_presets()
    with_ar = apply_method_overrides(get_method("ar"), {"token_rule": "my_rules.py:file_rule"})
    assert with_ar.name == "ar" and with_ar.ar is not None and with_ar.token_rule.name == "file_rule"
    with pytest.raises(ValueError, match="unregistered is not a registered token rule; decorate it"):
        get_method("my_rules.py:unregistered")
    with pytest.raises(ValueError, match="method='my_rules.py:file_rul': module .* has no attribute 'file_rul'"):
        get_method("my_rules.py:file_rul")


def test_a_rule_cannot_take_a_preset_name_nor_split_beside_lopti():
    grpo_rule = register_token_rule("grpo", lambda x: x.advantages_BT.abs(), stage="passes")
    with pytest.raises(ValueError, match="'grpo' is a method preset's name"):
        rule_method(grpo_rule)
    assert get_method("grpo").token_rule is None and grpo_rule.name == "grpo"
    split = register_token_rule("split", lambda x: x.position_BT > 0, stage="passes", output="split")
    with pytest.raises(ValueError, match="token_rule: 'split' .* splits the tokens into two passes and so does Lopti"):
        get_method("lopti").replace(token_rule=split)


def test_the_probe_names_a_rule_that_raises_or_returns_the_wrong_thing_and_passes_good_ones():
    """:func:`probe_rule` runs a rule once on a small synthetic batch (what the checks before the
    model load do): the example rules and rules reading every optional input pass; a wrong shape or
    an exception is one line naming the rule and its function."""
    for name in ("overlong_filter", "positive_only"):
        probe_rule(get_method(f"examples/rules/{name}.py:{name}").token_rule)
    probe_rule(register_token_rule("reads_entropy", lambda x: x.entropy_BT + 1, stage="loss", needs=("entropy",)))
    probe_rule(
        register_token_rule(
            "reads_groups",
            lambda x: x.correct_B[:, None] & x.response_mask_BT,
            stage="passes",
            output="split",
            needs=("group_ids", "correct"),
        )
    )
    wrong = register_token_rule("wrong_shape", lambda x: torch.ones(3), stage="passes")
    with pytest.raises(ValueError) as err:
        probe_rule(wrong)
    assert str(err.value).startswith("token rule 'wrong_shape' (tests.algorithms.test_token_rules.")
    assert "returned shape (3,); expected [B, T] = (4, 5) (on a small synthetic batch, before the model loads)" in str(
        err.value
    )

    def broken(inputs):
        return {}["missing"]

    with pytest.raises(ValueError, match=r"token rule 'raises' \(.*broken\) raised KeyError: 'missing' on a small"):
        probe_rule(register_token_rule("raises", broken, stage="loss"))


def test_an_unregistered_rule_name_lists_the_registered_ones_or_says_there_are_none(monkeypatch):
    from tokenbalance.algorithms.presets import load_token_rule

    monkeypatch.setattr(TOKEN_RULES, "_items", {})
    with pytest.raises(
        ValueError, match=r"method.token_rule='hi_entropy': no token rule of that name \(none is registered"
    ):
        load_token_rule("hi_entropy", "method.token_rule")
    register_token_rule("high_entropy", lambda x: torch.ones_like(x.advantages_BT), stage="passes")
    with pytest.raises(ValueError) as err:
        load_token_rule("hi_entropy", "method.token_rule")
    assert "(registered in this process: high_entropy (did you mean 'high_entropy'?)); name it by its file" in str(
        err.value
    )
