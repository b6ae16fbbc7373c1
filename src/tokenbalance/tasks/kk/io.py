"""Knights & Knaves files (spec ``kk.md`` §9): write the Logic-RL parquet schema (16 columns, their Arrow types,
written atomically, no ``datasets`` metadata), read Logic-RL / AR-Lopti parquet and K&K JSON lines back into
:class:`~tokenbalance.tasks.base.TaskExample`. docs/tasks.md ("Data schema")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenbalance.tasks.base import TaskExample
from tokenbalance.tasks.files import RowReader, read_rows, write_parquet_atomic
from tokenbalance.tasks.kk.records import DEFAULT_DATA_SOURCE, LOGIC_RL_COLUMNS
from tokenbalance.tasks.kk.reward import parse_gold_roles
from tokenbalance.tasks.kk.solver import consistent_mask
from tokenbalance.tasks.kk.statements import parse_statements
from tokenbalance.tasks.kk.templates import DEFAULT_TEMPLATE, get_template

GROUND_TRUTH_COLUMN = "reward_model.ground_truth.solution_text_format"
STATEMENTS_COLUMN = "reward_model.ground_truth.statements"


def logic_rl_schema() -> Any:
    """The pyarrow schema of the Logic-RL parquet files (16 columns)."""
    import pyarrow as pa

    string = pa.string()
    schema = pa.schema(
        [
            ("quiz", string),
            ("names", pa.list_(string)),
            (
                "knight_knave",
                pa.struct([(key, string) for key in ("Knave", "Knight", "a_knave", "a_knight", "knave", "knight")]),
            ),
            ("solution", pa.list_(pa.bool_())),
            ("solution_text", string),
            ("solution_text_format", string),
            ("cot_head", string),
            ("cot_repeat_steps", pa.list_(string)),
            ("cot_foot", string),
            ("statements", string),
            ("index", pa.int64()),
            ("data_source", string),
            ("prompt", pa.list_(pa.struct([("content", string), ("role", string)]))),
            ("ability", string),
            (
                "reward_model",
                pa.struct(
                    [
                        ("ground_truth", pa.struct([("solution_text_format", string), ("statements", string)])),
                        ("style", string),
                    ]
                ),
            ),
            ("extra_info", pa.struct([("index", pa.int64()), ("split", string)])),
        ]
    )
    assert tuple(schema.names) == LOGIC_RL_COLUMNS
    return schema


def write_logic_rl_parquet(rows: list[dict[str, Any]], path: str | os.PathLike, *, replace: bool = False) -> Path:
    """Write rows from :func:`~tokenbalance.tasks.kk.records.generate_rows` as a Logic-RL parquet file (an existing
    file only with ``replace``, and only one gen-data wrote: ``write_parquet_atomic``)."""
    if not rows:
        raise ValueError("no rows to write")
    return write_parquet_atomic(rows, path, logic_rl_schema(), replace=replace)


def _prompt_text(reader: RowReader) -> str | None:
    if not reader.has("prompt"):
        return None
    messages = reader.get("prompt", list)
    if not messages:
        raise reader.error("prompt", "expected at least one message, got an empty list")
    last = messages[-1]
    if not isinstance(last, dict) or not isinstance(last.get("content"), str):
        raise reader.error("prompt", f"message {len(messages) - 1} has no string 'content': {last!r}")
    return last["content"]


def example_from_row(reader: RowReader, template: str | None = None) -> TaskExample:
    """Validate one K&K / Logic-RL row as a :class:`TaskExample`; its prompt is ``prompt[-1].content`` if present and
    ``template`` is None, else the quiz rendered with ``template`` (default ``qwen-instruct``)."""
    quiz = reader.get("quiz", str)
    column = GROUND_TRUTH_COLUMN if reader.has("reward_model") else "solution_text_format"
    gold_text = reader.get(column, str)
    gold = parse_gold_roles(gold_text)
    if not gold:
        raise reader.error(column, f"no '(k) Name is a knight|knave' line in {gold_text[:60]!r}")
    names = reader.get_list("names", str, default=None)
    if names is not None and len(names) != len(gold):
        raise reader.error("names", f"{len(names)} names but {len(gold)} people in {column!r}")
    n_people = len(gold)
    solution = reader.get_list("solution", bool, default=None)
    if solution is not None and len(solution) != n_people:
        raise reader.error("solution", f"{len(solution)} values for {n_people} people")
    _check_gold_agrees(reader, column, gold, names, solution)
    ground_truth: dict[str, str] = {"solution_text_format": gold_text}
    for statements_column in (STATEMENTS_COLUMN, "statements"):
        statements = reader.get(statements_column, str, default=None)
        if statements is not None:
            try:
                puzzle = parse_statements(statements, n_people)
            except ValueError as err:
                raise reader.error(statements_column, str(err)) from None
            if not _satisfies(puzzle, [role == "knight" for role in gold.values()]):
                raise reader.error(
                    statements_column,
                    f"the gold answer in {column!r} ({_roles_text(gold)}) does not satisfy these statements; the "
                    "row contradicts itself",
                )
            ground_truth.setdefault("statements", statements)
    index = reader.get("index", int, default=reader.row_number)
    data_source = reader.get("data_source", str, default=DEFAULT_DATA_SOURCE)
    split = reader.get("extra_info.split", str, default=None) if reader.has("extra_info") else None
    stored_prompt = _prompt_text(reader)
    if template is None and stored_prompt is not None:
        prompt = stored_prompt
    else:
        try:
            prompt = get_template(template or DEFAULT_TEMPLATE).render_puzzle(
                quiz, ground_truth.get("statements"), names
            )
        except ValueError as err:
            raise reader.error("statements", str(err)) from None
    extra: dict[str, Any] = {"row": reader.row_number, "source_file": reader.path}
    if names is not None:
        extra["names"] = list(names)
    if solution is not None:
        extra["solution"] = list(solution)
    if split is not None:
        extra["split"] = split
    return TaskExample(
        prompt=prompt,
        question=quiz,
        ground_truth=ground_truth,
        data_source=data_source,
        difficulty=n_people,
        index=index,
        extra=extra,
    )


def _roles_text(gold: dict[str, str]) -> str:
    return ", ".join(f"{name} {role}" for name, role in gold.items())


def _check_gold_agrees(
    reader: RowReader, column: str, gold: dict[str, str], names: list[str] | None, solution: list[bool] | None
) -> None:
    """The row's own columns must agree with its gold answer: ``names`` in the gold's order, the ``solution`` flags
    (True = knight), and a second copy of the gold text."""
    if names is not None and list(names) != list(gold):
        raise reader.error(
            "names", f"{list(names)} differ from the people of the gold answer in {column!r}: {list(gold)}"
        )
    if solution is not None:
        expected = [role == "knight" for role in gold.values()]
        if list(solution) != expected:
            raise reader.error(
                "solution",
                f"{list(solution)} (True = knight) contradicts the gold answer in {column!r} ({_roles_text(gold)}); "
                "the row contradicts itself",
            )
    if column != "solution_text_format" and reader.has("solution_text_format"):
        other = reader.get("solution_text_format", str)
        if parse_gold_roles(other) != gold:
            raise reader.error(
                "solution_text_format",
                f"{_roles_text(parse_gold_roles(other))} contradicts the gold answer in {column!r} ({_roles_text(gold)})",
            )


def _satisfies(puzzle: Any, assignment: list[bool]) -> bool:
    """Whether ``assignment`` (True = knight, person order) is consistent with ``puzzle``."""
    n_people = len(assignment)
    candidate = sum(0 if knight else 1 << (n_people - 1 - person) for person, knight in enumerate(assignment))
    return bool(consistent_mask(puzzle) >> candidate & 1)


def read_kk_examples(path: str | os.PathLike, template: str | None = None) -> list[TaskExample]:
    """Task examples from a Logic-RL / AR-Lopti parquet or K&K JSON-lines file; ``template=None`` keeps stored prompts
    (``qwen-instruct`` for bare K&K records), a name re-renders every prompt."""
    if template is not None:
        get_template(template)
    readers = read_rows(path)
    if not readers:
        raise ValueError(f"{path}: the file has no rows")
    return [example_from_row(reader, template) for reader in readers]
