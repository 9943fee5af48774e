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


def table(header, rows):
    """``rows`` (sequences of cells) under ``header`` as an HTML table, shown as a table in Jupyter and
    in the book. Cells are written with ``str`` and escaped; a cell may hold inline math ``$...$``,
    which MathJax typesets on the page."""
    from IPython.display import HTML

    def cells(tag, values):
        return "".join(f"<{tag}>{html.escape(str(value), quote=False)}</{tag}>" for value in values)

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return HTML(f"<table><thead><tr>{cells('th', header)}</tr></thead><tbody>{body}</tbody></table>")


def rotation(angle):
    """The SymPy matrix of the rotation of the plane by ``angle``: [[cos, -sin], [sin, cos]]."""
    import sympy as sp

    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])
