"""What a verl grid cell launches (``run/cell_launch.py``): each cell's own model path, the keys a cell
sets itself, the launch record a resume must match (naming the key that changed), the checkpoint
directory a cell claims and prunes. The scripts that use it: tests/ablate/test_verl_sittings.py."""

import re

import pytest

from tests.integrations.verl_cpu.launch import REPO_ROOT
from tokenbalance.run import cell_launch
from tokenbalance.run.cell_launch import (
    check_overrides,
    claim_checkpoints,
    is_hydra_key,
    keep_setting,
    launch_record,
    model_path,
    override_key,
    prune_checkpoints,
    record_change,
)

HUB = "Qwen/Qwen2.5-3B-Instruct"


def test_each_cell_takes_its_own_models_path():
    assert model_path("3b", HUB, {"MODEL_PATH_3B": "/m/3b", "MODEL_PATH_7B": "/m/7b"}) == "/m/3b"
    assert model_path("7b", HUB, {"MODEL_PATH_3B": "/m/3b", "MODEL_PATH_7B": "/m/7b"}) == "/m/7b"
    assert model_path("3b", HUB, {}) == HUB  # the hub name when no copy is named
    assert model_path("3b", HUB, {"MODEL_PATH": "/m/3b", "MODEL_PATH_3B": "/m/3b"}) == "/m/3b"  # the same: fine


def test_one_model_path_for_every_model_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match=r"MODEL_PATH='/m/3b' would train every model's cells on one model; set "):
        model_path("7b", HUB, {"MODEL_PATH": "/m/3b"})
    with pytest.raises(ValueError, match="set MODEL_PATH_7B"):
        model_path("7b", HUB, {"MODEL_PATH": "/m/3b", "MODEL_PATH_3B": "/m/3b"})


def test_an_offline_node_without_the_models_path_is_refused():
    with pytest.raises(ValueError, match=f"MODEL_PATH_3B is not set and HF_HUB_OFFLINE forbids downloading {HUB}"):
        model_path("3b", HUB, {"HF_HUB_OFFLINE": "1"})
    assert model_path("3b", HUB, {"HF_HUB_OFFLINE": "0"}) == HUB


@pytest.mark.parametrize("word", ["data.seed=3", "+trainer.logger=[console]", "actor_rollout_ref.model.path=/m"])
def test_an_override_of_a_key_the_cell_sets_is_refused(word):
    with pytest.raises(ValueError, match="which the cell sets itself"):
        check_overrides(["trainer.total_epochs=1", word])
    check_overrides(["trainer.total_epochs=1", "trainer.default_local_dir=/scratch/c"])  # the user's to set


@pytest.mark.parametrize(
    ("word", "key", "hydras"),
    [
        ("hydra.run.dir=/x", "hydra.run.dir", True),
        ("++hydra.run.dir=/x", "hydra.run.dir", True),
        ("~hydra.run.dir", "hydra.run.dir", True),  # a delete has no '=': a prefix match on 'key=' misses it
        ("~hydra.run.dir=/x", "hydra.run.dir", True),
        ("hydra/launcher=basic", "hydra/launcher", True),  # hydra's config group, not 'hydra.'
        ("+db@hydra.run=x", "db", False),  # group@package: the key is the group
        ("data.seed=3", "data.seed", False),
        ("+trainer.logger=[console,file]", "trainer.logger", False),
        ("hydra_like.key=1", "hydra_like.key", False),
    ],
)
def test_the_key_of_a_hydra_override_is_hydras_key_or_group(word, key, hydras):
    """The values hydra's own parser gives (``Override.key_or_group``, ``is_hydra_override``)."""
    assert override_key(word) == key and is_hydra_key(override_key(word)) is hydras


def record(tmp_path, **env):
    launch = ["env", "MODEL=3b", "bash", "examples/verl/kk_method.sh"]
    return launch_record(launch, env.pop("extra", []), "3b", env.pop("path", HUB), env, tmp_path)


def test_the_record_names_the_first_thing_that_changed(tmp_path):
    (tmp_path / "examples" / "verl").mkdir(parents=True)
    (tmp_path / "examples" / "verl" / "common.sh").write_text("A=1\n")
    (tmp_path / "examples" / "verl" / "kk_method.sh").write_text("run\n")
    first = record(tmp_path)
    assert first["DATA_DIR"] == "data/kk" and first["N_GPUS"] == "4" and first["MODEL_PATH"] == HUB
    assert record_change(first, record(tmp_path, DATA_DIR="data/kk")) is None  # the default, spelt out
    assert record_change(first, record(tmp_path, DATA_DIR="/d")) == 'DATA_DIR changed ("data/kk" -> "/d")'
    assert record_change(first, record(tmp_path, N_GPUS="8")) == 'N_GPUS changed ("4" -> "8")'
    assert record_change(first, record(tmp_path, path="/m/3b")).startswith('MODEL_PATH changed ("Qwen/')
    assert record_change(first, record(tmp_path, extra=["a=1"])) == 'extra overrides changed ([] -> ["a=1"])'
    (tmp_path / "examples" / "verl" / "common.sh").write_text("A=2\n")
    assert record_change(first, record(tmp_path)).startswith("examples/verl/common.sh was edited (sha256 ")


def test_the_defaults_are_common_shs():
    common = (REPO_ROOT / cell_launch.COMMON_SCRIPT).read_text()
    for name, default in cell_launch.COMMON_DEFAULTS.items():
        assert re.search(rf'^{name}="\$\{{{name}:-{re.escape(default)}\}}"$', common, re.MULTILINE), name


def test_a_checkpoint_directory_belongs_to_one_cell(tmp_path):
    shared = tmp_path / "scratch"
    claim_checkpoints(shared, "grpo-3b-seed0", own=False)
    claim_checkpoints(shared, "grpo-3b-seed0", own=False)  # its own again: fine
    with pytest.raises(ValueError, match=f"the checkpoint directory {shared} is cell grpo-3b-seed0's"):
        claim_checkpoints(shared, "ar-3b-seed0", own=False)
    theirs = tmp_path / "theirs"
    (theirs / "global_step_20").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds files but no .tokenbalance-cell mark"):
        claim_checkpoints(theirs, "ar-3b-seed0", own=False)
    claim_checkpoints(theirs, "ar-3b-seed0", own=True)  # a cell's own checkpoints/ from before the mark
    assert (theirs / ".tokenbalance-cell").read_text() == "ar-3b-seed0\n"


def test_pruning_keeps_the_newest_up_to_the_one_a_resume_loads(tmp_path):
    for step in (20, 40, 60, 80):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("60")  # 80: a save that did not finish
    assert prune_checkpoints(tmp_path, None) == []  # null: verl keeps every one
    assert prune_checkpoints(tmp_path, 2) == ["global_step_20"]
    assert prune_checkpoints(tmp_path, 1) == ["global_step_40"]
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_60", "global_step_80"]
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    assert prune_checkpoints(tmp_path, 1) == []  # no tracker: nothing is known to be resumable


def test_the_kept_number_follows_the_overrides():
    assert keep_setting([], "1") == 1 and keep_setting([], "2") == 2  # KEEP_CHECKPOINTS, as common.sh passes it
    assert keep_setting(["trainer.max_actor_ckpt_to_keep=3"], "1") == 3
    assert keep_setting(["trainer.max_actor_ckpt_to_keep=null"], "1") is None
    assert keep_setting([], "null") is None
