"""What every chapter of the book uses, kept in one place instead of a copy per chapter.

A chapter's first visible cell is ``rng = book.start()``: it seeds torch and numpy, shows figures
inline in the book's style and, from then on, skips (with a notice) a cell marked
``# requires: <package>`` whose package is missing (:mod:`.notebook`). ``glue`` names a value for
the prose (myst-nb's, where myst-nb is installed), ``table`` shows rows as a table, ``rotation`` is
the plane rotation in SymPy.

Figures are drawn for the book's text column (about 756 px wide in a 1400 px window): at most
:data:`FIGURE_WIDTH` inches wide, text of at least :data:`MIN_FONT_PT` points, and stored as a
pixel-doubled PNG shown at half its pixel size, so that a high-density screen gets two image pixels
per screen pixel. Each PNG records in two text chunks the smallest font size it draws
(``rope:min-font-pt``) and the most panels it sets side by side (``rope:columns``):
tests/test_book_render.py reads them with the size the browser shows the image at, and so measures
the text height as the reader sees it.
"""

from __future__ import annotations

import html
import re

FIGURE_WIDTH = 7.0
"""The widest figure, in inches: at 100 dpi shown at 700 px, inside the text column."""
MIN_FONT_PT = 9.0
"""The smallest font size a figure may draw, in points: 12.5 px where a figure inch is 100 px."""
MIN_FONT_KEY = "rope:min-font-pt"
COLUMNS_KEY = "rope:columns"

STYLE = {
    "figure.figsize": (FIGURE_WIDTH, 3.2),
    "figure.dpi": 100,
    "font.size": 10.0,
    "axes.titlesize": 10.0,
    "axes.labelsize": 10.0,
    "xtick.labelsize": 9.0,
    "ytick.labelsize": 9.0,
    "legend.fontsize": 9.0,
    "legend.title_fontsize": 9.0,
    "figure.titlesize": 11.0,
}
"""The matplotlib settings of the book's figures."""


def start(seed: int = 0):
    """Set a chapter up: seed torch (``torch.manual_seed``) and return ``numpy.random.default_rng(seed)``;
    figures inline, in :data:`STYLE`, as pixel-doubled PNGs with their legibility recorded; cells
    marked ``# requires: <package>`` skipped where that package is missing. Outside IPython only the
    seeds and the style are set."""
    import matplotlib
    import numpy as np
    import torch

    from .notebook import skip_cells_without_their_packages

    torch.manual_seed(seed)
    try:
        from IPython import get_ipython
    except ImportError:
        shell = None
    else:
        shell = get_ipython()
    if shell is not None:
        shell.run_line_magic("matplotlib", "inline")  # resets rcParams: the style comes after
        from matplotlib.figure import Figure

        formatter = shell.display_formatter.formatters["image/png"]
        formatter.for_type(Figure, _retina_png)
        shell.display_formatter.formatters["image/svg+xml"].pop(Figure, None)
        skip_cells_without_their_packages()
    matplotlib.rcParams.update(STYLE)
    return np.random.default_rng(seed)


def figure_metrics(fig) -> dict[str, str]:
    """What the page test checks of a figure: the smallest font size (points) of the text it draws,
    and the most axes that share a horizontal band (panels side by side; colorbars not counted)."""
    from matplotlib.text import Text

    def drawn(artist) -> bool:
        return isinstance(artist, Text) and artist.get_visible() and bool(artist.get_text().strip())

    sizes = [text.get_fontsize() for text in fig.findobj(drawn)]
    panels = [ax.get_position() for ax in fig.axes if ax.get_visible() and not hasattr(ax, "_colorbar")]
    columns = max(
        (sum(1 for other in panels if other.y0 < box.y0 + box.height / 2 < other.y1) for box in panels),
        default=0,
    )
    return {MIN_FONT_KEY: f"{min(sizes, default=MIN_FONT_PT):g}", COLUMNS_KEY: str(columns)}


def _retina_png(fig):
    """The inline backend's retina PNG of ``fig`` (shown at half its pixel size), with
    :func:`figure_metrics` in its text chunks."""
    from IPython.core.pylabtools import retina_figure

    return retina_figure(fig, base64=True, metadata=figure_metrics(fig))


def _glue(name: str, variable, display: bool = True) -> None:
    """myst-nb's ``glue`` where myst-nb is missing (a Colab runtime): a value glued for the book's
    prose is only shown, when ``display`` asks for it."""
    if display:
        from IPython.display import display as show

        show(variable)


try:
    from myst_nb import glue
except ImportError:  # reading, not building, the book
    glue = _glue


INLINE_MATH = re.compile(r"\$([^$]+)\$")
"""``$...$`` in a table cell: written ``\\(...\\)``, the inline delimiters MathJax typesets in HTML
output on the book's pages (the book's MathJax does not take ``$`` there) and in Jupyter.

:meta hide-value:
"""


def table(header, rows):
    """``rows`` (sequences of cells) under ``header`` as an HTML table, shown as a table in Jupyter and
    in the book. Cells are written with ``str`` and escaped; inline math ``$...$`` in a cell is
    typeset (:data:`INLINE_MATH`)."""
    from IPython.display import HTML

    def cells(tag, values):
        return "".join(f"<{tag}>{_cell(value)}</{tag}>" for value in values)

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    # mathjax_process: the book's pages typeset math only inside elements of that class (their
    # sections are mathjax_ignore: MyST has typeset the prose's math already)
    head = f"<thead><tr>{cells('th', header)}</tr></thead>"
    return HTML(f'<table class="mathjax_process">{head}<tbody>{body}</tbody></table>')


def _cell(value) -> str:
    """A table cell's markup: its text escaped, its inline math in MathJax's delimiters."""
    return INLINE_MATH.sub(r"\\(\1\\)", html.escape(str(value), quote=False))


def rotation(angle):
    """The SymPy matrix of the rotation of the plane by ``angle``: [[cos, -sin], [sin, cos]]."""
    import sympy as sp

    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


def close(a, b, atol: float = 1e-12) -> bool:
    """Whether two float64 tensors agree to ``atol`` in every entry (no relative tolerance)."""
    import torch

    return torch.allclose(a, b, rtol=0.0, atol=atol)


def max_error(a, b) -> float:
    """The largest absolute entry of ``a - b``, as a Python float."""
    return (a - b).abs().max().item()


def rotate(x, positions, inv_freq, **options):
    """One tensor ``x`` [batch, seq, heads, head_dim] rotated by :func:`rope.apply_rotary` (which
    rotates a query and a key together) at ``positions`` with ``inv_freq``; ``options`` are its
    keyword arguments (``layout``, ``rotary_dim``, ...)."""
    import rope

    return rope.apply_rotary(x, x, positions, inv_freq, **options)[0]


def block_generator(thetas, d: int):
    """The float64 d x d generator blockdiag(J(t_0), J(t_1), ...) on the pairs (2j, 2j + 1), with
    J(t) = [[0, -t], [t, 0]] and ``thetas`` = (t_0, t_1, ...) a 1-D float64 tensor; the rows and
    columns past 2 len(thetas) are zero."""
    import torch

    generator = torch.zeros(d, d, dtype=torch.float64)
    j = torch.arange(len(thetas))
    generator[2 * j + 1, 2 * j], generator[2 * j, 2 * j + 1] = thetas, -thetas
    return generator


def exp_series(t, A):
    """exp(tA) to its t^2 term, I + tA + t^2 A^2 / 2, for a SymPy matrix (symbol) ``A``."""
    import sympy as sp

    return sp.Identity(A.shape[0]) + t * A + t**2 * A * A / 2


def matrix_coefficient(expr, monomial, variables):
    """The matrix that multiplies ``monomial`` (in the scalar ``variables``) in the expanded SymPy
    matrix expression ``expr``: each term's scalar factor read as a polynomial in ``variables``."""
    import sympy as sp

    total = sp.ZeroMatrix(*expr.shape)
    for term in sp.expand(expr).args:
        parts = term.args if isinstance(term, sp.MatMul) else (term,)
        scalar = sp.Mul(*[p for p in parts if not isinstance(p, sp.MatrixExpr)])
        matrix = sp.MatMul(*[p for p in parts if isinstance(p, sp.MatrixExpr)])
        total += sp.Poly(scalar, *variables).coeff_monomial(monomial) * matrix
    return total.doit()


# --- Block-diagonal and Kronecker structure (chapters 2, 4, 8 and 10) ---
# Block-diagonal and Kronecker structure, shared by chapters 2, 4, 8 and 10. With k = d/2 pairs
# and E_i the k x k matrix with a single 1 at (i, i), a block-diagonal matrix of 2 x 2 blocks B_i
# (the interleaved layout, pair i = coordinates (2i, 2i + 1)) is sum_i E_i ⊗ B_i, and the same
# blocks in the half layout (pair i = (i, i + k)) are sum_i B_i ⊗ E_i. The perfect shuffle P,
# defined by P (x ⊗ y) = y ⊗ x for x in R^k and y in R^2, carries one onto the other. The
# helpers let SymPy check these facts for a symbolic k, and build the concrete matrices for
# checks against the package.


def unit_matrix(i, k):
    """E_i: the ``k`` x ``k`` SymPy matrix (``k`` may be a symbol) with a 1 at (``i``, ``i``)."""
    import sympy as sp

    r, c = sp.symbols("r c", integer=True, nonnegative=True)
    return sp.FunctionMatrix(k, k, sp.Lambda((r, c), sp.KroneckerDelta(r, i) * sp.KroneckerDelta(c, i)))


def unit_vector(i, k):
    """e_i: the column of length ``k`` (``k`` may be a symbol) with a 1 at ``i``."""
    import sympy as sp

    r, c = sp.symbols("r c", integer=True, nonnegative=True)
    return sp.FunctionMatrix(k, 1, sp.Lambda((r, c), sp.KroneckerDelta(r, i)))


def in_range(expr, size, indices):
    """``expr`` with each ``Piecewise`` condition that says an index of ``indices`` is below ``size``
    taken as true: the indices lie in 0 .. size - 1 (a sum over a symbolic range leaves them)."""
    import sympy as sp

    slack = sp.Symbol("slack", integer=True, nonnegative=True)

    def inside(condition):
        return all(condition.subs(size, index + 1 + slack).simplify() is sp.true
                   for index in indices if index in condition.free_symbols) and condition.has(size)

    def first_true(piecewise):
        branch, condition = piecewise.args[0]
        return branch if inside(condition) else piecewise

    return expr.replace(lambda e: isinstance(e, sp.Piecewise), first_true)


def entries_vanish(matrix, size, indices) -> bool:
    """Whether every entry of the SymPy matrix expression ``matrix`` (symbolic sizes allowed) is 0,
    for every value of the index symbols ``indices``, each in 0 .. ``size`` - 1: the entry at
    symbolic (row, column) is computed, range conditions are resolved, and each Kronecker delta
    between two of ``indices`` is split into its two cases (equal, different)."""
    import itertools

    import sympy as sp

    row, column = sp.symbols("row column", integer=True, nonnegative=True)
    entry = in_range(matrix[row, column].doit(), size, indices)
    cases = [{}]
    for a, b in itertools.combinations(indices, 2):
        cases = [case | extra for case in cases for extra in ({sp.KroneckerDelta(a, b): 0}, {b: a})]
    for case in cases:
        value = entry.subs(case).doit()
        value = in_range(value, size, indices)
        if sp.simplify(value) != 0:
            return False
    return True


def mixed_product(expr):
    """``expr`` with each product of Kronecker products multiplied factor by factor,
    (A ⊗ B)(C ⊗ D) = AC ⊗ BD: SymPy's rule, valid for symbolic sizes where the shapes match."""
    from sympy.matrices.expressions.kronecker import combine_kronecker

    return combine_kronecker(expr)


def swap(expr, P):
    """``expr`` with each ``P * (x ⊗ y)`` replaced by ``y ⊗ x``: the defining property of the
    perfect shuffle ``P`` (a SymPy matrix symbol)."""
    import sympy as sp

    def swapped(product):
        factors = product.args
        for at in range(len(factors) - 1):
            if factors[at] == P and isinstance(factors[at + 1], sp.KroneckerProduct):
                x, y = factors[at + 1].args
                return sp.MatMul(*factors[:at], sp.KroneckerProduct(y, x), *factors[at + 2:]).doit()
        return product

    return expr.replace(lambda e: isinstance(e, sp.MatMul), swapped)


def sums_agree(left, right) -> bool:
    """Whether two nested finite SymPy ``Sum`` expressions are the same sum in another order: each
    is flattened (factors moved into the inner sums, so that one multiple sum remains) and the two
    must have the same expanded summand and the same ranges."""
    import sympy as sp

    def flatten(expr, limits=()):
        if isinstance(expr, sp.Sum):
            return flatten(expr.function, limits + expr.limits)
        if isinstance(expr, sp.Mul):
            inner = [flatten(factor) for factor in expr.args]
            summand = sp.Mul(*(term for term, _ in inner))
            return summand, limits + sum((ranges for _, ranges in inner), ())
        return expr, limits

    (f, f_limits), (g, g_limits) = flatten(left), flatten(right)
    return sp.expand(f - g) == 0 and sorted(map(str, f_limits)) == sorted(map(str, g_limits))


def shuffle(d):
    """The perfect shuffle for an even ``d`` as a SymPy matrix: P[a k + i, 2 i + a] = 1 for
    k = d/2, i < k and a in (0, 1), so that P x sends the interleaved layout to the half one."""
    import sympy as sp

    k = d // 2
    P = sp.zeros(d, d)
    for i in range(k):
        for a in range(2):
            P[a * k + i, 2 * i + a] = 1
    return P


def block_rotation(position, frequencies, layout="interleaved", block=rotation):
    """R at ``position`` as an explicit SymPy matrix: sum_i E_i ⊗ block(position theta_i) in the
    interleaved layout, sum_i block(position theta_i) ⊗ E_i in the half layout."""
    import sympy as sp

    k = len(frequencies)
    total = sp.zeros(2 * k, 2 * k)
    for i, theta in enumerate(frequencies):
        E_i = sp.zeros(k, k)
        E_i[i, i] = 1
        pair = block(position * theta)
        total += sp.kronecker_product(E_i, pair) if layout == "interleaved" else sp.kronecker_product(pair, E_i)
    return total


def vanishes(matrix) -> bool:
    """Whether every entry of an explicit SymPy matrix (or one expression) is 0 after expanding,
    the addition formulas and sin^2 + cos^2 = 1."""
    import sympy as sp

    entries = matrix if hasattr(matrix, "shape") else [matrix]
    return all(sp.simplify(sp.expand_trig(sp.expand(entry))) == 0 for entry in entries)
