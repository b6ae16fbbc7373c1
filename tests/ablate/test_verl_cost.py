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
    # 64 x 8 x (400 + 4096) = 2,301,952 tokens per step; 350 steps; 312 TFLOP/s peak per GPU
    assert verl_cost.tokens_per_step() == 2_301_952
    assert verl_cost.validations_per_cell() == 19  # step 0, 20, 40, ..., 340, and the last step 350
    # 3B (N = 3.09e9), one pass, GPU-seconds per step: rollout 2N x tokens at 10% = 455.96; old + ref
    # log-probs 4N at 40% = 227.98; update 8N (recompute) at 25% = 729.54; sum 1,413.49
    step = 2 * 3.09e9 * 2_301_952 / 31.2e12 + 4 * 3.09e9 * 2_301_952 / 124.8e12 + 8 * 3.09e9 * 2_301_952 / 78e12
    assert CellCost("3b", 1).step_gpu_seconds == pytest.approx(1413.49, abs=0.005)
    assert CellCost("3b", 1).step_gpu_seconds == pytest.approx(step, rel=1e-12)
    # one validation: 500 prompts x 4,496 tokens x 2N at 10% = 445.28 GPU-s; 19 of them
    assert verl_cost.validation_seconds(3.09e9) == pytest.approx(445.28, abs=0.005)
    # (350 x 1,413.49 + 19 x 445.28) / 3600 = 139.77 GPU-h; 34.9 h on its node: no resume
    assert CellCost("3b", 1).gpu_hours == pytest.approx(139.77, abs=0.005) and CellCost("3b", 1).resumes == 0
    # Lopti: the update twice (2,143.03 GPU-s per step): 210.70 GPU-h, 52.7 h on its node > 48 h: one
    # resume, adding a validation and the requested save (12 x 3.09e9 bytes at 1 GB/s = 37.08 s) with the
    # exit (60 s) on 4 GPUs: (445.28 + 4 x 97.08) / 3600 = 0.23 GPU-h
    lopti = CellCost("3b", 2)
    assert lopti.first_sitting_gpu_hours == pytest.approx(210.70, abs=0.005) and lopti.resumes == 1
    assert lopti.gpu_hours == pytest.approx(210.93, abs=0.005)
    assert lopti.wall_hours == pytest.approx(210.93 / 4, abs=0.005)


def test_checkpoint_disk_by_hand():
    # 12 bytes per parameter: 3B 37.08 GB, 7B 91.32 GB a checkpoint; one kept, two while saving
    assert CellCost("3b", 1).checkpoint_bytes == pytest.approx(37.08e9, rel=1e-12)
    assert CellCost("7b", 2).disk_bytes == pytest.approx(2 * 91.32e9, rel=1e-12)
    assert verl_cost.KEEP_CHECKPOINTS == int(setting("KEEP_CHECKPOINTS").removeprefix("${KEEP_CHECKPOINTS:-")[:-1])
    assert int(setting("trainer.save_freq")) == verl_cost.SAVE_FREQ
    assert int(setting("trainer.test_freq")) == verl_cost.TEST_FREQ


def test_the_table_groups_cells_and_totals_them():
    lines = verl_cost.cost_table([CellCost("3b", 1), CellCost("3b", 2), CellCost("3b", 1)])
    assert [line.split() for line in lines[1:3]] == [
        ["3b", "1", "2", "140", "35", "0", "74", "GB", "280"],
        ["3b", "2", "1", "211", "53", "1", "74", "GB", "211"],
    ]
    assert lines[3] == "  total: 3 cells, 490 GPU-hours = 123 hours of one 4-GPU node (cells in sequence: 5 days)"
    assert lines[4].startswith("  checkpoints: 0.22 TB if every cell runs at once; the completed grid keeps 0.11 TB")
