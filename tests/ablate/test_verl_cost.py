"""The verl grid's cost estimate: its settings are the launch scripts', its arithmetic by hand."""

import re

import pytest

from tests.integrations.verl_cpu.launch import REPO_ROOT
from tokenbalance.ablate.verl import cost as verl_cost
from tokenbalance.ablate.verl.cost import CellCost

COMMON = (REPO_ROOT / "examples" / "verl" / "common.sh").read_text()


def setting(key: str) -> str:
    match = re.search(rf"^\s*\"?{re.escape(key)}=\"?([^\s\"]+)", COMMON, re.MULTILINE)
    assert match, f"{key} not in examples/verl/common.sh"
    return match.group(1)


def test_the_estimate_uses_the_launch_scripts_settings():
    assert int(setting("data.train_batch_size")) == verl_cost.PROMPTS_PER_STEP
    assert int(setting("actor_rollout_ref.rollout.n")) == verl_cost.SAMPLES_PER_PROMPT
    assert int(setting("data.max_prompt_length")) == verl_cost.MAX_PROMPT_TOKENS
    assert int(setting("data.max_response_length")) == verl_cost.MAX_RESPONSE_TOKENS
    assert int(setting("trainer.total_epochs")) == verl_cost.EPOCHS
    assert setting("N_GPUS") == "${N_GPUS:-4}" and verl_cost.GPUS_PER_CELL == 4
    assert "merge_34567ppl" in setting("data.train_files") and list(verl_cost.TRAIN_PEOPLE) == [3, 4, 5, 6, 7]
    assert verl_cost.train_prompts() == 4500  # 900 per people count (prepare_kk_data.sh)
    assert verl_cost.steps_per_cell() == 350  # 5 x (4500 // 64), the paper's 350 steps


def test_gpu_hours_by_hand():
    # 64 x 8 x (400 + 4096) = 2,301,952 tokens per step; 350 steps; 62.4 TFLOP/s per GPU (20% of 312)
    assert verl_cost.tokens_per_step() == 2_301_952
    # 3B, one pass: 12 N = 3.708e10 FLOPs per token -> 2.98747e19 FLOPs -> 478,762 GPU-s = 132.99 GPU-h
    assert CellCost("3b", 1).gpu_hours == pytest.approx(132.99, abs=0.005)
    # Lopti: 18 N per token (a second 6N update pass), 1.5 x
    assert CellCost("3b", 2).gpu_hours == pytest.approx(199.48, abs=0.005)
    # 7B: 7.61 / 3.09 x; one node of 4 GPUs runs a cell in a quarter of its GPU-hours
    assert CellCost("7b", 1).gpu_hours == pytest.approx(327.52, abs=0.005)
    assert CellCost("7b", 2).wall_hours == pytest.approx(122.82, abs=0.005)  # 491.29 GPU-h


def test_the_table_groups_cells_and_totals_them():
    lines = verl_cost.cost_table([CellCost("3b", 1), CellCost("3b", 2), CellCost("3b", 1)])
    assert [line.split() for line in lines[1:3]] == [
        ["3b", "1", "2", "133", "33", "266"],
        ["3b", "2", "1", "199", "50", "199"],
    ]
    assert lines[3] == "  total: 3 cells, 465 GPU-hours = 116 hours of one 4-GPU node (cells in sequence: 5 days)"
