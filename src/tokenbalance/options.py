"""Config fields that carry their own help text and validity rule: :func:`option` declares default, help and
``choices`` or a ``low``/``high`` range (``path=True``: made absolute when a run starts, :func:`path_fields`);
:func:`validate` checks a tree of them, naming field, value and what is allowed (docs/reliability.md)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import MISSING, field
from typing import Any

from tokenbalance.checks import check_choice, check_range, check_type


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    choices=None,
    low=None,
    high=None,
    low_open: bool = False,
    default_factory: Any = MISSING,
    nullable: bool = False,
    path: bool = False,
):
    """A dataclass field carrying its help text and validity rule in ``metadata``."""
    metadata = {
        "help": help,
        "choices": choices,
        "low": low,
        "high": high,
        "low_open": low_open,
        "nullable": nullable,
        "path": path,
    }
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _check_field(path: str, value: Any, meta: dict, annotation: Any = Any) -> None:
    if value is None:
        if meta.get("nullable"):
            return
        raise ValueError(f"{path}: a value is required, got None")
    choices = meta.get("choices")
    if choices is not None:
        check_choice(path, value, choices)
    low, high = meta.get("low"), meta.get("high")
    if low is not None or high is not None:
        check_range(path, value, low, high, low_open=bool(meta.get("low_open")))
    check_type(path, value, annotation)
    if value == "":
        what = "a path" if meta.get("path") else "a value"
        raise ValueError(f"{path}: empty value ''; give {what} or leave the option out (an unset shell variable?)")


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def field_types(cls: type) -> dict[str, Any]:
    """The declared type of every field of the dataclass ``cls`` (string annotations resolved)."""
    if cls not in _FIELD_TYPES:
        _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    return _FIELD_TYPES[cls]


def path_fields(cls: type) -> list[str]:
    """Names of the fields of ``cls`` declared with ``path=True``."""
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get("path")]


def is_string_field(cls: type, name: str) -> bool:
    """Whether field ``name`` of ``cls`` is declared ``str`` or ``str | None`` (a command-line value for it is taken
    verbatim, never parsed as YAML)."""
    annotation = field_types(cls).get(name)
    options = set(typing.get_args(annotation)) if typing.get_args(annotation) else {annotation}
    return str in options and options <= {str, type(None)}


def validate(config: Any, prefix: str = "") -> None:
    """Check every field of a config tree against its declared rule (ValueError on the first bad one)."""
    types = field_types(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            validate(value, prefix=f"{path}.")
        else:
            _check_field(path, value, dict(f.metadata), types.get(f.name, Any))
