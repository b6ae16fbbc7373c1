"""Logic-RL parquet writing and the K&K / Logic-RL readers, including their error messages
(file, row and column named)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbalance.tasks.kk import generate_rows, read_kk_examples, write_logic_rl_parquet
from tokenbalance.tasks.kk.io import logic_rl_schema
from tokenbalance.tasks.kk.records import KK_RECORD_COLUMNS, LOGIC_RL_COLUMNS
from tokenbalance.tasks.kk.task import KKTask

GOLD_2 = "(1) Zoey is a knave\n(2) Oliver is a knight"
STATEMENTS_2 = "(('not', ('telling-truth', 1)), ('<=>', ('telling-truth', 1), ('lying', 0)))"


def kk_jsonl_record(**changes):
    record = {
        "quiz": "You meet 2 inhabitants: Zoey, and Oliver. ...",
        "names": ["Zoey", "Oliver"],
        "solution": [False, True],
        "solution_text_format": GOLD_2,
        "statements": STATEMENTS_2,
        "index": 0,
    }
    record.update(changes)
    return record


def write_jsonl(path, records, blank_line_after=None):
    lines = []
    for number, record in enumerate(records):
        lines.append(record if isinstance(record, str) else json.dumps(record))
        if number == blank_line_after:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def rows_3ppl():
    return generate_rows(3, "test", count=4)


def test_written_file_has_the_logic_rl_schema_and_round_trips(tmp_path, rows_3ppl):
    path = write_logic_rl_parquet(rows_3ppl, tmp_path / "sub" / "test.parquet")
    table = pq.read_table(path)
    assert tuple(table.column_names) == LOGIC_RL_COLUMNS
    assert table.schema.equals(logic_rl_schema())
    assert str(table.schema.field("reward_model").type) == (
        "struct<ground_truth: struct<solution_text_format: string, statements: string>, style: string>"
    )
    assert str(table.schema.field("knight_knave").type).startswith("struct<Knave: string, Knight: string, a_knave")
    assert table.to_pylist() == rows_3ppl
    assert not list(tmp_path.joinpath("sub").glob(".*tmp"))  # no temp file left behind


def test_reader_gives_the_same_examples_as_the_task(tmp_path, rows_3ppl):
    path = write_logic_rl_parquet(rows_3ppl, tmp_path / "test.parquet")
    examples = read_kk_examples(path)
    generated = KKTask().examples("test", count=4)
    assert [e.prompt for e in examples] == [e.prompt for e in generated]
    assert [e.ground_truth for e in examples] == [e.ground_truth for e in generated]
    first = examples[0]
    assert (first.data_source, first.difficulty, first.index) == ("kk_logic", 3, 1000)
    assert first.extra["names"] == ["Amelia", "Penelope", "Evelyn"]
    assert first.extra["split"] == "test" and first.extra["row"] == 0
    # Re-rendering with another template uses the quiz.
    plain = read_kk_examples(path, template="plain")[0]
    assert plain.prompt.endswith(rows_3ppl[0]["quiz"] + "\nAssistant: <think>")
    assert (
        KKTask().score(" r </think><answer>" + first.ground_truth["solution_text_format"] + "</answer>", plain).reward
        == 3
    )


def test_reader_accepts_kk_release_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "people2_num100.jsonl", [kk_jsonl_record(), kk_jsonl_record(index=1)])
    examples = read_kk_examples(path)
    assert len(examples) == 2
    assert examples[0].ground_truth == {"solution_text_format": GOLD_2, "statements": STATEMENTS_2}
    assert examples[0].prompt.startswith("<|im_start|>system\n") and examples[1].index == 1
    assert examples[0].data_source == "kk_logic" and examples[0].difficulty == 2


def parquet_with(tmp_path, rows_3ppl, row_number, change, name="bad.parquet"):
    rows = [json.loads(json.dumps(row)) for row in rows_3ppl]
    change(rows[row_number])
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(quiz=None), r"bad.parquet: row 2: column 'quiz': expected str, got NoneType"),
        (
            lambda r: r["reward_model"]["ground_truth"].update(solution_text_format=None),
            r"bad.parquet: row 2: column 'reward_model.ground_truth.solution_text_format': expected str",
        ),
        (
            lambda r: r["reward_model"]["ground_truth"].update(solution_text_format="nobody here"),
            r"row 2: column 'reward_model.ground_truth.solution_text_format': no '\(k\) Name is a knight\|knave' line",
        ),
        (
            lambda r: r["reward_model"]["ground_truth"].update(statements="__import__('os')"),
            r"row 2: column 'reward_model.ground_truth.statements': cannot parse statements",
        ),
        (
            lambda r: r.update(statements="(('lying', 1), ('lying', 0))"),
            r"row 2: column 'statements': expected 3 statements",
        ),
        (lambda r: r.update(names=["A", "B"]), r"row 2: column 'names': 2 names but 3 people"),
        (lambda r: r.update(solution=[True]), r"row 2: column 'solution': 1 values for 3 people"),
        (lambda r: r.update(prompt=[]), r"row 2: column 'prompt': expected at least one message"),
    ],
)
def test_malformed_parquet_rows_name_file_row_and_column(tmp_path, rows_3ppl, change, message):
    # Only row 2 is changed; rows 0 and 1 are valid, so the error must point at row 2.
    path = parquet_with(tmp_path, rows_3ppl, 2, change)
    with pytest.raises(ValueError, match=message):
        read_kk_examples(path)


def test_missing_column_in_every_row_is_reported_at_row_0(tmp_path, rows_3ppl):
    table = pa.Table.from_pylist(rows_3ppl).drop_columns(["reward_model"])
    path = tmp_path / "no_gt.parquet"
    pq.write_table(table.drop_columns(["solution_text_format"]), path)
    with pytest.raises(ValueError, match=r"no_gt.parquet: row 0: column 'solution_text_format': missing"):
        read_kk_examples(path)


def test_malformed_jsonl_rows_name_file_row_line_and_column(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [kk_jsonl_record(), "{not json"], blank_line_after=0)
    with pytest.raises(ValueError, match=r"x.jsonl: row 1 \(line 3\): invalid JSON"):
        read_kk_examples(path)
    path = write_jsonl(tmp_path / "y.jsonl", [kk_jsonl_record(), kk_jsonl_record(names=["Zoey", 7])])
    with pytest.raises(ValueError, match=r"y.jsonl: row 1 \(line 2\): column 'names': item 1 should be str, got int 7"):
        read_kk_examples(path)
    path = write_jsonl(tmp_path / "z.jsonl", [kk_jsonl_record(index=True)])
    with pytest.raises(ValueError, match=r"z.jsonl: row 0 \(line 1\): column 'index': expected int, got bool"):
        read_kk_examples(path)
    path = write_jsonl(tmp_path / "w.jsonl", ["[1, 2]"])
    with pytest.raises(ValueError, match=r"w.jsonl: row 0 \(line 1\): expected an object with named columns"):
        read_kk_examples(path)


def test_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match=r"missing.parquet: no such file"):
        read_kk_examples(tmp_path / "missing.parquet")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not a parquet file")
    with pytest.raises(ValueError, match=r"garbage.parquet: cannot read as parquet"):
        read_kk_examples(garbage)
    csv = tmp_path / "data.csv"
    csv.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"data.csv: unknown file type '.csv'; valid suffixes: .parquet, .jsonl"):
        read_kk_examples(csv)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty.jsonl: the file has no rows"):
        read_kk_examples(empty)
    with pytest.raises(ValueError, match="no rows to write"):
        write_logic_rl_parquet([], tmp_path / "out.parquet")


def test_kk_record_columns_come_first():
    assert LOGIC_RL_COLUMNS[: len(KK_RECORD_COLUMNS)] == KK_RECORD_COLUMNS
    assert LOGIC_RL_COLUMNS[-5:] == ("data_source", "prompt", "ability", "reward_model", "extra_info")
