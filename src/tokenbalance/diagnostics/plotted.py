"""What a figure plots, as numbers and words, and its fingerprint: written into every PNG that tokenbalance draws, so
that a committed figure can be checked against what its committed data draw today without comparing pixels across font
and matplotlib versions (docs/metrics.md, "Plots")."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedFormatter

FINGERPRINT_KEY = "tokenbalance plotted sha256"
DIGITS = 9  # significant digits kept: last-bit differences of libm functions do not count


def _round(value) -> float | str | None:
    value = float(value)
    if math.isnan(value):
        return None
    return repr(value) if math.isinf(value) else float(f"{value:.{DIGITS}g}")


def _points(xy) -> list:
    return [[_round(x), _round(y)] for x, y in xy]


def _axes(ax) -> dict:
    formatter = ax.xaxis.get_major_formatter()
    legend = ax.get_legend()
    return {
        "titles": [ax.get_title(loc) for loc in ("left", "center", "right")],
        "labels": [ax.get_xlabel(), ax.get_ylabel()],
        "scales": [ax.get_xscale(), ax.get_yscale()],
        "on": bool(ax.axison),
        "xticklabels": list(formatter.seq) if isinstance(formatter, FixedFormatter) else None,
        "lines": [
            [_points(line.get_xydata()), to_hex(line.get_color()), str(line.get_linestyle()), str(line.get_marker())]
            for line in ax.get_lines()
        ],
        "bars": [
            [_points([(p.get_x(), p.get_y()), (p.get_width(), p.get_height())]), to_hex(p.get_facecolor(), True)]
            + [p.get_hatch()]
            for p in ax.patches
            if isinstance(p, Rectangle)
        ],
        # areas (bands) and error bars as the set of their vertices: the order matplotlib draws them in may change
        "areas": [sorted({tuple(v) for path in c.get_paths() for v in _points(path.vertices)}) for c in ax.collections],
        "texts": [[t.get_text(), _points([t.get_position()])] for t in ax.texts],
        "legend": [legend.get_title().get_text()] + [t.get_text() for t in legend.get_texts()] if legend else [],
    }


def plotted(fig: Figure) -> dict:
    """Size, titles, labels, legends, texts, and every line's, bar's and band's coordinates of ``fig``; no tick
    positions or axis limits (matplotlib chooses those and may choose them differently)."""
    return {
        "inches": _points([fig.get_size_inches()]),
        "suptitle": fig.get_suptitle(),
        "texts": [t.get_text() for t in fig.texts],
        "legends": [
            [legend.get_title().get_text()] + [t.get_text() for t in legend.get_texts()] for legend in fig.legends
        ],
        "axes": [_axes(ax) for ax in fig.get_axes()],
    }


def fingerprint(fig: Figure) -> str:
    """SHA-256 of :func:`plotted`: equal for two draws of the same data by the same code."""
    return hashlib.sha256(json.dumps(plotted(fig), sort_keys=True).encode()).hexdigest()


def save_png(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG at its own dpi, with its fingerprint in the file's text (``FINGERPRINT_KEY``)."""
    fig.savefig(path, format="png", dpi="figure", metadata={FINGERPRINT_KEY: fingerprint(fig)})
    return path


def png_text(path: Path) -> dict[str, str]:
    """The text entries of a PNG file (its fingerprint, matplotlib's ``Software`` version)."""
    from PIL import Image

    with Image.open(path) as image:
        return dict(getattr(image, "text", {}))
