"""Synthetic chain of thought for a Knights & Knaves puzzle (spec ``kk.md`` §7): the reference's depth-first search,
whose events become the ``cot_*`` columns (not read by prompt or reward; SFT targets). With a random generator its
choices are drawn (``sft.target=cot_random``). Differences: docs/tasks.md ("Deliberate differences")."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tokenbalance.tasks.kk.formatter import join_with_oxford_comma
from tokenbalance.tasks.kk.solver import full_mask, knight_masks, truth_mask
from tokenbalance.tasks.kk.statements import Puzzle, mentioned_people, render_statement

COT_HEAD = "Let's think step by step, by considering whether each person is lying and if that leads to contradiction."
COT_FOOT_SUCCESS = "This leads to a feasible solution."
COT_FOOT_FAIL = "All the configurations lead to contradictions."


@dataclass(frozen=True)
class Proposal:
    """``person`` was assumed a knight (``is_knight``); ``conflict`` is ``(q, q_is_knight)`` for the first person q
    whose claim can no longer hold, or None."""

    person: int
    is_knight: bool
    conflict: tuple[int, bool] | None


@dataclass(frozen=True)
class Reconsider:
    """Backtracking: every option of ``exhausted`` (in exhaustion order) failed; go back to ``person``."""

    person: int
    exhausted: tuple[int, ...]


@dataclass(frozen=True)
class SearchResult:
    """The events of the search in order, and whether it ended with a feasible assignment."""

    events: tuple[Proposal | Reconsider, ...]
    success: bool


def _first_conflict(puzzle: Puzzle, assignment: list[bool | None]) -> int | None:
    """The first assigned person (index order) whose claim (negated for a knave) is false under every completion of
    the undecided people, or None."""
    n_people = len(puzzle)
    knights = knight_masks(n_people)
    everything = full_mask(n_people)
    partial = everything
    for person, value in enumerate(assignment):
        if value is not None:
            partial &= knights[person] if value else ~knights[person]
    for person, value in enumerate(assignment):
        if value is None:
            continue
        claim = truth_mask(puzzle[person], n_people)
        if not value:
            claim = everything & ~claim
        if not claim & partial:
            return person
    return None


def search(puzzle: Puzzle, rng: random.Random | None = None) -> SearchResult:
    """The reference's backtracking search (knight first, mentioned people next). With ``rng`` each fixed choice is
    drawn (start order, knight or knave first, order of mentioned people); still complete, so the same unique
    solution."""
    n_people = len(puzzle)
    assignment: list[bool | None] = [None] * n_people

    def fresh_options() -> list[bool]:  # popped from the end: knight first in the reference
        return [False, True] if rng is None or rng.random() < 0.5 else [True, False]

    def arranged(people: list[int]) -> list[int]:
        return people if rng is None else rng.sample(people, len(people))

    options = [fresh_options() for _ in range(n_people)]
    order = arranged(list(range(n_people)))
    cursor = 0
    events: list[Proposal | Reconsider] = []
    while True:
        if cursor == n_people:
            return SearchResult(tuple(events), success=True)
        if not options[order[cursor]]:
            exhausted = []
            while cursor >= 0 and not options[order[cursor]]:
                person = order[cursor]
                options[person] = fresh_options()
                assignment[person] = None
                exhausted.append(person)
                cursor -= 1
            if cursor < 0:
                return SearchResult(tuple(events), success=False)
            events.append(Reconsider(order[cursor], tuple(exhausted)))
        person = order[cursor]
        value = options[person].pop()
        assignment[person] = value
        conflict = _first_conflict(puzzle, assignment)
        if conflict is not None:
            events.append(Proposal(person, value, (conflict, bool(assignment[conflict]))))
            continue
        events.append(Proposal(person, value, None))
        cursor += 1
        remaining = order[cursor:]
        front = arranged([p for p in mentioned_people(puzzle[person]) if p in remaining])
        order[cursor:] = front + [p for p in remaining if p not in front]


def _list_people(people: list[str]) -> str:
    """``A`` / ``A and B`` / ``A, B, and C`` (no Oxford comma for exactly two, unlike the quiz)."""
    return " and ".join(people) if len(people) == 2 else join_with_oxford_comma(people)


def render_step(event: Proposal | Reconsider, puzzle: Puzzle, names: tuple[str, ...]) -> str:
    """One ``cot_repeat_steps`` sentence (the variant that repeats the claims)."""
    if isinstance(event, Reconsider):
        exhausted = _list_people([names[p] for p in event.exhausted])
        return (
            f"We have exhausted all possibilities for {exhausted}, "
            f"so let us go back and reconsider {names[event.person]}."
        )
    name = names[event.person]
    role = "a knight" if event.is_knight else "a knave"
    if event.conflict is None:
        claim = "claim" if event.is_knight else "false claim"
        content = render_statement(puzzle[event.person], names)
        return f"Assume {name} is {role}. No contradiction is found in their {claim} that {content}."
    other, other_is_knight = event.conflict
    claim = "claim" if other_is_knight else "false claim"
    owner = "their own" if other == event.person else names[other]
    content = render_statement(puzzle[other], names)
    return f"{name} cannot be {role}, because this would contradict the {claim} of {owner} that {content}."


def chain_of_thought(
    puzzle: Puzzle, names: tuple[str, ...], rng: random.Random | None = None
) -> tuple[str, list[str], str]:
    """``(cot_head, cot_repeat_steps, cot_foot)`` for a puzzle and its names (a random search with ``rng``)."""
    result = search(puzzle, rng)
    steps = [render_step(event, puzzle, names) for event in result.events]
    return COT_HEAD, steps, COT_FOOT_SUCCESS if result.success else COT_FOOT_FAIL
