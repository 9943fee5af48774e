"""`make gpu-check`'s dry run on the CPU (benchmarks/gpu_check.py --dry-run), so that the one
command run on a lent GPU cannot rot between GPU sessions: every step gets a status, the smoke
cases run in Triton's interpreter against the float64 references and pass, ``--steps`` and
``GPU_CHECK_STEPS`` run only the named steps, and a step past its timeout or the budget is
recorded as such."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
STATUSES = {"pass", "fail", "timeout", "skipped", "not selected"}


def dry_run(out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def summary(out: Path) -> dict[str, list[str]]:
    """step -> [status, seconds, note, writes], from summary.md's table."""
    rows = {}
    for line in (out / "summary.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("step", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def step_names() -> list[str]:
    return re.findall(r'^    Step\("([a-z-]+)"', SCRIPT.read_text(), re.M)


@pytest.mark.slow
def test_the_dry_run_gives_every_step_a_status_and_the_smoke_cases_pass(tmp_path):
    proc = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = summary(tmp_path)
    assert list(rows) == step_names() and len(rows) >= 10
    assert all(status in STATUSES for status, *_ in rows.values()), rows
    assert all(float(seconds) >= 0 for _, seconds, *_ in rows.values())
    for name in ("facts", "smoke", "kernel-tests"):
        assert rows[name][0] == "pass", rows[name]
    for name in ("microbench", "sanitizer", "bench-rotary"):  # nothing to time or check without CUDA
        assert rows[name][0] == "skipped" and "no CUDA" in rows[name][2], rows[name]
    assert all(note for status, _, note, _ in rows.values() if status == "skipped"), "a skip without a reason"
    smoke = (tmp_path / "smoke.md").read_text()
    cases = [line for line in smoke.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(cases) >= 30 and all(line.endswith("| pass |") for line in cases), smoke
    assert any("torch path, float64" in line for line in cases) and any("blockwise float64" in line for line in cases)
    for needle in ("rotary half fp16", "interleaved bf16", "float64_math on", "partial", "in place", "conjugate",
                   "backward", "decode", "M-RoPE", "ReRoPE", "Leaky", "non-causal", "decoding"):
        assert needle in smoke, needle
    facts = (tmp_path / "facts.json").read_text()
    assert '"torch"' in facts and '"rope_sources_sha256"' in facts
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool brings back


def test_only_the_named_steps_run_and_timeouts_and_the_budget_are_recorded(tmp_path):
    # smoke is killed at 1 s (importing torch alone takes longer), which leaves under the 1 s a dry-run
    # step needs of the 1.5 s budget: microbench is skipped for the budget
    proc = dry_run(tmp_path, "--steps", "smoke,microbench", "--timeout", "smoke=1", "--budget", "1.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a timeout fails the check
    rows = summary(tmp_path)
    assert rows["smoke"][0] == "timeout" and "killed after 1 s" in rows["smoke"][2]
    assert rows["microbench"][0] == "skipped" and rows["microbench"][2].startswith("budget")
    assert {name for name, row in rows.items() if row[0] == "not selected"} == set(step_names()) - {
        "smoke", "microbench"}
    assert not (tmp_path / "smoke.md").exists()
    # GPU_CHECK_STEPS does the same; rerun into the same folder, the summary is this run's
    proc = dry_run(tmp_path, env={"GPU_CHECK_STEPS": "wheels"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = summary(tmp_path)
    assert rows["wheels"][0] == "skipped" and "wheels" in rows["wheels"][2]
    assert all(row[0] == "not selected" for name, row in rows.items() if name != "wheels")
    assert (tmp_path / "steps.log").read_text().count("##### gpu_check") == 2


def test_unknown_steps_and_timeouts_are_refused_by_name(tmp_path):
    proc = dry_run(tmp_path, "--steps", "smoke,nonsense")
    assert proc.returncode == 2 and "nonsense" in proc.stderr
    proc = dry_run(tmp_path, "--timeout", "smoke")
    assert proc.returncode != 0 and "STEP=SECONDS" in proc.stderr + proc.stdout
