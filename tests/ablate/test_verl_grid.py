"""``tokenbalance ablate --runner verl``: the grid as one verl launch script, each row with its
preset's hyper-parameters, NTHR listed with the reason verl cannot run it."""

import subprocess
import sys

from tokenbalance.ablate.grid import GRID_METHODS, GRID_PRESETS, make_plan
from tokenbalance.ablate.verl_grid import grid_script, verl_launch
from tokenbalance.algorithms.methods import get_method


def test_verl_script_lists_every_row_or_why_not():
    plan = make_plan(GRID_PRESETS["kk-tiny"], seeds=[0, 1])
    text = grid_script(
        "kk-tiny", plan.methods, plan.seeds, ("3b", "7b"), out="OUT", script_path="run_grid.sh", command="cmd"
    )
    lines = [line for line in text.splitlines() if line.startswith("run_cell ")]
    assert len(lines) == 9 * 2 * 2  # every row but NTHR x models x seeds
    assert "#   NTHR (nthr): NTHR is not supported on verl: it needs the old policy's last-layer hidden" in text
    by_name = {line.split()[1]: line for line in lines}
    assert by_name["grpo-3b-seed0"].endswith("ESTIMATOR=grpo bash examples/verl/kk_baseline.sh")
    assert "MODEL=7b ESTIMATOR=grpo ALPHA=0.3 ETA=0.5 bash examples/verl/kk_ar_lopti.sh" in by_name["ar_lopti-7b-seed1"]
    assert (
        "ESTIMATOR=reinforce_pp ALPHA=0.1 ETA=0.5 bash examples/verl/kk_ar_lopti.sh" in by_name["rpp_ar_lopti-3b-seed0"]
    )
    # the Figure 4 eta, not the Lopti-only script's 0.4
    assert "ETA=0.5 bash examples/verl/kk_lopti.sh" in by_name["lopti-3b-seed0"]
    assert "policy_loss.loss_mode=tokenbalance_tr_grpo" in by_name["tr_grpo-3b-seed0"]
    assert by_name["rpp-7b-seed1"].startswith("run_cell rpp-7b-seed1 1 env MODEL=7b ESTIMATOR=reinforce_pp bash")
    assert all(row in GRID_METHODS for row in plan.preset.methods)


def test_rows_verl_cannot_run_say_why():
    assert "hidden states" in verl_launch(get_method("nthr"))
    assert "dynamic sampling" in verl_launch(get_method("nthr_math_tab2_grpo"))
    assert "weighted KL" in verl_launch(get_method("tr_grpo_literal"))
    assert "rloo" in verl_launch(get_method("grpo").replace(advantage=get_method("grpo").advantage.__class__("rloo")))


def test_the_verl_grid_is_written_without_verl(tmp_path):
    """Writing the script needs neither verl nor the verl integration (which checks verl on import):
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
    assert (out / "verl" / "run_grid.sh").read_text().startswith("#!/usr/bin/env bash")
