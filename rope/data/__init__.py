"""Committed data the chapters read, shipped with the package: benchmark tables and a model's factors.

The files are package data, so the chapters find them in a wheel install as in a clone:

* ``bench_rotary.md``: the GPU table written by ``python benchmarks/bench_rotary.py --out
  rope/data/bench_rotary.md`` (the fused kernel, forward and backward, against a copy and peers);
* ``bench_rotary.json``: where that table was measured: the date, the git commit of the
  measurement, the kernel file's path at that commit and the SHA-256 of its bytes, so that a
  reader can tell whether the kernel has changed since;
* ``bench_torch_path.md``: the CPU table of ``python benchmarks/bench_torch_path.py``;
* ``roofline.md``: the table written by ``python -m rope.kernels.targets --roofline --out
  rope/data/roofline.md`` (no GPU: the rotary kernel's machine code for the T4, A100, H100 and
  H200 and the fraction of a copy's bandwidth it permits, :mod:`rope.kernels.roofline`); rewrite
  it when the kernel changes;
* ``bench_blockwise.md``: the CPU table of ``python benchmarks/bench_blockwise_cpu.py`` (the blockwise
  attention's float32 and float64 paths against torch's SDPA, one thread);
* ``phi35_mini_longrope.json``: the rope keys of Phi-3.5-mini-instruct's ``config.json`` (the 48
  short and 48 long LongRoPE factors as that file prints them), with its pinned source (chapter 15).

:func:`read_text` returns a file's text, :func:`markdown_table` the rows of its markdown table and
:func:`provenance` the measurement record of the GPU table.
"""

from __future__ import annotations

import json
from importlib import resources

FILES = ("bench_rotary.md", "bench_rotary.json", "bench_torch_path.md", "bench_blockwise.md",
         "phi35_mini_longrope.json", "roofline.md")
"""The data files of this package."""


def read_text(name: str) -> str:
    """The text of one of :data:`FILES`, read from the installed package.

    Args:
        name: the file's name, one of :data:`FILES`.
    """
    if name not in FILES:
        raise ValueError(f"unknown data file {name!r}: expected one of {', '.join(FILES)}")
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def markdown_table(name: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table of a ``.md`` data file: its header cells and its rows of cells.

    Args:
        name: a ``.md`` file of :data:`FILES`.

    Returns:
        ``(header, rows)``: the header's cells and each row's cells, stripped.
    """
    lines = [line for line in read_text(name).splitlines() if line.startswith("|")]
    if len(lines) < 2:
        raise ValueError(f"{name}: no markdown table")

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    header, rows = cells(lines[0]), [cells(line) for line in lines[2:]]
    if any(len(row) != len(header) for row in rows):
        raise ValueError(f"{name}: a row's cell count differs from the header's")
    return header, rows


def provenance() -> dict:
    """Where ``bench_rotary.md`` was measured: ``measured`` (UTC), ``commit``, ``kernel_path``."""
    return json.loads(read_text("bench_rotary.json"))
