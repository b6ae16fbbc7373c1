"""The compact template: terse statements for tiny models, same puzzle and reward semantics."""

import pytest

from tokenbalance.tasks import get_task
from tokenbalance.tasks.kk.statements import compact_question, render_statement_compact
from tokenbalance.tasks.kk.templates import TEMPLATE_NAMES, get_template

NAMES = ("Zoey", "Oliver", "Ava")


@pytest.mark.parametrize(
    "statement, text",
    [
        (("telling-truth", 1), "Oliver knight"),
        (("not", ("lying", 0)), "not Zoey knave"),
        (("and", ("lying", 0), ("telling-truth", 2)), "Zoey knave and Ava knight"),
        (("or", ("lying", 0), ("telling-truth", 2)), "Zoey knave or Ava knight"),
        (("->", ("telling-truth", 1), ("lying", 2)), "if Oliver knight then Ava knave"),
        (("<=>", ("telling-truth", 0), ("lying", 0)), "Zoey knight iff Zoey knave"),
    ],
)
def test_compact_statement_rendering(statement, text):
    assert render_statement_compact(statement, NAMES) == text


def test_compact_question_from_statement_text():
    statements = "(('not', ('telling-truth', 2)), ('telling-truth', 0), ('<=>', ('lying', 1), ('lying', 0)))"
    assert compact_question(statements, NAMES) == (
        "Zoey says not Ava knight. Oliver says Zoey knight. Ava says Oliver knave iff Zoey knave."
    )


def test_compact_prompts_score_the_gold_answer_3_and_are_short():
    task = get_task("kk")
    assert "compact" in TEMPLATE_NAMES
    examples = task.examples("test", difficulty=3, template="compact")
    plain = task.examples("test", difficulty=3, template="plain")
    assert examples[0].prompt.startswith("User: ") and examples[0].prompt.endswith("\nAssistant: <think>")
    for example in examples:
        gold = example.ground_truth["solution_text_format"]
        assert task.score(f" </think>\n<answer> {gold} </answer>", example).reward == 3.0
    assert sum(map(len, (e.prompt for e in examples))) < 0.4 * sum(map(len, (e.prompt for e in plain)))
    assert task.render_prompt(plain[0], "compact") == examples[0].prompt


def test_compact_needs_statements():
    with pytest.raises(ValueError, match="renders the puzzle from its statements and names"):
        get_template("compact").render_puzzle("quiz text", None, NAMES)
