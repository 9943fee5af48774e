"""The book is read before it is run: in every chapter the prose takes more rendered rows than the
code shown in view.

Counted as issue 26 counts them: a visible line of code is one row; a paragraph line of prose is one
row per 90 characters (the text column at 1400 px holds about that many). Code in a cell tagged
``hide-input``, ``hide-cell``, ``remove-input`` or ``remove-cell`` is behind the toggle or left out,
and does not count; outputs do not count either way.
"""

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
HIDDEN = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
PROSE_CHARACTERS_PER_ROW = 90


def rows(path: Path) -> tuple[int, int]:
    """(visible code rows, prose rows) of a chapter."""
    code = prose = 0
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            if not HIDDEN & set(cell.get("metadata", {}).get("tags", [])):
                code += len(source.splitlines())
        elif cell["cell_type"] == "markdown":
            prose += sum(math.ceil(len(line) / PROSE_CHARACTERS_PER_ROW) for line in source.splitlines()
                         if line.strip())
    return code, prose


def test_rows_are_counted_as_documented():
    cell = {"cell_type": "markdown", "source": ["a" * 91 + "\n", "\n", "b\n"]}
    hidden = {"cell_type": "code", "metadata": {"tags": ["hide-input"]}, "source": ["x = 1\n"]}
    shown = {"cell_type": "code", "metadata": {}, "source": ["x = 1\n", "y = 2"]}
    path = ROOT / "_build" / "balance-probe.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"cells": [cell, hidden, shown]}))
    try:
        assert rows(path) == (2, 3)
    finally:
        path.unlink()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_prose_outweighs_visible_code(chapter):
    code, prose = rows(chapter)
    assert code < prose, f"{chapter.name}: {code} rows of visible code, {prose} rows of prose"
