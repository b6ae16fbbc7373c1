"""Step-by-step working for a generated arithmetic problem: the SFT targets ``cot`` and
``cot_random`` of the ``arith`` task.

The working reduces the expression one operation at a time, an operation being ready when both its
operands are numbers, and writes each reduction as a sentence, e.g. for ``(14 - 5) * 3 + 12 / 4``::

    14 - 5 = 9, so we have 9 * 3 + 12 / 4. 9 * 3 = 27, so we have 27 + 12 / 4.
    12 / 4 = 3, so we have 27 + 3. 27 + 3 = 30. The answer is \\boxed{30}.

``cot`` always takes the leftmost ready operation and the first wording of every slot.
``cot_random`` draws, once per problem from a generator seeded by its level and index, which ready
operation comes next and each slot's wording (:data:`LEADS`, :data:`EQUALS`, :data:`LINKS`,
:data:`CLOSERS`): the same problem always gets the same text, different problems different ones, so
that a policy which has learnt the working still has real choices to make at every step, as a
model writing its own reasoning does. Every order and wording is valid and ends in the answer.
"""

from __future__ import annotations

import random
from typing import Any

from tokenbalance.tasks.arith import evaluate_expression, render_expression

LEADS = ("", "Now ", "Next, ", "Then ", "So ")
EQUALS = ("=", "is", "gives", "makes", "equals")
LINKS = (", so we have", "; this leaves", ", and the expression becomes", ": now we have", ", which gives")
CLOSERS = ("The answer is", "So the result is", "Therefore the value is", "Hence the answer is", "The final answer is")

Position = tuple[int, ...]  # child indices (1 = left, 2 = right) from the root to an operation


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


def working(tree: Any, rng: random.Random | None = None) -> str:
    """The working of ``tree``, ending in the boxed answer; ``rng`` draws the order and wording
    (module docstring), None gives the reference."""

    def pick(options):
        return options[0] if rng is None else rng.choice(options)

    sentences = []
    while not isinstance(tree, int):
        ready = ready_operations(tree)
        path = pick(ready)
        operation = subtree(tree, path)
        value = int(evaluate_expression(operation))  # generated divisions are exact
        computed = f"{pick(LEADS)}{render_expression(operation)} {pick(EQUALS)} {render_expression(value)}"
        tree = replaced(tree, path, value)
        sentences.append(
            f"{computed}." if isinstance(tree, int) else f"{computed}{pick(LINKS)} {render_expression(tree)}."
        )
    sentences.append(f"{pick(CLOSERS)} \\boxed{{{tree}}}.")
    return " ".join(sentences)
