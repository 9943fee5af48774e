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


def test_close_and_max_error():
    a = torch.zeros(3, dtype=torch.float64)
    assert book.close(a, a + 1e-13) and not book.close(a, a + 1e-11)
    assert book.close(a, a + 1e-11, atol=1e-10)
    assert book.max_error(a, torch.tensor([0.0, -2.5, 1.0], dtype=torch.float64)) == 2.5


def test_rotate_turns_one_tensor_as_apply_rotary_turns_a_query():
    import rope

    x = torch.randn(1, 4, 2, 8, dtype=torch.float64)
    theta = rope.inv_freq({"rope_type": "default", "rope_theta": 100.0}, 8)[0]
    positions = torch.tensor([0, 3, -7, 2**40])
    other = torch.randn_like(x)
    for layout in ("half", "interleaved"):
        assert torch.equal(book.rotate(x, positions, theta, layout=layout),
                           rope.apply_rotary(x, other, positions, theta, layout=layout)[0])
    assert torch.equal(book.rotate(x, torch.zeros(4, dtype=torch.long), theta), x)


def test_block_generator_is_the_skew_generator_of_the_pairs():
    thetas = torch.tensor([1.0, 0.25], dtype=torch.float64)
    generator = book.block_generator(thetas, 5)
    assert torch.equal(generator, -generator.T) and generator[4].abs().sum() == 0
    rotation = torch.linalg.matrix_exp(3 * generator)[:2, :2]  # pair 0 turned by 3 theta_0
    expected = torch.tensor([[np.cos(3.0), -np.sin(3.0)], [np.sin(3.0), np.cos(3.0)]])
    assert torch.allclose(rotation, expected.to(torch.float64), atol=1e-14)


def test_exp_series_and_matrix_coefficient():
    sp = pytest.importorskip("sympy")
    d, t, s = sp.Symbol("d", integer=True, positive=True), *sp.symbols("t s")
    A, B = sp.MatrixSymbol("A", d, d), sp.MatrixSymbol("B", d, d)
    product = book.exp_series(t, A) * book.exp_series(s, B)
    assert book.matrix_coefficient(product, t * s, (t, s)) == A * B
    assert book.matrix_coefficient(product, t**2, (t, s)) == A * A / 2
    assert book.matrix_coefficient(product, 1, (t, s)) == sp.Identity(d)
    assert book.matrix_coefficient(product, s * t**2, (t, s)) == A * A * B / 2
