"""Scalar argument checks shared by the config (:mod:`tokenbalance.options`), the algorithms, the
tasks and the models: one range check and one choice check, one message format.

Standard library only, so every layer may import it (tests/test_layering.py allows it next to the
standard library). Each check raises ``ValueError`` naming the argument, the value and what is
allowed::

    check_range("optim.lr", 0, 0.0, 1.0, low_open=True)   # optim.lr: must be in (0.0, 1.0], got 0
    check_range("count", 0, 1, integer=True)               # count: must be an integer in [1, inf], got 0
    check_choice("kl.estimator", "k5", ("k1", "k3"))       # kl.estimator: unknown value 'k5'; valid: 'k1', 'k3'
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def _interval(low, high, low_open: bool, high_open: bool) -> str:
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    return f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
) -> None:
    """Fail unless ``value`` is a finite number (an ``int`` with ``integer=True``; never a bool)
    with ``low <= value <= high``; a bound is strict when its ``*_open`` flag is set and absent when
    ``None``. NaN, infinities and non-numbers fail with the same message as out-of-range values."""
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if ok:
        return
    kind = "an integer" if integer else "a finite number"
    if low is None and high is None:
        raise ValueError(f"{name}: must be {kind}, got {value!r}")
    kind = "an integer in" if integer else "in"
    raise ValueError(f"{name}: must be {kind} {_interval(low, high, low_open, high_open)}, got {value!r}")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Fail unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}: unknown value {value!r}; valid: {', '.join(map(repr, choices))}")
