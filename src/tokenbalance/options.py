"""Config fields that carry their own help text and validity rule.

:func:`option` declares a dataclass field with its default, help text and what is valid
(``choices`` or a ``low``/``high`` range); :func:`validate` checks a whole tree of such dataclasses
and names the field, the value and the allowed range. Used by :mod:`tokenbalance.config` and by
every module that contributes a config section.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING, field
from typing import Any


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
    if choices is not None and value not in choices:
        raise ValueError(f"{path}: unknown value {value!r}; valid: {', '.join(map(repr, choices))}")
    low, high = meta.get("low"), meta.get("high")
    if low is None and high is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path}: expected a finite number, got {value!r}")
    too_low = low is not None and (value <= low if meta.get("low_open") else value < low)
    too_high = high is not None and value > high
    if too_low or too_high:
        left = "(" if meta.get("low_open") else "["
        raise ValueError(f"{path}: must be in {left}{low}, {high if high is not None else 'inf'}], got {value!r}")


def validate(config: Any, prefix: str = "") -> None:
    """Check every field of a config tree against its declared rule (ValueError on the first bad one)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            validate(value, prefix=f"{path}.")
        else:
            _check_field(path, value, dict(f.metadata))
