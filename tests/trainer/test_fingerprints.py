"""A run records its fingerprints when it starts (start policy, prompt order, evaluation set, version, commit), and a
resume refuses a start policy other than the one the run started from."""

import json
import shutil

import torch

from tests.trainer.conftest import SMALL_RUN
from tokenbalance.models import load_policy, save_policy
from tokenbalance.run.fingerprints import FINGERPRINTS_FILE, start_policy_fingerprint

SETS = [arg for item in SMALL_RUN for arg in ("--set", item)]


def test_a_run_records_its_start_policy_and_a_resume_refuses_another(tiny_policy_dir, tmp_path, tokenbalance):
    policy = tmp_path / "policy"
    shutil.copytree(tiny_policy_dir, policy)
    run_dir = tmp_path / "run"
    status, _, err = tokenbalance("train", "--model", str(policy), *SETS, "--steps", "1", "--run-dir", str(run_dir))
    assert status == 0, err
    found = json.loads((run_dir / FINGERPRINTS_FILE).read_text())
    assert set(found) == {"start_policy", "prompt_order", "eval_set", "version", "commit"}
    model, tokenizer = load_policy(policy)
    assert found["start_policy"] == start_policy_fingerprint(model, tokenizer)
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)  # another start policy in the same directory
    save_policy(model, tokenizer, policy)
    status, _, err = tokenbalance("train", "--resume", str(run_dir), "--steps", "2")
    assert status == 2 and err.count("\n") == 1
    assert f"{run_dir / FINGERPRINTS_FILE}: the run started from another start policy" in err
