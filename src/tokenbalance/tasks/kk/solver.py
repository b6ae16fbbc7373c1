"""Knights & Knaves solver: every consistent assignment (knights' statements true, knaves' false), in the reference's
``product([True, False], repeat=n)`` order (spec ``kk.md`` §3.2-3.3), each statement compiled to a truth mask over all
2**n candidates (docs/tasks.md, "Deliberate differences")."""

from __future__ import annotations

from functools import cache

from tokenbalance.tasks.kk.statements import KNAVE_ATOM, KNIGHT_ATOM, Puzzle, Statement

MAX_PEOPLE = 16  # a truth table of 2**16 bits is still instant; the task itself allows 2..8


@cache
def knight_masks(n_people: int) -> tuple[int, ...]:
    """Bit ``a`` of mask j is set when person j is a knight in candidate ``a`` (product order: person 0 varies slowest
    and True comes first, so knight <=> bit ``n-1-j`` of ``a`` is 0)."""
    size = 1 << n_people
    masks = []
    for person in range(n_people):
        shift = n_people - 1 - person
        mask = 0
        for candidate in range(size):
            if not (candidate >> shift) & 1:
                mask |= 1 << candidate
        masks.append(mask)
    return tuple(masks)


def full_mask(n_people: int) -> int:
    """The mask with all ``2**n_people`` candidate bits set."""
    return (1 << (1 << n_people)) - 1


def truth_mask(statement: Statement, n_people: int) -> int:
    """Bit mask of the candidates (product order) under which ``statement`` is true."""
    knights = knight_masks(n_people)
    everything = full_mask(n_people)

    def mask(node: Statement) -> int:
        tag = node[0]
        if tag == KNIGHT_ATOM:
            return knights[node[1]]
        if tag == KNAVE_ATOM:
            return everything & ~knights[node[1]]
        if tag == "not":
            return everything & ~mask(node[1])
        if tag == "and":
            result = everything
            for child in node[1:]:
                result &= mask(child)
            return result
        if tag == "or":
            result = 0
            for child in node[1:]:
                result |= mask(child)
            return result
        if tag == "->":
            return (everything & ~mask(node[1])) | mask(node[2])
        if tag == "<=>":
            return everything & ~(mask(node[1]) ^ mask(node[2]))
        raise ValueError(f"unknown statement tag {tag!r}")

    return mask(statement)


def candidate_assignment(candidate: int, n_people: int) -> tuple[bool, ...]:
    """The assignment (True = knight) that candidate number ``candidate`` stands for."""
    return tuple(not (candidate >> (n_people - 1 - person)) & 1 for person in range(n_people))


def consistent_mask(puzzle: Puzzle) -> int:
    """Mask of the candidates where every person's role agrees with the truth of their statement."""
    n_people = len(puzzle)
    if not 1 <= n_people <= MAX_PEOPLE:
        raise ValueError(f"a puzzle needs 1..{MAX_PEOPLE} statements, got {n_people}")
    knights = knight_masks(n_people)
    result = full_mask(n_people)
    for person, statement in enumerate(puzzle):
        result &= ~(knights[person] ^ truth_mask(statement, n_people))
    return result & full_mask(n_people)


def all_solutions(puzzle: Puzzle) -> list[tuple[bool, ...]]:
    """All consistent assignments, all-knights-first (``product([True, False])``) order.

    >>> all_solutions((('lying', 1), ('and', ('telling-truth', 0), ('telling-truth', 1))))
    [(True, False)]"""
    n_people = len(puzzle)
    mask = consistent_mask(puzzle)
    solutions = []
    candidate = 0
    while mask:
        if mask & 1:
            solutions.append(candidate_assignment(candidate, n_people))
        mask >>= 1
        candidate += 1
    return solutions


def count_solutions(puzzle: Puzzle) -> int:
    """Number of consistent assignments (the generator keeps puzzles where this is exactly 1)."""
    return consistent_mask(puzzle).bit_count()
