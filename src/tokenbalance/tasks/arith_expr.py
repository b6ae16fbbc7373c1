"""The arithmetic task's expression trees: exact value and infix text (:mod:`.arith` generates them, :mod:`.arith_cot`
writes their working)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}

# An expression node: an int leaf, or (operator, left, right).
Expr = Any


def evaluate_expression(node: Expr) -> Fraction:
    """Exact value of a generated expression tree (our own trees, never model text)."""
    if isinstance(node, int):
        return Fraction(node)
    operator, left, right = node
    a, b = evaluate_expression(left), evaluate_expression(right)
    if operator == "+":
        return a + b
    if operator == "-":
        return a - b
    if operator == "*":
        return a * b
    if b == 0:
        raise ZeroDivisionError
    return a / b


def render_expression(node: Expr, parent: str | None = None, is_right: bool = False) -> str:
    """Infix text with the fewest parentheses; negative numbers are parenthesised, e.g. ``(-3)``."""
    if isinstance(node, int):
        return f"({node})" if node < 0 else str(node)
    operator, left, right = node
    text = f"{render_expression(left, operator)} {operator} {render_expression(right, operator, True)}"
    if parent is not None:
        weaker = _PRECEDENCE[operator] < _PRECEDENCE[parent]
        same_on_right = _PRECEDENCE[operator] == _PRECEDENCE[parent] and is_right and parent in "-/"
        if weaker or same_on_right or (is_right and parent == "*" and operator == "/"):
            return f"({text})"
    return text
