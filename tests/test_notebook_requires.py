"""Chapters whose cells need Triton or transformers run to their end without them.

The book's extra installs neither. Such a cell names the package on a line ``# requires: <package>``
and its chapter calls rope.analysis.notebook.skip_cells_without_their_packages() (rope.analysis.book.start()
does, in the chapter's first visible cell): where the package
is missing, the cell prints that it was skipped instead of failing (and every other cell runs).
Here each chapter runs in an IPython shell in a fresh process whose import of the package fails.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("IPython")

from rope.analysis import notebook

ROOT = Path(__file__).resolve().parents[1]

RUN_HIDDEN = r"""
import json, os, sys
hidden = sys.argv[2]
sys.modules[hidden] = None  # `import <hidden>` raises ImportError
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.enable_gui = lambda gui=None: None  # %matplotlib inline outside a kernel
path = os.path.abspath(sys.argv[1])
os.chdir(os.path.dirname(path))
for index, cell in enumerate(json.load(open(path))["cells"]):
    if cell["cell_type"] == "code" and not shell.run_cell("".join(cell["source"])).success:
        sys.exit(f"cell {index} failed")
"""

CHAPTERS = [("09_precision", "transformers"), ("18_kernels", "triton"), ("19_rope_inside_attention", "triton")]


@pytest.mark.slow  # each chapter's other cells run: 10-60 s
@pytest.mark.parametrize("chapter, package", CHAPTERS)
def test_chapter_runs_to_its_end_without_the_package(chapter, package):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", RUN_HIDDEN, str(ROOT / "notebooks" / f"{chapter}.ipynb"), package],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    marked = sum(bool(notebook.MARKER.search("".join(cell["source"])))
                 for cell in json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text())["cells"])
    notice = f"skipped: this cell needs {package} (pip install {package})"
    assert marked > 0 and done.stdout.count(notice) == marked


@pytest.mark.parametrize("chapter, package", CHAPTERS)
def test_chapter_names_the_package_near_the_top(chapter, package):
    """The introduction says which package the chapter needs, and the chapter installs the skipping
    before its first marked cell."""
    cells = json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text())["cells"]
    assert f"pip install {package}" in "".join(cells[0]["source"])
    sources = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    call = next(i for i, s in enumerate(sources) if "book.start()" in s or "skip_cells_without_their_packages()" in s)
    first_marked = next(i for i, s in enumerate(sources) if notebook.MARKER.search(s))
    assert call < first_marked


def test_a_marked_cell_runs_where_its_packages_import_and_is_replaced_by_a_notice_otherwise(monkeypatch):
    assert notebook.skipped("# requires: json, math\nx = 1\n") is None
    assert notebook.skipped("x = 1  # requires: nothing\n") is None  # the marker is a line of its own
    monkeypatch.setitem(sys.modules, "json", None)
    replacement = notebook.skipped("# NBVAL_IGNORE_OUTPUT\n# requires: json, math\nimport json\n")
    assert replacement == "print('skipped: this cell needs json (pip install json)')\n"
