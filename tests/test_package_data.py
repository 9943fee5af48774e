"""The committed results that chapters 17 and 18 read ship in the wheel and load from a wheel install;
so does the CPU kernel's source, which builds from there.

The chapters read them through importlib.resources (rope.experiment.committed_results, rope.data), so
a pip install from a wheel, without a clone, finds them. The test builds the wheel as a user would,
checks that every committed file is in it byte for byte, unpacks it into a folder of its own and
loads the files in a fresh interpreter that imports rope from there, not from this checkout.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = sorted((ROOT / "rope" / "experiment" / "results").glob("extrapolation_results*"))
DATA = sorted(p for p in (ROOT / "rope" / "data").iterdir() if p.suffix in (".md", ".json"))
KERNEL_SOURCES = sorted((ROOT / "rope" / "cpu").glob("*.c"))

LOAD = """
import sys
from pathlib import Path

import rope
import rope.data
from rope import experiment

assert Path(rope.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()), rope.__file__
for name in experiment.COMMITTED:
    results = experiment.committed_results(name)
    assert results["preset"] == "cpu" and "rope" in results["methods"], name
header, rows = rope.data.markdown_table("bench_rotary.md")
assert header[:2] == ["shape (b, s, hq, hk, d)", "pass"] and len(rows) >= 2, header
assert rope.data.provenance()["commit"] and rope.data.read_text("bench_torch_path.md").startswith("# ")
import rope.cpu.rotary
assert rope.cpu.rotary.available() or sys.argv[2] == "no cc", rope.cpu.build.unavailable_reason()
print("loaded", len(experiment.COMMITTED), len(rows))
"""


def test_the_committed_files_are_where_the_loaders_look():
    names = {p.name for p in EXPERIMENT}
    from rope import data, experiment

    assert {*experiment.COMMITTED, *(n.replace(".json", ".md") for n in experiment.COMMITTED)} <= names
    assert {p.name for p in DATA} == set(data.FILES)
    assert not list((ROOT / "benchmarks").glob("*results*")), "one copy only: the results moved into rope/"
    with pytest.raises(ValueError, match="unknown"):
        data.read_text("results.md")
    with pytest.raises(ValueError, match="unknown"):
        experiment.committed_results("extrapolation_results_gpu.json")


@pytest.mark.slow
def test_the_wheel_ships_the_committed_results_and_they_load_from_it(tmp_path):
    # built from a copy of what the wheel is made of, so that setuptools' build/ stays out of the checkout
    source = tmp_path / "source"
    shutil.copytree(ROOT / "rope", source / "rope", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", str(source),
         "-w", str(wheels)],
        check=True, cwd=tmp_path, capture_output=True,
    )
    (wheel,) = wheels.glob("rope_derived-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert KERNEL_SOURCES
        for path in [*EXPERIMENT, *DATA, *KERNEL_SOURCES]:
            member = path.relative_to(ROOT).as_posix()
            assert archive.read(member) == path.read_bytes(), member
        site = tmp_path / "site"
        archive.extractall(site)
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD, str(site), "cc" if shutil.which("cc", path="/usr/bin:/bin") else "no cc"],
        cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
             "ROPE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert loaded.returncode == 0, loaded.stderr
    from rope import data, experiment

    rows = len(data.markdown_table("bench_rotary.md")[1])
    assert loaded.stdout.split() == ["loaded", str(len(experiment.COMMITTED)), str(rows)]
