"""Token statistics by class on hand-made batches: each token's class from the characters it
covers, the profile by class and bucket, and the change of log p by class, bucket and sign with
saturated tokens apart."""

import math

import torch

from tokenbalance.diagnostics.token_classes import class_profile, logp_change_by_class, piece_kinds, token_classes
from tokenbalance.tasks.arith import DECISION_CLASSES, TOKEN_CLASSES
from tokenbalance.tasks.arith_cot import text_classes

EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)


class PieceTokenizer:
    """A tokenizer whose token i decodes to VOCAB[i] (EOS: a special token not in the text)."""

    VOCAB = [" 12", " +", " 5", " =", " 17", ".", " The answer is", " \\boxed{", "17", "}.", "<|endoftext|>"]

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return "".join(self.VOCAB[i] for i in ids)


def test_each_token_takes_the_class_of_its_first_non_space_character():
    text = " 12 + 5 = 17."
    pieces = [" 12", " +", " 5", " =", " 17", "."]
    kinds = piece_kinds(pieces, text_classes(text), text, "format")
    assert kinds == ["copy", "operator", "copy", "wording", "result", "format"]
    assert piece_kinds([" ", "x", "<eos>"], ["format", "copy"], " x", "rest") == ["rest", "copy", "rest"]


def test_token_classes_of_a_batch():
    ids_BT = torch.tensor([[0, 1, 2, 3, 4, 5, 10, 0], [6, 7, 8, 9, 10, 0, 0, 0]])
    mask_BT = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    class_BT = token_classes(text_classes, PieceTokenizer(), ids_BT, mask_BT, TOKEN_CLASSES)
    names = [[TOKEN_CLASSES[i] if i >= 0 else None for i in row] for row in class_BT.tolist()]
    assert names[0] == ["copy", "operator", "copy", "wording", "result", "format", "format", None]
    assert names[1] == ["wording", "format", "copy", "format", "format", None, None, None]  # EOS: format


def test_class_profile_counts_buckets_and_the_decisions_among_low_tokens():
    p_BT = torch.tensor([[0.1, 0.2, 0.9, 0.6], [0.05, 0.3, 0.99, 0.5]])
    mask_BT = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    names = ("result", "operator", "wording")
    class_BT = torch.tensor([[0, 2, 0, 1], [1, 2, 2, 0]])
    profile = class_profile(torch.log(p_BT), mask_BT, class_BT, names, ("result", "operator"), EDGES)
    assert profile["tokens"] == 7
    by_class = {row["class"]: row["buckets"] for row in profile["classes"]}
    assert by_class == {"result": [1, 0, 0, 1], "operator": [1, 0, 1, 0], "wording": [1, 1, 0, 1]}
    assert profile["low_share"] == 3 / 7 and profile["low_decision_share"] == 2 / 3
    assert profile["intervals"][0] == "[0, 0.25)"
    assert set(DECISION_CLASSES) <= set(TOKEN_CLASSES)


def test_logp_change_by_class_keeps_saturated_tokens_apart():
    old_BT = torch.log(torch.tensor([[0.9995, 0.8, 0.1, 0.8]]))
    new_BT = old_BT + torch.tensor([[0.0004, 0.05, -0.2, -0.1]])
    adv_BT = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    mask_BT = torch.ones(1, 4, dtype=torch.bool)
    class_BT = torch.tensor([[0, 0, 1, 1]])
    rows = logp_change_by_class(old_BT, new_BT, adv_BT, mask_BT, class_BT, ("result", "wording"), EDGES)
    found = {(r["class"], r["interval"], r["sign"]): r for r in rows if r["tokens"]}
    assert set(found) == {
        ("result", "saturated", "A>0"),
        ("result", "[0.75, 1]", "A>0"),
        ("wording", "[0, 0.25)", "A<0"),
        ("wording", "[0.75, 1]", "A>0"),
    }
    assert math.isclose(found[("result", "[0.75, 1]", "A>0")]["dlogp_mean"], 0.05, abs_tol=8 * 1.2e-7)  # float32 sums
    assert found[("wording", "[0, 0.25)", "A<0")]["right_way_frac"] == 1.0  # fell, as A < 0 asks
    assert found[("wording", "[0.75, 1]", "A>0")]["right_way_frac"] == 0.0  # fell where A > 0 asks up
    assert len(rows) == 2 * 5 * 2 and all(math.isnan(r["dlogp_mean"]) for r in rows if not r["tokens"])


def test_kk_role_words_in_the_answer_are_its_decisions():
    from tokenbalance.tasks import get_task

    task = get_task("kk")
    text = " Assume Zoey is a knight. </think>\n<answer>\n(1) Zoey is a knave\n(2) Ava is a knight"  # unclosed
    kinds = task.text_classes(text)
    assert kinds[text.index("knight")] == "role" and kinds[text.index("knave")] == "answer_role"
    assert kinds[text.rindex("knight")] == "answer_role" and kinds[text.index("Zoey")] == "other"
    assert task.decision_classes == ("answer_role",) and set(kinds) <= set(task.token_class_names)
