"""The K&K reward against the spec's test vectors (kk.md §11.4), the templates' byte-exactness
(§10, §17.6), a property test over generated rows and a hypothesis fuzz test."""

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenbalance.tasks.kk import compute_score, generate_rows, score_response, score_with_metrics
from tokenbalance.tasks.kk.reward import POSSIBLE_TOTALS, KKScore, accuracy, accuracy_by_source
from tokenbalance.tasks.kk.templates import PLAIN, QWEN_BASE, QWEN_INSTRUCT, get_template, render_prompt

GOLD = {"solution_text_format": "(1) Zoey is a knight\n(2) Oliver is a knave", "statements": "((),)"}
C = "(1) Zoey is a knight\n(2) Oliver is a knave"
QUIZ = "You meet 2 inhabitants: Zoey, and Oliver. So who is a knight and who is a knave?"
P = QWEN_INSTRUCT.render(QUIZ)  # ends in <|im_start|>assistant\n<think>


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def test_reference_templates_are_byte_exact():
    # §10.2 and §10.3: lengths and SHA-256 of prefix and suffix.
    assert (len(QWEN_INSTRUCT.prefix), sha(QWEN_INSTRUCT.prefix)) == (
        622,
        "64806840465c8c36af99ee49107116942bcd78dbfd87b2ca10b335d1c4592802",
    )
    assert (len(QWEN_INSTRUCT.suffix), sha(QWEN_INSTRUCT.suffix)) == (
        41,
        "6e15548abe3a54a8dca08ecdcf39c8fdf549a6337e0f5296944f7f40771861b2",
    )
    assert (len(QWEN_BASE.prefix), sha(QWEN_BASE.prefix)) == (
        686,
        "e04350d7250c023e780e29a851bbad5c071986be1bc75f17e321c77a593c885a",
    )
    assert (len(QWEN_BASE.suffix), sha(QWEN_BASE.suffix)) == (
        19,
        "294545b08eb94d808c6dd912679086b6667ad4e92daed2c2b8f60d54c1f4a5a0",
    )
    assert P.endswith("<|im_start|>assistant\n<think>")


def test_plain_template_has_no_special_tokens_and_one_assistant_marker():
    prompt = render_prompt(QUIZ, "plain")
    assert "<|" not in prompt
    assert prompt.count("Assistant:") == 1 and prompt.endswith("\nAssistant: <think>")
    assert prompt == PLAIN.prefix + QUIZ + PLAIN.suffix
    with pytest.raises(ValueError, match="unknown template 'base'; valid templates: qwen-instruct, qwen-base, plain"):
        get_template("base")


# §11.4, appended to P; expected totals from the reference run.
VECTORS = [
    (" r </think>\n<answer> (1) Zoey is a knight\n(2) Oliver is a knave </answer><|im_end|>", 3),
    (" r </think><answer>Oliver is a knave, Zoey is a knight</answer>", 3),
    (" r </think><answer>(1) zoey IS A KNIGHT\n(2) oliver is a knave</answer>", 3),
    (f" r </think><answer>{C}</answer> extra trailing text", 3),
    (" r </think><answer>(1) Zoey is a knave\n(2) Oliver is a knave</answer>", -0.5),
    (" r </think><answer>(1) Zoey is a knight\n(2) Oliver is a knave (not a knight)</answer>", -1),
    (" r </think><answer>(1) Zoey: knight\n(2) Oliver: knave</answer>", -1),
    (" r </think><answer> </answer>", -1),
    (f"<think> r </think><answer>{C}</answer>", -3),
    (" r </think> Zoey is a knight, Oliver is a knave", -3),
    (f" r </think><answer>(1)…</answer><answer>{C}</answer>", -3),
    (f" r <answer>{C}</answer></think>", -3),
    # additional edge cases
    (" r </think><answer>Zoey is  a\nknight, Oliver is a knave</answer>", 3),
    (" r </think><answer>Zoey is a Knight, Oliver is a KNAVE</answer>", 3),
    (" r </think><answer>Zoey is a knights and Oliver is a knave</answer>", -1),
    (" r </think><answer>Zoey is an knight, Oliver is a knave</answer>", -1),
    (" r </think><answer>Oliver is a knave</answer>", -1),
    (" r </think><answer>Zoey is a knight. Oliver is a knave. Both knights?</answer>", -1),
    (" r </think><answer>Zoey is a knight, Oliver is a knave, Zoey is a knave</answer>", -1),
    (" r </think></answer>Zoey is a knight, Oliver is a knave<answer>", -3),
    (" r </think><answer>Zoey is a knight, Oliver is a knave</answer>\n<|im_end|>Assistant: hi", -3),
]


@pytest.mark.parametrize(("response", "expected"), VECTORS)
def test_spec_vectors(response, expected):
    assert compute_score(P + response, GOLD) == expected
    # The same text scored as a bare response gives the same total (header put back in front).
    assert score_response(response, GOLD, "qwen-instruct").total == expected


def test_full_string_cases():
    # No header at all: answer None (-2), format judged on the whole string (+1).
    result = score_with_metrics(f"<think> r </think><answer>{C}</answer>", GOLD)
    assert result == KKScore(total=-1.0, format_ok=True, answer_parsed=False, correct=False)
    # Base template.
    assert compute_score(QWEN_BASE.render(QUIZ) + f" r </think><answer>{C}</answer>", GOLD) == 3
    # The plain template works with the unchanged reward.
    assert compute_score(PLAIN.render(QUIZ) + f" r </think><answer>{C}</answer>", GOLD) == 3
    assert compute_score(PLAIN.render(QUIZ) + f"<think> r </think><answer>{C}</answer>", GOLD) == -3


def test_components_and_metrics():
    wrong = score_with_metrics(P + " r </think><answer>(1) Zoey is a knave\n(2) Oliver is a knave</answer>", GOLD)
    assert wrong == KKScore(total=-0.5, format_ok=True, answer_parsed=True, correct=False)
    assert (wrong.format_score, wrong.answer_score) == (1.0, -1.5)
    assert wrong.metrics() == {"format_ok": 1.0, "answer_parsed": 1.0, "correct": 0.0}
    bad = score_with_metrics(P + "<think></think>", GOLD)
    assert (bad.total, bad.format_score, bad.answer_score) == (-3.0, -1.0, -2.0)
    assert bad.metrics() == {"format_ok": 0.0, "answer_parsed": 0.0, "correct": 0.0}


def test_ground_truth_as_string_and_bad_ground_truth():
    assert compute_score(P + f" r </think><answer>{C}</answer>", C) == 3
    with pytest.raises(ValueError, match=r"ground_truth\['solution_text_format'\] must be a string"):
        compute_score(P, {"statements": "()"})
    with pytest.raises(ValueError, match="solution_str must be a string"):
        compute_score(None, GOLD)
    with pytest.raises(ValueError, match="unknown template"):
        score_response("x", GOLD, "chatml")


def test_reward_prints_nothing(capsys):
    compute_score(P + f" r </think><answer>{C}</answer>", GOLD)
    compute_score("garbage", GOLD)
    assert capsys.readouterr() == ("", "")


@pytest.fixture(scope="module")
def logic_rl_test_rows():
    return [row for n_people in range(3, 8) for row in generate_rows(n_people, "test")]


@pytest.mark.parametrize("template", ["qwen-instruct", "qwen-base", "plain"])
def test_every_generated_test_row_scores_3_with_its_gold_answer(logic_rl_test_rows, template):
    # §11.4 property test, on the Logic-RL test rows of n = 3..7 (500 rows) for each template.
    assert len(logic_rl_test_rows) == 500
    for row in logic_rl_test_rows:
        gold = row["reward_model"]["ground_truth"]
        prompt = get_template(template).render(row["quiz"])
        if template == "qwen-instruct":
            assert prompt == row["prompt"][0]["content"]
        text = prompt + " reasoning </think>\n<answer> " + gold["solution_text_format"] + " </answer><|im_end|>"
        assert compute_score(text, gold) == 3


def test_accuracy_metric():
    # §17.8
    assert accuracy([3, -0.5, 3, -3]) == 0.5
    assert accuracy_by_source([3, -1, 3, 3, -3], ["kk_logic3", "kk_logic3", "kk_logic4", "kk_logic4", "kk_logic5"]) == {
        "kk_logic3": 0.5,
        "kk_logic4": 1.0,
        "kk_logic5": 0.0,
        "mean": 0.5,
    }
    with pytest.raises(ValueError, match="at least one reward"):
        accuracy([])


PIECES = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "Assistant:",
        "<|im_start|>assistant",
        "<|im_end|>",
        "Zoey",
        "Oliver",
        " is a ",
        "knight",
        "knave",
        "knights",
        "(1) ",
        "\n",
        " ",
        ",",
        ".",
        "\\b",
        "(",
        "[",
    ]
)
FUZZ_TEXT = st.lists(st.one_of(PIECES, st.text(max_size=8)), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=FUZZ_TEXT, gold=st.one_of(st.just(C), st.text(max_size=40)))
def test_fuzz_never_raises_and_only_four_totals(text, gold):
    result = score_with_metrics(text, {"solution_text_format": gold})
    assert result.total in POSSIBLE_TOTALS
    assert (result.total == 3) == result.correct
    assert result.correct <= result.answer_parsed <= result.format_ok
    assert result.total == result.format_score + result.answer_score
    assert score_response(text, gold, "plain").total in POSSIBLE_TOTALS
