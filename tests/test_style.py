"""The code style CI holds the tree to: ruff's lint over everything, and the chapters formatted to
the book's column (notebooks/ruff.toml), so that no code cell scrolls sideways on the page."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff")  # the `test` extra pins it
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_passes():
    done = ruff("check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_chapters_are_formatted_to_the_column():
    done = ruff("format", "--no-cache", "--check", "notebooks")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_is_the_pinned_one():
    """The pinned version is what the two tests above mean: another ruff may format differently."""
    pinned = next(line for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"ruff==' in line)
    version = ruff("--version").stdout.split()[1]
    assert pinned.strip().strip('",') == f"ruff=={version}"
