"""Bit-exact generation: the Logic-RL fixtures of spec kk.md §8.2 field by field, the worked CoT
example of §7.3, the whole-file digests of §8.3 and the uniqueness rule (§5, §17.2-17.4).

Expected values are copied from the spec as literals (the spec is not read at test time)."""

import hashlib
import random

import numpy as np
import pytest

from tokenbalance.tasks import get_task
from tokenbalance.tasks.kk.cot import COT_FOOT_SUCCESS, COT_HEAD, Reconsider, chain_of_thought, search
from tokenbalance.tasks.kk.formatter import COMMON_NAMES, SAYING_TEMPLATES, join_with_oxford_comma
from tokenbalance.tasks.kk.generator import generate_problems, iter_problems
from tokenbalance.tasks.kk.records import default_slice, generate_rows, kk_record
from tokenbalance.tasks.kk.solver import count_solutions
from tokenbalance.tasks.kk.statements import parse_statements

INTRO = (
    "A very special island is inhabited only by knights and knaves. Knights always tell the "
    "truth, and knaves always lie. "
)
KNIGHT_KNAVE = {
    "knight": "knight", "knave": "knave", "a_knight": "a knight", "a_knave": "a knave",
    "Knight": "Knight", "Knave": "Knave",
}  # fmt: skip


def record(n_people, index):
    (problem,) = generate_problems(n_people, index, 1)
    return kk_record(problem)


def test_names_and_templates_lists():
    # §6.2, §6.3
    assert len(COMMON_NAMES) == 51 and len(set(COMMON_NAMES)) == 51
    assert COMMON_NAMES[:3] == ("Emma", "Liam", "Olivia") and COMMON_NAMES[-1] == "Penelope"
    assert len(SAYING_TEMPLATES) == 18
    assert SAYING_TEMPLATES[5] == 'In {name}\'s words: "{content}".'
    assert SAYING_TEMPLATES[10] == '"{content}" - {name}.'
    assert join_with_oxford_comma(["Zoey", "Oliver"]) == "Zoey, and Oliver"


def test_logic_rl_3ppl_train_row_0():
    # §8.2, Logic-RL 3-ppl train row 0 = K&K index 100
    row = generate_rows(3, "train", count=1)[0]
    assert row["quiz"] == INTRO + (
        'You meet 3 inhabitants: Michael, Zoey, and Ethan. Michael was heard saying, "Ethan is a '
        'knight if and only if Michael is a knight". "Zoey is a knight or Ethan is a knight," Zoey '
        'mentioned. Ethan asserted: "Michael is a knave if and only if Zoey is a knave". So who is '
        "a knight and who is a knave?"
    )
    assert row["names"] == ["Michael", "Zoey", "Ethan"]
    assert row["knight_knave"] == KNIGHT_KNAVE
    assert row["statements"] == (
        "(('<=>', ('telling-truth', 2), ('telling-truth', 0)), ('or', ('telling-truth', 1), "
        "('telling-truth', 2)), ('<=>', ('lying', 0), ('lying', 1)))"
    )
    assert row["solution"] == [True, True, True]
    assert row["solution_text"] == "Michael is a knight, Zoey is a knight, and Ethan is a knight."
    assert row["solution_text_format"] == ("(1) Michael is a knight\n(2) Zoey is a knight\n(3) Ethan is a knight")
    assert row["cot_head"] == (
        "Let's think step by step, by considering whether each person is lying and if that leads to contradiction."
    )
    assert row["cot_repeat_steps"] == [
        "Assume Michael is a knight. No contradiction is found in their claim that Ethan is a "
        "knight if and only if Michael is a knight.",
        "Assume Ethan is a knight. No contradiction is found in their claim that Michael is a knave "
        "if and only if Zoey is a knave.",
        "Assume Zoey is a knight. No contradiction is found in their claim that Zoey is a knight or Ethan is a knight.",
    ]
    assert row["cot_foot"] == "This leads to a feasible solution."
    assert row["index"] == 100
    assert row["data_source"] == "kk_logic"
    assert row["ability"] == "logic"
    assert row["reward_model"] == {
        "ground_truth": {
            "solution_text_format": row["solution_text_format"],
            "statements": row["statements"],
        },
        "style": "rule",
    }
    assert row["extra_info"] == {"index": 0, "split": "train"}
    assert len(row["prompt"]) == 1 and row["prompt"][0]["role"] == "user"
    content = row["prompt"][0]["content"]
    assert content.endswith(row["quiz"] + "\n<|im_end|>\n<|im_start|>assistant\n<think>")
    assert len(content) == 622 + len(row["quiz"]) + 41  # §10.2 prefix and suffix lengths


def test_logic_rl_3ppl_test_row_0():
    # §8.2, Logic-RL 3-ppl test row 0 = K&K index 1000
    row = generate_rows(3, "test", count=1)[0]
    assert row["index"] == 1000 and row["extra_info"] == {"index": 0, "split": "test"}
    assert row["quiz"] == INTRO + (
        "You meet 3 inhabitants: Amelia, Penelope, and Evelyn. Amelia said that Evelyn is not a "
        'knight. Penelope was heard saying, "Penelope is a knight or Evelyn is a knave". Evelyn '
        'was heard saying, "Penelope is a knight if and only if Penelope is a knave". So who is a '
        "knight and who is a knave?"
    )
    assert row["statements"] == (
        "(('not', ('telling-truth', 2)), ('or', ('telling-truth', 1), ('lying', 2)), "
        "('<=>', ('telling-truth', 1), ('lying', 1)))"
    )
    assert row["solution_text_format"] == ("(1) Amelia is a knight\n(2) Penelope is a knight\n(3) Evelyn is a knave")
    # The reordering rule (§7.3): Evelyn, mentioned by Amelia, is considered before Penelope.
    assert row["cot_repeat_steps"] == [
        "Assume Amelia is a knight. No contradiction is found in their claim that Evelyn is not a knight.",
        "Evelyn cannot be a knight, because this would contradict the claim of Amelia that Evelyn is not a knight.",
        "Assume Evelyn is a knave. No contradiction is found in their false claim that Penelope is a "
        "knight if and only if Penelope is a knave.",
        "Assume Penelope is a knight. No contradiction is found in their claim that Penelope is a "
        "knight or Evelyn is a knave.",
    ]


def test_logic_rl_7ppl_test_row_0():
    # §8.2, Logic-RL 7-ppl test row 0 = K&K index 1000
    row = record(7, 1000)
    assert row["names"] == ["Harper", "Benjamin", "Olivia", "Daniel", "Henry", "Jackson", "Sebastian"]
    assert row["statements"] == (
        "(('<=>', ('lying', 6), ('telling-truth', 4)), ('<=>', ('telling-truth', 4), "
        "('telling-truth', 2)), ('and', ('lying', 1), ('lying', 3)), ('lying', 5), "
        "('not', ('telling-truth', 2)), ('and', ('telling-truth', 0), ('telling-truth', 1)), "
        "('and', ('telling-truth', 3), ('telling-truth', 5)))"
    )
    assert row["solution_text_format"] == (
        "(1) Harper is a knight\n(2) Benjamin is a knave\n(3) Olivia is a knave\n(4) Daniel is a "
        "knight\n(5) Henry is a knight\n(6) Jackson is a knave\n(7) Sebastian is a knave"
    )
    assert row["quiz"] == INTRO + (
        "You meet 7 inhabitants: Harper, Benjamin, Olivia, Daniel, Henry, Jackson, and Sebastian. "
        'According to Harper, "Sebastian is a knave if and only if Henry is a knight". Benjamin '
        'asserted: "Henry is a knight if and only if Olivia is a knight". Olivia commented, '
        '"Benjamin is a knave and Daniel is a knave". Daniel stated, "Jackson is a knave". Henry '
        "told you that Olivia is not a knight. Jackson said that Harper is a knight and Benjamin is "
        "a knight. Sebastian told you that Daniel is a knight and Jackson is a knight. So who is a "
        "knight and who is a knave?"
    )
    steps = row["cot_repeat_steps"]
    assert len(steps) == 17
    assert sum(step.startswith("We have exhausted all possibilities for ") for step in steps) == 2


def test_kk_2ppl_index_0_and_self_conflict_wording():
    # §8.2, K&K 2-ppl release test index 0 (the "Zoey ... Oliver" example)
    row = record(2, 0)
    assert row["quiz"] == INTRO + (
        'You meet 2 inhabitants: Zoey, and Oliver. Zoey remarked, "Oliver is not a knight". '
        'Oliver stated, "Oliver is a knight if and only if Zoey is a knave". So who is a knight '
        "and who is a knave?"
    )
    assert row["statements"] == ("(('not', ('telling-truth', 1)), ('<=>', ('telling-truth', 1), ('lying', 0)))")
    assert row["solution_text"] == "Zoey is a knave, and Oliver is a knight."
    assert row["cot_repeat_steps"][2] == (
        "Oliver cannot be a knave, because this would contradict the false claim of their own that "
        "Oliver is a knight if and only if Zoey is a knave."
    )


def test_worked_cot_example_3ppl_index_105():
    # §7.3: Logic-RL 3-ppl train row 5 (K&K index 105), including a reconsider step.
    row = record(3, 105)
    assert row["quiz"].endswith(
        'You meet 3 inhabitants: Penelope, Matthew, and Victoria. "Penelope is a knight and '
        'Matthew is a knight," Penelope claimed. Matthew was heard saying, "Victoria is a knave and '
        'Victoria is a knight". Victoria said that If Matthew is a knight then Matthew is a knave. So '
        "who is a knight and who is a knave?"
    )
    assert row["cot_repeat_steps"] == [
        "Assume Penelope is a knight. No contradiction is found in their claim that Penelope is a knight and Matthew is a knight.",
        "Matthew cannot be a knight, because this would contradict the claim of their own that Victoria is a knave and Victoria is a knight.",
        "Matthew cannot be a knave, because this would contradict the claim of Penelope that Penelope is a knight and Matthew is a knight.",
        "We have exhausted all possibilities for Matthew, so let us go back and reconsider Penelope.",
        "Assume Penelope is a knave. No contradiction is found in their false claim that Penelope is a knight and Matthew is a knight.",
        "Matthew cannot be a knight, because this would contradict the claim of their own that Victoria is a knave and Victoria is a knight.",
        "Assume Matthew is a knave. No contradiction is found in their false claim that Victoria is a knave and Victoria is a knight.",
        "Assume Victoria is a knight. No contradiction is found in their claim that If Matthew is a knight then Matthew is a knave.",
    ]
    assert row["cot_foot"] == COT_FOOT_SUCCESS
    assert row["solution"] == [False, False, True]


def test_cot_backtracking_lists_exhausted_people_and_reports_failure():
    # Hand-traced: Dee, Ann and Bob each say "I am a knight" (always fine); Cy says "Cy is not a
    # knight", a paradox. Every branch dies at Cy; backtracking lists the exhausted people
    # ("Cy", "Cy and Bob", "Cy, Bob, and Ann") and the search ends in failure.
    puzzle = (("telling-truth", 0), ("telling-truth", 1), ("telling-truth", 2), ("not", ("telling-truth", 3)))
    head, steps, foot = chain_of_thought(puzzle, ("Dee", "Ann", "Bob", "Cy"))
    assert head == COT_HEAD
    assert foot == "All the configurations lead to contradictions."
    assert len(steps) == 37  # per Dee value: 1 + 17 steps; plus one "reconsider Dee"
    assert steps[3] == (
        "Cy cannot be a knight, because this would contradict the claim of their own that Cy is not a knight."
    )
    assert steps[4] == (
        "Cy cannot be a knave, because this would contradict the false claim of their own that Cy is not a knight."
    )
    assert steps[5] == "We have exhausted all possibilities for Cy, so let us go back and reconsider Bob."
    assert steps[6] == "Assume Bob is a knave. No contradiction is found in their false claim that Bob is a knight."
    assert steps[9] == ("We have exhausted all possibilities for Cy and Bob, so let us go back and reconsider Ann.")
    assert steps[18] == (
        "We have exhausted all possibilities for Cy, Bob, and Ann, so let us go back and reconsider Dee."
    )
    assert steps[19] == "Assume Dee is a knave. No contradiction is found in their false claim that Dee is a knight."


# §8.3 whole-file digests: SHA-256 of the quizzes joined by "\n" and of the solution_text_format
# strings joined by "\n\n", for Logic-RL {n}ppl/{train,test}.parquet. All ten take ~1.5 s here.
DIGESTS = {
    (3, "train"): ("1f42854464c6fb51aec36617b8ae108e4ef82b360d8bdf7f5b8b9125380ca8e6", "1dc50ad5fb163b2e6efd3953e72e53c00f9ed37dfba213edec4078bc78824fc6"),
    (3, "test"): ("4aaa41f5835fcd144227207df37cbb4beeed3dc2cda094b286ab194ac698739b", "cc9d03bd480f3ed75c67c0d7aef334da09f3dbc3b691e804921aad6afd6bde4d"),
    (4, "train"): ("6d46090b8d11216de9935675b2977d75fd07e6ee6010a292e1de617d814d832c", "d429209b5c105d36f5b7759bd94e0ff888f265e8d3e3201fdab663735d552503"),
    (4, "test"): ("10b0c23aa354e50764fa4c4a6be0339f323c284d548af63e41c0bf4d7f66cb33", "a5ae4943fc8c029ca585ef89a16f873f20819cdd3e0108edf02bb6fee042f044"),
    (5, "train"): ("8944f32103d59bbc9fae25ec7e0370d7e83e9b50c0d46a93cea36e88ed275eb8", "7d0df7fc412377c80abfb59567a80a92b24f2ac037579764ddaafc5075f3c172"),
    (5, "test"): ("c08f427f2f9d56c862daeb74816433542e280991cc5482070b307184b552ea4c", "12a9cb36fc37bb8df98cb635116a930e153a226d88bce7d9e9da072744bcac87"),
    (6, "train"): ("329099a45f3fcb988bcd9219650b2931b3c7733449a3c6e65b299934706e188e", "86ef5ce2356a154c307f55053593a8eb6e1baea3ffc6430045d9963546834677"),
    (6, "test"): ("30e491ffb861a9ed730455db44edeac9c0d39cdc19a62fe21e33643826f09d20", "2b40f10a78a3735279a7a584d0ff11591606299c07bad2a40a7ee7a7056460b2"),
    (7, "train"): ("4a089baf38fa3bfc1edd2f332f63cf456374d43f38d5ebb7ca73fcc97b0c79cd", "41dd85976667833498496264d698d6ff38d599a8e7f9d097292f81e30d3ee43f"),
    (7, "test"): ("de21169774acab9057da70bf5cb409012ba41d9fc4ec4097bcad6e7e1baf7a88", "e38bf570f8a4df3e996901b218d1323bc1730b8bd66bdbf5e7c5248f85b0b0cc"),
}  # fmt: skip


@pytest.mark.parametrize("n_people", [3, 4, 5, 6, 7])
def test_whole_file_digests(n_people):
    records = {"train": [], "test": []}
    for problem in iter_problems(n_people):
        if problem.index >= 1100:
            break
        if problem.index >= 100:
            split = "train" if problem.index < 1000 else "test"
            records[split].append(kk_record(problem, with_cot=False))
    for split, rows in records.items():
        assert len(rows) == default_slice(n_people, split)[1]
        quizzes = "\n".join(row["quiz"] for row in rows)
        solutions = "\n\n".join(row["solution_text_format"] for row in rows)
        assert (
            hashlib.sha256(quizzes.encode()).hexdigest(),
            hashlib.sha256(solutions.encode()).hexdigest(),
        ) == DIGESTS[(n_people, split)]


@pytest.mark.parametrize("n_people", [2, 4, 8])
def test_every_puzzle_is_unique_and_uniquely_solvable(n_people):
    problems = generate_problems(n_people, 0, 150)
    assert [p.index for p in problems] == list(range(150))
    assert len({p.statements for p in problems}) == 150
    for problem in problems:
        assert count_solutions(problem.statements) == 1
        assert len(problem.solution) == n_people
        # No leaf says "I am a knave" about the speaker (§4 rejection rule).
        for speaker, statement in enumerate(problem.statements):
            assert statement != ("lying", speaker)


def test_slices_are_views_of_one_stream():
    whole = generate_problems(4, 0, 12)
    assert generate_problems(4, 7, 5) == whole[7:12]
    assert generate_problems(4, 0, 3, seed=99) != whole[:3]


def test_rows_parse_back_and_solution_matches():
    for row in generate_rows(5, "test", count=20):
        puzzle = parse_statements(row["statements"], n_people=5)
        assert count_solutions(puzzle) == 1
        assert [name in row["quiz"] for name in row["names"]] == [True] * 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_people": 9, "split": "test"}, r"people: must be an integer in \[2, 8\], got 9"),
        ({"n_people": 1, "split": "test"}, r"people: must be an integer in \[2, 8\], got 1"),
        ({"n_people": 3, "split": "dev"}, r"split must be one of train, test, got 'dev'"),
        ({"n_people": 3, "split": "test", "count": 0}, r"count: must be an integer in \[1, inf\], got 0"),
        ({"n_people": 3, "split": "test", "start_index": -1}, r"start_index: must be an integer in \[0, inf\], got -1"),
        (
            {"n_people": 3, "split": "test", "template": "chatml"},
            r"unknown template 'chatml'; valid templates: qwen-instruct, qwen-base, plain",
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_rows(**kwargs)


def test_two_people_run_out_of_puzzles_with_a_clear_error():
    # There are only a few hundred distinct 2-person puzzles; the reference would silently stop.
    assert default_slice(2, "train") == (100, 200) and default_slice(2, "test") == (0, 100)
    with pytest.raises(ValueError, match="no new puzzle with a unique solution for 2 people"):
        generate_problems(2, 0, 2000)


def test_numpy_choice_without_replacement_is_the_one_assumed():
    # Guard for NumPy changing its sampling algorithm (bit-exactness depends on it, §6.1):
    # formatter seed 1234 + 100 draws the names of the §8.2 fixture.
    rng = np.random.default_rng(1334)
    assert [str(x) for x in rng.choice(COMMON_NAMES, size=3, replace=False)] == ["Michael", "Zoey", "Ethan"]


def final_assignment(events, n_people):
    """Replay a search's events: who stands as what when it ends."""
    assignment = [None] * n_people
    for event in events:
        if isinstance(event, Reconsider):
            for person in (*event.exhausted, event.person):
                assignment[person] = None
        elif event.conflict is None:
            assignment[event.person] = event.is_knight
    return assignment


def test_a_random_order_search_ends_in_the_unique_solution_by_other_routes():
    firsts, routes = set(), 0
    for problem in generate_problems(4, 0, 60):
        reference = search(problem.statements)
        for seed in range(5):
            result = search(problem.statements, random.Random(f"{problem.index}/{seed}"))
            assert result.success
            assert final_assignment(result.events, 4) == list(problem.solution)
            firsts.add((result.events[0].person, result.events[0].is_knight))
            routes += result.events != reference.events
    assert len(firsts) == 8  # every person first, as knight and as knave
    assert routes > 200  # of 300 searches, most differ from the reference's
    # the reference's search is the one without a generator: the paradox of the test above fails
    # whatever the order
    paradox = (("telling-truth", 0), ("telling-truth", 1), ("telling-truth", 2), ("not", ("telling-truth", 3)))
    assert not search(paradox, random.Random(0)).success


def test_the_cot_random_target_is_a_correct_response_drawn_once_per_puzzle():
    kk = get_task("kk")
    puzzles = kk.examples("train", difficulty=3, count=20, start_index=2000, template="plain")
    differ = 0
    for puzzle in puzzles:
        response = kk.sft_response(puzzle, "cot_random")
        assert kk.score(response, puzzle).reward == kk.max_reward
        assert response.startswith(" " + COT_HEAD) and COT_FOOT_SUCCESS in response
        assert response == kk.sft_response(puzzle, "cot_random")  # the same puzzle, the same trace
        differ += response != kk.sft_response(puzzle, "cot")
    assert differ >= 10
    with pytest.raises(ValueError, match="'answer', 'cot', 'cot_random'"):
        kk.sft_response(puzzles[0], "cot_shuffled")
