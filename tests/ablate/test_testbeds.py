"""The across-testbeds figure: points read from a grid's accuracy.csv and a class profile."""

import csv
import json

import pytest

from tokenbalance.ablate.testbeds import caption_for, gain_points, gains_figure, read_manifest
from tokenbalance.cli import main

FIELDS = [
    "mode",
    "row",
    "label",
    "column",
    "n",
    "mean",
    "baseline",
    "diff_n",
    "diff_mean",
    "diff_ci_low",
    "diff_ci_high",
]


def write_testbed(directory, diffs: dict[str, tuple[float, float, float]], low_share=0.1, decision_share=0.6):
    directory.mkdir(parents=True, exist_ok=True)
    rows = [dict(mode="greedy", row="grpo", label="GRPO", column="eval/greedy/acc", n=8, mean=0.5, baseline="start")]
    for row, (mean, low, high) in diffs.items():
        for mode in ("greedy", "sample"):
            for column in (f"eval/{mode}/acc", f"eval/{mode}/acc_1"):
                shift = 0.0 if (mode, column) == ("greedy", "eval/greedy/acc") else 1.0  # only the average counts
                rows.append(
                    dict(
                        mode=mode,
                        row=row,
                        label=f"+ {row}",
                        column=column,
                        n=8,
                        mean=0.5,
                        baseline="grpo",
                        diff_n=8,
                        diff_mean=mean + shift,
                        diff_ci_low=low + shift,
                        diff_ci_high=high + shift,
                    )
                )
    with (directory / "accuracy.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    profile = {"class_profile": {"low_share": low_share, "low_decision_share": decision_share}}
    (directory / "profile.json").write_text(json.dumps(profile))


def test_points_are_the_rows_compared_with_grpo_on_the_average(tmp_path):
    write_testbed(tmp_path / "a", {"ar": (0.01, -0.005, 0.025), "lopti": (-0.02, -0.04, 0.0)})
    points = gain_points("a", tmp_path / "a" / "accuracy.csv", [tmp_path / "a" / "profile.json"])
    assert [(p.row, p.gain, p.ci_low, p.ci_high, p.seeds) for p in points] == [
        ("ar", 0.01, -0.005, 0.025, 8),
        ("lopti", -0.02, -0.04, 0.0, 8),
    ]
    assert {(p.low_share, p.decision_share, p.testbed) for p in points} == {(0.1, 0.6, "a")}
    assert caption_for(points[0]) == "a\n10.0% of tokens < 0.25"


def test_the_manifest_is_checked_before_anything_is_drawn(tmp_path):
    write_testbed(tmp_path / "a", {"ar": (0.01, 0.0, 0.02)})
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps([{"name": "a", "accuracy": "a/accuracy.csv", "profile": "a/nothing.json"}]))
    with pytest.raises(ValueError, match=r"entry 'a': no file .*nothing\.json"):
        read_manifest(manifest)
    manifest.write_text(json.dumps([{"name": "a", "accuracy": "a/accuracy.csv"}]))
    with pytest.raises(ValueError, match="entry 0 lacks profile"):
        read_manifest(manifest)
    manifest.write_text(json.dumps([{"name": "a", "accuracy": "a/accuracy.csv", "profile": []}]))
    with pytest.raises(ValueError, match="entry 'a': profile is a path or a non-empty list of paths"):
        read_manifest(manifest)


def test_a_profile_without_classes_or_unreadable_is_refused_in_one_line_naming_it(tmp_path):
    write_testbed(tmp_path / "a", {"ar": (0.01, 0.0, 0.02)})
    bare = tmp_path / "a" / "bare.json"
    bare.write_text(json.dumps({"buckets": []}))
    with pytest.raises(ValueError, match=r"bare\.json: no class_profile"):
        gain_points("a", tmp_path / "a" / "accuracy.csv", [bare])
    bare.write_text("{")
    with pytest.raises(ValueError, match=r"bare\.json: cannot read a diagnose buckets --json file"):
        gain_points("a", tmp_path / "a" / "accuracy.csv", [bare])


def test_a_list_of_start_policy_profiles_puts_the_testbed_at_their_mean(tmp_path):
    write_testbed(tmp_path / "a", {"ar": (0.01, 0.0, 0.02)}, low_share=0.1, decision_share=0.6)
    other = {"class_profile": {"low_share": 0.2, "low_decision_share": 0.9}}
    (tmp_path / "a" / "start1.json").write_text(json.dumps(other))
    manifest = tmp_path / "m.json"
    entry = {"name": "a", "accuracy": "a/accuracy.csv", "profile": ["a/profile.json", "a/start1.json"]}
    manifest.write_text(json.dumps([entry]))
    ((name, accuracy, profiles),) = read_manifest(manifest)
    assert profiles == [tmp_path / "a" / "profile.json", tmp_path / "a" / "start1.json"]
    (point,) = gain_points(name, accuracy, profiles)
    assert point.low_share == pytest.approx(0.15, rel=1e-12) and point.decision_share == pytest.approx(0.75, rel=1e-12)


def test_plot_testbeds_writes_the_figure_and_never_replaces_a_users_file(tmp_path, capsys):
    write_testbed(tmp_path / "a", {"ar": (0.01, 0.0, 0.02)}, decision_share=0.9)
    write_testbed(tmp_path / "b", {"ar": (-0.01, -0.02, 0.0)}, decision_share=0.1)
    manifest = tmp_path / "m.json"
    manifest.write_text(
        json.dumps([{"name": n, "accuracy": f"{n}/accuracy.csv", "profile": f"{n}/profile.json"} for n in "ab"])
    )
    out = tmp_path / "fig"
    assert main(["plot", "--testbeds", str(manifest), "--out", str(out), "--format", "png"]) == 0
    assert (out / "testbeds_greedy.png").stat().st_size > 1000
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "testbeds_greedy.png").write_bytes(b"user")
    assert main(["plot", "--testbeds", str(manifest), "--out", str(tmp_path / "mine"), "--format", "png"]) != 0
    assert (tmp_path / "mine" / "testbeds_greedy.png").read_bytes() == b"user"
    assert "tokenbalance did not write them" in capsys.readouterr().err


def test_captions_of_testbeds_close_on_the_axis_do_not_overlap(tmp_path):
    for name, share, low in (("a", 0.08, 0.0), ("b", 0.12, -0.03), ("c", 0.9, 0.0)):
        write_testbed(tmp_path / name, {"ar": (0.01, low, 0.02)}, decision_share=share)
    points = [p for n in "abc" for p in gain_points(n, tmp_path / n / "accuracy.csv", [tmp_path / n / "profile.json"])]
    ax = gains_figure(points).axes[0]
    offsets = {a.get_text().split("\n")[0]: a.xyann[1] for a in ax.texts}
    anchors = {a.get_text().split("\n")[0]: a.xy[1] for a in ax.texts}
    assert offsets["a"] == offsets["c"] and offsets["b"] < offsets["a"]  # b sits a caption lower than a, c apart
    assert anchors["a"] == anchors["b"]  # from one height: a lower bar of b cannot lift a's caption into b's


def test_stacked_captions_stay_inside_the_axes_whatever_the_bars_span(tmp_path):
    """Three close testbeds, one with an interval ten times the others': the axis is lowered until the three captions
    hung under the lowest bar end above the axes' bottom (not over the x label)."""
    for name, share, (low, high) in (("a", 0.05, (-0.2, 0.2)), ("b", 0.09, (-0.02, 0.0)), ("c", 0.13, (-0.01, 0.01))):
        write_testbed(tmp_path / name, {"ar": (0.0, low, high)}, decision_share=share)
    points = [p for n in "abc" for p in gain_points(n, tmp_path / n / "accuracy.csv", [tmp_path / n / "profile.json"])]
    fig = gains_figure(points)
    (ax,) = fig.axes
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    axes_box = ax.get_window_extent(renderer)
    captions = [a.get_window_extent(renderer) for a in ax.texts]
    assert len(captions) == 3
    assert all(box.y0 >= axes_box.y0 for box in captions)  # inside, above the x axis
    assert ax.get_ylim()[0] < -20.0  # lowered past the lowest bar (-20 points)
    bottoms = sorted(box.y0 for box in captions)
    assert bottoms[0] < bottoms[1] < bottoms[2]  # stacked, one under another
