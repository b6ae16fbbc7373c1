"""Statement trees, the no-eval parser, English rendering and the truth-table solver
(spec kk.md §3, §6.4, §17.1, §17.5)."""

import itertools

import pytest

from tokenbalance.tasks.kk.solver import all_solutions, count_solutions, truth_mask
from tokenbalance.tasks.kk.statements import (
    evaluate,
    format_statements,
    mentioned_people,
    parse_statements,
    render_statement,
)

NAMES = ("Zoey", "Oliver", "Emma")
# spec §3.1 example
REPR_3 = (
    "(('<=>', ('telling-truth', 2), ('telling-truth', 0)), ('or', ('telling-truth', 1), "
    "('telling-truth', 2)), ('<=>', ('lying', 0), ('lying', 1)))"
)


def test_solver_spec_fixture_has_one_solution():
    # §17.1. By hand: A says "B is a knave", B says "A and B are knights". B cannot be a knight
    # (A would be a knight saying B is a knave), so B is a knave, and then A's claim is true.
    puzzle = (("lying", 1), ("and", ("telling-truth", 0), ("telling-truth", 1)))
    assert all_solutions(puzzle) == [(True, False)]
    assert count_solutions(puzzle) == 1


def test_solver_orders_solutions_all_knights_first_and_matches_brute_force():
    # Each says "I am a knight": every assignment is consistent (4 solutions, product order).
    puzzle = (("telling-truth", 0), ("telling-truth", 1))
    assert all_solutions(puzzle) == [(True, True), (True, False), (False, True), (False, False)]
    # "A is a knave" said by B, "B is a knave" said by A: exactly the two mixed assignments.
    puzzle = (("lying", 1), ("lying", 0))
    assert all_solutions(puzzle) == [(True, False), (False, True)]
    # A paradox: A says "A is not a knight" -> no solution.
    assert all_solutions((("not", ("telling-truth", 0)), ("telling-truth", 1))) == []


def test_truth_mask_agrees_with_recursive_evaluation():
    statements = [
        ("->", ("telling-truth", 0), ("lying", 2)),
        ("<=>", ("lying", 1), ("telling-truth", 2)),
        ("and", ("lying", 0), ("telling-truth", 1), ("lying", 2)),
        ("or", ("telling-truth", 0), ("lying", 1)),
        ("not", ("and", ("telling-truth", 0), ("telling-truth", 1))),
    ]
    for statement in statements:
        mask = truth_mask(statement, 3)
        for candidate, assignment in enumerate(itertools.product([True, False], repeat=3)):
            assert bool(mask >> candidate & 1) == evaluate(statement, assignment)


def test_parse_statements_round_trips_repr():
    puzzle = parse_statements(REPR_3)
    assert puzzle == (
        ("<=>", ("telling-truth", 2), ("telling-truth", 0)),
        ("or", ("telling-truth", 1), ("telling-truth", 2)),
        ("<=>", ("lying", 0), ("lying", 1)),
    )
    assert format_statements(puzzle) == REPR_3
    assert all_solutions(puzzle) == [(True, True, True)]  # §8.2: solution [True, True, True]


def test_parse_statements_accepts_double_quotes_whitespace_and_trailing_commas():
    text = '( ("not", ("lying", 1),) ,\n ("telling-truth",0), )'
    assert parse_statements(text) == (("not", ("lying", 1)), ("telling-truth", 0))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("__import__('os').system('echo hi')", "unexpected character"),
        ("(('lying', 1), ('and', ('telling-truth', 0)))", "at least two operands"),
        ("(('lying', 5), ('telling-truth', 0))", "outside 0..1"),
        ("(('xor', ('lying', 1), ('lying', 0)), ('lying', 0))", "unknown statement tag 'xor'"),
        ("(('lying', 1), ('lying', 0)", "found 'end'"),
        ("(('lying', 1), ('lying', 0)) extra", "unexpected character"),
        ("(('lying', True), ('lying', 0))", "unexpected character"),
        ("(('not', ('lying', 1), ('lying', 0)), ('lying', 0))", "exactly one operand"),
        ("", "expected 'open'"),
    ],
)
def test_parse_statements_rejects_bad_text(text, fragment):
    with pytest.raises(ValueError, match="cannot parse statements|statement|operand|outside|tag") as info:
        parse_statements(text, n_people=2)
    assert fragment in str(info.value)


def test_parse_statements_checks_the_number_of_people():
    with pytest.raises(ValueError, match="expected 3 statements"):
        parse_statements("(('lying', 1), ('lying', 0))", n_people=3)


def test_render_connectives_exactly():
    # §17.5 and §6.4
    assert render_statement(("->", ("telling-truth", 1), ("lying", 1)), NAMES) == (
        "If Oliver is a knight then Oliver is a knave"
    )
    assert render_statement(("not", ("lying", 0)), NAMES) == "Zoey is not a knave"
    assert render_statement(("not", ("telling-truth", 2)), NAMES) == "Emma is not a knight"
    assert render_statement(("and", ("lying", 1), ("telling-truth", 2)), NAMES) == (
        "Oliver is a knave and Emma is a knight"
    )
    assert render_statement(("or", ("telling-truth", 0), ("lying", 2)), NAMES) == (
        "Zoey is a knight or Emma is a knave"
    )
    assert render_statement(("<=>", ("lying", 0), ("lying", 1)), NAMES) == (
        "Zoey is a knave if and only if Oliver is a knave"
    )
    with pytest.raises(ValueError, match="depth <= 2"):
        render_statement(("not", ("not", ("lying", 0))), NAMES)


def test_mentioned_people_in_first_mention_order():
    assert mentioned_people(("<=>", ("lying", 2), ("telling-truth", 0))) == [2, 0]
    assert mentioned_people(("and", ("lying", 1), ("telling-truth", 1))) == [1]
