"""Across testbeds: each method's paired gain over GRPO against the share of low-probability tokens that are decisions
(docs/results.md, "Across testbeds"), from a manifest of grids' ``accuracy.csv`` and their start policies' ``diagnose
buckets --json`` profiles (paths relative to it; one file, or a list of one per start policy, whose shares are
averaged)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.ablate.class_moves import read_class_profile
from tokenbalance.ablate.curves import row_colour
from tokenbalance.diagnostics.plots import new_figure

BASELINE_ROW = "grpo"
CAPTION_SPAN = 0.2  # decision shares closer than this would print their captions over each other
CAPTION_PT = 22.0  # the height of one two-line caption at font size 7, in points, with its spacing
CAPTION_GAP_PT = 4.0  # between a bar's end and the caption under it


@dataclass(frozen=True)
class GainPoint:
    """One method on one testbed: the x of the figure (profile of the start policy) and its paired difference from
    GRPO over seeds (mean and 95% t interval, accuracy.csv's ``diff_*``)."""

    testbed: str
    row: str
    label: str
    low_share: float  # share of sampled tokens below the lowest bucket edge (mean over the start policies' profiles)
    decision_share: float  # share of those that are decision tokens (the same mean)
    gain: float
    ci_low: float
    ci_high: float
    seeds: int


def read_json_list(path: Path, kind: str, shape: str) -> list:
    """A manifest file's non-empty JSON list; one-line ``ValueError`` naming ``path`` otherwise."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read the {kind} manifest ({error})") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: a {kind} manifest is a non-empty JSON list of {shape}")
    return entries


def read_manifest(path: Path) -> list[tuple[str, Path, list[Path]]]:
    """``(name, accuracy.csv, profile files)`` per testbed; one-line ``ValueError`` naming what is wrong."""
    entries = read_json_list(path, "testbed", "{name, accuracy, profile}")
    out = []
    for i, entry in enumerate(entries):
        missing = {"name", "accuracy", "profile"} - set(entry if isinstance(entry, dict) else ())
        if missing:
            raise ValueError(f"{path}: entry {i} lacks {', '.join(sorted(missing))}")
        named = entry["profile"] if isinstance(entry["profile"], list) else [entry["profile"]]
        if not named or not all(isinstance(name, str) for name in named):
            raise ValueError(f"{path}: entry {entry['name']!r}: profile is a path or a non-empty list of paths")
        accuracy, profiles = path.parent / entry["accuracy"], [path.parent / name for name in named]
        for file in (accuracy, *profiles):
            if not file.is_file():
                raise ValueError(f"{path}: entry {entry['name']!r}: no file {file}")
        out.append((str(entry["name"]), accuracy, profiles))
    return out


def class_shares(profile_path: Path) -> tuple[float, float]:
    """``(low_share, decision_share)`` of a ``diagnose buckets --json`` file's class profile."""
    profile = read_class_profile(profile_path)["class_profile"]
    return float(profile["low_share"]), float(profile["low_decision_share"])


def mean_shares(profiles: list[Path]) -> tuple[float, float]:
    """:func:`class_shares` averaged over the start policies' profiles, each policy weighing the same."""
    shares = [class_shares(path) for path in profiles]
    return math.fsum(s[0] for s in shares) / len(shares), math.fsum(s[1] for s in shares) / len(shares)


def gain_points(name: str, accuracy: Path, profiles: list[Path], mode: str = "greedy") -> list[GainPoint]:
    """The rows of ``accuracy.csv`` compared with GRPO on the difficulty average, for ``mode``."""
    low_share, decision_share = mean_shares(profiles)
    points = []
    with accuracy.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["mode"] != mode or row["column"] != f"eval/{mode}/acc" or row["baseline"] != BASELINE_ROW:
                continue
            if not row["diff_mean"]:
                continue
            points.append(
                GainPoint(
                    name,
                    row["row"],
                    row["label"],
                    low_share,
                    decision_share,
                    float(row["diff_mean"]),
                    float(row["diff_ci_low"]) if row["diff_ci_low"] else math.nan,
                    float(row["diff_ci_high"]) if row["diff_ci_high"] else math.nan,
                    int(row["diff_n"]),
                )
            )
    return points


def testbed_points(manifest: Path, mode: str = "greedy") -> list[GainPoint]:
    """The points of every testbed ``manifest`` lists; ``ValueError`` when none is compared with GRPO."""
    points = [p for name, acc, prof in read_manifest(manifest) for p in gain_points(name, acc, prof, mode)]
    if not points:
        raise ValueError(f"{manifest}: no row of any testbed is compared with GRPO in {mode} accuracy")
    return points


def caption_for(point: GainPoint) -> str:
    """A testbed's name and how many of its start policy's sampled tokens are low-probability, under its bars."""
    return f"{point.testbed}\n{100 * point.low_share:.1f}% of tokens < 0.25"


def caption_clusters(points: list[GainPoint]) -> list[list[str]]:
    """The testbeds in order of their decision share, grouped where neighbours are closer than ``CAPTION_SPAN``."""
    shares = {p.testbed: p.decision_share for p in points}
    clusters: list[list[str]] = []
    for name in sorted(shares, key=shares.__getitem__):
        if clusters and shares[name] - shares[clusters[-1][-1]] < CAPTION_SPAN:
            clusters[-1].append(name)
        else:
            clusters.append([name])
    return clusters


def make_room_below(ax, needs: list[tuple[float, float]]) -> None:
    """Lower the y axis' bottom so that ``need_pt`` points fit under the data height ``y`` for every ``(y, need_pt)``
    of ``needs`` (the captions under the bars), the top kept; the axes' height in points as laid out (the figure is
    laid out once first), less a tenth for the layout's change when the ticks change."""
    ax.figure.draw_without_rendering()
    bottom, top = ax.get_ylim()
    height_pt = 0.9 * ax.get_position().height * ax.figure.get_figheight() * 72
    for y, need_pt in needs:
        # data per point is (top - bottom) / height_pt; y - need_pt * that >= bottom, solved for bottom
        if need_pt < height_pt:
            bottom = min(bottom, (y * height_pt - need_pt * top) / (height_pt - need_pt))
    ax.set_ylim(bottom, top)


def gains_figure(points: list[GainPoint], mode: str = "greedy"):
    """One marker per method and testbed at (decision share, paired gain), 95% interval as a bar, in the row's colour
    of the grid figures; the methods are spread a little along x so that their bars do not hide each other, the
    testbed's name under its lowest bar (the axis lowered to make room)."""
    fig = new_figure(1, 1, 6.0, 3.6)
    ax = fig.subplots()
    rows = list(dict.fromkeys(p.row for p in points))
    for i, row in enumerate(rows):
        mine = [p for p in points if p.row == row]
        xs = [p.decision_share + 0.01 * (i - (len(rows) - 1) / 2) for p in mine]
        ys = [100 * p.gain for p in mine]
        below = [100 * (p.gain - p.ci_low) for p in mine]
        above = [100 * (p.ci_high - p.gain) for p in mine]
        ax.errorbar(
            xs, ys, yerr=[below, above], fmt="o", markersize=4, color=row_colour(row, i), capsize=2, label=mine[0].label
        )
    ax.axhline(0, color="0.6", lw=0.8)
    ax.margins(y=0.05)
    clusters = caption_clusters(points)
    lowest = {}  # each cluster's captions hang one under another from its lowest bar, from one height
    for cluster in clusters:
        lowest[cluster[0]] = min(
            100 * (p.ci_low if math.isfinite(p.ci_low) else p.gain) for p in points if p.testbed in cluster
        )
        for stacked, name in enumerate(cluster):
            first = next(p for p in points if p.testbed == name)
            caption = ax.annotate(
                caption_for(first),
                (first.decision_share, lowest[cluster[0]]),
                textcoords="offset points",
                xytext=(0, -CAPTION_GAP_PT - CAPTION_PT * stacked),
                ha="center",
                va="top",
                fontsize=7,
            )
            caption.set_in_layout(False)  # inside the axes, by make_room_below: the layout need not shrink them
    ax.set_xlim(-0.05, 1.05)
    ax.set_xlabel("share of low-probability tokens (p < 0.25) that are decisions, start policy", fontsize=8)
    ax.set_ylabel(f"paired gain over GRPO,\n{mode} accuracy (points)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.set_title("each method's gain over GRPO across testbeds (95% t interval over seeds)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    make_room_below(ax, [(lowest[c[0]], CAPTION_GAP_PT + CAPTION_PT * len(c)) for c in clusters])
    return fig
