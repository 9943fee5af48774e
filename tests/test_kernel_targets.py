"""The kernel compiles for every GPU generation it must run on (see rope/kernels/targets.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # about 50 s per target, empty Triton cache (37 rotary and 9 attention variants compiled)
@pytest.mark.parametrize("arch", [75, 80, 90])
def test_kernel_compiles_for_the_target(arch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-m", "rope.kernels.targets", str(arch)],
                          capture_output=True, text=True, env=env, timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == 37 + 9 and all(line.startswith(f"ok sm_{arch} ") for line in lines)
