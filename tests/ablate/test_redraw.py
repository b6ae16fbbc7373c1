"""Every committed figure is what ``tokenbalance plot --redraw docs/results/figures.json`` draws from
the committed data.

How they are compared. PNG bytes differ across machines (fonts, freetype, matplotlib's version and
its choice of ticks), so the test compares what is robust and can still fail:

* the fingerprint every PNG tokenbalance writes carries (diagnostics/plotted.py): a hash of the
  numbers and words the figure plots (every line's, bar's and band's coordinates to 9 significant
  digits, titles, labels, legends, texts, colours, the size in inches), none of them chosen by
  matplotlib; a committed figure drawn from other data or by other drawing code differs;
* the size in pixels;
* the pixels themselves, where the committed file was written by the matplotlib version installed
  here (its ``Software`` text; pip's matplotlib wheels bundle one freetype, so that text renders
  alike). Agg draws the same figure to the same pixels; a pixel is allowed to differ by
  anti-aliasing's rounding of a blended edge (at most 2 of 255 per channel) and the figure is
  allowed ``PIXEL_SHARE`` of pixels beyond that, far less than one moved line or label.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tokenbalance.ablate import figure1
from tokenbalance.ablate.redraw import read_figures
from tokenbalance.cli import main
from tokenbalance.diagnostics.plotted import FINGERPRINT_KEY, fingerprint, plotted, png_text
from tokenbalance.outputs import written_files

DOCS = Path(__file__).resolve().parents[2] / "docs"
MANIFEST = DOCS / "results" / "figures.json"
PIXEL_SHARE = 1e-4


def software(path: Path) -> str:
    return png_text(path).get("Software", "")


def test_the_committed_figures_are_what_the_committed_data_draw(tmp_path):
    import matplotlib

    committed = sorted(p.relative_to(MANIFEST.parent) for p in DOCS.rglob("*.png"))
    listed = sorted(Path(entry["figure"]) for entry in read_figures(MANIFEST))
    assert committed == listed, "every figure under docs/ is listed in docs/results/figures.json, and only those"
    assert main(["plot", "--redraw", str(MANIFEST), "--out", str(tmp_path)]) == 0
    for name in listed:
        old, new = MANIFEST.parent / name, tmp_path / name
        assert png_text(old).get(FINGERPRINT_KEY) == png_text(new)[FINGERPRINT_KEY], (
            f"{name} is not what its data draw today: run `tokenbalance plot --redraw {MANIFEST.relative_to(DOCS.parent)}`"
        )
        old_pixels, new_pixels = (
            np.asarray(Image.open(old).convert("RGBA")),
            np.asarray(Image.open(new).convert("RGBA")),
        )
        assert old_pixels.shape == new_pixels.shape, name
        if software(old) != f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/":
            continue  # another matplotlib renders text and ticks its own way: the fingerprint is the check
        off = np.abs(old_pixels.astype(int) - new_pixels.astype(int)).max(axis=2) > 2
        assert off.mean() <= PIXEL_SHARE, f"{name}: {off.mean():.2%} of the pixels differ"


def test_the_documented_redraw_may_replace_every_committed_figure():
    """``plot --redraw docs/results/figures.json`` without --out replaces the committed figures: each must be listed
    as tokenbalance's in its folder's manifest, or the documented command refuses (a figure copied in by hand)."""
    for entry in read_figures(MANIFEST):
        figure = MANIFEST.parent / entry["figure"]
        assert figure.name in written_files(figure.parent), f"{entry['figure']}: not in its folder's manifest"


def test_redraw_checks_every_folder_before_drawing_any(tmp_path, capsys):
    """A figure of the user's in the second folder: refused before the first folder's figure is drawn."""
    data = MANIFEST.parent / "arith-cot-grid" / "figure1_buckets.json"
    manifest = tmp_path / "figures.json"
    entries = [{"figure": f"{folder}/figure1_buckets.png", "draw": "figure1", "data": str(data)} for folder in "ab"]
    manifest.write_text(json.dumps(entries))
    out = tmp_path / "out"
    (out / "b").mkdir(parents=True)
    (out / "b" / "figure1_buckets.png").write_bytes(b"mine")
    assert main(["plot", "--redraw", str(manifest), "--out", str(out)]) != 0
    assert "tokenbalance did not write them" in capsys.readouterr().err
    assert not (out / "a").exists() and (out / "b" / "figure1_buckets.png").read_bytes() == b"mine"


def test_the_fingerprint_is_what_the_figure_plots():
    data = figure1.read_json(MANIFEST.parent / "arith-cot-grid" / "figure1_buckets.json")
    fig = figure1.figure(data)
    norms = plotted(fig)["axes"][4]["bars"]  # (e): each bucket's gradient norm, then all tokens', per row
    rows = list(data["rows"].values())
    expected = [v for row in rows for v in [*row["grad_norm"], row["grad_norm_all"]]]
    assert [bar[0][1][1] for bar in norms] == pytest.approx(expected, rel=1e-8)
    assert fingerprint(figure1.figure(data)) == fingerprint(fig)  # two draws of the same data
    rows[1]["grad_norm_all"] *= 1.001
    assert fingerprint(figure1.figure(data)) != fingerprint(fig)  # one bar 0.1% higher
    rows[1]["grad_norm_all"] /= 1.001
    data["tokens"] += 1
    assert fingerprint(figure1.figure(data)) != fingerprint(fig)  # one word of a text


def test_a_bad_manifest_is_named_before_any_figure(tmp_path, capsys):
    manifest = tmp_path / "figures.json"
    for entries, message in (
        ([{"figure": "a.png", "draw": "paint"}], "a.png: 'draw' must be one of runs, grid, figure1, testbeds"),
        ([{"figure": "a.png", "draw": "figure1"}], "a.png: lacks data (draw 'figure1')"),
        ([{"figure": "a.svg", "draw": "figure1", "data": "x.json"}], "a.svg: a committed figure is a .png file"),
        ([{"figure": "x/a.png", "draw": "runs", "runs": [], "labels": []}], "names one of training, buckets"),
    ):
        manifest.write_text(json.dumps(entries))
        assert main(["plot", "--redraw", str(manifest), "--out", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["plot", "--redraw", str(manifest), "--format", "svg"]) == 2
    assert "--redraw draws what its manifest lists, as PNG: drop --format" in capsys.readouterr().err
