"""Typed config: defaults, validation naming the field, YAML round trip, dotted overrides."""

import pytest

from tokenbalance.config import RunConfig, apply_overrides, describe_options, load_config, save_config


def test_yaml_round_trip_and_overrides(tmp_path):
    config = apply_overrides(
        RunConfig(),
        [
            "train.steps=7",
            "optim.lr=1e-4",
            "data.train_difficulties=[3, 4]",
            "train.method_overrides.lopti.eta=0.4",
            "model.path=/models/x",
        ],
    )
    assert (config.train.steps, config.optim.lr, config.data.train_difficulties) == (7, 1e-4, (3, 4))
    assert config.train.method_overrides == {"lopti.eta": 0.4} and config.model.path == "/models/x"
    save_config(config, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == config


def test_yaml_file_scientific_notation(tmp_path):
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 3e-4\n")
    assert load_config(tmp_path / "c.yaml").optim.lr == 3e-4


@pytest.mark.parametrize(
    "override, match",
    [
        ("optim.lr=0", r"optim.lr: must be in \(0.0, 1.0\], got 0"),
        ("rollout.group_size=0", r"rollout.group_size: must be in \[1, 1024\], got 0"),
        ("data.task=chess", "data.task: unknown value 'chess'; valid: 'kk', 'arith'"),
        ("optim.momentum=0.9", "optim.momentum: unknown option; valid: lr, beta1"),
        ("steps=3", "override 'steps': unknown option"),
        ("train.steps", "expected section.field=value"),
        ("rollout.temperature=nan", r"rollout.temperature: must be in \(0.0, 10.0\], got nan"),
        ("train.steps=many", r"train.steps: must be in \[0, 10000000\], got 'many'"),
    ],
)
def test_bad_values_name_the_field(override, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(RunConfig(), [override])


def test_missing_or_invalid_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("optim: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_every_option_has_help():
    lines = describe_options()
    assert len(lines) > 40 and all("#  " not in line and line.split("# ", 1)[1].strip() for line in lines)
    assert any(line.startswith("train.method = 'ar_lopti'") for line in lines)


def test_replace_sections_sets_typed_values_checks_them_and_shares_nothing():
    from tokenbalance.config import replace_sections

    base = RunConfig()
    changed = replace_sections(base, train={"seed": 7, "steps": 3}, model={"path": "/a b=c #d"})
    assert (changed.train.seed, changed.train.steps, changed.model.path) == (7, 3, "/a b=c #d")
    assert (base.train.seed, base.model.path) == (0, None)  # the original is untouched
    changed.data.eval_difficulties = (9,)  # a section not replaced is a copy too
    assert base.data.eval_difficulties == (3,)
    with pytest.raises(ValueError, match="train.steps"):
        replace_sections(base, train={"steps": -1})  # checked as a loaded config is
    with pytest.raises(ValueError, match=r"train.sed: unknown option \(did you mean 'seed'\?\)"):
        replace_sections(base, train={"sed": 1})


def test_the_vocabulary_size_is_described_as_a_cap():
    (line,) = [line for line in describe_options(RunConfig()) if "model.vocab_size" in line]
    assert "1024" in line and "vocabulary, at most" in line and "gives fewer" in line


def test_sft_help_names_every_source_of_targets(capsys):
    from tokenbalance.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["sft", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "supervised warm start on generated solutions (K&K, arith) or on your rows' --target-column" in text


def test_method_overrides_are_checked_at_load_against_the_stage_fields(tmp_path):
    (tmp_path / "c.yaml").write_text("train:\n  method_overrides: {lopti.etaa: 0.4}\n")
    with pytest.raises(ValueError, match=r"^method.lopti.etaa: unknown field 'etaa'; .*\(did you mean 'eta'\?\)$"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text("train:\n  method_overrides: {lopti.eta: 1.5}\n")
    with pytest.raises(ValueError, match=r"^method.lopti.eta: must be in \(0.0, 1.0\), got 1.5$"):
        load_config(tmp_path / "c.yaml")


def test_method_overrides_apply_in_the_order_given_and_round_trip(tmp_path):
    from tokenbalance.algorithms.passes import LoptiConfig
    from tokenbalance.config import replace_sections

    off = apply_overrides(RunConfig(), ["method.lopti.eta=0.3", "method.lopti=null"])
    assert off.train.method_overrides == {"lopti": None} and off.method().lopti is None
    on = apply_overrides(off, ["method.lopti.eta=0.3"])
    assert on.train.method_overrides == {"lopti": None, "lopti.eta": 0.3} and on.method().lopti == LoptiConfig(eta=0.3)
    # YAML 1.1 reads 1e-4 as a string; a stage object from Python is stored as its fields
    (tmp_path / "c.yaml").write_text("train:\n  method_overrides: {kl.coef: 1e-4}\n")
    assert load_config(tmp_path / "c.yaml").train.method_overrides == {"kl.coef": 1e-4}
    config = replace_sections(
        RunConfig(), train={"method_overrides": {"lopti": LoptiConfig(eta=0.25, order="high_first")}}
    )
    assert config.train.method_overrides["lopti"]["order"] == "high_first"
    save_config(config, tmp_path / "saved.yaml")
    loaded = load_config(tmp_path / "saved.yaml")
    assert loaded == config and loaded.method().lopti == LoptiConfig(eta=0.25, order="high_first")
