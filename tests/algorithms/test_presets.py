"""The preset table and the one resolving function every runner uses."""

import pytest

from tokenbalance.algorithms.nthr import NTHRConfig
from tokenbalance.algorithms.passes import LoptiConfig
from tokenbalance.algorithms.presets import (
    METHOD_PRESETS,
    METHOD_SECTIONS,
    OPTIONAL_STAGES,
    as_overrides,
    get_method,
    resolve_method,
)
from tokenbalance.algorithms.weights import ARConfig


def test_every_preset_cites_a_source_for_its_own_values():
    assert len(METHOD_PRESETS) == 27
    for name in METHOD_PRESETS.names():
        method = get_method(name)
        assert method.name == name and method.description and method.citations
        stages = [stage for stage in OPTIONAL_STAGES if getattr(method, stage) is not None]
        assert all(any(what.startswith(stage) for what, _ in method.citations) for stage in stages), name


def test_the_sections_are_read_from_the_method_itself():
    assert OPTIONAL_STAGES == ("ar", "tr_grpo", "nthr", "lopti")
    assert set(METHOD_SECTIONS) == {"advantage", "clip", "kl", "dynamic_sampling", *OPTIONAL_STAGES}


def test_resolve_applies_overrides_in_order_and_names_the_key_as_written():
    method = resolve_method("grpo", {"ar.alpha": 0.2, "lopti": {}, "lopti.eta": 0.4})
    assert method.ar == ARConfig(alpha=0.2) and method.lopti == LoptiConfig(eta=0.4)
    assert resolve_method("ar_lopti", {"lopti.eta": 0.4, "lopti": None}).lopti is None
    with pytest.raises(ValueError, match=r"^train.method: unknown method 'gpro'; .*\(did you mean 'grpo'\?\)$"):
        resolve_method("gpro", setting="train.method")
    with pytest.raises(
        ValueError, match=r"^x.overrides.ar.alpah: unknown field 'alpah'; .*\(did you mean 'alpha'\?\)$"
    ):
        resolve_method("ar", {"ar.alpah": 0.1}, key_prefix="x.overrides.")
    with pytest.raises(ValueError, match=r"^x.ar_alpha: must be in \[0.0, 1.0\], got 1.5$"):
        resolve_method("ar", {"ar.alpha": 1.5}, key_prefix="x.overrides.", key_names={"ar.alpha": "x.ar_alpha"})


def test_a_method_travels_as_its_preset_and_overrides():
    for name in METHOD_PRESETS.names():
        assert as_overrides(get_method(name)) == (name, {})
    changed = get_method("nthr").replace(nthr=NTHRConfig(beta=0.0, positives="advantage_sign"), ar=ARConfig())
    name, overrides = as_overrides(changed)
    assert (name, overrides) == ("nthr", {"ar": {}, "nthr.beta": 0.0, "nthr.positives": "advantage_sign"})
    assert resolve_method(name, overrides) == changed
    assert as_overrides(get_method("ar_lopti").replace(lopti=None)) == ("ar_lopti", {"lopti": None})
    with pytest.raises(ValueError, match="neither a preset nor a token rule's method"):
        as_overrides(get_method("grpo").replace(name="mine"))
