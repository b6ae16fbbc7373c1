"""Figure 1 by class over several policies: from ``diagnose buckets --json`` files, how far the high-probability
decision tokens move when every token is in the one-step update against when only the high-probability tokens are.
The crowding-out reading of AR-Lopti's Figure 1 predicts that they move less with the low-probability tokens in the
update. Per file, and as a mean with a 95% t interval over files (one file per policy). docs/metrics.md ("Offline
diagnostics")."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.ablate.stats import Estimate, mean_ci

ALL, HIGHEST = "all", "highest"  # the diagnose's update on every token, and on the highest bucket's tokens only
SIGNS = ("A>0", "A<0")


@dataclass(frozen=True)
class DecisionMoves:
    """One policy's batch: its class profile and, per advantage sign, the high-probability decision tokens' count and
    mean change of log p under each update, signed so that a move the advantage's way is positive."""

    name: str
    low_share: float  # share of sampled tokens in the lowest bucket
    decision_share: float  # share of those that are decision tokens
    tokens: dict[str, int]  # sign -> high-probability decision tokens
    moves: dict[str, dict[str, float]]  # sign -> update -> token-weighted mean of ±Δ log p (NaN where none)

    def difference(self, sign: str) -> float:
        """Every token in the update minus the highest bucket alone: negative when the low-probability tokens hold
        the high-probability decisions back."""
        return self.moves[sign][ALL] - self.moves[sign][HIGHEST]


def read_class_profile(path: Path) -> dict:
    """A ``diagnose buckets --json`` file with a class profile; one-line ``ValueError`` otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read a diagnose buckets --json file ({error})") from None
    if not isinstance(data, dict) or not data.get("class_profile"):
        raise ValueError(f"{path}: no class_profile (diagnose buckets --json on a task with token classes)")
    return data


def read_profile(path: Path) -> dict:
    """A ``diagnose buckets --json`` file with a class profile and both updates; one-line ``ValueError`` otherwise."""
    data = read_class_profile(path)
    missing = [u for u in (ALL, HIGHEST) if u not in data.get("updates", {})]
    if missing:
        raise ValueError(f"{path}: no {' or '.join(missing)} update")
    return data


def decision_moves(data: dict, name: str) -> DecisionMoves:
    """The high-probability decision tokens of one file: those of a decision class in the highest non-saturated
    bucket (tokens with p > 0.999 are reported apart by the diagnose and left out here)."""
    profile = data["class_profile"]
    decisions, high = set(profile["decision_classes"]), profile["intervals"][-1]
    tokens: dict[str, int] = {}
    moves: dict[str, dict[str, float]] = {sign: {} for sign in SIGNS}
    for update in (ALL, HIGHEST):
        rows = [
            row
            for row in data["updates"][update]["by_class"]
            if row["class"] in decisions and row["interval"] == high and row["tokens"]
        ]
        for sign in SIGNS:
            mine = [row for row in rows if row["sign"] == sign]
            count = sum(row["tokens"] for row in mine)
            way = 1.0 if sign == "A>0" else -1.0
            total = math.fsum(way * row["tokens"] * row["dlogp_mean"] for row in mine)
            moves[sign][update] = total / count if count else math.nan
            tokens[sign] = count  # the same tokens in both updates: the buckets are of the old probability
    return DecisionMoves(name, float(profile["low_share"]), float(profile["low_decision_share"]), tokens, moves)


def pooled_difference(policies: list[DecisionMoves], sign: str) -> Estimate:
    """Mean of :meth:`DecisionMoves.difference` over the policies that have such tokens, 95% t interval."""
    return mean_ci([d for p in policies if math.isfinite(d := p.difference(sign))])


def pooled_text(e: Estimate) -> str:
    """The pooled difference as the table shows it: with its interval from two policies on."""
    if e.n == 0:
        return "no policy has such tokens"
    if e.n == 1:
        return f"{e.mean:+.2e} (n = 1: no interval)"
    return f"{e.mean:+.2e} [{e.low:+.2e}, {e.high:+.2e}] (n = {e.n})"


def summary_table(policies: list[DecisionMoves]) -> str:
    """A markdown table: per policy the profile and, for each sign, the moves and their difference; then the mean
    difference over policies."""
    header = ["policy", "tokens < lowest edge", "of those, decisions"]
    for sign in SIGNS:
        header += [f"{sign}: tokens", f"{sign}: all", f"{sign}: high only", f"{sign}: all - high only"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in policies:
        cells = [p.name, f"{p.low_share:.1%}", f"{p.decision_share:.0%}"]
        for sign in SIGNS:
            cells += [
                str(p.tokens[sign]),
                f"{p.moves[sign][ALL]:+.2e}",
                f"{p.moves[sign][HIGHEST]:+.2e}",
                f"{p.difference(sign):+.2e}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    pooled = ["mean over policies [95% CI]", "", ""]
    for sign in SIGNS:
        pooled += ["", "", "", pooled_text(pooled_difference(policies, sign))]
    lines.append("| " + " | ".join(pooled) + " |")
    return "\n".join(lines)


PAIRED_MEASURES = (
    ("tokens < lowest edge", lambda p: p.low_share),
    ("decisions < lowest edge (of all tokens)", lambda p: p.low_share * p.decision_share),
    ("other classes < lowest edge (of all tokens)", lambda p: p.low_share * (1.0 - p.decision_share)),
    ("A>0: all - high only", lambda p: p.difference("A>0")),
    ("A<0: all - high only", lambda p: p.difference("A<0")),
)


def paired_table(policies: list[DecisionMoves], against: list[DecisionMoves]) -> str:
    """A markdown table of each measure's difference policy minus its pair in ``against`` (paired in order, e.g. two
    methods' checkpoints of the same seeds): the mean over pairs with its 95% t interval, pairs where the measure is
    undefined (no such tokens) left out."""
    if len(policies) != len(against):
        raise ValueError(f"--against: {len(against)} file(s) for {len(policies)}; give one to pair with each file")
    lines = ["| measure | mean of the policies | mean of --against | difference [95% CI] |", "|---|---|---|---|"]
    for label, measure in PAIRED_MEASURES:
        pairs = [(measure(p), measure(a)) for p, a in zip(policies, against, strict=True)]
        pairs = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
        mine, theirs = mean_ci([x for x, _ in pairs]), mean_ci([y for _, y in pairs])
        lines.append(
            f"| {label} | {mine.mean:+.3e} | {theirs.mean:+.3e} | {pooled_text(mean_ci([x - y for x, y in pairs]))} |"
        )
    return "\n".join(lines)
