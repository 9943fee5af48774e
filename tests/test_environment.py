"""The three places that name dependencies agree: pyproject.toml, environment.yml, requirements.lock."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> dict[str, list[Requirement]]:
    """Every requirement of pyproject.toml by package name: a name may be named twice, as triton is
    (the kernels extra's supported range, the test extra's pin)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    named: dict[str, list[Requirement]] = {}
    for r in map(Requirement, listed):
        named.setdefault(r.name.lower(), []).append(r)
    return named


def test_environment_yml_names_the_pyproject_dependencies():
    """environment.yml names each package once, with one of pyproject's specifiers for it (the
    narrowest: a pin where there is one), and that specifier lies within every other one."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda = {Requirement(r).name.lower(): Requirement(r) for r in pip_section if not r.startswith("-e")}
    ours = pyproject_requirements()
    assert set(conda) == set(ours), (f"only in environment.yml: {set(conda) - set(ours)}; "
                                     f"only in pyproject: {set(ours) - set(conda)}")
    for name, requirements in ours.items():
        assert conda[name].specifier in [r.specifier for r in requirements], f"{name}: {conda[name]} vs {requirements}"
        for pin in (s.version for s in conda[name].specifier if s.operator == "=="):
            assert all(r.specifier.contains(pin) for r in requirements), f"{name}=={pin} outside {requirements}"


def test_lock_file_satisfies_pyproject():
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[Requirement(name).name.lower().replace("_", "-")] = version.split("+")[0]
    for name, requirements in pyproject_requirements().items():
        assert name in pins, f"{name} is missing from requirements.lock (run `make lock`)"
        for requirement in requirements:
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"lock pins {name}=={pins[name]}, pyproject wants {requirement}")


def test_the_oldest_triton_is_named_once_everywhere():
    """rope.kernels.MIN_TRITON (refused below at import), the kernels extra's floor in pyproject.toml
    and the Triton of `make test`'s second environment (Makefile's TRITON_OLDEST) are one version."""
    from rope.kernels import MIN_TRITON

    oldest = ".".join(map(str, MIN_TRITON))
    make = re.search(r"^TRITON_OLDEST\s*:=\s*(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert make.startswith(oldest + "."), f"Makefile tests Triton {make}, rope.kernels.MIN_TRITON is {oldest}"
    floors = [str(r.specifier) for r in pyproject_requirements()["triton"] if ">=" in str(r.specifier)]
    assert floors == [f">={oldest}"], f"pyproject's Triton floor {floors}, rope.kernels.MIN_TRITON {oldest}"


def test_lock_pins_no_local_versions():
    """A local version label (torch==2.13.0+cpu) installs only where that label's wheel index is
    configured; the plain version installs everywhere (`make lock` drops the labels)."""
    lines = [line for line in (ROOT / "requirements.lock").read_text().splitlines() if not line.startswith("#")]
    labelled = [line for line in lines if "+" in line]
    assert not labelled, f"local versions in requirements.lock: {labelled}"


@pytest.mark.slow
def test_import_rope_needs_neither_triton_nor_transformers():
    code = "import sys, rope; bad = {'triton', 'transformers'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_the_library_runs_without_numpy():
    """The library needs torch alone: the torch path, rope.hf, rope.attention, and rope.kernels as far
    as it can run without a GPU (imported, its float32 constants computed; Triton's CPU interpreter
    itself needs numpy, a test dependency). rope.analysis and rope.experiment name numpy in their extras."""
    code = """if True:
        import sys, warnings
        sys.modules["numpy"] = None  # import numpy now raises ImportError
        warnings.simplefilter("ignore")  # torch warns that it found no NumPy
        import torch, rope, rope.attention, rope.hf, rope.kernels.operators
        q = torch.randn(1, 3, 2, 8, dtype=torch.float64)
        theta, s = rope.inv_freq({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}, 8)
        rope.apply_rotary(q, q, torch.arange(3), theta, attention_factor=s, backend="torch")
    """
    compiled = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # as on a GPU
    subprocess.run([sys.executable, "-c", code], check=True, env=compiled)


def test_citation_cff_names_the_pyproject_version_and_license():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert citation["cff-version"] == "1.2.0"
    assert citation["version"] == project["version"], "CITATION.cff's version differs from pyproject.toml's"
    assert citation["license"] == project["license"]["text"], "CITATION.cff's license differs from pyproject.toml's"
    assert {"message", "title", "authors", "date-released"} <= set(citation)
