"""The arith working's noisy teacher (``sft.error_rate``) and its token classes: a slip is a result
off by one or another operator applied to the same operands, the working goes on consistently from
what it wrote, the order and wording are the clean working's, slips come at the asked rate, and every
character's class (decision, copy, wording, format) is known, for the generator's text and for a
model's."""

import math
import random

import pytest

from tests.tasks.test_arith import independent_value
from tokenbalance.config import SFTConfig
from tokenbalance.run.examples import check_sft_target
from tokenbalance.tasks import get_task
from tokenbalance.tasks.arith import DECISION_CLASSES, ArithTask, render_expression
from tokenbalance.tasks.arith_cot import (
    EQUALS,
    LINKS,
    NoisyTeacher,
    divisions_exact,
    piece_classes,
    ready_operations,
    replaced,
    subtree,
    text_classes,
    working,
    working_pieces,
)
from tokenbalance.tasks.base import BaseTask, drawn_choices

TASK = ArithTask(timeout_s=None)
TREE = ("+", ("*", ("-", 14, 5), 3), ("/", 12, 4))  # (14 - 5) * 3 + 12 / 4 = 30


def steps_of(text):
    """(operation text, equals word, written result, rewritten expression or None) per sentence."""
    *sentences, _closer = text.strip().split(". ")
    parsed = []
    for sentence in sentences:
        sentence = sentence.removesuffix(".")
        link = next((link for link in LINKS if link in sentence), None)
        computed, rest = sentence.split(link) if link else (sentence, None)
        equals = next(e for e in EQUALS if f" {e} " in computed)
        operation, result = computed.split(f" {equals} ", 1)
        parsed.append((operation, int(result.strip("()")), None if rest is None else rest.strip()))
    return parsed


def test_rate_zero_is_the_clean_working_and_draws_are_unchanged():
    for example in TASK.examples("train", difficulty=3, count=50):
        tree = example.extra["tree"]
        clean = working(tree, drawn_choices(example))
        assert working(tree, drawn_choices(example), NoisyTeacher(0.0, random.Random(1))) == clean
        assert TASK.sft_response(example, "cot_random", error_rate=0.0) == " " + clean


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_every_operation_slips_at_rate_one_and_the_working_goes_on_from_it(level):
    unslipped = operations = 0
    for example in TASK.examples("train", difficulty=level, count=40):
        text = TASK.sft_response(example, "cot", error_rate=1.0)  # the reference order: replayable
        tree = example.extra["tree"]
        for operation, result, rest in steps_of(text):
            path = ready_operations(tree)[0]
            true_operator, left, right = subtree(tree, path)
            written_left, operator, written_right = operation.rsplit(" ", 2)
            assert (independent_value(written_left), independent_value(written_right)) == (left, right)  # copied
            true_value = int(independent_value(f"{left} {true_operator} {right}"))
            if operator == true_operator and result == true_value:  # no slip keeps the later divisions exact
                assert level >= 3 and all(
                    not divisions_exact(replaced(tree, path, v))
                    for v in (true_value - 1, true_value + 1, left + right, left - right, left * right)
                    if v != true_value and (v >= 0 or true_value < 0)
                ), text
                unslipped += 1
            elif operator == true_operator:  # a result off by one
                assert abs(result - true_value) == 1, text
            else:  # another operator, applied right
                assert operator in "+-*" and result == independent_value(operation) != true_value, text
            tree = replaced(tree, path, result)  # the working goes on from what it wrote
            assert rest is None or rest == render_expression(tree), text
        assert isinstance(tree, int) and text.endswith(f"\\boxed{{{tree}}}.")
        operations += len(steps_of(text))
    assert unslipped <= 0.2 * operations


def test_slips_keep_the_clean_order_and_wording():
    for example in TASK.examples("train", difficulty=2, count=60):
        tree = example.extra["tree"]
        clean = working_pieces(tree, drawn_choices(example))
        noisy = working_pieces(tree, drawn_choices(example), NoisyTeacher(0.5, drawn_choices(example, "slips")))
        assert [p.kind for p in noisy if p.kind != "format"] == [p.kind for p in clean if p.kind != "format"]
        assert [p.text for p in noisy if p.kind == "wording"] == [p.text for p in clean if p.kind == "wording"]


def test_slips_come_at_the_asked_rate_and_lower_the_teachers_accuracy():
    rate, operations, slips, correct = 0.25, 0, 0, 0
    examples = TASK.examples("train", difficulty=2, count=400)
    for example in examples:
        text = TASK.sft_response(example, "cot", error_rate=rate)
        clean = steps_of(TASK.sft_response(example, "cot"))
        noisy = steps_of(text)
        operations += len(clean)
        first_slip = next((i for i, (a, b) in enumerate(zip(noisy, clean)) if a[:2] != b[:2]), None)
        slips += first_slip is not None  # at least one slip in this working
        correct += TASK.score(text, example).reward
    expected = 1 - (1 - rate) ** 3  # level 2: three operations
    sd = math.sqrt(expected * (1 - expected) / len(examples))
    assert operations == 3 * len(examples)
    assert abs(slips / len(examples) - expected) < 5 * sd
    assert correct - (len(examples) - slips) <= 0.05 * slips  # slips rarely cancel out (+1 then -1)
    assert TASK.sft_response(examples[0], "cot", error_rate=rate) == TASK.sft_response(
        examples[0], "cot", error_rate=rate
    )


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_classes_of_the_generators_text_are_the_pieces_classes(level):
    for example in TASK.examples("train", difficulty=level, count=30):
        for target in ("cot", "cot_random"):
            for rate in (0.0, 0.5):
                rng = drawn_choices(example) if target == "cot_random" else None
                errors = NoisyTeacher(rate, drawn_choices(example, "slips")) if rate else None
                pieces = working_pieces(example.extra["tree"], rng, errors)
                text = "".join(p.text for p in pieces)
                assert text_classes(text) == piece_classes(pieces), text


def test_classes_of_a_models_text():
    text = " Now 12 + 5 gives 18; this leaves 18 * (-2). 18 * (-2) = (-36). So the result is \\boxed{-36}."
    kinds = text_classes(text)

    def kind_at(fragment, occurrence=0, offset=0):
        start = -1
        for _ in range(occurrence + 1):
            start = text.index(fragment, start + 1)
        return kinds[start + offset]

    assert kind_at("Now") == "wording" and kind_at("12") == "copy" and kind_at("+") == "operator"
    assert kind_at("gives") == "wording" and kind_at("18") == "result" and kind_at("; this leaves") == "wording"
    assert kind_at("18", 1) == "copy" and kind_at("*", 0) == "copy"  # the rewritten expression copies
    assert kind_at("*", 1) == "operator" and kind_at("-36") == "result" and kind_at("(", 2) == "format"
    assert kind_at("So the result is") == "wording" and kind_at("-36", 1) == "copy" and kind_at("{") == "format"
    assert set(DECISION_CLASSES) == {"result", "operator"}
    assert TASK.text_classes(text) == kinds and BaseTask().text_classes(text) is None  # a task that does not tell


def test_error_rate_is_refused_where_it_cannot_apply():
    (example,) = TASK.examples("train", difficulty=1, count=1)
    with pytest.raises(ValueError, match="not to 'answer'"):
        TASK.sft_response(example, "answer", error_rate=0.2)
    with pytest.raises(ValueError, match="task 'kk' has no noisy teacher"):
        check_sft_target(get_task("kk"), SFTConfig(target="cot", error_rate=0.2))
    with pytest.raises(ValueError, match="sft.target=cot or cot_random"):
        check_sft_target(TASK, SFTConfig(target="answer", error_rate=0.2))
    check_sft_target(TASK, SFTConfig(target="cot", error_rate=0.2))  # accepted
    check_sft_target(get_task("kk"), SFTConfig(target="answer"))  # no noisy teacher asked: nothing to check
