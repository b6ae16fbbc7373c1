"""The preset table and the one resolving function every runner uses."""

from dataclasses import replace

import pytest
import torch

from tests.tolerances import assert_close_in
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
from tokenbalance.algorithms.weights import ARConfig, tr_grpo_token_weights


def test_every_preset_cites_a_source_for_its_own_values():
    assert len(METHOD_PRESETS) == 29
    for name in METHOD_PRESETS.names():
        method = get_method(name)
        assert method.name == name and method.description and method.citations
        stages = [stage for stage in OPTIONAL_STAGES if getattr(method, stage) is not None]
        assert all(any(what.startswith(stage) for what, _ in method.citations) for stage in stages), name


def test_the_tr_grpo_presets_keep_the_reading_every_published_row_ran():
    # docs/methods.md §5: each published TR-GRPO row (kk-tiny, arith-cot, arith 2 x 2) ran preset
    # tr_grpo with no overrides. If the paper's own form is ever read and differs, it comes in under a
    # new name; these presets keep this reading so the committed records re-run as they were.
    reading = get_method("tr_grpo").tr_grpo
    for name in ("tr_grpo", "reinforce_pp_tr_grpo"):
        tr = get_method(name).tr_grpo
        assert (tr.shape, tr.alpha, tr.tau, tr.mu, tr.lower, tr.upper) == ("sigmoid_shift", 2.0, 9.0, 0.25, 1.0, 1.4)
        assert (tr.prob_source, tr.placement, tr.weight_kl) == ("current", "loss_multiplier", False)
    assert get_method("tr_grpo_literal").tr_grpo == replace(reading, placement="ratio_in_clip", weight_kl=True)
    # w = clip(2 sigmoid(9 (p - 0.25)), 1, 1.4): p = 0.1 -> 1 (raw 0.41); p = 0.3 -> 2 / (1 + e^-0.45);
    # p = 0.9 -> 1.4 (raw 1.99); padding -> 1. Computed from the current log-probs with no gradient.
    logp_BT = torch.log(torch.tensor([[0.1, 0.3, 0.9, 0.5]], dtype=torch.float64)).requires_grad_(True)
    mask_BT = torch.tensor([[True, True, True, False]])
    weights_BT = tr_grpo_token_weights(logp_BT, mask_BT, reading)
    expected_BT = torch.tensor([[1.0, 2.0 / (1.0 + torch.e**-0.45), 1.4, 1.0]], dtype=torch.float64)
    assert_close_in(weights_BT, expected_BT, torch.float64, msg="tr_grpo preset weights")
    assert not weights_BT.requires_grad


def test_the_sections_are_read_from_the_method_itself():
    assert OPTIONAL_STAGES == ("ar", "tr_grpo", "nthr", "lopti", "random_split")
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
