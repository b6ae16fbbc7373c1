"""Knights & Knaves reward exactly as Logic-RL / AR-Lopti's ``kk.compute_score`` (spec ``kk.md`` §11): format (+1 /
-1)
+ answer (+2, -1.5 wrong, -2 unparsable), totals 3, -0.5, -1, -3, on prompt **plus** response, every quirk kept.
Nothing printed; :func:`score_with_metrics` returns the parts, :func:`score_response` scores a bare response.
docs/tasks.md ("Reward")."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenbalance.tasks.kk.templates import DEFAULT_TEMPLATE, get_template

logger = logging.getLogger(__name__)

FORMAT_OK = 1.0
FORMAT_BAD = -1.0
ANSWER_CORRECT = 2.0
ANSWER_WRONG = -1.5
ANSWER_UNPARSABLE = -2.0
MAX_REWARD = FORMAT_OK + ANSWER_CORRECT  # 3.0: "correct" for the accuracy metric
POSSIBLE_TOTALS = (3.0, -0.5, -1.0, -3.0)

RESPONSE_MARKERS = ("Assistant:", "<|im_start|>assistant")  # tried in this order
FORMAT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")

_GOLD_LINE_RE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)
_ANSWER_BLOCK_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class KKScore:
    """A scored completion: ``total`` and its steps: ``format_ok`` (the four tags once each, in order),
    ``answer_parsed`` (passed the count guard, every person named as "X is a knight/knave"), ``correct`` (every role
    matches; total 3)."""

    total: float
    format_ok: bool
    answer_parsed: bool
    correct: bool

    @property
    def format_score(self) -> float:
        return FORMAT_OK if self.format_ok else FORMAT_BAD

    @property
    def answer_score(self) -> float:
        return self.total - self.format_score

    def metrics(self) -> dict[str, float]:
        """``{"format_ok", "answer_parsed", "correct"}`` as 0.0 / 1.0 floats (ready to average)."""
        return {
            "format_ok": float(self.format_ok),
            "answer_parsed": float(self.answer_parsed),
            "correct": float(self.correct),
        }


def parse_gold_roles(solution_text_format: str) -> dict[str, str]:
    """``{"Zoey": "knight", "Oliver": "knave"}`` from ``"(1) Zoey is a knight\\n(2) Oliver is a knave"``: per line the
    first alphabetic word and the first ``knight``/``knave`` after it, as the reference."""
    roles: dict[str, str] = {}
    for line in solution_text_format.split("\n"):
        line = line.strip()
        if not line:
            continue
        match = _GOLD_LINE_RE.search(line)
        if match:
            roles[match.group(1)] = match.group(2).lower()
    return roles


def split_assistant_part(text: str) -> tuple[str, bool]:
    """``(part, has_header)``: the text after the first response marker, or the whole text."""
    for marker in RESPONSE_MARKERS:
        if marker in text:
            return text.split(marker, 1)[1], True
    return text, False


def extract_answer(part: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` block, or None."""
    blocks = _ANSWER_BLOCK_RE.findall(part)
    return blocks[-1].strip() if blocks else None


def has_valid_format(part: str) -> bool:
    """Each format tag exactly once and first occurrences in order think < /think < answer < /answer."""
    if any(part.count(tag) != 1 for tag in FORMAT_TAGS):
        return False
    positions = [part.find(tag) for tag in FORMAT_TAGS]
    return all(a <= b for a, b in zip(positions, positions[1:]))


def parse_answer_roles(answer: str, names: list[str]) -> dict[str, str] | None:
    """Predicted roles for ``names``, or None when the count guard fails or a name is missing."""
    lowered = answer.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    roles: dict[str, str] = {}
    for name in names:
        pattern = rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b"
        match = re.search(pattern, answer, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match.group(1).lower()
    return roles


def _solution_text_format(ground_truth: Mapping[str, Any] | str) -> str:
    if isinstance(ground_truth, str):
        return ground_truth
    if isinstance(ground_truth, Mapping):
        value = ground_truth.get("solution_text_format")
        if isinstance(value, str):
            return value
        raise ValueError(
            f"ground_truth['solution_text_format'] must be a string, got {type(value).__name__}: {value!r}"
        )
    raise ValueError(
        "ground_truth must be the reward_model.ground_truth dict or the solution_text_format "
        f"string, got {type(ground_truth).__name__}"
    )


def score_with_metrics(solution_str: str, ground_truth: Mapping[str, Any] | str) -> KKScore:
    """Score decoded prompt + response (special tokens kept) against ``ground_truth`` (the row's dict or its
    ``solution_text_format`` string)."""
    if not isinstance(solution_str, str):
        raise ValueError(f"solution_str must be a string, got {type(solution_str).__name__}")
    gold = parse_gold_roles(_solution_text_format(ground_truth))
    part, has_header = split_assistant_part(solution_str)
    answer = extract_answer(part) if has_header else None
    format_ok = has_valid_format(part)
    predicted = parse_answer_roles(answer, list(gold)) if format_ok and answer else None
    correct = predicted is not None and predicted == gold
    if predicted is None:
        answer_score = ANSWER_UNPARSABLE
    else:
        answer_score = ANSWER_CORRECT if correct else ANSWER_WRONG
    score = KKScore(
        total=(FORMAT_OK if format_ok else FORMAT_BAD) + answer_score,
        format_ok=format_ok,
        answer_parsed=predicted is not None,
        correct=correct,
    )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "kk reward %.1f (format_ok=%s, parsed=%s, correct=%s) gold=%s predicted=%s",
            score.total,
            format_ok,
            score.answer_parsed,
            correct,
            gold,
            predicted,
        )
    return score


def compute_score(solution_str: str, ground_truth: Mapping[str, Any] | str) -> float:
    """The reference entry point: the total reward (3, -0.5, -1 or -3) of decoded prompt + response."""
    return score_with_metrics(solution_str, ground_truth).total


def score_response(response: str, ground_truth: Mapping[str, Any] | str, template: str = DEFAULT_TEMPLATE) -> KKScore:
    """Score a response *without* its prompt, as if the ``template`` prompt (ending in ``<think>``) came before it."""
    return score_with_metrics(get_template(template).response_header + response, ground_truth)


def accuracy(rewards: list[float] | tuple[float, ...]) -> float:
    """Share of responses whose total is exactly 3 (spec §12.3); ``[3, -0.5, 3, -3]`` gives 0.5."""
    if len(rewards) == 0:
        raise ValueError("accuracy needs at least one reward")
    return sum(1 for reward in rewards if reward == MAX_REWARD) / len(rewards)


def accuracy_by_source(
    rewards: list[float] | tuple[float, ...], data_sources: list[str] | tuple[str, ...]
) -> dict[str, float]:
    """Accuracy per ``data_source`` (e.g. ``kk_logic3``) plus ``"mean"``, the unweighted mean over the sources present
    (AR-Lopti reports each level and their average)."""
    if len(rewards) != len(data_sources):
        raise ValueError(f"{len(rewards)} rewards but {len(data_sources)} data sources")
    groups: dict[str, list[float]] = {}
    for reward, source in zip(rewards, data_sources):
        groups.setdefault(source, []).append(reward)
    result = {source: accuracy(values) for source, values in sorted(groups.items())}
    result["mean"] = sum(result.values()) / len(result)
    return result
