"""Config fields that carry their own help text and validity rule.

:func:`option` declares a dataclass field with its default, help text and what is valid
(``choices`` or a ``low``/``high`` range); :func:`validate` checks a whole tree of such dataclasses
and names the field, the value and the allowed range (with :mod:`tokenbalance.checks`, the
algorithms' and tasks' checks too). Used by :mod:`tokenbalance.config` and by
every module that contributes a config section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, field
from typing import Any

from tokenbalance.checks import check_choice, check_range


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
):
    """A dataclass field carrying its help text and validity rule in ``metadata``."""
    metadata = {"help": help, "choices": choices, "low": low, "high": high, "low_open": low_open, "nullable": nullable}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _check_field(path: str, value: Any, meta: dict) -> None:
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


def validate(config: Any, prefix: str = "") -> None:
    """Check every field of a config tree against its declared rule (ValueError on the first bad one)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            validate(value, prefix=f"{path}.")
        else:
            _check_field(path, value, dict(f.metadata))
