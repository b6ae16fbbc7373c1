"""Scalar argument checks shared by every layer: a range, a choice and a field's declared type.

Standard library only, so every layer may import it (tests/test_layering.py). Each check raises one
``ValueError`` naming the argument, the value and what is allowed (docs/reliability.md)::

    check_range("optim.lr", 0, 0.0, 1.0, low_open=True)   # optim.lr: must be in (0.0, 1.0], got 0
    check_type("output.wandb", "flase", bool)               # output.wandb: expected true or false, got 'flase'"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Collection, Iterable
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
    """Fail unless ``value`` is a finite number (an ``int`` with ``integer=True``; never a bool) with ``low <= value
    <= high``; a bound is strict when its ``*_open`` flag is set and absent when ``None``. NaN, infinities and
    non-numbers fail with the same message as out-of-range values."""
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
    """Fail unless ``value`` is one of ``choices`` (a collection's own ``in`` decides: a view may accept a name it
    does not list); the message lists ``choices``."""
    listed = tuple(choices)
    if value not in (choices if isinstance(choices, Collection) else listed):
        raise ValueError(f"{name}: unknown value {value!r}; valid: {', '.join(map(repr, listed))}")


def _describe(annotation: Any) -> str:
    """What a value of the declared type looks like, in the words of a YAML / command-line user."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if annotation is type(None):
        return "null"
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if annotation is str:
        return "a string"
    if origin in (tuple, list) or annotation in (tuple, list):
        item = args[0] if args else Any
        if item is Any:
            return "a list"
        return f"a list of {_describe(item).removeprefix('an ').removeprefix('a ')}s, e.g. [{_example(item)}]"
    if origin is dict or annotation is dict:
        return "a mapping"
    if dataclasses.is_dataclass(annotation):
        return f"a mapping of {getattr(annotation, '__name__', 'its')} fields"
    return getattr(annotation, "__name__", str(annotation))


def _example(annotation: Any) -> str:
    return {int: "3", float: "0.5", str: "'a'", bool: "true"}.get(annotation, "...")


def _matches(value: Any, annotation: Any) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:  # an integer is a number
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (tuple, list) or annotation in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
        return all(_matches(v, args[0]) for v in value)
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # a type this check does not know: left to the field's own rule


def check_type(name: str, value: Any, annotation: Any) -> None:
    """Fail unless ``value`` is of the declared type ``annotation`` (as resolved by ``typing.get_type_hints``):
    ``bool`` only ``True``/``False``; ``int`` an integer, never a bool or a float; ``float`` any number; ``str`` a
    string; ``tuple[T, ...]`` / ``list[T]`` a list of ``T``; ``X | None`` either. Types it does not know pass (the
    field's own rule checks them)."""
    if not _matches(value, annotation):
        shown = list(value) if isinstance(value, tuple) else value
        raise ValueError(f"{name}: expected {_describe(annotation)}, got {shown!r}")
