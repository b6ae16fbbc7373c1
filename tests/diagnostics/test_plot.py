"""``tokenbalance plot``: non-empty PNG and SVG from small logs, including an older run lacking keys."""

import json

import pytest

from tokenbalance.cli import main
from tokenbalance.diagnostics.plots import (
    BUCKET_STATS,
    NotDrawn,
    Run,
    buckets_figure,
    buckets_steps_figure,
    load_run,
    plot_runs,
)


def write_log(path, records, tail=""):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def full_records(steps=4):
    records = [{"step": 0, "kind": "eval", "eval/greedy/acc_2": 0.1, "eval/greedy/acc_3": 0.0}]
    for step in range(1, steps + 1):
        record = {
            "step": step,
            "kind": "train",
            "reward/mean": -1 + 0.5 * step,
            "reward/acc": 0.1 * step,
            "response/len_mean": 20.0 + step,
            "diag/grad_norm/all": 0.8,
            "diag/lld/delta_mean": 0.1,
            "diag/lld/delta_p10": -0.2,
            "diag/lld/delta_p50": 0.05,
            "diag/lld/frac_below_eps": 0.25,
        }
        for b, share in enumerate([0.2, 0.1, 0.1, 0.6]):
            key = f"diag/bucket{b}/"
            record.update(
                {
                    key + "lo": b / 4,
                    key + "hi": (b + 1) / 4,
                    key + "token_frac": share,
                    key + "grad_share": [0.7, 0.1, 0.1, 0.1][b],
                    key + "grad_share_before": [0.8, 0.1, 0.05, 0.05][b],
                    key + "pos/adv_mean": 1.0,
                    key + "neg/adv_mean": "nan",
                    key + "clip_frac": 0.1,
                    key + "entropy": 2.0 - b / 2,
                    f"diag/grad_norm/bucket{b}": 0.7 - b / 6,
                }
            )
        records.append(record)
    records.append({"step": steps, "kind": "eval", "eval/greedy/acc_2": 0.5, "eval/greedy/acc_3": 0.25})
    return records


def test_plot_writes_png_and_svg_for_overlaid_runs(tmp_path, capsys):
    new = write_log(tmp_path / "new-run", full_records())
    old = write_log(tmp_path / "old-run", [{"step": 1, "kind": "train", "reward/mean": -1.0}], tail='{"step": 2, "ki')
    out = tmp_path / "figures"
    assert main(["plot", str(new), str(old), "--out", str(out)]) == 0
    for name in ("training", "buckets", "buckets_steps", "lld"):
        for fmt, magic in (("png", b"\x89PNG"), ("svg", b"<?xml")):
            data = (out / f"{name}.{fmt}").read_bytes()
            assert data.startswith(magic) and len(data) > 5000, (name, fmt)
    svg = (out / "buckets.svg").read_text()
    assert "old-run (no data)" in svg and "new-run" in svg  # the legend says what the old run lacks
    assert "old-run: skipped 1 unreadable line(s)" in capsys.readouterr().out


def test_labels_name_the_runs_in_order(tmp_path, capsys):
    runs = [str(write_log(tmp_path / name, full_records(2))) for name in ("a", "b")]
    out = tmp_path / "figures"
    assert main(["plot", *runs, "--out", str(out), "--format", "svg", "--labels", "kk-tiny, arith-cot"]) == 0
    svg = (out / "buckets.svg").read_text()
    assert "kk-tiny" in svg and "arith-cot" in svg
    assert main(["plot", *runs, "--out", str(tmp_path / "x"), "--labels", "only-one"]) == 2
    assert "--labels: 1 label(s) for 2 run(s)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before any figure is drawn


def test_default_output_directory_and_one_format(tmp_path):
    run = write_log(tmp_path / "r", full_records(2))
    assert main(["plot", str(run), "--format", "png"]) == 0
    assert sorted(p.name for p in (run / "plots").iterdir() if not p.name.startswith(".")) == [
        "buckets.png",
        "buckets_steps.png",
        "lld.png",
        "training.png",
    ]


def test_one_legend_names_a_run_without_data_and_a_panel_without_data_is_dropped_and_named():
    full = Run("full", path=None, train=[r for r in full_records(2) if r["kind"] == "train"])
    empty = Run("empty", path=None, train=[{"step": 1, "kind": "train"}])
    part = Run("part", path=None, train=[{k: v for k, v in r.items() if "grad_norm" not in k} for r in full.train])
    fig = buckets_figure([full, empty, part])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["full", "empty (no data)", "part"]
    assert all(ax.get_legend() is None for ax in fig.axes)  # one legend for the figure, none over the bars
    assert [ax.get_title(loc="left") for ax in fig.axes] == [s.title for s in BUCKET_STATS]  # all six have data
    assert [t.get_text() for t in fig.axes[0].texts] == ["a"]  # lettered
    xlabels = {ax.get_title(loc="left"): ax.get_xlabel() for ax in fig.axes}
    assert xlabels["gradient norm, bucket's tokens only"] == "old-policy probability\n(no data: part)"
    assert xlabels["entropy (old policy)"] == "old-policy probability"

    # no gradient norms logged, a clip fraction of 0 everywhere: both panels dropped and named
    records = [{k: (0.0 if "clip_frac" in k else v) for k, v in r.items() if "grad_norm" not in k} for r in full.train]
    fig = buckets_figure([Run("run", path=None, train=records)])
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.axison]
    assert titles == [s.title for s in BUCKET_STATS if s.stat not in ("grad_norm", "clip_frac")]
    assert len(fig.axes) == 4  # 2 x 2, no empty place
    assert fig.get_supxlabel().replace("\n", " ") == (
        "not drawn: gradient norm (no run logged it: --set diagnostics.grad_norm_every=K); clip fraction (0 in "
        "every bucket of every run)"
    )
    steps = buckets_steps_figure([Run("run", path=None, train=records)])
    assert [ax.get_ylabel() for ax in steps.axes if ax.get_ylabel()] == [
        "token share",
        "mean advantage",
        "gradient share",
        "entropy (nats)",
    ]  # one row per statistic with data, its name once, on the first column
    assert steps.get_supxlabel().replace("\n", " ") == fig.get_supxlabel().replace("\n", " ")


def test_a_figure_without_data_is_not_written_and_an_earlier_one_is_removed(tmp_path):
    run = write_log(tmp_path / "r", full_records(2))
    out = tmp_path / "figures"
    assert main(["plot", str(run), "--out", str(out), "--format", "png"]) == 0
    assert (out / "lld.png").is_file()
    bare = write_log(tmp_path / "bare", [{"step": 1, "kind": "train", "reward/mean": 0.5}])
    lines = []
    written = plot_runs([bare], out, formats=("png",), log=lines.append)
    assert [p.name for p in written] == ["training.png"]
    assert sorted(p.name for p in out.iterdir()) == [".tokenbalance-written.json", "training.png"]
    assert lines == [
        "buckets: not drawn, no run logged diag/bucket* statistics (--set diagnostics.bucket_stats=true); "
        "removed the earlier buckets.png",
        "buckets_steps: not drawn, no run logged diag/bucket* statistics (--set diagnostics.bucket_stats=true); "
        "removed the earlier buckets_steps.png",
        "lld: not drawn, no run logged the LLD monitor (train with --set diagnostics.lld=true); removed the earlier "
        "lld.png",
    ]


def test_bad_run_directories(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no metrics.jsonl here"):
        load_run(tmp_path / "empty")
    assert main(["plot", str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl here" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 2
    run = write_log(tmp_path / "r", full_records(1))
    assert main(["plot", str(run), "--format", "pdf"]) == 2
    assert "unknown format 'pdf'" in capsys.readouterr().err


def test_runs_are_labelled_by_method_and_seed_and_an_empty_lld_figure_says_so(tmp_path):
    from tokenbalance.config import RunConfig, apply_overrides, save_config
    from tokenbalance.diagnostics.plots import _unique_names, lld_figure, training_figure

    runs = []
    for name in ("a", "b"):
        run_dir = write_log(tmp_path / name, [r for r in full_records(2) if "lld" not in json.dumps(r)])
        save_config(apply_overrides(RunConfig(), ["train.method=grpo", "train.seed=3"]), run_dir / "config.yaml")
        runs.append(load_run(run_dir))
    bare = load_run(write_log(tmp_path / "bare", full_records(2)))  # no config.yaml: the directory's name
    assert [r.name for r in runs] == ["grpo seed 3", "grpo seed 3"] and bare.name == "bare"
    _unique_names(runs)  # the same method and seed twice: told apart by their directories
    assert [r.name for r in runs] == [f"grpo seed 3 ({tmp_path.name}/a)", f"grpo seed 3 ({tmp_path.name}/b)"]

    assert lld_figure(runs) == NotDrawn("no run logged the LLD monitor (train with --set diagnostics.lld=true)")
    assert [ax.get_title() for ax in lld_figure([bare]).axes][0].startswith("LLD")  # it has LLD records
    train_acc, held_out = training_figure([bare]).axes[1:3]
    assert train_acc.get_ylim() == held_out.get_ylim()  # the two accuracies on one scale
    assert train_acc.get_lines()[0].get_marker() == "."  # markers at the logged steps
