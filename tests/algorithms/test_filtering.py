"""DAPO dynamic sampling, the pure half (tokenbalance.algorithms.filtering): hand-computed groups."""

import math

import pytest
import torch

from tokenbalance.algorithms.filtering import (
    DynamicSamplingConfig,
    dynamic_sampling_metrics,
    filter_values,
    informative_groups,
    informative_rows,
    select_informative,
)
from tokenbalance.algorithms.presets import apply_method_overrides, get_method

# one row per prompt; K&K rewards 3 / -0.5 / -1 / -3
REWARDS_PG = torch.tensor(
    [
        [1.0, 1.0, 1.0, 1.0],  # all correct: zero advantage -> dropped
        [1.0, 0.0, 0.0, 0.0],  # mixed -> kept
        [0.0, 0.0, 0.0, 0.0],  # all wrong -> dropped
        [3.0, -0.5, -3.0, -3.0],  # mixed -> kept
        [-0.5, -0.5, -1.0, -3.0],  # no correct answer, different format scores -> kept by reward
        [-3.0, -3.0, -3.0, -3.0],  # dropped
    ]
)


def test_groups_whose_rewards_are_all_equal_are_not_informative():
    assert informative_groups(REWARDS_PG).tolist() == [False, True, False, True, True, False]
    # a single response per prompt is kept (verl keeps it); no prompt at all gives nothing
    assert informative_groups(torch.tensor([[2.0], [2.0]])).tolist() == [True, True]
    assert informative_groups(torch.zeros(0, 4)).tolist() == []


def test_the_correctness_metric_also_drops_all_wrong_groups_with_mixed_format_scores():
    config = DynamicSamplingConfig(enabled=True, metric="correct")
    correct_PG = REWARDS_PG == REWARDS_PG.new_tensor([[1.0], [1.0], [1.0], [3.0], [3.0], [3.0]])
    values = filter_values(config, REWARDS_PG, correct_PG)
    assert values.dtype == torch.float64 and values[1].tolist() == [1.0, 0.0, 0.0, 0.0]
    # DAPO's 0 < #correct < G: the [-0.5, -0.5, -1, -3] group (row 4) goes too
    assert informative_groups(values).tolist() == [False, True, False, True, False, False]
    assert filter_values(DynamicSamplingConfig(), REWARDS_PG) is REWARDS_PG
    with pytest.raises(ValueError, match="correct: required by dynamic_sampling.metric='correct'"):
        filter_values(config, REWARDS_PG)
    with pytest.raises(ValueError, match="correct: expected a bool tensor"):
        filter_values(config, REWARDS_PG, correct_PG.float())


def test_informative_rows_with_any_group_layout():
    # groups 7: (1, 1) equal; 3: (0, 2, 0) mixed; 5: (4) alone -> kept; rows interleaved
    values_B = torch.tensor([1.0, 0.0, 1.0, 2.0, 4.0, 0.0])
    group_ids_B = torch.tensor([7, 3, 7, 3, 5, 3])
    assert informative_rows(values_B, group_ids_B).tolist() == [False, True, False, True, True, True]
    grouped = informative_groups(REWARDS_PG)
    flat = informative_rows(REWARDS_PG.reshape(-1), torch.arange(6).repeat_interleave(4))
    assert torch.equal(flat, grouped.repeat_interleave(4))


def test_select_the_first_informative_groups_up_to_the_target():
    informative = torch.tensor([True, False, True, True, False, True])
    assert select_informative(informative, kept_groups=0, target=3).tolist() == [0, 2, 3]
    assert select_informative(informative, kept_groups=1, target=3).tolist() == [0, 2]
    assert select_informative(informative, kept_groups=3, target=3).tolist() == []
    assert select_informative(informative, kept_groups=0, target=8).tolist() == [0, 2, 3, 5]


def test_rounds_stop_at_the_target_or_the_cap():
    config = DynamicSamplingConfig(enabled=True, max_extra_rounds=2)  # three rounds in all
    assert config.max_rounds == 3 and config.target(32) == 32
    assert DynamicSamplingConfig(enabled=True, target_groups=16).target(32) == 16
    assert config.wants_another_round(kept_groups=10, target=32, rounds_done=1)
    assert config.wants_another_round(kept_groups=31, target=32, rounds_done=2)
    assert not config.wants_another_round(kept_groups=32, target=32, rounds_done=1)
    assert not config.wants_another_round(kept_groups=31, target=32, rounds_done=3)  # cap: train on 31
    strict = DynamicSamplingConfig(enabled=True, max_extra_rounds=2, on_shortfall="error")
    with pytest.raises(ValueError, match=r"31 informative group\(s\) of 32 after 3 rollout round\(s\)"):
        strict.wants_another_round(kept_groups=31, target=32, rounds_done=3)
    off = DynamicSamplingConfig()
    assert off.max_rounds == 1 and not off.wants_another_round(kept_groups=0, target=32, rounds_done=1)


def test_a_step_by_hand():
    """Target 3 groups; round 1 draws REWARDS_PG (3 informative), round 2 would not be needed."""
    config = DynamicSamplingConfig(enabled=True, target_groups=3)
    target = config.target(6)
    first = informative_groups(REWARDS_PG)
    kept = select_informative(first, 0, target)
    assert kept.tolist() == [1, 3, 4]
    assert not config.wants_another_round(len(kept), target, rounds_done=1)
    # target 5: a second round of the same six prompts adds two more of its three informative groups
    config = DynamicSamplingConfig(enabled=True, target_groups=5)
    kept = select_informative(first, 0, 5).tolist()
    assert config.wants_another_round(len(kept), 5, rounds_done=1)
    kept += select_informative(first, len(kept), 5).tolist()
    assert kept == [1, 3, 4, 1, 3] and not config.wants_another_round(len(kept), 5, rounds_done=2)
    metrics = dynamic_sampling_metrics(rounds=2, groups_drawn=12, groups_informative=6, groups_kept=5, target=5)
    assert metrics == {
        "sampling/rounds": 2.0,
        "sampling/groups_drawn": 12.0,
        "sampling/informative_frac": 0.5,
        "sampling/groups_kept": 5.0,
        "sampling/shortfall": 0.0,
    }
    short = dynamic_sampling_metrics(rounds=10, groups_drawn=40, groups_informative=3, groups_kept=3, target=8)
    assert short["sampling/shortfall"] == 5.0 and short["sampling/informative_frac"] == pytest.approx(3 / 40)


def test_a_method_carries_the_option():
    assert not get_method("grpo").dynamic_sampling.enabled  # AR-Lopti reference: no filtering
    on = apply_method_overrides(get_method("grpo"), {"dynamic_sampling.enabled": True})
    assert on.dynamic_sampling == DynamicSamplingConfig(enabled=True)
    dict_form = apply_method_overrides(get_method("grpo"), {"dynamic_sampling": {"enabled": True, "metric": "correct"}})
    assert dict_form.dynamic_sampling.metric == "correct"
    with pytest.raises(ValueError, match="unknown field 'rounds'"):
        apply_method_overrides(get_method("grpo"), {"dynamic_sampling.rounds": 3})


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DynamicSamplingConfig(enabled=1), "dynamic_sampling.enabled: must be a bool"),
        (lambda: DynamicSamplingConfig(target_groups=0), "dynamic_sampling.target_groups: must be an int >= 1"),
        (lambda: DynamicSamplingConfig(max_extra_rounds=-1), "dynamic_sampling.max_extra_rounds: must be an int >= 0"),
        (lambda: DynamicSamplingConfig(max_extra_rounds=2.0), "max_extra_rounds"),
        (lambda: DynamicSamplingConfig(metric="acc"), "dynamic_sampling.metric: unknown value 'acc'"),
        (lambda: DynamicSamplingConfig(on_shortfall="skip"), "dynamic_sampling.on_shortfall: unknown value 'skip'"),
        (lambda: DynamicSamplingConfig().target(0), "prompts_per_step: must be an int >= 1"),
        (lambda: informative_groups(torch.tensor([[1.0, math.nan]])), "values_PG: must be finite"),
        (lambda: informative_groups(torch.ones(4)), r"values_PG: expected a 2-d tensor"),
        (lambda: informative_rows(torch.ones(3), torch.zeros(2, dtype=torch.long)), "group_ids_B: expected shape"),
        (lambda: informative_rows(torch.ones(2), torch.zeros(2)), "group_ids_B: expected an integer dtype"),
        (lambda: select_informative(torch.ones(3), 0, 2), "informative_P: expected a bool tensor"),
        (lambda: dynamic_sampling_metrics(1, 4, 5, 1, 2), "informative <= drawn"),
        (lambda: get_method("grpo").replace(dynamic_sampling={"enabled": True}), "expected a DynamicSamplingConfig"),
        (lambda: get_method("grpo").replace(recommended_temperature=0.0), "recommended_temperature"),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()
