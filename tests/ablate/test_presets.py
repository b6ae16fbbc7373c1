"""Every grid preset's settings are a valid run config, checked before any work: the reasoning
testbed's (``arith-cot``) among them, and a bad ``--set`` on it is refused before an SFT is built."""

import pytest

from tokenbalance.ablate.cells import base_config
from tokenbalance.ablate.grid import GRID_PRESETS, make_plan
from tokenbalance.cli import main
from tokenbalance.config import RunConfig, apply_overrides, to_dict


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
