"""Every chapter opens with the same Colab setup cell, naming the repository that _config.yml names.

On Colab a chapter runs outside a checkout, and some chapters read committed files
(the kernel's benchmark table, the experiment's results; in a clone as in a wheel install they are
package data under rope/): the first code cell clones the repository
(into a side folder renamed when complete, so an interrupted clone is redone), installs it unless
``rope`` already imports, and moves into its notebooks/ folder; run again after a failure, it retries
what is missing, and after a runtime restart it only moves. A failed step raises one RuntimeError
that says what to do. Elsewhere the cell only checks that ``rope`` imports, and installs nothing.
The cell is tagged remove-cell: the book leaves it out, the .ipynb (nbval, Colab) keeps it. The
chapters that use a GPU ask Colab for one in their notebook metadata and say so in that cell.
"""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CLONE = "/content/rope-derived"
URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
GPU_CHAPTERS = {"09_precision", "18_kernels"}
GPU_NOTE = (
    "# A GPU chapter: the notebook asks Colab for a T4 GPU runtime (Runtime > Change runtime type).\n"
    "# Without a GPU it still runs: its GPU cells fall back to the CPU (Triton's interpreter) or are skipped.\n"
)
RETRY = "Runtime > Restart session, then run this cell again."


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def setup_source(path: Path) -> str:
    """The first code cell, without the GPU chapters' note."""
    source = "".join(code_cells(path)[0]["source"])
    return source.removeprefix(GPU_NOTE) if path.stem in GPU_CHAPTERS else source


CANONICAL = setup_source(NOTEBOOKS[0])


def test_every_chapter_has_the_same_setup_cell_naming_the_book_repository():
    assert len(NOTEBOOKS) >= 18
    for path in NOTEBOOKS:
        assert setup_source(path) == CANONICAL, f"{path.name}: its setup cell differs from {NOTEBOOKS[0].name}'s"
    assert f'    repository = "{URL}"\n    clone = "{CLONE}"\n' in CANONICAL
    assert CANONICAL.rstrip().endswith("\n_setup()")
    # plain Python (no ! or % lines), so that the test below runs it as it is
    assert not re.search(r"^\s*[!%]", CANONICAL, re.MULTILINE)


def test_the_setup_cell_is_hidden_in_the_book_and_the_chapter_imports_rope_in_view():
    for path in NOTEBOOKS:
        setup, imports = code_cells(path)[:2]
        assert setup["metadata"].get("tags") == ["remove-cell"], f"{path.name}: setup cell not tagged remove-cell"
        assert setup["outputs"] == [], f"{path.name}: the setup cell prints nothing off Colab"
        assert "remove-cell" not in imports["metadata"].get("tags", []), path.name
        assert re.search(r"^import rope$", "".join(imports["source"]), re.MULTILINE), (
            f"{path.name}: the second code cell, shown in the book, imports rope")


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


# Runs the setup cell in a fresh interpreter, as a kernel would, with Colab faked (a google.colab
# package on sys.path), `rope` refused by a meta path finder until the stubbed pip has "installed"
# a stand-in package, and subprocess.run replaced by stubs for git and pip that fail or succeed as
# told. It runs the cell once per entry of the plan and prints what happened as JSON.
DRIVER = textwrap.dedent('''
    import importlib.abc, importlib.machinery, json, os, subprocess, sys, traceback

    work, colab, plan = sys.argv[1], sys.argv[2] == "colab", json.loads(sys.argv[3])
    code = open(os.path.join(work, "cell.py")).read()
    site = os.path.join(work, "site")  # where the stubbed pip installs a stand-in rope
    if colab:
        sys.path.insert(0, os.path.join(work, "fake"))
        import google.colab  # noqa: F401

    class Refuse(importlib.abc.MetaPathFinder):
        """rope does not import until `installed`; then it is the stand-in from `site`."""
        installed = os.path.isdir(os.path.join(site, "rope"))

        def find_spec(self, name, path=None, target=None):
            if name != "rope" and not name.startswith("rope."):
                return None
            if not self.installed:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return importlib.machinery.PathFinder.find_spec(name, [site] if path is None else path)

    finder = Refuse()
    sys.meta_path.insert(0, finder)
    calls, attempt = [], {}

    def run(command, **kwargs):
        calls.append(command)
        tool = "git" if command[0] == "git" else "pip" if command[1:4] == ["-m", "pip", "install"] else None
        if tool is None:
            raise AssertionError(f"unexpected command {command}")
        if attempt["outcome"][tool] == "fail":
            return subprocess.CompletedProcess(command, 1, "", f"{tool}: simulated failure")
        if tool == "git":
            os.makedirs(os.path.join(command[-1], "notebooks"))
        else:
            os.makedirs(os.path.join(site, "rope"))
            open(os.path.join(site, "rope", "__init__.py"), "w").write("STAND_IN = True\\n")
            finder.installed = attempt["outcome"][tool] == "ok"  # else: rope still does not import
        return subprocess.CompletedProcess(command, 0, "", "")

    subprocess.run = run
    report = []
    for outcome in plan:
        attempt["outcome"] = outcome
        calls.clear()
        namespace = {"__name__": "__main__"}
        error = None
        try:
            exec(compile(code, "<setup cell>", "exec"), namespace)
        except BaseException as exc:
            error = {"type": type(exc).__name__, "message": str(exc),
                     "chained": exc.__cause__ is not None or (exc.__context__ is not None
                                                              and not exc.__suppress_context__),
                     "traceback": "".join(traceback.format_exception(exc))}
        rope = sys.modules.get("rope")
        report.append({"error": error, "calls": [c[:2] if c[0] == "git" else c[1:4] + c[5:] for c in calls],
                       "cwd": os.getcwd(), "names": sorted(k for k in namespace if not k.startswith("__")),
                       "rope": getattr(rope, "STAND_IN", "real") if rope else None})
    print(json.dumps(report))
''')


def run_setup(tmp_path: Path, plan: list[dict], colab: bool = True, installed: bool = False) -> list[dict]:
    clone = tmp_path / "content" / "rope-derived"
    (tmp_path / "content").mkdir()
    (tmp_path / "cell.py").write_text(CANONICAL.replace(CLONE, str(clone)))
    (tmp_path / "fake" / "google" / "colab").mkdir(parents=True)
    (tmp_path / "fake" / "google" / "__init__.py").write_text("")
    (tmp_path / "fake" / "google" / "colab" / "__init__.py").write_text("")
    if installed:  # a runtime restart after a complete setup: clone and package are there
        (clone / "notebooks").mkdir(parents=True)
        (tmp_path / "site" / "rope").mkdir(parents=True)
        (tmp_path / "site" / "rope" / "__init__.py").write_text("STAND_IN = True\n")
    start = tmp_path / "start"  # where the kernel starts: /content on Colab, no checkout around it
    start.mkdir()
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), "colab" if colab else "local",
                           json.dumps(plan)], cwd=start, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


OK = {"git": "ok", "pip": "ok"}


def assert_one_clear_error(result: dict, *words: str):
    error = result["error"]
    assert error is not None and error["type"] == "RuntimeError", error
    assert not error["chained"], error["traceback"]  # one exception, not "During handling of ..."
    assert error["traceback"].count("Traceback") == 1
    assert "NameError" not in error["traceback"]
    for word in words:
        assert word in error["message"], (word, error["message"])
    assert result["names"] == ["_setup"]  # nothing half-defined for later cells to trip on
    assert result["rope"] is None


def test_setup_on_colab_clones_installs_and_moves_into_the_notebooks(tmp_path):
    (result,) = run_setup(tmp_path, [OK])
    clone = tmp_path / "content" / "rope-derived"
    assert result["error"] is None
    assert result["calls"] == [["git", "clone"], ["-m", "pip", "install", str(clone)]]
    assert result["cwd"] == str(clone / "notebooks")
    assert result["rope"] is True  # the freshly installed package imports in the same session
    assert not (tmp_path / "content" / "rope-derived.partial").exists()


def test_setup_after_a_restart_only_moves_into_the_notebooks(tmp_path):
    (result,) = run_setup(tmp_path, [OK], installed=True)
    assert result["error"] is None and result["calls"] == [] and result["rope"] is True
    assert result["cwd"] == str(tmp_path / "content" / "rope-derived" / "notebooks")


def test_a_failed_clone_raises_one_clear_error_and_is_redone_on_the_next_run(tmp_path):
    failed, again = run_setup(tmp_path, [{"git": "fail", "pip": "ok"}, OK])
    assert_one_clear_error(failed, "clone the repository", f"git clone -q --depth 1 {URL}", "simulated failure", RETRY)
    assert failed["calls"] == [["git", "clone"]]  # no install from a clone that is not there
    assert failed["cwd"] == str(tmp_path / "start")
    assert again["error"] is None and again["calls"][0] == ["git", "clone"] and again["rope"] is True


def test_a_failed_install_raises_one_clear_error_and_is_retried_on_the_next_run(tmp_path):
    failed, again = run_setup(tmp_path, [{"git": "ok", "pip": "fail"}, OK])
    clone = tmp_path / "content" / "rope-derived"
    assert_one_clear_error(failed, "install the repository", f"pip install -q {clone}", "simulated failure", RETRY)
    # the retry installs again, without cloning again: the check is whether rope imports
    assert again["error"] is None and again["rope"] is True
    assert again["calls"] == [["-m", "pip", "install", str(clone)]]
    assert again["cwd"] == str(clone / "notebooks")


def test_an_install_that_does_not_make_rope_importable_says_to_restart(tmp_path):
    # pip reports success but rope still does not import (e.g. a dependency needs a fresh session)
    (result,) = run_setup(tmp_path, [{"git": "ok", "pip": "ok, but rope does not import"}])
    clone = tmp_path / "content" / "rope-derived"
    assert_one_clear_error(result, f"installed {clone}", "still fails", "ModuleNotFoundError", RETRY)


def test_setup_off_colab_never_installs_and_says_how_to_install(tmp_path):
    (result,) = run_setup(tmp_path, [OK], colab=False)
    assert_one_clear_error(result, "`import rope` failed", "pip install -e .", URL)
    assert result["calls"] == [] and result["cwd"] == str(tmp_path / "start")


@pytest.mark.parametrize("colab", [False, True])
def test_setup_with_rope_importable_outside_a_clone_does_nothing(tmp_path, colab):
    """Off Colab (nbval, CI, a local Jupyter) with rope installed: no command, no move, no output."""
    if colab:  # on Colab but in a checkout (notebooks/ next to rope/): no clone either
        (tmp_path / "rope").mkdir()
    (result,) = run_setup(tmp_path, [OK], colab=colab, installed=True)
    assert result["error"] is None and result["calls"] == [] and result["rope"] is True
    assert result["cwd"] == str(tmp_path / "start")


def test_setup_cell_runs_silently_here_with_the_real_rope():
    """The cell as nbval runs it: here rope imports, so the stored empty output is what it prints."""
    proc = subprocess.run([sys.executable, "-c", CANONICAL], cwd=ROOT / "notebooks", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr
