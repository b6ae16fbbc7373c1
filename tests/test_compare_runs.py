"""scripts/compare_runs.py: the reward means, the evaluations and the per-puzzle McNemar of two small runs."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compare_runs():
    spec = importlib.util.spec_from_file_location("compare_runs", ROOT / "scripts" / "compare_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(run_dir: Path, rewards: list[float], greedy: str, sample: str, examples: str = "abc") -> Path:
    run_dir.mkdir()
    lines = [
        {"step": i + 1, "kind": "train", "reward/mean": r, "reward/acc": float(r > 0)} for i, r in enumerate(rewards)
    ]
    lines.append({"step": 3, "kind": "eval", "eval/greedy/acc": greedy.count("1") / 8, "eval/sample/acc": 0.25})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    outcomes = [{"step": 3, "mode": "greedy", "examples": examples, "correct": greedy}]
    outcomes.append({"step": 3, "mode": "sample", "examples": examples, "correct": sample})
    (run_dir / "eval_outcomes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in outcomes))
    return run_dir


def test_two_runs_side_by_side(compare_runs, tmp_path, capsys):
    base = write_run(tmp_path / "base", [-1.0, 0.5, 1.0], "11000000", "10000000")
    other = write_run(tmp_path / "other", [0.0, 1.0, 1.0], "01111110", "10000000")
    assert compare_runs.main([str(base), str(other), "--labels", "A,B", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "| A | 2 | -0.250 | 0.500 | 3: 0.25 / 0.25 |" in out  # steps 1-2 only
    assert "| B | 2 | +0.500 | 0.500 | 3: 0.75 / 0.25 |" in out
    assert "- B, step 3 greedy: 5 / 1, p = 0.22" in out  # exact McNemar: 2 * (1 + 6) / 2^6
    assert "- B, step 3 sample: 0 / 0, p = 1.00" in out


def test_evaluations_of_other_puzzles_do_not_pair(compare_runs, tmp_path, capsys):
    base = write_run(tmp_path / "base", [0.0], "11000000", "10000000")
    other = write_run(tmp_path / "other", [0.0], "01111110", "10000000", examples="xyz")
    assert compare_runs.main([str(base), str(other)]) == 0
    assert "step 3" not in capsys.readouterr().out.split("McNemar")[1]


def test_a_missing_run_is_one_line_and_exit_2(compare_runs, tmp_path, capsys):
    assert compare_runs.main([str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "absent" in err and "not a directory" in err


def responses(correct: str, mode: str) -> list[dict]:
    return [
        {"mode": mode, "data_source": "kk_logic", "difficulty": 3, "index": i, "correct": c == "1"}
        for i, c in enumerate(correct)
    ]


def test_an_eval_responses_file_pairs_at_its_checkpoints_step(compare_runs, tmp_path, capsys):
    from tokenbalance.trainer.evaluate import outcome_lines

    base = write_run(tmp_path / "base", [0.0], "11000000", "10000000")
    lines = outcome_lines(3, responses("11000000", "greedy") + responses("10000000", "sample"))
    (base / "eval_outcomes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    document = {
        "written_by": "tokenbalance eval",
        "model": str(tmp_path / "run" / "checkpoints" / "step_000003" / "model"),
        "metrics": {"eval/greedy/acc": 0.5, "eval/sample/acc": 0.125},
        "responses": responses("00111100", "greedy") + responses("10000000", "sample"),
    }
    (tmp_path / "under-bf16.json").write_text(json.dumps(document))
    assert compare_runs.main([str(base), str(tmp_path / "under-bf16.json")]) == 0
    out = capsys.readouterr().out
    assert "| under-bf16 | 0 | - | - | 3: 0.50 / 0.12 |" in out
    assert "- under-bf16, step 3 greedy: 4 / 2, p = 0.69" in out
    assert "- under-bf16, step 3 sample: 0 / 0, p = 1.00" in out


def test_a_json_file_of_another_command_is_refused(compare_runs, tmp_path, capsys):
    (tmp_path / "other.json").write_text(json.dumps({"written_by": "something else"}))
    assert compare_runs.main([str(tmp_path / "other.json")]) == 2
    assert "not a file of `tokenbalance eval --responses`" in capsys.readouterr().err
