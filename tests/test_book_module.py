"""rope.analysis.book: what every chapter uses (its start, figures, tables, glue)."""

import base64
import io

import numpy as np
import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from rope.analysis import book  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_matplotlib():
    saved = dict(matplotlib.rcParams)
    yield
    plt.close("all")
    matplotlib.rcParams.update(saved)


def test_start_seeds_torch_and_numpy_and_sets_the_style():
    rng = book.start(seed=3)
    drawn = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(drawn, torch.rand(4))
    assert rng.integers(10**9) == np.random.default_rng(3).integers(10**9)
    assert matplotlib.rcParams["figure.figsize"] == [book.FIGURE_WIDTH, 3.2]
    smallest = min(matplotlib.rcParams[key] for key in book.STYLE if key.endswith("size") and "fig" not in key)
    assert smallest >= book.MIN_FONT_PT


def test_figure_metrics_report_the_smallest_drawn_font_and_the_panels_side_by_side():
    book.start()
    fig, axes = plt.subplots(2, 3)
    axes[0, 0].set_title("tiny", fontsize=6)
    axes[1, 2].text(0.5, 0.5, "", fontsize=2)  # empty text is not drawn
    hidden = axes[1, 1].text(0.5, 0.5, "hidden", fontsize=3)
    hidden.set_visible(False)
    assert book.figure_metrics(fig) == {book.MIN_FONT_KEY: "6", book.COLUMNS_KEY: "3"}
    fig2, (left, right) = plt.subplots(1, 2)
    fig2.colorbar(left.imshow(np.eye(3)), ax=right)  # a colorbar is not a panel
    assert book.figure_metrics(fig2)[book.COLUMNS_KEY] == "2"
    assert book.figure_metrics(fig2)[book.MIN_FONT_KEY] == "9"  # the tick labels of the style


def test_the_retina_png_is_pixel_doubled_and_carries_the_metrics():
    book.start()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    data, shown = book._retina_png(fig)
    with Image.open(io.BytesIO(base64.b64decode(data))) as im:
        assert (im.width // 2, im.height // 2) == (shown["width"], shown["height"])  # shown at half size
        assert im.info[book.MIN_FONT_KEY] == "9" and im.info[book.COLUMNS_KEY] == "1"
        assert im.info["dpi"][0] == pytest.approx(2 * matplotlib.rcParams["figure.dpi"], rel=1e-4)


def test_table_escapes_its_cells_and_keeps_math():
    markup = book.table(["a", "b<c"], [[1, "$x < y$"], ["&", 2.5]]).data
    assert markup.startswith('<table class="mathjax_process"><thead><tr><th>a</th><th>b&lt;c</th></tr></thead><tbody>')
    assert "<td>\\(x &lt; y\\)</td>" in markup  # MathJax's inline delimiters
    assert "<td>&amp;</td><td>2.5</td>" in markup
    assert markup.count("<tr>") == 3


def test_rotation_is_the_plane_rotation():
    sp = pytest.importorskip("sympy")
    a, b = sp.symbols("a b", real=True)
    r = book.rotation(a)
    assert sp.simplify(r * book.rotation(b) - book.rotation(a + b)) == sp.zeros(2, 2)
    assert r * sp.Matrix([1, 0]) == sp.Matrix([sp.cos(a), sp.sin(a)])  # counterclockwise


def test_glue_without_myst_nb_only_shows_what_is_asked(capsys):
    book._glue("name", 41, display=False)
    assert capsys.readouterr().out == ""
    book._glue("name", 42)
    assert capsys.readouterr().out == "42\n"
