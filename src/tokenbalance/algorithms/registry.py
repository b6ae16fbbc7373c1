"""Exact-name registries.

A registry maps a name to an object (a function or a preset). Lookups are exact: no case folding, no prefix matching,
so a typo never silently selects another method. An unknown name raises a ``ValueError`` that lists every valid name
and suggests the closest one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def did_you_mean(name: object, valid: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest valid name to a misspelt one, else ``""``."""
    close = difflib.get_close_matches(str(name), list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry(Generic[T]):
    """A named, exact-match mapping from names to objects of one kind (``what``)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T, *, replace: bool = False) -> T:
        """Register ``item`` as ``name``; a name already taken fails unless ``replace``."""
        if name in self._items and not replace:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            valid = ", ".join(sorted(self._items))
            hint = did_you_mean(name, self._items)
            raise ValueError(f"unknown {self.what} {name!r}; valid names: {valid}{hint}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
