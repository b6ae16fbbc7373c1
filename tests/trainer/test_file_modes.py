"""Files and directories tokenbalance writes get the permissions the user's umask gives a plain
write (0666 / 0777 less the umask), although they are built as private temporary files and
directories (mkstemp, mkdtemp, safetensors) renamed into place: colleagues on a shared machine
can read a saved policy, a run's checkpoints and the embedded policy's cache."""

import os
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import replace_section
from tokenbalance.models import load_policy, save_policy
from tokenbalance.outputs import write_text_atomic
from tokenbalance.tasks.files import write_parquet_atomic
from tokenbalance.trainer import runner, sft_checkpoint
from tokenbalance.trainer.embedded import embedded_key

UMASK = 0o027  # neither 022 (the usual one) nor 077 (what the temporary files have)


@pytest.fixture
def umask():
    old = os.umask(UMASK)
    yield
    os.umask(old)


def modes(root: Path) -> dict[str, set[int]]:
    """The permission bits of ``root`` and everything under it, by kind."""
    found: dict[str, set[int]] = {"dir": set(), "file": set()}
    for path in [root, *root.rglob("*")]:
        found["dir" if path.is_dir() else "file"].add(path.stat().st_mode & 0o777)
    return found


def test_a_saved_policy_is_readable_as_the_umask_says(tiny_policy_dir, tmp_path, umask):
    model, tokenizer = load_policy(tiny_policy_dir)
    path = save_policy(model, tokenizer, tmp_path / "policy")
    assert (path / "model.safetensors").is_file()
    assert modes(path) == {"dir": {0o750}, "file": {0o640}}


def test_checkpoints_and_the_embedded_cache_are_readable_as_the_umask_says(small_config, tmp_path, umask):
    replace_section(small_config, "model", path=None, cache_dir=str(tmp_path / "cache"), hidden_size=16)
    replace_section(small_config, "sft", steps=1, batch_size=2, train_count=2, save_every=1)
    run_dir = runner.run_training(small_config, log=lambda *_: None)
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_000001", "step_000002"]
    assert (checkpoints / "step_000002" / "model" / "model.safetensors").is_file()
    assert modes(checkpoints) == {"dir": {0o750}, "file": {0o640}}
    cache = tmp_path / "cache" / embedded_key(small_config)
    assert (cache / "model.safetensors").is_file()
    assert modes(cache) == {"dir": {0o750}, "file": {0o640}}


def test_sft_checkpoints_parquet_and_text_files_are_readable_as_the_umask_says(tiny_policy_dir, tmp_path, umask):
    model, _ = load_policy(tiny_policy_dir)
    optimizer = torch.optim.AdamW(model.parameters())
    sft_checkpoint.save(tmp_path / "sft", 1, model, optimizer, torch.Generator(), [1.0], "key")
    assert modes(tmp_path / "sft") == {"dir": {0o750}, "file": {0o640}}
    import pyarrow as pa

    write_parquet_atomic([{"x": 1}], tmp_path / "rows.parquet", pa.schema([("x", pa.int64())]))
    write_text_atomic(tmp_path / "note.txt", "hello\n")
    assert {(tmp_path / name).stat().st_mode & 0o777 for name in ("rows.parquet", "note.txt")} == {0o640}
