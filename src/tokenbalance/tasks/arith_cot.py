"""Step-by-step working for a generated arithmetic problem, the ``arith`` SFT targets ``cot`` and ``cot_random``::

    14 - 5 = 9, so we have 9 * 3 + 12 / 4. 9 * 3 = 27, so we have 27 + 12 / 4. ...

``cot`` takes the leftmost ready operation and the first wording; ``cot_random`` draws both per problem (seeded by its
level and index). docs/tasks.md ("Arithmetic")."""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenbalance.tasks.arith_expr import evaluate_expression, render_expression

LEADS = ("", "Now ", "Next, ", "Then ", "So ")
EQUALS = ("=", "is", "gives", "makes", "equals")
LINKS = (", so we have", "; this leaves", ", and the expression becomes", ": now we have", ", which gives")
CLOSERS = ("The answer is", "So the result is", "Therefore the value is", "Hence the answer is", "The final answer is")

Position = tuple[int, ...]  # child indices (1 = left, 2 = right) from the root to an operation

WRONG_OPERATORS = "+-*"  # a slip never divides: the result would rarely be an integer


@dataclass(frozen=True)
class Piece:
    """A stretch of a working's text and its class (:data:`tokenbalance.tasks.arith.TOKEN_CLASSES`)."""

    text: str
    kind: str


@dataclass
class NoisyTeacher:
    """A teacher whose every operation slips with probability ``rate`` (:meth:`step`), the working going on from what
    it wrote; ``rng`` draws only the slips, so order and wording draws stay the clean working's."""

    rate: float
    rng: random.Random

    def step(
        self, operator: str, left: int, right: int, value: int, allowed: Callable[[int], bool] = lambda _: True
    ) -> tuple[str, int]:
        """The operator and result written for ``left operator right = value``: with a slip, half the time another
        operator (``+ - *``), half a result off by one, each only if ``allowed`` (later divisions stay exact) and
        non-negative where ``value`` is; if neither qualifies, written right."""
        if self.rng.random() >= self.rate:
            return operator, value

        def plausible(result: int) -> bool:
            return result != value and (result >= 0 or value < 0) and allowed(result)

        wrong_operators = [(o, applied(o, left, right)) for o in WRONG_OPERATORS if o != operator]
        off_by_one = [(operator, v) for v in (value - 1, value + 1)]
        kinds = [
            slips for slips in ([(o, r) for o, r in s if plausible(r)] for s in (wrong_operators, off_by_one)) if slips
        ]
        return self.rng.choice(self.rng.choice(kinds)) if kinds else (operator, value)


def applied(operator: str, left: int, right: int) -> int:
    """``left operator right`` for ``+ - *``."""
    return int(evaluate_expression((operator, left, right)))


def ready_operations(node: Any, path: Position = ()) -> list[Position]:
    """The paths of the operations whose operands are both numbers, left to right."""
    if isinstance(node, int):
        return []
    _, left, right = node
    if isinstance(left, int) and isinstance(right, int):
        return [path]
    return ready_operations(left, (*path, 1)) + ready_operations(right, (*path, 2))


def subtree(node: Any, path: Position) -> Any:
    """The node at ``path``."""
    for position in path:
        node = node[position]
    return node


def replaced(node: Any, path: Position, value: int) -> Any:
    """``node`` with the operation at ``path`` replaced by the number ``value``."""
    if not path:
        return value
    parts = list(node)
    parts[path[0]] = replaced(node[path[0]], path[1:], value)
    return tuple(parts)


def working(tree: Any, rng: random.Random | None = None, errors: NoisyTeacher | None = None) -> str:
    """The working of ``tree``, ending in the boxed answer; ``rng`` draws the order and wording (module docstring),
    None gives the reference; ``errors`` makes it a noisy teacher's."""
    return "".join(piece.text for piece in working_pieces(tree, rng, errors))


def working_pieces(tree: Any, rng: random.Random | None = None, errors: NoisyTeacher | None = None) -> list[Piece]:
    """:func:`working` as pieces of text, each with its class (:data:`tokenbalance.tasks.arith.TOKEN_CLASSES`). The
    order of ``rng``'s draws is that of the working written without errors, so that a noisy teacher's order and
    wording are those of the clean working."""

    def pick(options):
        return options[0] if rng is None else rng.choice(options)

    pieces: list[Piece] = []

    def add(text: str, kind: str) -> None:
        if text:
            pieces.append(Piece(text, kind))

    while not isinstance(tree, int):
        ready = ready_operations(tree)
        path = pick(ready)
        operator, left, right = subtree(tree, path)
        add(pick(LEADS), "wording")
        written, value = (operator, int(evaluate_expression((operator, left, right))))  # generated divisions are exact
        if errors is not None:
            written, value = errors.step(operator, left, right, value, functools.partial(exact_after, tree, path))
        pieces.extend(number_pieces(left, "copy"))
        add(" ", "format")
        add(written, "operator")
        add(" ", "format")
        pieces.extend(number_pieces(right, "copy"))
        add(" ", "format")
        add(pick(EQUALS), "wording")
        add(" ", "format")
        pieces.extend(number_pieces(value, "result"))
        tree = replaced(tree, path, value)
        if not isinstance(tree, int):
            add(pick(LINKS), "wording")
            add(" ", "format")
            pieces.extend(expression_pieces(tree))
        add(". ", "format")
    add(pick(CLOSERS), "wording")
    add(" \\boxed{", "format")
    add(str(tree), "copy")
    add("}.", "format")
    return pieces


def exact_after(tree: Any, path: Position, result: int) -> bool:
    """Whether every division of ``tree`` stays exact with the operation at ``path`` giving ``result``."""
    return divisions_exact(replaced(tree, path, result))


def divisions_exact(node: Any) -> bool:
    """Whether every division in ``node`` (and below) leaves an integer."""
    if isinstance(node, int):
        return True
    if not (divisions_exact(node[1]) and divisions_exact(node[2])):
        return False
    try:
        return evaluate_expression(node).denominator == 1
    except ZeroDivisionError:
        return False


def number_pieces(number: int, kind: str) -> list[Piece]:
    """``render_expression(number)``: the number as ``kind``, a negative one's parentheses as ``format``."""
    if number < 0:
        return [Piece("(", "format"), Piece(str(number), kind), Piece(")", "format")]
    return [Piece(str(number), kind)]


def expression_pieces(tree: Any) -> list[Piece]:
    """``render_expression(tree)`` cut into its numbers and operators (class ``copy``: the working copies them from
    the expression before) and the spaces and parentheses between (``format``)."""
    return [
        Piece(part, "format" if part.isspace() or part in "()" else "copy")
        for part in re.findall(r"-?\d+|[()]|\s+|[-+*/]", render_expression(tree))
    ]


_EQUALS_PATTERN = "|".join(re.escape(word) for word in EQUALS)
_WORDING = sorted({*LEADS, *EQUALS, *LINKS, *CLOSERS} - {""}, key=len, reverse=True)


def text_classes(text: str) -> list[str]:
    """The class (:data:`tokenbalance.tasks.arith.TOKEN_CLASSES`) of each character of any working (also a model's):
    wording phrases ``wording``, a number after an equals word ``result``, an operator before it ``operator``, other
    numbers and operators ``copy``, the rest ``format``; on generated workings equal to :func:`working_pieces`'
    classes."""
    kinds = ["format"] * len(text)
    equals_ends = set()
    for phrase in _WORDING:
        pattern = re.escape(phrase)
        if phrase[0].isalpha():
            pattern = r"(?<![A-Za-z])" + pattern
        if phrase[-1].isalpha():
            pattern += r"(?![A-Za-z])"
        for match in re.finditer(pattern, text):
            if all(kind == "format" for kind in kinds[match.start() : match.end()]):
                kinds[match.start() : match.end()] = ["wording"] * (match.end() - match.start())
                if phrase in EQUALS:
                    equals_ends.add(match.end())
    for match in re.finditer(r"-?\d+", text):
        if kinds[match.start()] != "format":
            continue
        before = match.start()
        while before > 0 and text[before - 1] in " (":
            before -= 1
        kind = "result" if before in equals_ends else "copy"
        kinds[match.start() : match.end()] = [kind] * (match.end() - match.start())
    for match in re.finditer(r"(?<= )[-+*/](?= )", text):
        sentence_start = text.rfind(". ", 0, match.start()) + 1
        applied_here = not any(sentence_start < end <= match.start() for end in equals_ends)
        kinds[match.start()] = "operator" if applied_here else "copy"
    return kinds


def piece_classes(pieces: list[Piece]) -> list[str]:
    """The class of each character of the text ``pieces`` make."""
    return [piece.kind for piece in pieces for _ in piece.text]
