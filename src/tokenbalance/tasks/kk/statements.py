"""Knights & Knaves statements (spec ``kk.md`` §3.1, §6.4): nested tuples exactly as the reference stores them
(``('telling-truth', j)``, ``('lying', j)``, ``('not', S)``, ``('and', S1, ...)``, ``('or', ...)``, ``('->', S1,
S2)``, ``('<=>', S1, S2)``), their repr as the ``statements`` column, a parser that accepts only this grammar (never
``eval``) and the English rendering. docs/tasks.md."""

from __future__ import annotations

import re
from typing import Any

KNIGHT_ATOM = "telling-truth"
KNAVE_ATOM = "lying"
ATOM_TAGS = (KNIGHT_ATOM, KNAVE_ATOM)
OPERATOR_TAGS = ("not", "and", "or", "->", "<=>")

# A statement tree: ('telling-truth', 0), ('and', ('lying', 1), ('telling-truth', 2)), ...
Statement = tuple[Any, ...]
Puzzle = tuple[Statement, ...]
StatementLike = Statement | list


def is_atom(statement: Statement) -> bool:
    """True for a leaf ``('telling-truth', j)`` or ``('lying', j)``."""
    return statement[0] in ATOM_TAGS


def validate_statement(statement: Any, n_people: int | None = None) -> Statement:
    """Check that ``statement`` is a well-formed tree (and, when ``n_people`` is given, that every person index is in
    ``0..n_people-1``); return it unchanged. Raises ``ValueError`` otherwise."""
    if not isinstance(statement, tuple) or not statement:
        raise ValueError(f"a statement must be a non-empty tuple, got {statement!r}")
    tag = statement[0]
    if tag in ATOM_TAGS:
        if len(statement) != 2 or type(statement[1]) is not int:
            raise ValueError(f"an atom must be ({tag!r}, person_index), got {statement!r}")
        person = statement[1]
        upper = n_people if n_people is not None else None
        if person < 0 or (upper is not None and person >= upper):
            valid = f"0..{upper - 1}" if upper is not None else ">= 0"
            raise ValueError(f"person index {person} in {statement!r} is outside {valid}")
        return statement
    if tag == "not":
        if len(statement) != 2:
            raise ValueError(f"'not' takes exactly one operand, got {statement!r}")
    elif tag in ("and", "or"):
        if len(statement) < 3:
            raise ValueError(f"{tag!r} takes at least two operands, got {statement!r}")
    elif tag in ("->", "<=>"):
        if len(statement) != 3:
            raise ValueError(f"{tag!r} takes exactly two operands, got {statement!r}")
    else:
        valid = ", ".join(repr(t) for t in ATOM_TAGS + OPERATOR_TAGS)
        raise ValueError(f"unknown statement tag {tag!r}; valid tags: {valid}")
    for child in statement[1:]:
        validate_statement(child, n_people)
    return statement


def evaluate(statement: Statement, assignment: tuple[bool, ...] | list[bool]) -> bool:
    """Truth value of ``statement`` when ``assignment[j]`` says whether person j is a knight."""
    tag = statement[0]
    if tag == KNIGHT_ATOM:
        return bool(assignment[statement[1]])
    if tag == KNAVE_ATOM:
        return not assignment[statement[1]]
    if tag == "not":
        return not evaluate(statement[1], assignment)
    if tag == "and":
        return all(evaluate(child, assignment) for child in statement[1:])
    if tag == "or":
        return any(evaluate(child, assignment) for child in statement[1:])
    if tag == "->":
        return (not evaluate(statement[1], assignment)) or evaluate(statement[2], assignment)
    if tag == "<=>":
        return evaluate(statement[1], assignment) == evaluate(statement[2], assignment)
    raise ValueError(f"unknown statement tag {tag!r}")


def mentioned_people(statement: Statement) -> list[int]:
    """People named in ``statement``, in order of first mention (left-to-right, no duplicates)."""
    seen: list[int] = []

    def walk(node: Statement) -> None:
        if is_atom(node):
            if node[1] not in seen:
                seen.append(node[1])
            return
        for child in node[1:]:
            walk(child)

    walk(statement)
    return seen


def format_statements(puzzle: Puzzle) -> str:
    """The ``statements`` column text: Python ``repr`` of the tuple of statements."""
    return repr(tuple(puzzle))


# -------------------------------------------------------------------------------------------- Parser for the repr
# text (no eval) --------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<open>\() | (?P<close>\)) | (?P<comma>,)
      | '(?P<squote>[^'\\]*)' | "(?P<dquote>[^"\\]*)"
      | (?P<int>-?\d+)
    )""",
    re.VERBOSE,
)


def _tokenize(text: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos = 0
    end = len(text.rstrip())
    while pos < end:
        match = _TOKEN_RE.match(text, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"unexpected character {text[pos : pos + 1]!r} at offset {pos}")
        kind = match.lastgroup
        assert kind is not None
        if kind in ("squote", "dquote"):
            tokens.append(("str", match.group(kind)))
        elif kind == "int":
            tokens.append(("int", int(match.group(kind))))
        else:
            tokens.append((kind, None))
        pos = match.end()
    return tokens


class _TupleParser:
    """Recursive descent over ``tuple := '(' [item (',' item)* [',']] ')'``, ``item := tuple | 'string' | int``."""

    def __init__(self, tokens: list[tuple[str, Any]]) -> None:
        self.tokens = tokens
        self.pos = 0

    def _peek(self) -> str:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else "end"

    def _expect(self, kind: str) -> Any:
        if self._peek() != kind:
            raise ValueError(f"expected {kind!r} at token {self.pos}, found {self._peek()!r}")
        value = self.tokens[self.pos][1]
        self.pos += 1
        return value

    def item(self) -> Any:
        kind = self._peek()
        if kind == "open":
            return self.parse_tuple()
        if kind in ("str", "int"):
            return self._expect(kind)
        raise ValueError(f"expected a tuple, string or integer at token {self.pos}, found {kind!r}")

    def parse_tuple(self) -> tuple[Any, ...]:
        self._expect("open")
        items: list[Any] = []
        while self._peek() != "close":
            items.append(self.item())
            if self._peek() == "comma":
                self.pos += 1
            elif self._peek() != "close":
                raise ValueError(f"expected ',' or ')' at token {self.pos}, found {self._peek()!r}")
        self._expect("close")
        return tuple(items)

    def parse_all(self) -> tuple[Any, ...]:
        value = self.parse_tuple()
        if self._peek() != "end":
            raise ValueError(f"unexpected trailing text at token {self.pos}")
        return value


def parse_statements(text: str, n_people: int | None = None) -> Puzzle:
    """Parse the ``statements`` column (the repr of a tuple of statements) without ``eval``.

    Accepts single- or double-quoted tags, any whitespace and trailing commas. When ``n_people`` is given, the puzzle
    must have exactly that many statements and indices in ``0..n_people-1``.

    >>> parse_statements("(('lying', 1), ('and', ('telling-truth', 0), ('telling-truth', 1)))")
    (('lying', 1), ('and', ('telling-truth', 0), ('telling-truth', 1)))"""
    if not isinstance(text, str):
        raise ValueError(f"statements must be a string, got {type(text).__name__}")
    try:
        puzzle = _TupleParser(_tokenize(text)).parse_all()
    except ValueError as err:
        raise ValueError(f"cannot parse statements {text[:80]!r}: {err}") from None
    if n_people is not None and len(puzzle) != n_people:
        raise ValueError(f"expected {n_people} statements (one per person), got {len(puzzle)}")
    size = n_people if n_people is not None else len(puzzle)
    for statement in puzzle:
        validate_statement(statement, size)
    return puzzle


# -------------------------------------------------------------------------------------------- Natural-language
# rendering (§6.4) --------------------------------------------------------------------------------------------


def render_statement(statement: Statement, names: list[str] | tuple[str, ...]) -> str:
    """English text of a depth <= 2 statement (``If Zoey is a knight then Oliver is a knave``) with the reference's
    wording quirks; deeper trees raise ``ValueError``."""
    tag = statement[0]
    if tag == KNIGHT_ATOM:
        return f"{names[statement[1]]} is a knight"
    if tag == KNAVE_ATOM:
        return f"{names[statement[1]]} is a knave"
    children = statement[1:]
    if not all(is_atom(child) for child in children):
        raise ValueError(f"only depth <= 2 statements can be rendered, got {statement!r}")
    if tag == "not":
        role = "knight" if children[0][0] == KNIGHT_ATOM else "knave"
        return f"{names[children[0][1]]} is not a {role}"
    parts = [render_statement(child, names) for child in children]
    if tag == "and":
        return " and ".join(parts)
    if tag == "or":
        return " or ".join(parts)
    if tag == "->":
        return f"If {parts[0]} then {parts[1]}"
    if tag == "<=>":
        return f"{parts[0]} if and only if {parts[1]}"
    raise ValueError(f"unknown statement tag {tag!r}")


_COMPACT_JOINERS = {"and": "{0} and {1}", "or": "{0} or {1}", "->": "if {0} then {1}", "<=>": "{0} iff {1}"}


def render_statement_compact(statement: Statement, names: list[str] | tuple[str, ...]) -> str:
    """Terse text of a statement for small models: ``Zoey knight``, ``not Oliver knave``, ``if Zoey knight then Oliver
    knave``, ``Zoey knight iff Oliver knave`` (any depth)."""
    tag = statement[0]
    if tag == KNIGHT_ATOM:
        return f"{names[statement[1]]} knight"
    if tag == KNAVE_ATOM:
        return f"{names[statement[1]]} knave"
    parts = [render_statement_compact(child, names) for child in statement[1:]]
    if tag == "not":
        return f"not {parts[0]}"
    if tag in _COMPACT_JOINERS and len(parts) == 2:
        return _COMPACT_JOINERS[tag].format(*parts)
    if tag in ("and", "or"):
        return f" {tag} ".join(parts)
    raise ValueError(f"unknown statement tag {tag!r}")


def compact_question(statements: str, names: list[str] | tuple[str, ...]) -> str:
    """One terse line per person (``Zoey says Oliver knave. Oliver says not Zoey knight.``) for the ``compact``
    template."""
    puzzle = parse_statements(statements, len(names))
    return " ".join(f"{names[i]} says {render_statement_compact(s, names)}." for i, s in enumerate(puzzle))
