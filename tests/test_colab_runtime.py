"""One chapter run the way a fresh Colab runtime runs it, its outputs checked by nbval.

tests/test_notebook_bootstrap.py runs the hidden setup cell with its magic recorded. Here nothing in
the cell's path is stubbed but the network: a new virtual environment where `rope` does not import
(its dependencies are .venv's, reused through a directory of links, without rope's own files); a
`google.colab` module imported at start-up, as Colab's kernel does; a `git` on PATH that serves the
book's repository address from a local repository holding this checkout's files (tracked and
untracked, not ignored), and passes everything else to the real git; pip run offline (no index, no
build isolation: the dependencies and setuptools are already there). The chapter runs with a
kernel whose Python is that environment, under nbval: its outputs must match the stored ones, the
setup cell's `%pip install` must print only IPython's note, and the chapter must have used the
package pip installed there, whose files are those of the project's built wheel.
"""

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "01_why_positions.ipynb"  # the quickest chapter (about 6 s under nbval)
URL = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
KERNEL = "fresh-colab-runtime"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def is_this_project(entry: Path) -> bool:
    """The project's own entries in .venv's site-packages: the package, its metadata, the editable finder."""
    return entry.name == "rope" or entry.name.startswith(("rope_derived-", "rope_derived.", "__editable__"))


def checkout_files() -> list[str]:
    """The files a clone of this working tree would hold: tracked and untracked ones, not the ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]  # not deleted ones


def copy_checkout(to: Path) -> None:
    for name in checkout_files():
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, to / name)


def fresh_environment(venv: Path, deps: Path) -> Path:
    """A virtual environment that sees .venv's packages except this project; returns its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps.mkdir()
    # Links, not copies; no .pth files (nothing of .venv's runs at start-up, rope's editable finder neither).
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not is_this_project(entry) and entry.suffix != ".pth" and entry.name != "__pycache__":
            (deps / entry.name).symlink_to(entry)
    (site / "dependencies.pth").write_text(f"{deps}\n")  # a plain path line: pip, torch, ipykernel, ...
    # Colab: google.colab is imported when the kernel starts (nothing in a chapter depends on it).
    (site / "google" / "colab").mkdir(parents=True)  # google: a namespace package, as on Colab
    (site / "google" / "colab" / "__init__.py").write_text('"""A stand-in for Colab\'s module."""\n')
    (site / "zz_colab_runtime.pth").write_text("import google.colab\n")
    return site


def package_files(record: str) -> set[str]:
    """The files a RECORD lists, less the .dist-info folder and the bytecode pip compiles on install."""
    return {row[0] for row in csv.reader(io.StringIO(record)) if ".dist-info/" not in row[0]
            and "__pycache__/" not in row[0]}


def test_the_clone_and_the_linked_dependencies_leave_out_only_what_they_must():
    """`make check`'s share of the test below: the fake clone holds the package and the chapter and
    nothing git ignores; the fresh environment links every entry of .venv's site-packages but this
    project's (the names an editable install leaves); the RECORD comparison leaves out only metadata
    and bytecode."""
    files = checkout_files()
    assert "rope/__init__.py" in files and CHAPTER.relative_to(ROOT).as_posix() in files
    assert not [name for name in files if name.startswith((".git/", ".venv/", "_build/")) or "/__pycache__/" in name]
    assert all(map(is_this_project, [Path("rope"), Path("rope_derived-0.1.0.dist-info"),
                                     Path("__editable__.rope_derived-0.1.0.pth")]))
    assert not any(map(is_this_project, [Path("torch"), Path("ropey"), Path("rope_other-1.0.dist-info")]))
    record = ("rope/__init__.py,sha256=x,1\nrope/__pycache__/__init__.cpython-311.pyc,,\n"
              "rope_derived-0.1.0.dist-info/RECORD,,\nrope/data/notes.md,sha256=y,2\n")
    assert package_files(record) == {"rope/__init__.py", "rope/data/notes.md"}


@pytest.mark.slow  # 30-60 s: a wheel build, a kernel start, the install, the chapter
@pytest.mark.skipif(os.name == "nt", reason="a POSIX layout: bin/python, a shell script for git")
def test_a_chapter_runs_in_a_fresh_colab_runtime_as_nbval_runs_it_here(tmp_path):
    source = tmp_path / "checkout"  # what the fake git clones
    copy_checkout(source)
    assert (source / "rope" / "__init__.py").is_file() and (source / CHAPTER.relative_to(ROOT)).is_file()

    # The project's wheel, built from another copy so that the clone gets no build leftovers.
    shutil.copytree(source, tmp_path / "wheel-source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    str(tmp_path / "wheel-source"), "-w", str(tmp_path / "wheels")], check=True,
                   env={**os.environ, **OFFLINE, "PIP_CACHE_DIR": str(tmp_path / "pip-cache")}, timeout=300)
    (wheel,) = (tmp_path / "wheels").glob("rope_derived-*.whl")

    venv = tmp_path / "venv"
    site = fresh_environment(venv, tmp_path / "dependencies")
    python = venv / "bin" / "python"
    probe = subprocess.run([python, "-c", "import sys, torch, ipykernel, pip, setuptools, google.colab\n"
                            "assert 'google.colab' in sys.modules\nimport rope"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "ModuleNotFoundError: No module named 'rope'" in probe.stderr, probe.stderr  # only rope is missing

    # The book's repository, as a local one: a commit of the checkout's files. The fake git hands the
    # real one that repository wherever an argument names the book's address (pip clones from it).
    remote = tmp_path / "remote"
    shutil.copytree(source, remote)
    author = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
              "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path)}
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "the book"]):
        subprocess.run(["git", *command], cwd=remote, check=True, env={**os.environ, **author}, timeout=120)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"book, local, git = {URL!r}, {str(remote)!r}, {shutil.which('git')!r}\n"
        "args = [local if a in (book, book + '.git') else a for a in sys.argv[1:]]\n"
        "os.execv(git, [git, *args])\n")
    (bin_dir / "git").chmod(0o755)

    # The kernel: the fresh environment's Python, found by name through JUPYTER_PATH.
    kernels = tmp_path / "jupyter" / "kernels" / KERNEL
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "A fresh Colab runtime", "language": "python"}))

    # The chapter as Colab opens it: in /content (here tmp_path/content), no checkout around it. The
    # setup cell's stored output, empty where rope imports, becomes what it prints on a fresh runtime
    # (IPython's note after a %pip install); a last cell prints where rope came from.
    content = tmp_path / "content"
    content.mkdir()
    notebook = json.loads(CHAPTER.read_text())
    setup = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
    assert f"git+{URL}" in "".join(setup["source"]) and setup["outputs"] == []
    setup["execution_count"] = 0  # a run reference cell: nbval compares the outputs of those only
    setup["outputs"] = [{"output_type": "stream", "name": "stdout",
                         "text": "Note: you may need to restart the kernel to use updated packages.\n"}]
    notebook["cells"].append({
        "cell_type": "code", "execution_count": 99, "metadata": {}, "id": "fresh-runtime-check",
        "source": "import sys\n\nimport rope\n\nprint(rope.__file__, sys.prefix, sep='\\n')",
        "outputs": [{"output_type": "stream", "name": "stdout",
                     "text": f"{site / 'rope' / '__init__.py'}\n{venv}\n"}]})
    copy = content / CHAPTER.name
    copy.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")

    env = {key: value for key, value in os.environ.items()
           if key not in {"PYTHONPATH", "VIRTUAL_ENV", "JUPYTER_PATH", "PYTHONHOME"} and not key.startswith("PIP_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", JUPYTER_PATH=str(tmp_path / "jupyter"),
               **OFFLINE, PIP_NO_BUILD_ISOLATION="0",  # "0" turns isolation off (pip's inverted switch)
               PIP_CACHE_DIR=str(tmp_path / "pip-cache"),
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    nbval = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "-p", "no:cacheprovider", "-q",
                            "--nbval-kernel-name", KERNEL, "--nbval-cell-timeout", "600", str(copy)],
                           cwd=content, env=env, capture_output=True, text=True, timeout=900)
    assert nbval.returncode == 0, nbval.stdout[-8000:] + nbval.stderr[-2000:]
    code_cells = sum(cell["cell_type"] == "code" for cell in notebook["cells"])
    assert f"{code_cells} passed" in nbval.stdout, nbval.stdout[-2000:]

    # What the setup cell's pip installed: a regular install of the wheel's files, byte for byte.
    (dist_info,) = site.glob("rope_derived-*.dist-info")
    assert not list(site.glob("__editable__*")), "the runtime got an editable install"
    with zipfile.ZipFile(wheel) as archive:
        built = {name: archive.read(name) for name in archive.namelist() if ".dist-info/" not in name}
    assert "rope/__init__.py" in built and all(name.startswith("rope/") for name in built)
    assert package_files((dist_info / "RECORD").read_text()) == set(built)
    assert {name: (site / name).read_bytes() for name in built} == built
