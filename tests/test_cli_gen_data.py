"""``tokenbalance gen-data``: the Logic-RL files it writes, its options and its error lines."""

import pandas as pd
import pytest

from tokenbalance.cli import main

LOGIC_RL_COLUMNS = [
    "quiz",
    "names",
    "knight_knave",
    "solution",
    "solution_text",
    "solution_text_format",
    "cot_head",
    "cot_repeat_steps",
    "cot_foot",
    "statements",
    "index",
    "data_source",
    "prompt",
    "ability",
    "reward_model",
    "extra_info",
]  # fmt: skip  (spec kk.md §9.3)


def test_kk_3ppl_test_file(tmp_path, capsys):
    out = tmp_path / "x.parquet"
    assert main(["gen-data", "kk", "--people", "3", "--split", "test", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"wrote 100 rows (3 people, test, indices 1000..1099) to {out}"
    assert captured.err == ""
    frame = pd.read_parquet(out)
    assert list(frame.columns) == LOGIC_RL_COLUMNS and len(frame) == 100
    row = frame.iloc[0]
    # spec §8.2, Logic-RL 3-ppl test row 0
    assert list(row["names"]) == ["Amelia", "Penelope", "Evelyn"]
    assert row["solution_text_format"] == "(1) Amelia is a knight\n(2) Penelope is a knight\n(3) Evelyn is a knave"
    assert row["statements"] == (
        "(('not', ('telling-truth', 2)), ('or', ('telling-truth', 1), ('lying', 2)), "
        "('<=>', ('telling-truth', 1), ('lying', 1)))"
    )
    assert list(row["solution"]) == [True, True, False]
    assert row["index"] == 1000 and row["data_source"] == "kk_logic" and row["ability"] == "logic"
    assert row["extra_info"] == {"index": 0, "split": "test"}
    assert row["reward_model"]["style"] == "rule"
    assert row["reward_model"]["ground_truth"]["solution_text_format"] == row["solution_text_format"]
    content = row["prompt"][0]["content"]
    assert content.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert content.endswith(row["quiz"] + "\n<|im_end|>\n<|im_start|>assistant\n<think>")
    assert frame["index"].tolist() == list(range(1000, 1100))
    assert frame.iloc[99]["extra_info"] == {"index": 99, "split": "test"}


def test_kk_merge_template_count_and_per_level_sources(tmp_path, capsys):
    merged = tmp_path / "merge.parquet"
    assert (
        main(
            [
                "gen-data",
                "kk",
                "--people",
                "3-4",
                "--split",
                "train",
                "--merge",
                "--count",
                "2",
                "--template",
                "plain",
                "--per-level-source",
                "--out",
                str(merged),
            ]
        )
        == 0
    )
    frame = pd.read_parquet(merged)
    assert frame["names"].map(len).tolist() == [3, 3, 4, 4]
    assert frame["data_source"].tolist() == ["kk_logic3", "kk_logic3", "kk_logic4", "kk_logic4"]
    assert frame["index"].tolist() == [100, 101, 100, 101]
    assert (
        frame.iloc[0]["quiz"].startswith("A very special island")
        and "Michael, Zoey, and Ethan" in frame.iloc[0]["quiz"]
    )
    assert frame.iloc[0]["prompt"][0]["content"].endswith("\nAssistant: <think>")
    assert "<|im_start|>" not in frame.iloc[0]["prompt"][0]["content"]

    pattern = str(tmp_path / "{n}ppl" / "test.parquet")
    assert (
        main(
            [
                "gen-data",
                "kk",
                "--people",
                "5-6",
                "--split",
                "test",
                "--count",
                "1",
                "--start-index",
                "7",
                "--seed",
                "99",
                "--data-source",
                "kk_custom",
                "--out",
                pattern,
            ]
        )
        == 0
    )
    five = pd.read_parquet(tmp_path / "5ppl" / "test.parquet")
    assert five["index"].tolist() == [7] and five["data_source"].tolist() == ["kk_custom"]
    assert len(capsys.readouterr().out.strip().splitlines()) == 3


def test_progress_goes_to_stderr_only(tmp_path, capsys):
    out = tmp_path / "late.parquet"
    # 2 x 1501 puzzles drawn > the 2,000 threshold: a progress display on stderr.
    assert (
        main(
            [
                "gen-data",
                "kk",
                "--people",
                "3-4",
                "--merge",
                "--split",
                "train",
                "--start-index",
                "1500",
                "--count",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "kk puzzles" in captured.err
    assert captured.out.strip() == f"wrote 2 rows (3-4 people, train, merged) to {out}"


def test_arith_file(tmp_path, capsys):
    out = tmp_path / "arith.parquet"
    assert main(["gen-data", "arith", "--level", "1", "--split", "test", "--count", "5", "--out", str(out)]) == 0
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert frame.iloc[0]["reward_model"]["ground_truth"] == str(int(frame.iloc[0]["reward_model"]["ground_truth"]))
    assert frame.iloc[0]["prompt"][0]["content"].endswith("within \\boxed{}.")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["kk", "--people", "9", "--split", "test"], "--people must be in 2..8 (A <= B for a range), got '9'"),
        (["kk", "--people", "three", "--split", "test"], "--people must be N or A-B with people in 2..8, got 'three'"),
        (["kk", "--people", "3-5", "--split", "test"], "gives one file per level: put {n} in --out"),
        (
            ["kk", "--split", "test", "--template", "chatml"],
            "unknown template 'chatml'; valid templates: qwen-instruct, qwen-base, plain",
        ),
        (["kk", "--split", "test", "--count", "0"], "count: must be an integer in [1, inf], got 0"),
        (["kk", "--split", "test", "--level", "2"], "--level applies to arith only"),
        (["arith", "--split", "test", "--level", "7"], "level: must be an integer in [1, 5], got 7"),
        (["arith", "--split", "test", "--people", "3"], "arith takes --level"),
    ],
)
def test_bad_options_print_one_error_line(tmp_path, capsys, argv, message):
    out = tmp_path / "never.parquet"
    assert main(["gen-data", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokenbalance gen-data: error: ") and message in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_out_must_be_parquet(tmp_path, capsys):
    assert main(["gen-data", "kk", "--split", "test", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--out must be a .parquet path" in capsys.readouterr().err
