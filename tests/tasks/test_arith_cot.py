"""The arith task's step-by-step working (``sft.target=cot`` / ``cot_random``): every sentence is a
true reduction, every order and wording ends in the scored answer, the reference is fixed and the
drawn one is fixed per problem but varies across problems."""

import random

import pytest

from tests.tasks.test_arith import independent_value
from tokenbalance.tasks.arith import ArithTask, evaluate_expression
from tokenbalance.tasks.arith_cot import CLOSERS, EQUALS, LEADS, LINKS, ready_operations, replaced, working

TREE = ("+", ("*", ("-", 14, 5), 3), ("/", 12, 4))  # (14 - 5) * 3 + 12 / 4 = 30
TASK = ArithTask(timeout_s=None)


def value(text):
    """The value of an expression text of ours (the arith tests' independent evaluator)."""
    return independent_value(text.strip())


def without_lead(sentence):
    lead = next(lead for lead in sorted(LEADS, key=len, reverse=True) if sentence.startswith(lead))
    return sentence.removeprefix(lead)


def test_reference_working_is_the_documented_text():
    assert working(TREE) == (
        "14 - 5 = 9, so we have 9 * 3 + 12 / 4. 9 * 3 = 27, so we have 27 + 12 / 4. "
        "12 / 4 = 3, so we have 27 + 3. 27 + 3 = 30. The answer is \\boxed{30}."
    )


def test_ready_operations_and_replacement():
    assert ready_operations(TREE) == [(1, 1), (2,)]
    assert replaced(TREE, (2,), 3) == ("+", ("*", ("-", 14, 5), 3), 3)
    assert ready_operations(7) == []


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("target", ["cot", "cot_random"])
def test_every_sentence_is_a_true_reduction_and_the_answer_scores(level, target):
    for example in TASK.examples("train", difficulty=level, count=40):
        response = TASK.sft_response(example, target)
        assert TASK.score(response, example).reward == 1.0
        answer = int(example.ground_truth)
        *steps, closer = response.strip().split(". ")
        assert any(closer.startswith(c) for c in CLOSERS) and closer.endswith(f"\\boxed{{{answer}}}.")
        assert len(steps) == str(example.extra["tree"]).count("'") // 2  # one sentence per operation
        for step in steps:
            step = step.removesuffix(".")
            step = without_lead(step)
            link = next((link for link in LINKS if link in step), None)
            computed, rest = step.split(link) if link else (step, None)
            equals = next(e for e in EQUALS if f" {e} " in computed)
            left, right = computed.split(f" {equals} ", 1)
            assert value(left) == value(right)  # the operation and its result
            if rest is not None:
                assert value(rest.strip()) == answer  # the rewritten expression keeps the value


def test_reference_and_drawn_workings():
    examples = TASK.examples("train", difficulty=3, count=200)
    reference = [TASK.sft_response(e, "cot") for e in examples]
    drawn = [TASK.sft_response(e, "cot_random") for e in examples]
    assert drawn == [TASK.sft_response(e, "cot_random") for e in examples]  # fixed per problem
    assert all(", so we have" in r and "The answer is" in r for r in reference)
    assert sum(d != r for d, r in zip(drawn, reference)) > 190
    text = " ".join(drawn)
    for options in (EQUALS, LINKS, CLOSERS, LEADS[1:]):
        assert all(f"{option}" in text for option in options)  # every wording is drawn somewhere
    # the drawn order: either ready operation of TREE may come first
    firsts = {without_lead(working(TREE, random.Random(seed)))[:6] for seed in range(40)}
    assert firsts == {"14 - 5", "12 / 4"}


def test_working_needs_a_generated_example_and_a_known_target():
    (example,) = TASK.examples("train", difficulty=2, count=1)
    with pytest.raises(ValueError, match="target: unknown value 'chain'"):
        TASK.sft_response(example, "chain")
    bare = type(example)(prompt="p", question="q", ground_truth="3", data_source="math")
    with pytest.raises(ValueError, match="no expression to write the working of"):
        TASK.sft_response(bare, "cot")
    assert TASK.sft_response(bare, "answer") == " \\boxed{3}"


def test_tokenizer_corpus_holds_the_working():
    corpus = list(TASK.tokenizer_corpus((1,), "plain"))
    examples = list(TASK.corpus_examples((1,), "plain"))
    assert len(corpus) == 600 and corpus[:3] == [
        examples[0].prompt,
        TASK.sft_response(examples[0], "answer"),
        TASK.sft_response(examples[0], "cot_random"),
    ]
    assert evaluate_expression(examples[0].extra["tree"]) == int(examples[0].ground_truth)
