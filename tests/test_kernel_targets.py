"""The kernel compiles for every GPU generation it must run on (see rope/kernels/targets.py)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parent.parent


def compiler_environment() -> dict:
    """The environment of a process that compiles: Triton's interpreter (which the CPU suite
    switches on) replaces the compiler, so TRITON_INTERPRET is unset."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return env


def _in_a_compiler_process(expression: str):
    """The value of ``expression`` (a Python literal) over the names of rope.kernels.targets,
    evaluated in a process that compiles."""
    done = subprocess.run([sys.executable, "-c", f"from rope.kernels.targets import *; print(repr({expression}))"],
                          capture_output=True, text=True, env=compiler_environment(), timeout=600)
    assert done.returncode == 0, done.stderr
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # about 60 s per target, empty Triton cache (40 rotary and 9 attention variants compiled)
@pytest.mark.parametrize("arch", [75, 80, 90])
def test_kernel_compiles_for_the_target(arch):
    done = subprocess.run([sys.executable, "-m", "rope.kernels.targets", str(arch)],
                          capture_output=True, text=True, env=compiler_environment(), timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == 40 + 9 and all(line.startswith(f"ok sm_{arch} ") for line in lines)


ONE_VARIANT = """if True:
    from rope.kernels.targets import compile_variant
    from rope.kernels.triton_rotary import FLOAT_FLOAT_TUNING_CANDIDATES

    kernel = compile_variant(75, "bf16", FLOAT_FLOAT_TUNING_CANDIDATES[-1], interleaved=False, tail=64)
    assert kernel.asm["cubin"], "empty cubin"
"""


def test_a_bfloat16_variant_compiles_for_the_t4(tmp_path):
    """`make check`'s share of the test above (a few seconds): one rotary variant, bfloat16 (which
    sm_75 has no arithmetic for) in its default float-float math with an unrotated tail, compiled
    for sm_75 in an empty Triton cache."""
    env = compiler_environment() | {"TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", ONE_VARIANT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # a compiler process each: about 3 s
@pytest.mark.parametrize("arch", [75, 90])
def test_machine_code_counts_the_vector_loads_of_q_and_k(arch):
    """The q/k loads of the smallest launch (1 token x 16 heads of 128 coordinates, 2 warps: two
    128-bit loads per thread of each half) are found in the SASS of every target, whose spelling
    of the load differs (sm_75: LDG.E.128.SYS, sm_80 and later: LDG.E.128)."""
    code = _in_a_compiler_process(f"machine_code({arch}, (1, 16, 1, 2), arithmetic='float32')")
    assert code["vector_loads"] == 4 and 0 <= code["loads_before_angle"] <= 4


@pytest.mark.slow  # a compiler process each: about 5 s
@pytest.mark.parametrize("arch", [75, 90])
def test_float_float_math_runs_no_float64_instruction(arch):
    """bfloat16's default math issues no float64 instruction (no DADD, DMUL, DFMA, no conversion
    to or from float64), where float64 math issues dozens a thread: a T4 runs those at 1/32 of
    float32's rate."""
    code = _in_a_compiler_process(f"[machine_code({arch}, (1, 16, 1, 4), arithmetic=a)['float64'] "
                                  "for a in ('float-float', 'float64')]")
    assert code[0] == 0 and code[1] > 20


@pytest.mark.slow  # 25 s per target on an idle core (33 variants compiled afresh)
@pytest.mark.parametrize("arch", [80, 90])
def test_no_launch_size_a_gpu_may_run_spills_registers(arch):
    """Every autotuning candidate of the rotary kernel (float-float, float64 and float32 math) and the attention
    kernels at their launchers' GPU sizes keep their values in registers (ptxas: 0 bytes of spill
    stores and loads): a spill moves values to local memory, off the chip."""
    done = subprocess.run([sys.executable, "-m", "rope.kernels.targets", "--spills", str(arch)],
                          capture_output=True, text=True, env=compiler_environment(), timeout=1200)
    lines = done.stdout.splitlines()
    assert len(lines) == 8 + 8 + 8 + 8 + 9, done.stdout + done.stderr
    assert done.returncode == 0 and all(line.endswith(" 0 bytes spilled") for line in lines), done.stdout


def test_each_math_tunes_over_its_own_candidates():
    """The autotuner's configurations are the three lists; a launch in float64 math tries only
    FLOAT64_TUNING_CANDIDATES, one in float-float math only FLOAT_FLOAT_TUNING_CANDIDATES, one in
    float32 math only TUNING_CANDIDATES, and below 256 tokens only the first of its list."""
    from rope.kernels import triton_rotary

    def sizes(configs):
        return [(c.kwargs["BLOCK_S"], c.kwargs["BLOCK_H"], c.kwargs["GROUP"], c.num_warps) for c in configs]

    configs = triton_rotary.tuned_kernel.configs
    for arithmetic, expected in (("float64", triton_rotary.FLOAT64_TUNING_CANDIDATES),
                                 ("float-float", triton_rotary.FLOAT_FLOAT_TUNING_CANDIDATES),
                                 ("float32", triton_rotary.TUNING_CANDIDATES)):
        for tokens, count in ((4096, len(expected)), (128, 1)):
            chosen = triton_rotary._candidates_of_the_math(configs, {"tokens_bucket": tokens},
                                                           MATH=arithmetic)
            assert sizes(chosen) == expected[:count]
