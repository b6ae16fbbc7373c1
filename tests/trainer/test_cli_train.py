"""``tokenbalance train`` / ``eval`` as a user runs them: the first run in a subprocess (the entry
point, exit status and streams of a real process), the rest through ``tokenbalance.cli.main`` in this
process (the same argument parsing, one-line error handler and exit statuses, without a new
interpreter's imports for every command)."""

import json
import subprocess
import sys

from tests.trainer.conftest import SMALL_RUN


def in_a_subprocess(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "tokenbalance.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_train_in_a_subprocess_then_eval_and_resume(tiny_policy_dir, tmp_path, tokenbalance):
    sets = [arg for item in SMALL_RUN for arg in ("--set", item)]
    run_dir = tmp_path / "run"
    result = in_a_subprocess(
        "train", "--model", str(tiny_policy_dir), "--method", "grpo", "--run-dir", str(run_dir), *sets
    )
    assert result.returncode == 0, result.stderr
    assert "held-out accuracy, reward" in result.stdout and "greedy/acc_3" in result.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["eval", "train", "train", "eval"]
    checkpoint_model = run_dir / "checkpoints" / "step_000002" / "model"
    responses_file = tmp_path / "responses.json"
    evaluate = ("eval", "--model", str(checkpoint_model), "--json", "--responses", str(responses_file), *sets)
    evaluated = tokenbalance(*evaluate)
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert metrics["eval/greedy/acc"] == records[-1]["eval/greedy/acc"]
    # --responses: every response of both modes, agreeing with the metrics
    kept = json.loads(responses_file.read_text())
    assert kept["written_by"] == "tokenbalance eval" and kept["metrics"] == metrics
    for mode in ("greedy", "sample"):
        rows = [r for r in kept["responses"] if r["mode"] == mode]
        assert len(rows) == len(kept["responses"]) // 2 > 0
        assert sum(r["tokens"] for r in rows) / len(rows) == metrics[f"eval/{mode}/response_len"]
        for outcome, name in ((True, "correct"), (False, "incorrect")):
            lengths = [r["tokens"] for r in rows if r["correct"] is outcome]
            expected = sum(lengths) / len(lengths) if lengths else None  # no response: NaN, written as null
            assert metrics[f"eval/{mode}/response_len_{name}"] == expected
    # the file is never replaced without --force, and a file of the user's never
    again = tokenbalance(*evaluate)
    assert again.returncode == 2 and "--responses" in again.stderr and "Traceback" not in again.stderr
    assert tokenbalance(*evaluate, "--force").returncode == 0
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    refused = tokenbalance("eval", "--model", str(checkpoint_model), "--responses", str(mine), "--force", *sets)
    assert refused.returncode == 2 and mine.read_text() == "{}", refused.stderr

    # --resume never ignores what it is given: a change of the experiment is refused by name ...
    for change in (["--set", "optim.lr=0.5"], ["--method", "ar"], ["--set", "method.lopti.eta=0.3"]):
        refused = tokenbalance("train", "--resume", str(run_dir), *change, "--no-progress")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "cannot change" in refused.stderr, refused.stderr
    shorter = tokenbalance("train", "--resume", str(run_dir), "--steps", "1", "--no-progress")
    assert shorter.returncode == 2 and "can only extend a run" in shorter.stderr, shorter.stderr
    # ... and --steps extends the run from its last checkpoint, recording the new length
    extended = tokenbalance("train", "--resume", str(run_dir), "--steps", "3", "--no-progress")
    assert extended.returncode == 0, extended.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records][-2:] == [("train", 3), ("eval", 3)]
    assert "steps: 3" in (run_dir / "config.yaml").read_text()


def test_config_errors_come_before_any_model_or_data_work(tmp_path, tokenbalance):
    """A typo in the method or an out-of-range hyper-parameter fails at load, with a suggestion,
    before the embedded policy is built (nothing is cached in the working directory)."""
    cases = [
        (["--method", "ar_lopt"], "train.method: unknown method 'ar_lopt'", "did you mean 'ar_lopti'?"),
        (["--set", "method.lopti.eta=1.5"], "method.lopti.eta: must be in (0.0, 1.0), got 1.5", ""),
        (["--set", "method.lopti.etaa=0.4"], "method.lopti.etaa: unknown field", "did you mean 'eta'?"),
        (["--set", "optim.lrr=1e-4"], "optim.lrr: unknown option", "did you mean 'lr'?"),
        (["--set", "data.train_file=missing.parquet"], "data.train_file='missing.parquet': no such file", ""),
    ]
    for args, message, hint in cases:
        result = tokenbalance("train", *args, "--no-progress", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and hint in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no SFT build, no cache, no run directory


def test_bad_model_path_is_one_clear_line(tmp_path, tokenbalance):
    result = tokenbalance("train", "--model", str(tmp_path / "missing"), "--no-progress")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("tokenbalance train: error: policy path")
    assert "Traceback" not in result.stderr


def test_help_config_lists_options(tokenbalance):
    result = tokenbalance("train", "--help-config")
    assert result.returncode == 0 and "rollout.group_size = 8" in result.stdout
    # the method's hyper-parameters too, with the configured preset's values and their help
    assert "method.lopti.eta = 0.5  # probability threshold" in result.stdout
    assert "method.ar.alpha = 0.3" in result.stdout
    grpo = tokenbalance("train", "--method", "grpo", "--help-config")
    assert "method.lopti.eta = 0.5" in grpo.stdout and "[stage off" in grpo.stdout
