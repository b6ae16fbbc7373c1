"""Knights & Knaves natural-language formatter (names, quiz and solution texts), bit-exact with the K&K data (spec
``kk.md`` §6): puzzle i draws from ``numpy.random.default_rng(seed + i)`` its names, then one template per person.
Names and templates from the K&K generator (AlphaPav/mem-kk-logic, MIT License, (c) 2024 AlphaPav); only the default
options Logic-RL uses. docs/tasks.md."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenbalance.tasks.kk.statements import Puzzle, render_statement

# 51 names; the order matters for bit-exactness (§6.2).
COMMON_NAMES = (
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Isabella", "William",
    "Mia", "James", "Charlotte", "Benjamin", "Amelia", "Lucas", "Harper", "Henry", "Evelyn",
    "Alexander", "Abigail", "Michael", "Emily", "Daniel", "Elizabeth", "Jacob", "Sofia", "Logan",
    "Avery", "Jackson", "Ella", "Sebastian", "Scarlett", "Jack", "Grace", "Aiden", "Chloe", "Owen",
    "Victoria", "Samuel", "Riley", "Matthew", "Aria", "Joseph", "Lily", "Luke", "Aurora", "David",
    "Zoey", "Oliver", "Penelope",
)  # fmt: skip

# 18 saying templates; the index order matters (§6.3). Mind where the final period sits.
SAYING_TEMPLATES = (
    "{name} said that {content}.",
    "{name} told you that {content}.",
    '{name} said, "{content}."',
    '{name} stated, "{content}".',
    'According to {name}, "{content}".',
    'In {name}\'s words: "{content}".',
    '{name} remarked, "{content}".',
    '"{content}," {name} declared.',
    '{name} was heard saying, "{content}".',
    "{name} expressed that {content}.",
    '"{content}" - {name}.',
    'As {name} put it, "{content}".',
    '{name} asserted: "{content}".',
    '"{content}," {name} mentioned.',
    '{name} commented, "{content}".',
    'In a statement by {name}: "{content}".',
    '{name} noted, "{content}".',
    '"{content}," {name} claimed.',
)

QUIZ_INTRO = (
    "A very special island is inhabited only by knights and knaves. "
    "Knights always tell the truth, and knaves always lie. "
)
QUIZ_QUESTION = " So who is a knight and who is a knave?"

# The ``knight_knave`` column, identical in every row.
KNIGHT_KNAVE_WORDS = {
    "knight": "knight",
    "knave": "knave",
    "a_knight": "a knight",
    "a_knave": "a knave",
    "Knight": "Knight",
    "Knave": "Knave",
}


@dataclass(frozen=True)
class FormattedProblem:
    """The text columns of one puzzle: ``names[i]`` is person i, ``template_ids[i]`` the saying template index used
    for person i's sentence."""

    names: tuple[str, ...]
    template_ids: tuple[int, ...]
    quiz: str
    solution_text: str
    solution_text_format: str


def draw_names_and_templates(seed: int, n_people: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The per-puzzle RNG draws, in the reference order: names first, then one template per person."""
    rng = np.random.default_rng(seed)
    names = tuple(str(name) for name in rng.choice(COMMON_NAMES, size=n_people, replace=False))
    template_ids = tuple(int(rng.integers(0, len(SAYING_TEMPLATES))) for _ in range(n_people))
    return names, template_ids


def join_with_oxford_comma(items: list[str] | tuple[str, ...]) -> str:
    """``a, and b`` / ``a, b, and c``: the reference's joining, Oxford comma even for two items."""
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def format_quiz(statements: Puzzle, names: tuple[str, ...], template_ids: tuple[int, ...]) -> str:
    """The ``quiz`` column: intro, the inhabitants, one sentence per person, the question."""
    parts = [QUIZ_INTRO, f"You meet {len(names)} inhabitants: ", join_with_oxford_comma(names), "."]
    for person, statement in enumerate(statements):
        template = SAYING_TEMPLATES[template_ids[person]]
        content = render_statement(statement, names)
        parts.append(" " + template.format(name=names[person], content=content))
    parts.append(QUIZ_QUESTION)
    return "".join(parts)


def role_sentences(names: tuple[str, ...] | list[str], solution: tuple[bool, ...] | list[bool]) -> list[str]:
    """``["Zoey is a knight", "Oliver is a knave"]``: one sentence per person, index order."""
    return [f"{name} is a {'knight' if is_knight else 'knave'}" for name, is_knight in zip(names, solution)]


def format_solution_text(names: tuple[str, ...], solution: tuple[bool, ...]) -> str:
    """``Zoey is a knave, and Oliver is a knight.`` (the ``solution_text`` column)."""
    return join_with_oxford_comma(role_sentences(names, solution)) + "."


def format_solution_text_format(names: tuple[str, ...], solution: tuple[bool, ...]) -> str:
    """``(1) Zoey is a knave\\n(2) Oliver is a knight``, the reward's ground truth (numbered directly; the same text
    as the reference's string surgery on ``solution_text``)."""
    sentences = role_sentences(names, solution)
    return "\n".join(f"({k}) {sentence}" for k, sentence in enumerate(sentences, start=1))


def format_problem(seed: int, statements: Puzzle, solution: tuple[bool, ...]) -> FormattedProblem:
    """Draw names/templates with ``default_rng(seed)`` and render all text columns.

    For the published data ``seed = 1234 + global index``."""
    names, template_ids = draw_names_and_templates(seed, len(statements))
    return FormattedProblem(
        names=names,
        template_ids=template_ids,
        quiz=format_quiz(statements, names, template_ids),
        solution_text=format_solution_text(names, solution),
        solution_text_format=format_solution_text_format(names, solution),
    )
