"""Every grid preset's settings are a valid run config, checked before any work: the reasoning
testbed's (``arith-cot``) among them, and a bad ``--set`` on it is refused before an SFT is built."""

import pytest

from tokenbalance.ablate.cells import base_config
from tokenbalance.ablate.grid import ARITH_2X2_CONDITIONS, GRID_PRESETS, GridPreset, make_plan
from tokenbalance.cli import main
from tokenbalance.config import RunConfig, apply_overrides, replace_sections, to_dict


@pytest.mark.parametrize("name", sorted(GRID_PRESETS))
def test_every_preset_is_a_valid_config_with_known_rows(name):
    config = base_config(make_plan(GRID_PRESETS[name]))  # validates every override and every row's method
    for override in GRID_PRESETS[name].overrides:  # each took effect: setting it again changes nothing
        assert to_dict(apply_overrides(config, [override])) == to_dict(config), override
        assert to_dict(apply_overrides(RunConfig(), [override])) != to_dict(RunConfig()), f"{override}: the default"


def test_the_reasoning_testbed_preset():
    preset = GRID_PRESETS["arith-cot"]
    config = base_config(make_plan(preset))
    assert (config.data.task, config.sft.target, config.data.train_difficulties) == ("arith", "cot_random", (1, 2))
    assert config.data.eval_difficulties == (1, 2) and config.data.eval_set == "test"  # chosen on validation only
    assert preset.start_seed == 0 and {"grpo", "ar", "lopti", "ar_lopti", "tr_grpo", "nthr"} <= set(preset.methods)


def test_a_bad_setting_is_refused_before_any_work(tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["ablate", "--preset", "arith-cot", "--out", str(out), "--no-progress", "--set", f"model.cache_dir={cache}"]
    assert main([*args, "--set", "data.eval_count=0"]) == 2
    assert main([*args, "--set", "sft.target=proof"]) == 2
    err = capsys.readouterr().err
    assert "data.eval_count" in err and "sft.target" in err
    assert not out.exists() and not cache.exists()  # no SFT build, no grid directory


def test_the_arith_2x2_presets_differ_only_in_the_teacher():
    configs = {name: base_config(make_plan(GRID_PRESETS[name])) for name in ARITH_2X2_CONDITIONS}
    teacher = {name: (c.sft.target, c.sft.error_rate) for name, c in configs.items()}
    assert teacher == {
        "arith-clean": ("cot", 0.0),
        "arith-wording": ("cot_random", 0.0),
        "arith-decisions": ("cot", 0.25),
        "arith-decisions-wording": ("cot_random", 0.25),
    }
    plain = {
        name: to_dict(replace_sections(c, sft={"target": "cot", "error_rate": 0.0})) for name, c in configs.items()
    }
    assert all(d == plain["arith-clean"] for d in plain.values())  # nothing else differs
    assert {c.rollout.temperature for c in configs.values()} == {0.7}  # one temperature, the papers'
    for name in ARITH_2X2_CONDITIONS:
        preset = GRID_PRESETS[name]
        starts = [preset.policy_seed(seed) for seed in preset.seeds]
        assert len(preset.seeds) == 8 and starts == [0, 1, 2, 3, 0, 1, 2, 3]  # 4 start policies, 2 seeds each
        assert preset.methods == ("grpo", "ar", "lopti", "ar_lopti", "tr_grpo", "nthr")


def test_a_preset_takes_one_start_seed_or_several_start_policies():
    with pytest.raises(ValueError, match="start_seed or start_policies"):
        GridPreset("x", "x", start_seed=0, start_policies=4)
    with pytest.raises(ValueError, match="start_policies must be >= 1"):
        GridPreset("x", "x", start_policies=0)


def test_a_preset_for_a_given_model_refuses_to_run_without_it(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ablate", "--preset", "smollm2-kk", "--out", str(out), "--no-progress"]) == 2
    assert "--preset smollm2-kk: give its start policy with --model DIR" in capsys.readouterr().err
    assert not out.exists()
