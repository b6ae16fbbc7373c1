"""``tokenbalance ablate --runner verl`` writes the grid: one launch script per cell with its row's
hyper-parameters (NTHR through its own trainer's script), the rows verl cannot run with the reason, the
drivers, the cost estimate;
writing it again never touches what the cells wrote."""

import subprocess
import sys

import pytest

from tokenbalance.ablate.grid import GRID_METHODS
from tokenbalance.ablate.verl.grid import verl_launch
from tokenbalance.algorithms.nthr import NTHRConfig
from tokenbalance.algorithms.presets import get_method
from tokenbalance.cli import main

VERL = ["ablate", "--runner", "verl"]


def write(tmp_path, *flags: str):
    out = tmp_path / "out"
    assert main([*VERL, "--out", str(out), *flags]) == 0
    return out / "verl"


def launches(grid_dir) -> dict[str, str]:
    """Each cell's ``LAUNCH=(...)`` line, by cell name (in cells.txt order)."""
    names = (grid_dir / "cells.txt").read_text().split()
    return {
        name: next(
            line for line in (grid_dir / "cells" / name / "run.sh").read_text().splitlines() if "LAUNCH=" in line
        )
        for name in names
    }


def test_every_row_launches_with_its_presets_values_or_says_why_not(tmp_path):
    grid_dir = write(tmp_path, "--seeds", "0,1")
    by_name = launches(grid_dir)
    assert len(by_name) == 10 * 2 * 2  # every default row x models x seeds
    assert list(by_name)[:2] == ["grpo-3b-seed0", "ar-3b-seed0"]  # model-major, then seed, then row
    script = "bash examples/verl/kk_method.sh)"  # each row's preset travels by name, resolved in verl's workers
    assert (
        by_name["grpo-3b-seed0"]
        == f"LAUNCH=(env MODEL=3b ESTIMATOR=grpo METHOD=arlopti_kk_fig4_grpo TRAINER=sync {script}"
    )
    assert by_name["ar_lopti-7b-seed1"] == (
        f"LAUNCH=(env MODEL=7b ESTIMATOR=grpo METHOD=arlopti_kk_fig4_ar_lopti TRAINER=lopti {script}"
    )
    assert (
        f"ESTIMATOR=reinforce_pp METHOD=arlopti_kk_tab7_reinforce_pp_ar_lopti TRAINER=lopti {script}"
        in (by_name["rpp_ar_lopti-3b-seed0"])
    )
    assert f"METHOD=arlopti_kk_fig4_lopti TRAINER=lopti {script}" in by_name["lopti-3b-seed0"]  # Figure 4's eta 0.5
    assert f"METHOD=tr_grpo TRAINER=sync {script}" in by_name["tr_grpo-3b-seed0"]
    assert by_name["nthr-3b-seed0"] == f"LAUNCH=(env MODEL=3b ESTIMATOR=grpo METHOD=nthr TRAINER=nthr {script}"
    run = (grid_dir / "cells" / "rpp-7b-seed1" / "run.sh").read_text()
    assert "\nCELL=rpp-7b-seed1\nSEED=1\n" in run and run.rstrip().endswith('source "$CELL_DIR/../../run_cell.sh"')
    assert (grid_dir / "cells" / "rpp-7b-seed1" / "STATUS").read_text() == "not started\n"
    for driver in ("run_grid.sh", "slurm_array.sh"):
        assert "# not on verl" not in (grid_dir / driver).read_text()
    assert "#SBATCH --array=0-39\n" in (grid_dir / "slurm_array.sh").read_text()
    assert all(row in GRID_METHODS for row in [name.split("-")[0] for name in by_name])


def test_rows_verl_cannot_run_say_why():
    nthr_lopti = get_method("nthr").replace(lopti=get_method("lopti").lopti)
    assert "NTHR and Lopti are two verl trainers" in verl_launch(nthr_lopti)
    assert "dynamic sampling" in verl_launch(get_method("nthr_math_tab2_grpo"))
    assert "weighted KL" in verl_launch(get_method("tr_grpo_literal"))
    assert "rloo" in verl_launch(get_method("grpo").replace(advantage=get_method("grpo").advantage.__class__("rloo")))


def test_nthr_rows_carry_their_settings_to_the_nthr_trainer():
    beta_zero = get_method("nthr").replace(nthr=NTHRConfig(beta=0.0, positives="advantage_sign"))
    launch = verl_launch(beta_zero)
    assert launch.script == "examples/verl/kk_method.sh" and launch.update_passes == 1
    assert launch.env == (("ESTIMATOR", "grpo"), ("METHOD", "nthr"), ("TRAINER", "nthr"))
    assert launch.overrides == (  # the preset's name and what differs from it, as dotted overrides
        "+actor_rollout_ref.actor.policy_loss.overrides.nthr.beta=0.0",
        "+actor_rollout_ref.actor.policy_loss.overrides.nthr.positives=advantage_sign",
    )
    rpp = verl_launch(get_method("reinforce_pp_nthr"))
    assert rpp.env == (("ESTIMATOR", "reinforce_pp"), ("METHOD", "reinforce_pp_nthr"), ("TRAINER", "nthr"))
    with_ar = verl_launch(get_method("nthr").replace(ar=get_method("ar").ar))  # a stage on with its defaults
    assert with_ar.overrides == ("+actor_rollout_ref.actor.policy_loss.overrides.ar={}",)


def test_the_size_and_the_estimated_cost_are_printed(tmp_path, capsys):
    write(tmp_path, "--methods", "grpo,lopti", "--seeds", "0", "--verl-models", "3b")
    printed = capsys.readouterr().out
    assert "verl grid kk-tiny: 2 rows x 1 models x 1 seeds = 2 cells" in printed
    assert "cost: an ESTIMATE from the settings, not a measurement" in printed
    assert "  total: 2 cells, 351 GPU-hours" in printed  # 140 (one update pass) + 211 (Lopti's two, a resume)
    assert "MFU per phase (ASSUMED, not measured): rollout 10%, logprob 40%, update 25%" in printed
    assert "  checkpoints: 0.15 TB if every cell runs at once" in printed  # 2 x 2 x 37.08 GB


def test_the_verl_grid_is_written_without_verl(tmp_path):
    """Writing the grid needs neither verl nor the verl integration (which checks verl on import):
    in a process where ``import verl`` fails, as on a laptop without it, the grid is written."""
    out = tmp_path / "grid"
    code = (
        "import sys; sys.modules['verl'] = None\n"  # any import of verl now fails
        "from tokenbalance.cli import main\n"
        f"status = main(['ablate', '--preset', 'kk-smoke', '--runner', 'verl', '--out', {str(out)!r}])\n"
        "assert 'tokenbalance.integrations.verl' not in sys.modules, 'the verl integration was imported'\n"
        "sys.exit(status)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in ("run_grid.sh", "slurm_array.sh", "run_cell.sh"):
        assert (out / "verl" / name).read_text().startswith(("#!/usr/bin/env bash", "# tokenbalance"))


def test_writing_again_keeps_what_the_cells_wrote(tmp_path):
    flags = ("--preset", "kk-smoke", "--seeds", "0", "--verl-models", "3b")
    cell = write(tmp_path, *flags) / "cells" / "grpo-3b-seed0"
    (cell / "STATUS").write_text("failed at step 3: exit status 1\n")
    (cell / "metrics.sitting-1.jsonl").write_text('{"step":1,"data":{}}\n')
    write(tmp_path, *flags)
    assert (cell / "STATUS").read_text() == "failed at step 3: exit status 1\n"
    assert (cell / "metrics.sitting-1.jsonl").read_text() == '{"step":1,"data":{}}\n'


def test_a_cell_that_ran_another_launch_is_refused(tmp_path, capsys):
    flags = ("--preset", "kk-smoke", "--seeds", "0", "--verl-models", "3b")
    cell = write(tmp_path, *flags) / "cells" / "ar_lopti-3b-seed0"
    script = cell / "run.sh"
    script.write_text(script.read_text().replace("TRAINER=lopti", "TRAINER=lopti ALPHA=0.2"))  # another version
    (cell / "metrics.sitting-1.jsonl").write_text('{"step":1,"data":{}}\n')
    before = script.read_text()
    assert main([*VERL, "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert "--out: cell ar_lopti-3b-seed0 has run with another launch" in err and "ALPHA=0.2" in err
    assert script.read_text() == before


@pytest.mark.parametrize("script", ["slurm_array.sh", "run_grid.sh", "cells/grpo-3b-seed0/run.sh"])
def test_writing_again_never_replaces_a_script_the_user_edited(tmp_path, capsys, script):
    """One more seed rewrites the scripts; the ``#SBATCH`` lines the Slurm header tells users to add
    (or an edit of a cell's ``run.sh``) are refused by name instead of being replaced, and nothing is
    written; once the user moves the file away the grid is written again."""
    flags = ("--preset", "kk-smoke", "--seeds", "0", "--verl-models", "3b")
    grid_dir = write(tmp_path, *flags)
    edited = grid_dir / script
    text = edited.read_text().replace("#!/usr/bin/env bash\n", "#!/usr/bin/env bash\n#SBATCH --partition=gpu\n", 1)
    edited.write_text(text)
    capsys.readouterr()
    assert main([*VERL, "--out", str(tmp_path / "out"), *flags[:2], "--seeds", "0,1", "--verl-models", "3b"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--out: {edited} was edited after the grid wrote it" in err and "Move it away" in err
    assert len(err.splitlines()) == 1 and edited.read_text() == text
    assert not (grid_dir / "cells" / "grpo-3b-seed1").exists()
    edited.rename(tmp_path / "mine.sh")
    write(tmp_path, *flags[:2], "--seeds", "0,1", "--verl-models", "3b")
    assert (
        grid_dir / "cells" / "grpo-3b-seed1" / "run.sh"
    ).is_file() and "#SBATCH --partition=gpu" not in edited.read_text()


def test_a_grid_written_before_digests_is_adopted_with_all_its_cells(tmp_path):
    """A grid from before the digests (no record): written again with fewer seeds, then with its
    earlier seeds again, it is not refused (every cell script it held was adopted)."""
    flags = ("--preset", "kk-smoke", "--verl-models", "3b")
    grid_dir = write(tmp_path, *flags, "--seeds", "0,1")
    (grid_dir / ".tokenbalance-scripts.json").unlink()
    write(tmp_path, *flags, "--seeds", "0")
    write(tmp_path, *flags, "--seeds", "0,1")
    assert "grpo-3b-seed1" in (grid_dir / "cells.txt").read_text()


def test_writing_again_unchanged_scripts_just_works(tmp_path):
    flags = ("--preset", "kk-smoke", "--seeds", "0", "--verl-models", "3b")
    write(tmp_path, *flags)
    grid_dir = write(tmp_path, *flags[:2], "--seeds", "0,1", "--verl-models", "3b")
    assert "grpo-3b-seed1" in (grid_dir / "cells.txt").read_text()


@pytest.mark.parametrize("flag", ["--no-figure", "--figure-prompts=4"])
def test_the_verl_report_refuses_local_only_flags(tmp_path, capsys, flag):
    write(tmp_path, "--preset", "kk-smoke")
    assert main([*VERL, "--preset", "kk-smoke", "--out", str(tmp_path / "out"), "--report-only", flag]) == 2
    assert "apply to the local grid only" in capsys.readouterr().err


def test_the_verl_report_needs_a_written_grid(tmp_path, capsys):
    assert main([*VERL, "--out", str(tmp_path / "none"), "--report-only"]) == 2
    assert "holds no verl grid (write it first" in capsys.readouterr().err


def test_slurm_signals_a_task_early_enough_for_its_slowest_cell_to_stop_with_a_checkpoint(tmp_path):
    """The lead of ``--signal=B:USR1@LEAD`` covers the slowest cell's estimated worst-case stop (the step
    in progress, its save and validation, the requested save, the exit: 7B Lopti in the default grid)
    plus the margin kept for a SIGTERM after the grace; whole minutes, at least 900 s, within Slurm's
    limit; the grace before that SIGTERM is the lead less the margin."""
    from tokenbalance.ablate.verl.cost import CellCost
    from tokenbalance.ablate.verl.scripts import SLURM_SIGNAL_MAX_S, STOP_LEAD_S, STOP_MARGIN_S

    slurm = (write(tmp_path) / "slurm_array.sh").read_text()
    lead = int(slurm.split("#SBATCH --signal=B:USR1@")[1].split("\n")[0])
    slowest = CellCost("7b", 2).stop_seconds
    assert slowest > CellCost("7b", 1).stop_seconds > CellCost("3b", 2).stop_seconds > CellCost("3b", 1).stop_seconds
    assert slowest > CellCost("7b", 2).step_gpu_seconds / 4  # at least the step in progress on the cell's 4 GPUs
    assert lead % 60 == 0 and slowest + STOP_MARGIN_S <= lead < slowest + STOP_MARGIN_S + 60
    assert STOP_LEAD_S < lead <= SLURM_SIGNAL_MAX_S
    assert f'"${{STOP_GRACE_S:-{lead - STOP_MARGIN_S}}}"' in slurm
