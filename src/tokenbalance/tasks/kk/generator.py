"""Knights & Knaves puzzle sampler, bit-exact with the K&K generator behind the Logic-RL data (spec ``kk.md`` §4-5,
§8.1): one ``numpy.random.default_rng(seed)`` stream in the reference's call order; the k-th accepted puzzle (new,
exactly one solution) is *global index* k. Puzzles come lazily; running out of retries raises. docs/tasks.md
("Generation", "Deliberate differences")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from tokenbalance.checks import check_range
from tokenbalance.tasks.kk.solver import all_solutions
from tokenbalance.tasks.kk.statements import KNAVE_ATOM, KNIGHT_ATOM, Puzzle, Statement

MIN_PEOPLE = 2
MAX_PEOPLE = 8
DEFAULT_SEED = 1234
DEFAULT_DEPTH = 2
DEFAULT_WIDTH = 2
DEFAULT_MAX_RETRY = 1000

_DICE_OPERATORS = {1: "not", 2: "and", 3: "or", 4: "->", 5: "<=>"}


@dataclass(frozen=True)
class KKProblem:
    """One accepted puzzle: ``statements[i]`` what person i says, ``solution[i]`` True for a knight, ``index`` its
    global index (acceptance order, from 0)."""

    index: int
    statements: Puzzle
    solution: tuple[bool, ...]

    @property
    def n_people(self) -> int:
        return len(self.statements)


def check_people(n_people: object) -> int:
    """Validate the number of people (an int in 2..8) and return it."""
    check_range("people", n_people, MIN_PEOPLE, MAX_PEOPLE, integer=True)
    return n_people  # type: ignore[return-value]


class StatementSampler:
    """Draws statements from one RNG stream, following the reference call order exactly."""

    def __init__(self, rng: np.random.Generator, n_people: int, width: int = DEFAULT_WIDTH):
        self.rng = rng
        self.n_people = n_people
        self.width = width

    def _leaf(self, speaker: int) -> Statement:
        while True:
            role = (KNIGHT_ATOM, KNAVE_ATOM)[int(self.rng.integers(0, 2))]
            person = int(self.rng.integers(0, self.n_people))
            if not (role == KNAVE_ATOM and person == speaker):
                return (role, person)

    def _distinct_children(self, speaker: int, depth: int, count: int) -> list[Statement]:
        children: list[Statement] = []
        while len(children) < count:
            child = self.sample(speaker, depth)
            if child not in children:
                children.append(child)
        return children

    def sample(self, speaker: int, depth: int) -> Statement:
        """One statement said by ``speaker``, at most ``depth`` levels deep."""
        dice = int(self.rng.integers(0, 6))  # drawn first, even at depth 1 (RNG fidelity)
        if depth == 1 or dice == 0:
            return self._leaf(speaker)
        operator = _DICE_OPERATORS[dice]
        if operator == "not":
            return ("not", self.sample(speaker, depth - 1))
        if operator in ("and", "or"):
            # With width 2 this is integers(2, 3) == 2 and does not advance the stream; it is made anyway so that a
            # wider grammar stays faithful too.
            count = int(self.rng.integers(2, self.width + 1))
        else:
            count = 2
        return (operator, *self._distinct_children(speaker, depth - 1, count))


def iter_problems(
    n_people: int,
    seed: int = DEFAULT_SEED,
    *,
    depth: int = DEFAULT_DEPTH,
    width: int = DEFAULT_WIDTH,
    max_retry: int = DEFAULT_MAX_RETRY,
) -> Iterator[KKProblem]:
    """Yield accepted puzzles forever in global-index order; ``ValueError`` after ``max_retry`` rejections in a row (n
    = 2 runs out after a few hundred)."""
    check_people(n_people)
    if depth < 1 or width < 2:
        raise ValueError(f"depth must be >= 1 and width >= 2, got depth={depth}, width={width}")
    sampler = StatementSampler(np.random.default_rng(seed), n_people, width)
    accepted: set[Puzzle] = set()
    index = 0
    while True:
        for _ in range(max_retry):
            puzzle = tuple(sampler.sample(person, depth) for person in range(n_people))
            if puzzle in accepted:
                continue
            solutions = all_solutions(puzzle)
            if len(solutions) != 1:
                continue
            accepted.add(puzzle)
            yield KKProblem(index=index, statements=puzzle, solution=solutions[0])
            break
        else:
            raise ValueError(
                f"no new puzzle with a unique solution for {n_people} people after {max_retry} "
                f"tries at global index {index} (seed {seed}); ask for fewer puzzles"
            )
        index += 1


def generate_problems(
    n_people: int,
    start_index: int,
    count: int,
    seed: int = DEFAULT_SEED,
    *,
    on_progress: Callable[[], None] | None = None,
) -> list[KKProblem]:
    """The puzzles with global indices ``start_index .. start_index + count - 1``; earlier ones are sampled and
    dropped, so index k is the same puzzle in any slice. ``on_progress``: called per puzzle drawn (``start_index +
    count`` calls)."""
    check_people(n_people)
    check_range("start_index", start_index, 0, integer=True)
    check_range("count", count, 1, integer=True)
    check_range("seed", seed, integer=True)
    problems = []
    for problem in iter_problems(n_people, seed):
        if on_progress is not None:
            on_progress()
        if problem.index >= start_index:
            problems.append(problem)
            if len(problems) == count:
                break
    return problems
