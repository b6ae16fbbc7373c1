"""Copies of verl's batch handle with one thing changed; the handle itself is never edited.

verl's v1 trainer passes TransferQueue's ``KVBatchMeta`` (sample keys, tags, ``fields``,
``extra_info``) from stage to stage. A worker call receives ``extra_info`` as non-tensor data and
fetches the handle's ``fields`` (every field stored for its keys when ``fields`` is ``None``).
The Lopti trainer names its pass in ``extra_info``; the NTHR trainer asks for the hidden states
there and keeps their field out of the later worker calls' fetches.
"""

from __future__ import annotations

import copy
from typing import Any


def with_extra_info(batch, **items: Any):
    """A shallow copy of ``batch`` whose ``extra_info`` also holds ``items`` (``batch`` untouched)."""
    changed = copy.copy(batch)
    changed.extra_info = {**(batch.extra_info or {}), **items}
    return changed


def without_field(batch, name: str):
    """A shallow copy of ``batch`` whose worker calls do not fetch field ``name`` (``batch`` untouched).

    Needs an explicit ``fields`` list, which every handle verl's stages return from a
    TransferQueue write has.
    """
    if batch.fields is None:
        raise ValueError(f"without_field({name!r}): the batch handle lists no fields; a worker would fetch them all")
    changed = copy.copy(batch)
    changed.fields = [field for field in batch.fields if field != name]
    return changed
