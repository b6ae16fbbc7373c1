"""Where commands write: never over a file tokenbalance did not write, checked before the work (a writable directory,
a new file or with ``--force`` one of ours, the manifest of a directory shared with the user's files). Each command's
case: docs/reliability.md."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

MANIFEST = ".tokenbalance-written.json"


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(directory: str | os.PathLike, flag: str, shown: str | os.PathLike | None = None) -> None:
    """``ValueError`` unless ``directory`` can be created (its nearest existing ancestor is a writable directory) or,
    when it exists, written: a probe file is created and removed. The message names ``flag`` and ``shown`` (default:
    ``directory``), what the user typed."""
    directory = Path(directory)
    shown = directory if shown is None else shown
    existing = _nearest_existing(directory)
    if not existing.is_dir():
        raise ValueError(f"{flag} {shown}: {existing} is a file, not a directory; choose another path")
    try:
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".tokenbalance-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(
            f"{flag} {shown}: cannot write in {existing} ({err.strerror or err}); choose a writable location"
        ) from None


def check_output_file(
    path: str | os.PathLike,
    flag: str,
    *,
    force: bool = False,
    written_by: Callable[[Path], bool] = lambda _: False,
) -> None:
    """``ValueError`` unless the output file ``path`` may be written: it does not exist (and its directory is
    writable), or ``force`` is given and ``written_by(path)`` says tokenbalance wrote it. A file of the user's is
    refused with or without ``force``."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file path")
    if path.exists() or path.is_symlink():
        ours = path.is_file() and written_by(path)
        if not ours:
            raise ValueError(
                f"{flag} {path}: the file exists and was not written by tokenbalance; it is never replaced. "
                "Choose another path (or move the file away yourself)"
            )
        if not force:
            raise ValueError(
                f"{flag} {path}: the file exists (written by an earlier tokenbalance command); pass --force to "
                "replace it, or choose another path"
            )
    check_writable_dir(path.parent, flag, shown=path)


def check_output_dir(out: Path, flag: str, *, force: bool, ours: set[str], writer: str, what: str) -> None:
    """``ValueError`` unless a command may write the directory ``out``: new or empty, or (with ``force``) holding only
    ``ours``, the files an earlier run of ``writer`` recorded writing there (``what`` it holds then, for the message).
    A directory holding anything else is never replaced."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out}: is a file, not a directory; choose another {flag}")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if entries:
        foreign = [name for name in entries if name not in ours]
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise ValueError(
                f"{flag} {out}: the directory exists and holds files {writer} did not write ({shown}); "
                f"it is never replaced. Choose a new or empty {flag}"
            )
        if not force:
            raise ValueError(
                f"{flag} {out}: holds {what} written earlier; pass --force to replace it, or choose another {flag}"
            )
    check_writable_dir(out.parent, flag)


def json_written_by(writer: str) -> Callable[[Path], bool]:
    """A ``written_by`` test for :func:`check_output_file`: whether a file is a JSON object whose ``"written_by"``
    field is ``writer`` (the files ``diagnose --json`` and ``eval --responses`` write)."""

    def written(path: Path) -> bool:
        try:
            return json.loads(path.read_text()).get("written_by") == writer
        except (OSError, ValueError, AttributeError):
            return False

    return written


def write_text_atomic(path: str | os.PathLike, text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file beside it and a rename, so that ``path`` is
    always either the old or the new content; the temporary file is removed on any failure. The file gets the usual
    permissions (0666 less the umask), as a plain write would."""
    path = Path(path)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb" if isinstance(text, bytes) else "w") as out:
            out.write(text)
        umask_modes(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    """The process's file-creation mask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def umask_modes(path: str | os.PathLike) -> None:
    """Give ``path`` (a file, or a directory and all under it) a plain write's permissions (0666 / 0777 for
    directories and executables, less the umask). Every atomic writer calls it before the rename: ``mkstemp`` /
    ``mkdtemp`` and safetensors make private files, which colleagues sharing the umask could not read."""
    mask = current_umask()

    def fix(item: str, directory: bool) -> None:
        if os.path.islink(item):
            return
        executable = directory or os.stat(item).st_mode & 0o111
        os.chmod(item, (0o777 if executable else 0o666) & ~mask)

    root = os.fspath(path)
    fix(root, os.path.isdir(root))
    if os.path.isdir(root) and not os.path.islink(root):
        for parent, dirs, files in os.walk(root):
            for name in dirs:
                fix(os.path.join(parent, name), True)
            for name in files:
                fix(os.path.join(parent, name), False)


def recorded_files(record: str | os.PathLike) -> set[str]:
    """The ``files`` list of a JSON record a command wrote beside its outputs (``tokenbalance_sft.json``,
    ``tokenbalance_model.json``): the names it may replace. Empty when the record is missing or unreadable."""
    try:
        files = json.loads(Path(record).read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()


def written_files(directory: str | os.PathLike) -> set[str]:
    """Names of the files tokenbalance recorded as written in ``directory`` (its manifest)."""
    manifest = Path(directory) / MANIFEST
    try:
        names = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def check_files_replaceable(directory: str | os.PathLike, names: Iterable[str], flag: str) -> None:
    """``ValueError`` naming the first of ``names`` that exists in ``directory`` without being in its manifest (a file
    tokenbalance did not write), so that writing ``names`` replaces nothing of the user's; also checks that
    ``directory`` is writable."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{flag} {directory}: is a file, not a directory")
    ours = written_files(directory)
    clashes = sorted(n for n in names if (directory / n).exists() and n not in ours)
    if clashes:
        raise ValueError(
            f"{flag} {directory}: {', '.join(clashes)} exist(s) there and tokenbalance did not write them; they are "
            "never replaced. Choose another output directory"
        )
    check_writable_dir(directory, flag)


def record_written(directory: str | os.PathLike, names: Iterable[str]) -> None:
    """Add ``names`` to ``directory``'s manifest (written through a temporary file and a rename)."""
    directory = Path(directory)
    write_text_atomic(directory / MANIFEST, json.dumps(sorted(written_files(directory) | set(names)), indent=1) + "\n")
