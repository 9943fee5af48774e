"""The kernel compiles for every GPU generation it must run on (see rope/kernels/targets.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parent.parent


def compiler_environment() -> dict[str, str]:
    """This process's environment without TRITON_INTERPRET (the interpreter replaces the compiler)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return env


@pytest.mark.slow  # about 50 s per target, empty Triton cache (37 rotary and 9 attention variants compiled)
@pytest.mark.parametrize("arch", [75, 80, 90])
def test_kernel_compiles_for_the_target(arch):
    done = subprocess.run([sys.executable, "-m", "rope.kernels.targets", str(arch)],
                          capture_output=True, text=True, env=compiler_environment(), timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == 37 + 9 and all(line.startswith(f"ok sm_{arch} ") for line in lines)


ONE_VARIANT = """if True:
    from rope.kernels.targets import compile_variant
    from rope.kernels.triton_rotary import TUNING_CANDIDATES

    kernel = compile_variant(75, "bf16", TUNING_CANDIDATES[-1], interleaved=False, tail=64)
    assert kernel.asm["cubin"], "empty cubin"
"""


def test_a_bfloat16_variant_compiles_for_the_t4(tmp_path):
    """`make check`'s share of the test above (a few seconds): one rotary variant, bfloat16 (which
    sm_75 has no arithmetic for) with an unrotated tail, compiled for sm_75 in an empty Triton cache."""
    env = compiler_environment() | {"TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", ONE_VARIANT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
