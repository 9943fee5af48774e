"""Every chapter opens with the same Colab bootstrap, naming the repository that _config.yml names.

On Colab a chapter runs outside a checkout, and some chapters read committed files
(benchmarks/results.md, the experiment's results): the first code cell clones the repository
once, installs it, and moves into its notebooks/ folder; after a runtime restart it only moves.
Elsewhere it does nothing but ``import rope``.
"""

import json
import sys
import types
from pathlib import Path

import pytest
import yaml
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CLONE = "/content/rope-derived"
URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


def first_code_cell(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"])


def bootstrap(path: Path) -> str:
    source = first_code_cell(path)
    return source[: source.index("import rope\n") + len("import rope\n")]


def test_every_chapter_has_the_same_bootstrap_naming_the_book_repository():
    assert len(NOTEBOOKS) >= 18
    texts = {bootstrap(path) for path in NOTEBOOKS}
    assert len(texts) == 1, "the notebooks' first cells differ before `import rope`"
    assert f"git clone -q --depth 1 {URL} {CLONE}\n" in texts.pop()


class RecordingShell:
    """Stands in for IPython: records the shell commands and line magics the cell runs."""

    def __init__(self):
        self.calls = []

    def system(self, command):
        self.calls.append(("!", command))

    def run_line_magic(self, name, line):
        self.calls.append((name, line))


@pytest.mark.parametrize("restarted", [False, True])
def test_bootstrap_on_colab_clones_once_installs_and_moves_into_the_notebooks(tmp_path, monkeypatch, restarted):
    clone = tmp_path / "rope-derived"
    if restarted:  # a runtime restart: the clone and the installed package are still there
        clone.mkdir()
    code = TransformerManager().transform_cell(bootstrap(NOTEBOOKS[0])).replace(CLONE, str(clone))
    shell = RecordingShell()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    exec(code, {"get_ipython": lambda: shell})
    expected = [] if restarted else [("!", f"git clone -q --depth 1 {URL} {clone}"), ("pip", f"install -q {clone}")]
    assert shell.calls == expected + [("cd", f"{clone}/notebooks")]


def test_bootstrap_does_nothing_outside_colab(tmp_path, monkeypatch):
    shell = RecordingShell()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(TransformerManager().transform_cell(bootstrap(NOTEBOOKS[0])), {"get_ipython": lambda: shell})
    assert shell.calls == []

