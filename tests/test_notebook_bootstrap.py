"""Every chapter opens with the same short setup cell, and then shows its imports.

The setup cell (tagged remove-cell: the book leaves it out, the .ipynb keeps it for nbval and Colab)
installs the package where `rope` is missing, as on a fresh Colab runtime, from the repository that
_config.yml names, with the `chapters` extra: the packages the chapters import that a plain install
lacks. Everything a chapter reads is package data, so nothing is cloned and the cell changes no
folder. Where `rope` imports (nbval, CI, a local Jupyter, Colab after the install) it does nothing.
tests/test_colab_runtime.py runs it for real in a fresh environment.
"""

import ast
import json
import re
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from IPython.core.inputtransformer2 import TransformerManager
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
GPU_CHAPTERS = {"09_precision", "18_kernels"}
GPU_NOTE = (
    "# A GPU chapter: the notebook asks Colab for a T4 GPU runtime (Runtime > Change\n"
    "# runtime type). Without a GPU it still runs: its GPU cells fall back to the CPU\n"
    "# (Triton's interpreter) or are skipped.\n"
)
# Imported by chapters without being in the extra: torch is rope's own dependency; IPython comes with
# every Jupyter kernel; myst_nb only builds the book (rope.analysis.book.glue stands in without it);
# triton and transformers only in cells marked `# requires:` (skipped where missing).
BESIDES_THE_EXTRA = {"rope", "torch", "IPython", "myst_nb", "triton", "transformers"}


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def setup_source(path: Path) -> str:
    """The first code cell, without the GPU chapters' note."""
    source = "".join(code_cells(path)[0]["source"])
    return source.removeprefix(GPU_NOTE) if path.stem in GPU_CHAPTERS else source


CANONICAL = setup_source(NOTEBOOKS[0])


def run_setup(rope_present: bool) -> list[tuple[str, str]]:
    """Run the setup cell as IPython runs it (its `%pip` line turned into Python by IPython's own
    transformer), with `find_spec` answering for `rope` as told; returns the magics it called."""
    import importlib.util

    calls = []

    class Shell:
        def run_line_magic(self, name, line):
            calls.append((name, line))

    python = TransformerManager().transform_cell(CANONICAL)
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "rope":
            return real("rope") if rope_present else None
        return real(name, *args, **kwargs)

    namespace = {"get_ipython": Shell}  # get_ipython() is the shell whose magics the cell calls
    original = importlib.util.find_spec
    importlib.util.find_spec = find_spec
    try:
        exec(compile(python, "<setup cell>", "exec"), namespace)
    finally:
        importlib.util.find_spec = original
    return calls


def test_every_chapter_has_the_same_short_setup_cell():
    assert len(NOTEBOOKS) >= 18
    for path in NOTEBOOKS:
        assert setup_source(path) == CANONICAL, f"{path.name}: its setup cell differs from {NOTEBOOKS[0].name}'s"
    code = [line for line in CANONICAL.splitlines() if line.strip() and not line.startswith("#")]
    assert len(code) <= 4, CANONICAL
    # it says what to do when the install fails
    assert "Runtime > Restart session, then run this cell again" in CANONICAL


def test_the_setup_cell_installs_the_book_repository_with_the_chapters_extra():
    (line,) = [line.strip() for line in CANONICAL.splitlines() if line.strip().startswith("%pip install")]
    requirement = Requirement(line.split('"')[1])
    assert requirement.name == "rope-derived"
    assert requirement.extras == {"chapters"} and "chapters" in EXTRAS
    assert requirement.url == f"git+{URL}"


def test_the_setup_cell_installs_only_where_rope_is_missing():
    assert run_setup(rope_present=True) == []
    (call,) = run_setup(rope_present=False)
    assert call[0] == "pip" and call[1].startswith("install --quiet ") and f"git+{URL}" in call[1]


def test_the_chapters_extra_covers_what_the_chapters_import():
    """Every top-level module a chapter imports is the standard library's, in the extra, or one of
    the few named above for their reasons; and every package of the extra is imported somewhere."""
    imported = set()
    for path in NOTEBOOKS:
        for cell in code_cells(path):
            python = TransformerManager().transform_cell("".join(cell["source"]))
            for node in ast.walk(ast.parse(python)):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split(".")[0])
    extra = {Requirement(r).name for r in EXTRAS["chapters"]}  # each imports under its own name
    outside = imported - set(sys.stdlib_module_names) - extra - BESIDES_THE_EXTRA
    assert not outside, f"chapters import {sorted(outside)}: add them to the chapters extra"
    assert extra <= imported, f"the chapters extra names {sorted(extra - imported)}, which no chapter imports"


def test_the_setup_cell_is_hidden_in_the_book_and_the_chapter_starts_in_view():
    for path in NOTEBOOKS:
        setup, imports = code_cells(path)[:2]
        assert setup["metadata"].get("tags") == ["remove-cell"], f"{path.name}: setup cell not tagged remove-cell"
        assert setup["outputs"] == [], f"{path.name}: the setup cell prints nothing where rope imports"
        assert not {"remove-cell", "hide-input"} & set(imports["metadata"].get("tags", [])), path.name
        source = "".join(imports["source"])
        assert re.search(r"^import rope$", source, re.MULTILINE), f"{path.name}: the imports cell imports rope"
        assert re.search(r"^rng = book\.start\(\)", source, re.MULTILINE), f"{path.name}: it calls book.start()"


def test_gpu_chapters_ask_colab_for_a_gpu_and_say_so():
    uses_cuda = set()
    for path in NOTEBOOKS:
        if any("cuda" in "".join(c["source"]) for c in code_cells(path)[1:]):
            uses_cuda.add(path.stem)
    assert uses_cuda == GPU_CHAPTERS, "chapters whose code uses CUDA changed: update GPU_CHAPTERS and their metadata"
    for path in NOTEBOOKS:
        metadata = json.loads(path.read_text())["metadata"]
        first = "".join(code_cells(path)[0]["source"])
        if path.stem in GPU_CHAPTERS:
            assert metadata.get("accelerator") == "GPU", path.name
            assert metadata.get("colab", {}).get("gpuType") == "T4", path.name
            assert first.startswith(GPU_NOTE), f"{path.name}: its setup cell does not open with the GPU note"
        else:
            assert "accelerator" not in metadata and "gpuType" not in metadata.get("colab", {}), path.name
            assert "GPU" not in first, path.name


@pytest.mark.parametrize("cell", ["import rope", "%pip install x"])
def test_the_transformer_used_above_is_ipythons(cell):
    """The magic is turned into the same call a kernel makes, and plain Python is left as it is."""
    python = TransformerManager().transform_cell(cell)
    assert ("run_line_magic('pip', 'install x')" in python) == cell.startswith("%")
