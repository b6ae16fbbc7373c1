"""Probability bucket edges: validation, parsing and labels (standard library only, so the config can use it)."""

from __future__ import annotations

import itertools
import math

EDGES_NAME = "diagnostics.bucket_edges"
DEFAULT_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)
BUCKET_MODES = ("fixed", "quantile")


def check_bucket_edges(edges) -> tuple[float, ...]:
    """``edges`` as a tuple of floats if they cover [0, 1] in increasing order; ValueError otherwise."""
    try:
        values = tuple(float(e) for e in edges)
    except (TypeError, ValueError):
        raise ValueError(
            f"{EDGES_NAME}: expected a list of numbers such as [0, 0.25, 0.5, 0.75, 1], got {edges!r}"
        ) from None
    if len(values) < 2:
        raise ValueError(f"{EDGES_NAME}: need at least two edges (one bucket), got {list(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{EDGES_NAME}: edges must be finite, got {list(values)}")
    if values[0] != 0.0 or values[-1] != 1.0:
        raise ValueError(
            f"{EDGES_NAME}: the buckets must cover [0, 1]: the first edge must be 0 and the last 1, got {list(values)}"
        )
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"{EDGES_NAME}: edges must be strictly increasing, got {list(values)}")
    return values


def parse_edges(text: str) -> tuple[float, ...]:
    """Edges from a command-line string: ``"0,0.25,0.5,0.75,1"`` (validated)."""
    try:
        values = [float(piece) for piece in text.replace("[", "").replace("]", "").split(",") if piece.strip()]
    except ValueError:
        raise ValueError(
            f"{EDGES_NAME}: expected comma-separated numbers such as 0,0.25,0.5,0.75,1, got {text!r}"
        ) from None
    return check_bucket_edges(values)


def interval_label(edges, b: int) -> str:
    """``"[0.25, 0.5)"``; the last bucket is closed: ``"[0.75, 1]"``."""
    lo, hi = edges[b], edges[b + 1]
    close = "]" if b == len(edges) - 2 else ")"
    return f"[{lo:g}, {hi:g}{close}"
