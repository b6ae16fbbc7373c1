"""A test-only reward that varies between samples of a random tiny policy.

The K&K reward gives a randomly initialised tiny model -3 on every response (no well-formed
answer), so every advantage is 0 and an update tests nothing. This reward is the share of the
response's non-space characters that are letters of the puzzle's solution text
(``reward_model.ground_truth``): a value in [0, 1] that differs between samples of one prompt.
verl calls it through ``reward.custom_reward_function.path`` (this file), ``name=compute_score``.
"""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info=None, **_: Any) -> float:
    """Share of the non-space characters of ``solution_str`` that are letters of the solution text."""
    solution = ground_truth.get("solution_text_format", "") if isinstance(ground_truth, dict) else str(ground_truth)
    letters = {character.lower() for character in solution if character.isalpha()}
    characters = [character.lower() for character in solution_str if not character.isspace()]
    return sum(character in letters for character in characters) / len(characters) if characters else 0.0
