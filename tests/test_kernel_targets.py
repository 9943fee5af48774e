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


@pytest.mark.slow  # about 60 s per target, empty Triton cache (44 rotary and 9 attention variants compiled)
@pytest.mark.parametrize("arch", [75, 80, 90])
def test_kernel_compiles_for_the_target(arch):
    done = subprocess.run([sys.executable, "-m", "rope.kernels.targets", str(arch)],
                          capture_output=True, text=True, env=compiler_environment(), timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == 44 + 9 and all(line.startswith(f"ok sm_{arch} ") for line in lines)


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
    """Every autotuning candidate and few-token launch size of the rotary kernel (float-float,
    float64 and float32 math; float-float with the last coordinates rotated, rotated="last") and
    the attention kernels at their launchers' GPU sizes keep their
    values in registers (ptxas: 0 bytes of spill stores and loads): a spill moves values to local
    memory, off the chip."""
    from rope.kernels.triton_rotary import candidates_of, few_token_launches

    done = subprocess.run([sys.executable, "-m", "rope.kernels.targets", "--spills", str(arch)],
                          capture_output=True, text=True, env=compiler_environment(), timeout=1200)
    lines = done.stdout.splitlines()
    rotary = sum(len(candidates_of(math)) + len(few_token_launches()) for math in ("float-float", "float64", "float64",
                                                                                  "float32"))
    rotated_last = len(candidates_of("float-float")) + len(few_token_launches(32))  # DeepSeek-V4's variant
    assert len(lines) == rotary + rotated_last + 9, done.stdout + done.stderr
    assert done.returncode == 0 and all(line.endswith(" 0 bytes spilled") for line in lines), done.stdout


def test_each_math_tunes_over_its_own_candidates():
    """The autotuner's configurations are the three lists; a launch in float64 math tries only
    FLOAT64_TUNING_CANDIDATES, one in float-float math only FLOAT_FLOAT_TUNING_CANDIDATES, one in
    float32 math only TUNING_CANDIDATES (fewer tokens than AUTOTUNE_FROM_TOKENS take
    few_token_sizes and never reach the autotuner)."""
    from rope.kernels import triton_rotary

    def sizes(configs):
        return [(c.kwargs["BLOCK_S"], c.kwargs["BLOCK_H"], c.kwargs["GROUP"], c.num_warps) for c in configs]

    configs = triton_rotary.tuned_kernel.configs
    for arithmetic, expected in (("float64", triton_rotary.FLOAT64_TUNING_CANDIDATES),
                                 ("float-float", triton_rotary.FLOAT_FLOAT_TUNING_CANDIDATES),
                                 ("float32", triton_rotary.TUNING_CANDIDATES)):
        chosen = triton_rotary._candidates_of_the_math(configs, {"tokens_bucket": 4096}, MATH=arithmetic)
        assert sizes(chosen) == expected


# The roofline (rope/kernels/roofline.py, targets --roofline) ---------------------------------

def test_the_gpu_specs_give_their_datasheets_peak_rates():
    """Each GPU's SMs x clock x per-SM rate x 2 (an fma is two operations) is its datasheet's peak
    in TFLOPS, float32 and float64 without tensor cores (NVIDIA's T4, A100, H100 and H200 datasheets)."""
    from rope.kernels import roofline

    datasheets = {"T4": (8.1, None), "A100": (19.5, 9.7), "H100": (67.0, 34.0), "H200": (67.0, 34.0)}
    assert [gpu.name for gpu in roofline.GPUS] == list(datasheets)
    for gpu in roofline.GPUS:
        for rate, tflops in zip((gpu.rates["fp32"], gpu.rates["fp64"]), datasheets[gpu.name]):
            if tflops is not None:
                assert abs(2 * gpu.sms * gpu.clock_ghz * rate / 1000 / tflops - 1) < 0.02, gpu


def test_an_fp64_bound_kernel_on_a_t4():
    """bfloat16 (2 bytes read, 2 written per element), 30 instructions of which 20 float64 per
    element, on 40 SMs at 1.59 GHz with 320 GB/s and 2 float64 results per clock per SM: memory
    4 / 320 ns, float64 20 / (2 x 40 x 1.59) ns, issue 30 / (128 x 40 x 1.59) ns."""
    from rope.kernels import roofline

    t4 = next(gpu for gpu in roofline.GPUS if gpu.name == "T4")
    memory, fp64 = 4 / 320, 20 / (2 * 40 * 1.59)
    estimate = roofline.estimate(t4, {"issue": 30, "fp64": 20}, itemsize=2)
    assert estimate["bound"] == "fp64" and estimate["fraction"] == pytest.approx(memory / fp64, rel=1e-12)
    assert estimate["memory_ns"] == pytest.approx(memory) and estimate["compute_ns"] == pytest.approx(fp64)


def test_issue_bound_and_memory_bound_kernels_on_an_h100():
    """60 instructions, 25 of them float64, per bfloat16 element on 132 SMs at 1.98 GHz with 3350 GB/s:
    issue (128 a clock per SM) takes longer than float64 (64) and than memory; 10 instructions per
    element take less than memory: a copy's speed, 1."""
    from rope.kernels import roofline

    h100 = next(gpu for gpu in roofline.GPUS if gpu.name == "H100")
    clocks = 132 * 1.98
    issue, fp64, memory = 60 / (128 * clocks), 25 / (64 * clocks), 4 / 3350
    assert issue > fp64 > memory
    estimate = roofline.estimate(h100, {"issue": 60, "fp64": 25}, itemsize=2)
    assert estimate["bound"] == "issue" and estimate["fraction"] == pytest.approx(memory / issue, rel=1e-12)
    estimate = roofline.estimate(h100, {"issue": 10, "fp32": 4}, itemsize=2)
    assert estimate["bound"] == "memory" and estimate["fraction"] == 1.0


def test_opcodes_go_to_their_pipes():
    from rope.kernels import roofline

    expected = {"DFMA": "fp64", "DADD": "fp64", "DSETP.GEU.AND": "fp64", "DEPBAR.LE": None, "FFMA": "fp32",
                "FMUL.FTZ": "fp32", "IMAD.MOV.U32": "imad", "LOP3.LUT": "alu", "FSEL": "alu",
                "F2F.F64.F32": "conversion64", "F2I.S64.F64.TRUNC": "conversion64", "I2F.F64.S64": "conversion64",
                "FRND.F64.TRUNC": "conversion64", "F2FP.BF16.F32.PACK_AB": "conversion", "I2FP.F32.S32": "conversion",
                "LDG.E.128": None, "STG.E.128": None, "ULDC.64": None, "EXIT": None}
    assert {opcode: roofline.pipe_of(opcode) for opcode in expected} == expected
    assert roofline.pipe_counts(["DFMA", "DFMA", "FFMA", "LDG.E.128"]) == {"issue": 4, "fp64": 2, "fp32": 1}


def test_per_element_counts_charge_each_program_its_own_head_blocks():
    """Two programs of 64 threads, one with a second head block (3 blocks in all): 10 + 10 + 4
    instructions per thread of the first block, 4 more for the second; over 256 elements."""
    from rope.kernels import roofline

    counts = roofline.per_element({"issue": 10, "fp64": 3}, 64, 2, 256, block={"issue": 4, "fp64": 1}, blocks=1)
    assert counts == {"issue": 64 * (2 * 10 + 4) / 256, "fp64": 64 * (2 * 3 + 1) / 256}


def test_the_launch_grid_of_the_prefill_shape():
    """4096 tokens, 32 + 8 heads: BLOCK_H 8 gives 4 + 1 head blocks, GROUP 2 three programs per
    token block of 2 tokens (the last with one block); BLOCK_H 16 gives 2 + 1 (half of k's empty)."""
    from rope.kernels.targets import PREFILL, launch_grid

    assert PREFILL == (1, 4096, 32, 8, 128)
    assert launch_grid(PREFILL, (2, 8, 2, 4)) == (2048 * 3, 128, 2048 * 5)
    assert launch_grid(PREFILL, (1, 16, 1, 2)) == (4096 * 3, 64, 4096 * 3)
    assert launch_grid((3, 5, 4, 4, 64), (4, 4, 1, 1)) == (3 * 2 * 2, 32, 3 * 2 * 2)


def test_executed_opcodes_stop_at_the_last_exit():
    from rope.kernels.targets import executed_opcodes

    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;        /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 EXIT ;                        /* 0x000000000000894d */
        /*0020*/                   DFMA R2, R4, R6, R8 ;         /* 0x0000000604027229 */
        /*0030*/                   EXIT ;                        /* 0x000000000000794d */
        /*0040*/                   BRA 0x40;                     /* 0xfffffffc00fc7947 */
        /*0050*/                   NOP;                          /* 0x0000000000007918 */
    """
    assert executed_opcodes(sass) == ["LDC", "EXIT", "DFMA", "EXIT"]


def _roofline_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith(("| GPU ", "| ---"))]


def test_the_committed_roofline_table_has_a_row_per_gpu_dtype_and_math():
    """rope/data/roofline.md (targets --roofline --out): a row per GPU, dtype and math of
    triton_rotary.MATHS, starting with the GPU's name and ending with a fraction in (0, 1], the math
    ``launch`` takes by default marked ``default`` once per GPU and dtype. A new math, or a new
    default, fails here until the table is written again."""
    import torch

    import rope.data
    from rope.kernels import roofline, triton_rotary

    text = rope.data.read_text("roofline.md")
    header, _ = rope.data.markdown_table("roofline.md")
    assert header == roofline.HEADER and header[0] == "GPU" and header[-1] == "fraction of a copy"
    rows = _roofline_rows(text)
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    expected = [(gpu.name, dtype, math) for gpu in roofline.GPUS for dtype in dtypes for math in triton_rotary.MATHS]
    assert [(row[0], row[1], row[2].removesuffix(" (default)")) for row in rows] == expected
    for row in rows:
        assert 0 < float(row[-1]) <= 1 and row[-1] == f"{float(row[-1]):.2f}", row
        assert row[2].endswith(" (default)") == (triton_rotary.default_math(dtypes[row[1]]) == row[2].split()[0])
    for gpu in roofline.GPUS:
        for dtype in dtypes:
            assert sum("default" in row[2] for row in rows if row[:2] == [gpu.name, dtype]) == 1


def test_the_markdown_table_marks_the_default_and_ends_rows_with_the_fraction():
    from rope.kernels import roofline

    row = dict(gpu="H100", dtype="bf16", math="float64", default=True, sizes=(2, 8, 2, 4), issue=60.24, fp64=25.5,
               registers=136, spills=0, bound="issue", fraction=0.6638)
    text = roofline.markdown_table([row, {**row, "math": "float32", "default": False, "fraction": 1.0}], ["# T"])
    assert text.startswith("# T\n\n| GPU |") and text.endswith("\n")
    assert _roofline_rows(text) == [["H100", "bf16", "float64 (default)", "2, 8, 2, 4", "60.2", "25.5", "136", "0",
                                     "issue", "0.66"],
                                    ["H100", "bf16", "float32", "2, 8, 2, 4", "60.2", "25.5", "136", "0", "issue",
                                     "1.00"]]


@pytest.mark.slow  # a compiler process: about 20 s (16 variants compiled)
def test_the_roofline_of_bfloat16_on_the_h100_from_its_machine_code():
    """bfloat16 on the H100 in each math, compiled: float64 math executes float64 operations
    (about 25 per element, the cos/sin and the exact products), float32 math almost none (the
    turns' conversion of theta, once per token and pair) and float-float math, the default, none;
    float64 math issues several times float32's instructions and is further from a copy's speed,
    float-float math reaches 0.9 of it (issue 27's goal)."""
    rows = _in_a_compiler_process("roofline_rows(gpus=[g for g in roofline.GPUS if g.name == 'H100'], "
                                  "dtypes=('bf16',), maths=('float32', 'float-float', 'float64'))")
    single, pair, double = rows
    assert [row["math"] for row in rows] == ["float32", "float-float", "float64"]
    assert [row["default"] for row in rows] == [False, True, False]
    assert single["fp64"] < 1 < 10 < double["fp64"] < 40 and pair["fp64"] == 0
    assert 3 * single["issue"] < double["issue"] and double["fraction"] < single["fraction"] <= 1
    assert 0.9 <= pair["fraction"] <= 1
    assert all(row["spills"] == 0 and 0 < row["registers"] <= 255 for row in rows)
