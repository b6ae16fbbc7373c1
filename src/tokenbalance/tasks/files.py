"""Row files (parquet, JSON lines) for the task readers, with errors naming the file, the row (from 0; the line too
for JSON lines) and the column (nested with dots). pyarrow is imported only where needed."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenbalance.outputs import umask_modes

PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_MISSING = object()


class RowReader:
    """Typed access to the columns of one row; every failure is a ``ValueError`` of the form ``"<file>: row <r>[ (line
    <l>)]: column '<c>': <problem>"``."""

    def __init__(self, path: str | os.PathLike, row_number: int, row: Any, line: int | None = None):
        self.path = str(path)
        self.row_number = row_number
        self.line = line
        if not isinstance(row, dict):
            raise self.error(None, f"expected an object with named columns, got {type(row).__name__}")
        self.row = row

    @property
    def where(self) -> str:
        """``"<file>: row <r>[ (line <l>)]"``: the start of every message about this row."""
        where = f"{self.path}: row {self.row_number}"
        return where if self.line is None else f"{where} (line {self.line})"

    def error(self, column: str | None, problem: str) -> ValueError:
        """A ``ValueError`` naming this file, row and ``column`` (for the caller to raise)."""
        where = self.where
        if column is not None:
            where += f": column {column!r}"
        return ValueError(f"{where}: {problem}")

    def has(self, column: str) -> bool:
        """Whether the (dotted) column is present in this row (a null value counts as present)."""
        return self._lookup(column) is not _MISSING

    def _lookup(self, column: str) -> Any:
        value: Any = self.row
        for key in column.split("."):
            if not isinstance(value, dict) or key not in value:
                return _MISSING
            value = value[key]
        return value

    def get(self, column: str, kind: type | tuple[type, ...], *, default: Any = _MISSING) -> Any:
        """The value of ``column``, checked to be of type ``kind`` (``bool`` is never an ``int``); missing:
        ``default`` if given, else raises."""
        value = self._lookup(column)
        if value is _MISSING:
            if default is not _MISSING:
                return default
            raise self.error(column, "missing")
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise self.error(column, f"expected {expected}, got {type(value).__name__} {shown}")
        return value

    def get_list(self, column: str, item_kind: type, *, default: Any = _MISSING) -> Any:
        """A list column whose items are all of type ``item_kind``."""
        items = self.get(column, list, default=default)
        if items is default and default is not _MISSING:
            return items
        for position, item in enumerate(items):
            if not isinstance(item, item_kind) or (isinstance(item, bool) and item_kind is not bool):
                raise self.error(
                    column,
                    f"item {position} should be {item_kind.__name__}, got {type(item).__name__} {item!r}",
                )
        return items


def json_array_rows(file: Path, text: str) -> list[RowReader]:
    """The rows of a file holding one JSON array of row objects (``[{...}, {...}]``)."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{file}: a JSON array of rows (it starts with '['), but invalid JSON: {err}; write one JSON object "
            "per line (JSON lines) or a valid array"
        ) from None
    if not isinstance(rows, list):
        raise ValueError(f"{file}: expected a JSON array of row objects, got {type(rows).__name__}")
    return [RowReader(file, number, row) for number, row in enumerate(rows)]


def read_rows(path: str | os.PathLike) -> list[RowReader]:
    """All rows of a ``.parquet``, JSON-lines (``.jsonl``/``.json``/``.ndjson``) or JSON-array ``.json`` file;
    unreadable files, unknown suffixes and bad lines raise ``ValueError`` naming the file (and line)."""
    file = Path(path)
    suffix = file.suffix.lower()
    if not file.is_file():
        raise ValueError(f"{file}: no such file")
    if suffix in PARQUET_SUFFIXES:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(file).to_pylist()
        except (OSError, pa.ArrowException) as err:
            raise ValueError(f"{file}: cannot read as parquet: {err}") from None
        return [RowReader(file, number, row) for number, row in enumerate(rows)]
    if suffix in JSONL_SUFFIXES:
        readers: list[RowReader] = []
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{file}: cannot read as UTF-8 text: {err}") from None
        if suffix == ".json" and text.lstrip().startswith("["):  # one JSON array of rows, not JSON lines
            return json_array_rows(file, text)
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            row_number = len(readers)
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{file}: row {row_number} (line {line_number}): invalid JSON: {err}") from None
            readers.append(RowReader(file, row_number, row, line=line_number))
        return readers
    valid = ", ".join(PARQUET_SUFFIXES + JSONL_SUFFIXES)
    raise ValueError(f"{file}: unknown file type {suffix or '(none)'!r}; valid suffixes: {valid}")


WRITTEN_BY_KEY = b"written_by"
WRITTEN_BY = b"tokenbalance gen-data"


def parquet_written_by_tokenbalance(path: str | os.PathLike) -> bool:
    """Whether the parquet file ``path`` carries the mark :func:`write_parquet_atomic` writes (its schema metadata
    ``written_by``); False for any other or unreadable file."""
    try:
        import pyarrow.parquet as pq

        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 - not a parquet file we can read: not ours
        return False
    return metadata.get(WRITTEN_BY_KEY) == WRITTEN_BY


def check_parquet_target(path: str | os.PathLike, *, replace: bool = False) -> None:
    """``ValueError`` unless ``path`` may be written: it does not exist, or ``replace`` is given and the file there
    was written by tokenbalance (:func:`parquet_written_by_tokenbalance`). A file of the user's is never replaced."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"--out {target}: is a directory; give a .parquet file path")
    if not target.exists():
        return
    if not parquet_written_by_tokenbalance(target):
        raise ValueError(
            f"--out {target}: the file exists and was not written by tokenbalance gen-data; it is never replaced. "
            "Choose another --out (or move the file away yourself)"
        )
    if not replace:
        raise ValueError(
            f"--out {target}: the file exists (written by an earlier gen-data); pass --force to replace it, "
            "or choose another --out"
        )


def write_parquet_atomic(
    rows: Iterable[dict[str, Any]], path: str | os.PathLike, schema: Any, *, replace: bool = False
) -> Path:
    """Write ``rows`` with the given pyarrow ``schema`` to ``path`` (temp file + rename); returns the path. The file
    is marked as tokenbalance's (schema metadata ``written_by``); an existing file is replaced only with ``replace``
    and only when it carries that mark (:func:`check_parquet_target`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = Path(path)
    check_parquet_target(target, replace=replace)
    target.parent.mkdir(parents=True, exist_ok=True)
    schema = schema.with_metadata({**(schema.metadata or {}), WRITTEN_BY_KEY: WRITTEN_BY})
    table = pa.Table.from_pylist(list(rows), schema=schema)
    handle, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        pq.write_table(table, temp_name)
        umask_modes(temp_name)
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return target
