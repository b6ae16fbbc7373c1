"""Metric sinks: ``metrics.jsonl`` always (``{"step": N, "kind": "train"|"eval", ...}`` per line), TensorBoard and W&B
(offline unless ``WANDB_MODE``) on request. :func:`dump_json` writes non-finite numbers as ``null``,
:func:`restore_non_finite` reads them back as NaN (docs/metrics.md, "Non-finite numbers")."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

from tokenbalance.outputs import write_text_atomic
from tokenbalance.user_code import first_line

METRICS_FILE = "metrics.jsonl"  # a run directory's metrics, one JSON object a line, written only here
METRICS_RECORD = "metrics.jsonl.gz"  # a record's metrics (run/records.py), gzip-compressed: a fifth of the bytes
OLD_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how files before null wrote them


def json_safe(value):
    """``value`` with every non-finite float replaced by ``None`` (JSON ``null``), inside dicts, lists and tuples too
    (tuples become lists, as ``json`` writes them anyway)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def dump_json(value, **kwargs) -> str:
    """Strict JSON text of ``value`` with non-finite numbers as ``null`` (``json.dumps`` arguments such as ``indent``
    pass through)."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


def restore_non_finite(value):
    """A value read from a metrics file with ``null`` as ``float("nan")``, and the strings ``"nan"`` / ``"inf"`` /
    ``"-inf"`` of older files as those floats, inside dicts and lists too."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        return OLD_NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: restore_non_finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_non_finite(v) for v in value]
    return value


class MetricsLog:
    """Append-only JSONL log plus optional TensorBoard / W&B mirrors."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        run_name: str = "",
        config: dict | None = None,
        wandb_options: dict | None = None,
    ) -> None:
        """``wandb_options``: ``project``, ``entity``, ``name`` (default ``run_name``) and ``mode`` (default offline;
        ``WANDB_MODE`` in the environment wins) for ``wandb.init``."""
        self.path = Path(run_dir) / METRICS_FILE
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ValueError(
                    "output.tensorboard needs the tensorboard extra: pip install -e '.[tensorboard]'"
                ) from err
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as err:
                raise ValueError("output.wandb needs the wandb extra: pip install -e '.[wandb]'") from err
            options = {
                "project": "tokenbalance",
                "entity": None,
                "name": None,
                "mode": "offline",
                **(wandb_options or {}),
            }
            try:
                self._wandb = wandb_module.init(
                    project=options["project"],
                    entity=options["entity"],
                    name=options["name"] or run_name,
                    mode=os.environ.get("WANDB_MODE", options["mode"]),
                    dir=str(run_dir),
                    config=config,
                )
            except Exception as err:  # noqa: BLE001 - a service, a login, a network: one line
                if self._tb is not None:
                    self._tb.close()
                raise ValueError(
                    f"output.wandb: W&B did not start ({first_line(err)}); fix that, or log offline with "
                    "output.wandb_mode=offline (`wandb sync` uploads it later), or set output.wandb=false"
                ) from None

    def truncate_after(self, step: int) -> str | None:
        """Drop records logged after ``step`` (a resumed run repeats them), and a torn last line (an append cut short,
        e.g. by a full disk); returns a note when a torn line was dropped. The file is replaced through a temporary
        file and a rename. A malformed line before the last is an error naming the file and the line."""
        if not self.path.exists():
            return None
        records, torn = parse_metrics_lines(self.path)
        kept = [line for line, record in records if record.get("step", 0) <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))
        if torn is None:
            return None
        return f"{self.path}: dropped a torn last line (an interrupted write): {torn[:80]!r}"

    def log(self, step: int, kind: str, metrics: dict[str, float]) -> None:
        record = {"step": step, "kind": kind, **metrics}
        with self.path.open("a") as out:
            out.write(dump_json(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def metrics_path(run_dir: Path) -> Path:
    """The metrics of ``run_dir``: its ``metrics.jsonl`` (a run's), else its ``metrics.jsonl.gz`` where that exists (a
    record's, :data:`METRICS_RECORD`), else the ``metrics.jsonl`` a run would write."""
    plain, compressed = Path(run_dir) / METRICS_FILE, Path(run_dir) / METRICS_RECORD
    return compressed if not plain.exists() and compressed.exists() else plain


def compressed_metrics(text: str) -> bytes:
    """``metrics.jsonl``'s text as a record keeps it (:data:`METRICS_RECORD`): gzip with no time stamp, so the same
    text gives the same bytes; :func:`read_metrics_text` reads it back."""
    return gzip.compress(text.encode(), mtime=0)


def read_metrics_text(path: Path) -> str:
    """The text of a metrics file, decompressed when its name ends in ``.gz`` (``ValueError`` naming it when it does
    not decompress)."""
    path = Path(path)
    if path.suffix != ".gz":
        return path.read_text()
    try:
        return gzip.decompress(path.read_bytes()).decode()
    except (EOFError, gzip.BadGzipFile) as err:
        raise ValueError(f"{path}: not a complete gzip file ({err}); the file is damaged") from None


def parse_metrics_lines(path: Path) -> tuple[list[tuple[str, dict]], str | None]:
    """``([(line, record), ...], torn)`` of a ``metrics.jsonl`` file: ``torn`` is an unreadable last line (an append
    cut short), left out of the records; an unreadable line before the last (or a line that is not a JSON object) is a
    ``ValueError`` naming the file and the line."""
    text = read_metrics_text(Path(path))
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    records: list[tuple[str, dict]] = []
    for position, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError as err:
            if position == len(lines) - 1:
                return records, line
            raise ValueError(
                f"{path}: line {number} is not JSON ({err}); fix or delete that line (records are one JSON object "
                "per line)"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {number} is not a JSON object: {line[:80]!r}")
        records.append((line, record))
    return records, None


def read_metrics(path: Path) -> list[dict]:
    """All records of a ``metrics.jsonl`` file; non-finite values (``null``, or ``"nan"`` / ``"inf"`` / ``"-inf"`` in
    older files) come back as floats (:func:`restore_non_finite`). A torn last line (an append cut short) is left out;
    another malformed line is a ``ValueError`` naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no metrics.jsonl here (is this a run directory?)")
    return [restore_non_finite(record) for _, record in parse_metrics_lines(path)[0]]
