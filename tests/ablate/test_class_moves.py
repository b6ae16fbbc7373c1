"""Figure 1 by class over policies (``diagnose summary``): the high-probability decision tokens' moves read from
hand-made ``diagnose buckets --json`` files."""

import json
import math
import re

import pytest

from tokenbalance.ablate.class_moves import decision_moves, pooled_difference, pooled_text, read_profile
from tokenbalance.cli import main

HIGH = "[0.75, 1]"


def row(cls, interval, sign, tokens, dlogp):
    return {"class": cls, "interval": interval, "sign": sign, "tokens": tokens, "dlogp_mean": dlogp}


def profile(all_rows, highest_rows, low_share=0.05, decision_share=0.5):
    return {
        "updates": {
            "all": {"by_class": all_rows},
            "lowest": {"by_class": []},
            "highest": {"by_class": highest_rows},
        },
        "class_profile": {
            "intervals": ["[0, 0.25)", "[0.25, 0.5)", "[0.5, 0.75)", HIGH],
            "decision_classes": ["result", "operator"],
            "low_share": low_share,
            "low_decision_share": decision_share,
        },
    }


def batch(scale=1.0):
    """Decisions at high p: 3 result tokens at +4e-4 and 1 operator token at +8e-4 (A>0), 2 results at -1e-4 (A<0);
    every other row (wording, a low bucket, saturated, an empty set) must be left out."""
    noise = [
        row("wording", HIGH, "A>0", 50, 1.0),
        row("result", "[0, 0.25)", "A>0", 7, 1.0),
        row("result", "saturated", "A>0", 9, 1.0),
        row("result", HIGH, "A>0", 0, None),
    ]
    every = [
        row("result", HIGH, "A>0", 3, 4e-4 * scale),
        row("operator", HIGH, "A>0", 1, 8e-4 * scale),
        row("result", HIGH, "A<0", 2, -1e-4 * scale),
    ]
    high_only = [
        row("result", HIGH, "A>0", 3, 2e-4),
        row("operator", HIGH, "A>0", 1, 2e-4),
        row("result", HIGH, "A<0", 2, -3e-4),
    ]
    return profile(noise + every, noise + high_only)


def test_moves_are_token_weighted_over_decision_classes_at_high_p_signed_the_advantages_way():
    moves = decision_moves(batch(), "p0")
    assert moves.tokens == {"A>0": 4, "A<0": 2}
    assert moves.moves["A>0"]["all"] == pytest.approx((3 * 4e-4 + 8e-4) / 4, rel=1e-12)  # 5e-4
    assert moves.moves["A>0"]["highest"] == pytest.approx(2e-4, rel=1e-12)
    assert moves.moves["A<0"]["all"] == pytest.approx(1e-4, rel=1e-12)  # a fall, the way of A < 0
    assert moves.difference("A>0") == pytest.approx(3e-4, rel=1e-12)
    assert moves.difference("A<0") == pytest.approx(-2e-4, rel=1e-12)
    assert (moves.low_share, moves.decision_share) == (0.05, 0.5)


def test_the_pooled_difference_is_a_t_interval_over_policies_skipping_those_without_tokens():
    policies = [decision_moves(batch(s), f"p{s}") for s in (1.0, 2.0, 3.0)]
    empty = decision_moves(profile([], []), "none")
    assert math.isnan(empty.moves["A>0"]["all"]) and empty.tokens == {"A>0": 0, "A<0": 0}
    pooled = pooled_difference([*policies, empty], "A>0")
    # differences 3e-4, 8e-4, 13e-4: mean 8e-4, sd 5e-4, t(0.975, 2) = 4.303
    assert pooled.n == 3 and pooled.mean == pytest.approx(8e-4, rel=1e-12)
    assert pooled.high - pooled.mean == pytest.approx(4.302653 * 5e-4 / math.sqrt(3), rel=1e-5)


def test_a_file_without_classes_or_an_update_is_refused_naming_it(tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"updates": {}}))
    with pytest.raises(ValueError, match="bare.json: no class_profile"):
        read_profile(bare)
    partial = tmp_path / "partial.json"
    data = batch()
    del data["updates"]["highest"]
    partial.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="partial.json: no highest update"):
        read_profile(partial)


def test_diagnose_summary_prints_one_row_per_file_and_the_mean(tmp_path, capsys):
    for name, scale in (("start0", 1.0), ("start1", 2.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps(batch(scale)))
    assert main(["diagnose", "summary", str(tmp_path / "start0.json"), str(tmp_path / "start1.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| start") or line.startswith("| mean")]
    assert rows[0].split(" | ")[:7] == ["| start0", "5.0%", "50%", "4", "+5.00e-04", "+2.00e-04", "+3.00e-04"]
    assert rows[1].split(" | ")[6] == "+8.00e-04"
    assert "+5.50e-04 [" in rows[2] and "(n = 2)" in rows[2]


def test_the_pooled_text_gives_an_interval_only_from_two_policies():
    one = [decision_moves(batch(1.0), "p1")]
    assert pooled_text(pooled_difference(one, "A>0")) == "+3.00e-04 (n = 1: no interval)"
    none = [decision_moves(profile([], []), "none")]
    assert pooled_text(pooled_difference(none, "A>0")) == "no policy has such tokens"
    two = [decision_moves(batch(s), f"p{s}") for s in (1.0, 2.0)]
    assert pooled_text(pooled_difference(two, "A>0")).startswith("+5.50e-04 [") and "nan" not in pooled_text(
        pooled_difference(two, "A>0")
    )


def test_against_pairs_the_files_in_order_and_gives_each_measures_paired_difference(tmp_path, capsys):
    shares = {"m0": (0.04, 0.5), "m1": (0.02, 0.25), "g0": (0.05, 0.6), "g1": (0.03, 0.5)}
    for name, (low, decisions) in shares.items():
        data = batch(1.0 if name.endswith("0") else 2.0)
        data["class_profile"] |= {"low_share": low, "low_decision_share": decisions}
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    files = [str(tmp_path / f"{n}.json") for n in ("m0", "m1")]
    against = [str(tmp_path / f"{n}.json") for n in ("g0", "g1")]
    assert main(["diagnose", "summary", *files, "--against", *against]) == 0
    table = capsys.readouterr().out.split("paired in order with --against")[1]
    cells = {
        line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| measure")
    }

    def difference(measure):  # the mean difference and its interval, as numbers
        text = cells[measure][2]
        mean, low, high = re.match(r"(\S+) \[(\S+), (\S+)\] \(n = 2\)", text).groups()
        return float(mean), float(low), float(high)

    # tokens below the edge: 0.04 - 0.05 and 0.02 - 0.03, both -0.01: an interval of no width
    assert [float(v) for v in cells["tokens < lowest edge"][:2]] == pytest.approx([0.03, 0.04], rel=1e-12)
    assert difference("tokens < lowest edge") == pytest.approx((-0.01, -0.01, -0.01), rel=1e-9)
    # decisions below it, of all tokens: 0.02 - 0.03 and 0.005 - 0.015; the other classes: 0.02 - 0.02, 0.015 - 0.015
    assert difference("decisions < lowest edge (of all tokens)") == pytest.approx((-0.01, -0.01, -0.01), rel=1e-9)
    assert difference("other classes < lowest edge (of all tokens)") == pytest.approx((0, 0, 0), abs=1e-15)
    # the moves: each pair has the same batch on both sides
    assert difference("A>0: all - high only") == pytest.approx((0, 0, 0), abs=1e-15)
    assert main(["diagnose", "summary", *files, "--against", against[0]]) == 2
    assert "--against: 1 file(s) for 2; give one to pair with each file" in capsys.readouterr().err
