"""A preset's ``start_seed``: every cell starts from one seed's embedded SFT policy (one build)."""

import dataclasses

from tokenbalance.ablate.grid import GridPlan, grid_method, grid_preset
from tokenbalance.ablate.runner import planned_configs
from tokenbalance.config import RunConfig, replace_sections
from tokenbalance.trainer.embedded import embedded_key


def test_cells_of_every_seed_start_from_the_start_seeds_policy(tmp_path):
    rows = (grid_method("grpo"), grid_method("ar_lopti"))
    own = dataclasses.replace(grid_preset("kk-smoke"), start_seed=None)  # each seed its own start policy
    shared = dataclasses.replace(own, start_seed=0)
    base = replace_sections(RunConfig(), model={"cache_dir": str(tmp_path / "cache")})
    policy_of = {
        seed: str((tmp_path / "cache" / embedded_key(replace_sections(base, train={"seed": seed}))).resolve())
        for seed in (0, 1)
    }
    for preset, expected in ((own, {0: policy_of[0], 1: policy_of[1]}), (shared, {0: policy_of[0], 1: policy_of[0]})):
        configs = planned_configs(GridPlan(preset, rows, (0, 1), 4, ()), base, tmp_path / "out")
        for name, config in configs.items():
            assert config.model.path == expected[config.train.seed], name
            assert config.train.seed == int(name.rsplit("seed", 1)[1])  # RL still runs with the cell's seed
    assert policy_of[0] != policy_of[1]
