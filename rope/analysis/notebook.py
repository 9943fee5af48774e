"""Chapters that need an optional package (Triton, transformers) and still run without it.

The book's extra (``pip install -e .[book]``) installs neither Triton nor transformers. A cell that
needs one names it on a line of its own, ``# requires: triton`` (or ``# requires: transformers``,
or both, comma separated), and the chapter calls :func:`skip_cells_without_their_packages` once,
before such a cell (:func:`rope.analysis.book.start`, every chapter's first visible cell, does).
Where every named package imports the line is a comment and the cell runs as written; where one
does not, IPython runs instead a ``print`` saying that the cell was skipped and
what to install, so that the chapter runs to its end.
"""

from __future__ import annotations

import importlib.util
import re

MARKER = re.compile(r"^# requires: *([\w.-]+(?: *, *[\w.-]+)*) *$", re.M)
"""A cell's line naming the packages it needs.

:meta hide-value:
"""


def missing(packages) -> list[str]:
    """Those of ``packages`` that are not installed (in order). Found, not imported: a cell may
    import its package in its own way (transformers under a warnings filter, for one).

    Args:
        packages: the names of the packages (importable module names), an iterable of str.
    """
    return [package for package in packages if importlib.util.find_spec(package) is None]


def skipped(source: str) -> str | None:
    """The replacement of a cell's ``source``: None if it runs as written (no marker, or every
    package it names imports), else a ``print`` of one line naming what is missing.

    Args:
        source: the cell's source code.
    """
    needed = [name.strip() for found in MARKER.findall(source) for name in found.split(",")]
    absent = missing(needed)
    if not absent:
        return None
    notice = f"skipped: this cell needs {' and '.join(absent)} (pip install {' '.join(absent)})"
    return f"print({notice!r})\n"


def _transform(lines: list[str]) -> list[str]:
    replacement = skipped("".join(lines))
    return lines if replacement is None else [replacement]


def skip_cells_without_their_packages() -> None:
    """From now on in this IPython session, skip (with a printed notice) every cell whose packages,
    named by a ``# requires:`` line, are missing. Idempotent; nothing outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()  # None outside an IPython session
    if shell is not None and _transform not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(_transform)
