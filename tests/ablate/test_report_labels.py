"""The report names difficulty columns as the task does, lists seeds sharing a start policy together, and
says how likely one of several compared rows is to exclude zero by chance."""

from tokenbalance.ablate.grid import GridPlan, grid_method, grid_preset
from tokenbalance.ablate.report import column_label, multiplicity_note, start_policy_summary
from tokenbalance.config import RunConfig, replace_sections, save_config
from tokenbalance.tasks import get_task


def test_difficulty_columns_are_named_by_the_task():
    assert column_label("eval/greedy/acc_3", get_task("kk").difficulty_label) == "3 people"
    assert column_label("eval/sample/acc_2", get_task("arith").difficulty_label) == "level 2"
    assert column_label("eval/greedy/acc", get_task("arith").difficulty_label) == "Avg"


def test_seeds_sharing_a_start_policy_are_listed_together(tmp_path):
    plan = GridPlan(grid_preset("kk-smoke"), (grid_method("grpo"),), (0, 1, 2), 4, ())
    (tmp_path / "configs").mkdir()
    policies = {0: tmp_path / "shared", 1: tmp_path / "shared", 2: tmp_path / "own"}
    for seed, policy in policies.items():
        policy.mkdir(exist_ok=True)
        save_config(
            replace_sections(RunConfig(), model={"path": str(policy)}), tmp_path / "configs" / f"grpo-seed{seed}.yaml"
        )
    (tmp_path / "shared" / "tokenbalance_sft.json").write_text('{"sft_seconds": 500.4}')
    assert start_policy_summary(tmp_path, plan) == (
        "- start policies: seeds 0, 1: `shared`, SFT built in 500 s; seed 2: `own`"
    )
    # a warm start `tokenbalance sft` wrote (given with --model) records its final loss, not a build time
    (tmp_path / "own" / "tokenbalance_sft.json").write_text('{"sft_final_loss": 0.07626, "built_with": {}}')
    assert start_policy_summary(tmp_path, plan).endswith("seed 2: `own`, SFT final loss 0.076")
    (tmp_path / "own" / "tokenbalance_sft.json").write_text("{")  # damaged: the report is still written
    assert start_policy_summary(tmp_path, plan).endswith("seed 2: `own`")


def test_several_compared_rows_carry_the_chance_that_one_interval_excludes_zero():
    six = GridPlan(grid_preset("arith-cot"), tuple(map(grid_method, grid_preset("arith-cot").methods)), (0,), 4, ())
    note = multiplicity_note(six)  # GRPO is compared with the start policy; the other five with GRPO
    assert "compares 5 rows" in note and "1 - 0.95^5 = 23%" in note
    one = GridPlan(grid_preset("kk-smoke"), (grid_method("grpo"), grid_method("ar_lopti")), (0,), 4, ())
    assert multiplicity_note(one) == ""
