"""The by-class tables ``diagnose buckets`` prints keep a space after the longest class name (K&K's
``answer_role`` ran into the bucket column)."""

from tokenbalance.commands.diagnose import print_class_profile, print_logp_changes


def test_a_long_class_name_keeps_its_column_apart(capsys):
    profile = {
        "decision_classes": ["answer_role"],
        "low_share": 0.01,
        "low_decision_share": 0.056,
        "intervals": ["[0, 0.25)", "[0.75, 1]"],
        "classes": [
            {"class": "answer_role", "tokens": 241, "buckets": [8, 233]},
            {"class": "other", "tokens": 9, "buckets": [1, 8]},
        ],
    }
    print_class_profile(profile)
    rows = [{"class": "answer_role", "interval": "saturated", "sign": "A>0", "dlogp_mean": 2.55e-6, "tokens": 44}]
    print_logp_changes({"all": {"by_class": rows}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["class", "tokens", "[0,", "0.25)", "[0.75,", "1]"]
    assert lines[3].split() == ["answer_role", "241", "8", "233"]
    assert lines[4].split() == ["other", "9", "1", "8"]
    assert lines[-1].split() == ["answer_role", "saturated", "A>0", "+2.55e-06", "(44)"]
