"""Compile the fused RoPE kernel to machine code for named GPU architectures, without a GPU.

    python -m rope.kernels.targets 75 80 90

Triton's NVIDIA backend and the ptxas it bundles build a cubin for any target on any machine,
so a machine without a GPU can check what only a GPU would otherwise show: that the kernels use
no feature their targets lack (sm_75 is the T4 of a Colab runtime, with no native bfloat16; sm_80
the A100; sm_90 the H100): the rotary kernel in 44 variants (4 of them rotating the last
coordinates, ``rotated="last"``), the RoPE-inside-attention kernels
(:mod:`.triton_attention` and its backward) in those of :data:`ATTENTION_VARIANTS`. Run it as a
separate process with ``TRITON_INTERPRET`` unset: Triton's interpreter, which the CPU test suite
switches on, replaces the compiler. Prints one line per variant and exits non-zero if any fails.
Not imported by ``import rope`` (it imports Triton).

    python -m rope.kernels.targets --code 90

prints instead, for each math and each launch size the autotuner may pick in it (bfloat16), the
machine code Triton's bundled ``cuobjdump`` disassembles from the cubin: SASS instructions (there
are no loops, so a thread executes each at most once) and those of them on float64 (arithmetic
and conversions), each also per element of q and k the thread rotates, registers, bytes spilled
to local memory, shared memory, and how many of its 128-bit loads of q/k the program issues
before the angle's floating-point part starts (:data:`_ANGLE_STARTS`): those loads wait in memory
while the angle is computed.

    python -m rope.kernels.targets --roofline [--out rope/data/roofline.md]

prints the roofline of :mod:`.roofline` for the T4, A100, H100 and H200 (:func:`roofline_report`):
per GPU, dtype and math, the instructions and FP64 operations per element of the machine code,
registers, spills, and the estimated fraction of a copy's bandwidth at a prefill shape.

    python -m rope.kernels.targets --spills 80 90

prints the registers and spilled bytes (ptxas's count) of every launch size a GPU may run, the
rotary kernel's candidates and the attention kernels at their launchers' sizes, and exits
non-zero if any spills (:func:`spill_report`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import subprocess
import sys
import tempfile
import warnings

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import roofline, triton_attention, triton_attention_backward, triton_attention_decode
from .triton_rotary import (
    FLOAT64_TUNING_CANDIDATES,
    MATHS,
    TUNING_CANDIDATES,
    candidates_of,
    default_math,
    few_token_launches,
    kernel_constants,
    rotary_kernel,
)

STRIDES = ["sq_b", "sq_s", "sq_h", "sk_b", "sk_s", "sk_h", "sqo_b", "sqo_s", "sqo_h", "sko_b", "sko_s", "sko_h"]


def default_arithmetic(dtype: str) -> str:
    """The math ``launch`` takes by default for q/k of Triton type ``dtype``
    (:func:`rope.kernels.triton_rotary.default_math`): "float32" for "fp32", "float64" for "fp64",
    "float-float" for "fp16" and "bf16"."""
    return {"fp32": "float32", "fp64": "float64"}.get(dtype, "float-float")


def compile_variant(arch: int, dtype: str, sizes: tuple[int, int, int, int], interleaved: bool, tail: int,
                    mrope: bool = False, scale_after: bool | None = None, arithmetic: str | None = None,
                    rotated: str = "first"):
    """The kernel for q/k of Triton type ``dtype`` (e.g. "bf16"), head_dim 128 with ``tail``
    unrotated coordinates, launch ``sizes`` = (BLOCK_S, BLOCK_H, GROUP, num_warps), M-RoPE or not,
    with the attention factor's power of two applied after the rotation (``scale_after``; None:
    as ``launch`` does for attention factor 1, which bfloat16 in float-float math applies
    after), in ``arithmetic`` (one of
    :data:`rope.kernels.triton_rotary.MATHS`; None: ``launch``'s default for the dtype,
    :func:`default_arithmetic`; "fp64" always takes "float64"); compiled as ``launch`` compiles it,
    with no contraction of multiplies and adds into fused multiply-adds.

    Args:
        arch: the target's compute capability, e.g. 90 for sm_90.
        dtype: the Triton type of q and k: "fp16", "bf16", "fp32" or "fp64".
        sizes: the launch sizes (BLOCK_S, BLOCK_H, GROUP, num_warps).
        interleaved: the interleaved layout, else the half layout.
        tail: the unrotated coordinates of the 128.
        rotated: ``"first"`` or ``"last"``: the rotated block at 0, or after the ``tail``.
        mrope: the M-RoPE variant (a position row per pair).
        scale_after: the attention factor's power of two applied after the rotation (a factor above
            1, or for bfloat16 in float-float math above 1/2), or None for factor 1.
        arithmetic: "float32", "float-float" or "float64" math, or None for the dtype's default.

    Returns:
        The compiled kernel (Triton's ``CompiledKernel``).
    """
    block_s, block_h, group, warps = sizes
    arithmetic = "float64" if dtype == "fp64" else arithmetic or default_arithmetic(dtype)
    if scale_after is None:
        scale_after = dtype == "bf16" and arithmetic == "float-float"
    types = {name: "*" + dtype for name in ("Q", "K", "QO", "KO")}
    types.update(POS="*i64", FREQ="*fp32", AXES="*i64" if mrope else "*fp32",
                 WINDOWS="*fp32" if arithmetic == "float32" else "*i64", TABLE="*fp32", seq_len="i32",
                 heads_q="i32", heads_k="i32", tokens_bucket="i32", scale="fp32", scale_lo="fp32", power="fp32",
                 scale64="fp64", power64="fp64")
    types.update({name: "i64" for name in STRIDES + ["sp_b", "sp_s", "sp_a"]})
    constants = kernel_constants(128, 128 - tail, interleaved=interleaved, conjugate=False, arithmetic=arithmetic,
                                 copy_tail=True, mrope=mrope, scale_after=scale_after, rotated=rotated)
    constants.update(BLOCK_S=block_s, BLOCK_H=block_h, GROUP=group)
    types.update({name: "constexpr" for name in constants})
    names = rotary_kernel.arg_names  # the signature in the kernel's order
    signature = {name: types[name] for name in names}
    # What Triton's launcher assumes of typical arguments: 16-aligned pointers and strides.
    aligned = ["Q", "K", "QO", "KO", "POS", "FREQ", "AXES", "WINDOWS", "TABLE"] + STRIDES
    source = ASTSource(
        fn=rotary_kernel, signature=signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned},
    )
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "enable_fp_fusion": False})


_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def _attention_type(name: str, dtype: str) -> str:
    """The Triton type of a runtime argument of the attention kernels, by its name."""
    if name in ("LSE", "DELTA", "FREQ", "LEAKY_FREQ", "ROW_SCALE", "OUT_PART", "LSE_PART"):
        return "*fp32"
    if name in ("Q_POS", "K_POS"):
        return "*i64"
    if name.isupper():  # Q, K, V, OUT, DO, DQ, DK, DV
        return "*" + dtype
    if re.fullmatch(r"s[a-z]+_[bsh]", name):  # strides
        return "i64"
    return "fp32" if name.endswith("scale") else "i32"


def compile_attention_variant(arch: int, dtype: str, mode: int, causal: bool, interleaved: bool, head_dim: int,
                              tail: int, kernel: str = "forward", logn: bool = False,
                              sizes: tuple[int, ...] | None = None):
    """One of the attention kernels (``kernel``: "forward", :mod:`.triton_attention`; "dkdv" or "dq",
    :mod:`.triton_attention_backward`; "decode", :mod:`.triton_attention_decode`) for q/k/v of
    Triton type ``dtype``, ``mode`` (PLAIN, RE_ROPE, LEAKY), ``head_dim`` = v_dim with ``tail``
    unrotated coordinates, launch ``sizes`` = (BLOCK_M, BLOCK_N, num_warps[, num_stages]) (by
    default the launchers' on a GPU), with log-n scaling (``logn``) or not, compiled as the
    launchers compile it.

    Args:
        arch: the target's compute capability, e.g. 90 for sm_90.
        dtype: the Triton type of q, k and v: "fp16", "bf16" or "fp32".
        mode: the logits, ``PLAIN``, ``RE_ROPE`` or ``LEAKY`` of :mod:`.triton_attention`.
        causal: the causal mask.
        interleaved: the interleaved layout, else the half layout.
        head_dim: the head dimension, also v_dim.
        tail: the unrotated coordinates of the head.
        kernel: "forward", "dkdv", "dq" or "decode".
        logn: log-n scaling of the logits.
        sizes: (BLOCK_M, BLOCK_N, num_warps[, num_stages]), or ``None`` for the launchers' GPU sizes.

    Returns:
        The compiled kernel (Triton's ``CompiledKernel``).
    """
    import torch

    function = {"forward": triton_attention.attention_forward_kernel,
                "dkdv": triton_attention_backward.attention_dkdv_kernel,
                "dq": triton_attention_backward.attention_dq_kernel,
                "decode": triton_attention_decode.attention_decode_kernel}[kernel]
    if sizes is None:
        sizes = {"forward": triton_attention.GPU_LAUNCH, "dkdv": triton_attention_backward.DKDV_LAUNCH,
                 "dq": triton_attention_backward.DQ_LAUNCH,
                 "decode": (triton_attention_decode.DECODE_ROWS, *triton_attention_decode.DECODE_LAUNCH)}[kernel]
    block_m, block_n, warps, *stages = sizes
    constants = triton_attention.kernel_constants(head_dim, head_dim - tail, head_dim, interleaved=interleaved,
                                                  causal=causal, mode=mode, logn=logn,
                                                  dtype=getattr(torch, _TORCH_DTYPES[dtype]))
    constants.update(BLOCK_M=block_m, BLOCK_N=block_n)
    if kernel in ("dkdv", "dq"):
        constants.update(SCALE_AFTER=False)  # the ordinary scales' variant
    names = function.arg_names
    signature = {name: "constexpr" if name in constants else _attention_type(name, dtype) for name in names}
    aligned = [name for name in names if signature[name].startswith("*") or signature[name] == "i64"]
    source = ASTSource(
        fn=function, signature=signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned},
    )
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=warps, enable_fp_fusion=False, **dict(zip(["num_stages"], stages))))


ATTENTION_VARIANTS = [
    # (dtype, mode, causal, interleaved, head_dim, tail, kernel, logn): every mode, dtype and layout
    # once in each kernel, both head dims, with and without log-n
    ("bf16", triton_attention.LEAKY, True, False, 128, 0, "forward", True),
    ("fp16", triton_attention.RE_ROPE, False, True, 128, 64, "forward", False),
    ("fp32", triton_attention.PLAIN, True, False, 64, 0, "forward", False),
    ("bf16", triton_attention.LEAKY, True, False, 128, 0, "dkdv", True),
    ("bf16", triton_attention.LEAKY, True, False, 128, 0, "dq", False),
    ("fp16", triton_attention.RE_ROPE, False, True, 128, 64, "dkdv", False),
    ("fp32", triton_attention.PLAIN, True, False, 64, 0, "dq", False),
    ("bf16", triton_attention.LEAKY, True, False, 128, 0, "decode", True),
    ("fp16", triton_attention.RE_ROPE, False, True, 128, 64, "decode", False),
]
"""The attention kernels' variants :func:`main` compiles for each target (several seconds each)."""


_ANGLE_STARTS = {"float32": lambda opcode: opcode == "F2F.F64.F32", "float64": lambda opcode: opcode.startswith("DFMA"),
                 "float-float": lambda opcode: opcode.startswith("I2F")}
"""The first instruction of the angle's floating-point part in each math: the conversion of theta to
float64 (float32 math), the first float64 fused multiply-add, the cos/sin polynomial after the
integer turns (float64 math), the conversion of the rest of the turns to float32 (float-float math)."""


def _is_float64(opcode: str) -> bool:
    """Whether a SASS instruction runs float64 arithmetic or converts to or from float64 (the
    DADD/DMUL/DFMA/DSETP/DMNMX family and F2F/F2I/I2F with an F64 operand)."""
    return opcode.split(".")[0] in ("DADD", "DMUL", "DFMA", "DSETP", "DMNMX", "DSET") or (
        opcode.split(".")[0] in ("F2F", "F2I", "I2F", "FRND") and "F64" in opcode.split("."))


def machine_code(arch: int, sizes: tuple[int, int, int, int], dtype: str = "bf16",
                 arithmetic: str | None = None) -> dict:
    """SASS instruction count, float64 instructions, registers, shared bytes and load order of one
    variant (head_dim 128, half layout, no tail), and the elements (q/k coordinates) each thread
    rotates. The angle starts as :data:`_ANGLE_STARTS` says.

    Args:
        arch: the target's compute capability, e.g. 90 for sm_90.
        sizes: the launch sizes (BLOCK_S, BLOCK_H, GROUP, num_warps).
        dtype: the Triton type of q and k.
        arithmetic: "float32", "float-float" or "float64" math, or None for the dtype's default.

    Returns:
        ``opcodes`` (:func:`executed_opcodes`), ``instructions`` (their number), ``float64``,
        ``elements``, ``registers``, ``spills``, ``shared``, ``vector_loads`` and
        ``loads_before_angle``.
    """
    arithmetic = arithmetic or default_arithmetic(dtype)
    kernel, usage = ptxas_usage(lambda: compile_variant(arch, dtype, sizes, interleaved=False, tail=0,
                                                        arithmetic=arithmetic))
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([cuobjdump, "-sass", cubin.name], capture_output=True, text=True, check=True).stdout
        resources = subprocess.run([cuobjdump, "-res-usage", cubin.name], capture_output=True, text=True,
                                   check=True).stdout
    opcodes = executed_opcodes(sass)
    angle_starts = next((i for i, opcode in enumerate(opcodes) if _ANGLE_STARTS[arithmetic](opcode)), len(opcodes))
    # a 128-bit global load: LDG.E.128 on sm_80+, with a suffix on others (sm_75: LDG.E.128.SYS)
    vector_loads = [i for i, opcode in enumerate(opcodes) if opcode.split(".")[:3] == ["LDG", "E", "128"]]
    block_s, block_h, group, warps = sizes
    return dict(opcodes=opcodes, instructions=len(opcodes), float64=sum(map(_is_float64, opcodes)),
                elements=block_s * block_h * group * 128 // (32 * warps),
                registers=int(re.search(r"REG:(\d+)", resources).group(1)),
                spills=usage["spills"], shared=kernel.metadata.shared, vector_loads=len(vector_loads),
                loads_before_angle=sum(i < angle_starts for i in vector_loads))


def executed_opcodes(sass: str) -> list[str]:
    """The opcodes (with modifiers, e.g. ``DFMA`` or ``LDG.E.128``) of the instructions a thread may
    execute, in order, from ``cuobjdump -sass`` output: those up to the last ``EXIT``. What follows
    it, a branch to itself and ``NOP`` padding, never runs."""
    opcodes = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)]
    return opcodes[:len(opcodes) - opcodes[::-1].index("EXIT")]


def print_machine_code(arch: int) -> None:
    """The table of :func:`machine_code` for bfloat16 in float-float math (``launch``'s default for
    it), float64 math and float32 math, for every launch size the autotuner may pick in each: SASS
    instructions and float64 instructions per thread and per element (a thread's share of q/k
    coordinates; there are no loops, so a thread executes each instruction at most once).

    Args:
        arch: the target's compute capability, e.g. 90 for sm_90.
    """
    print("| BLOCK_S, BLOCK_H, GROUP, warps | math | SASS instructions (per element) | float64 (per element) "
          "| registers | spilled bytes | shared bytes | q/k loads before the angle |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for arithmetic in ("float-float", "float64", "float32"):
        for sizes in candidates_of(arithmetic):
            code = machine_code(arch, sizes, arithmetic=arithmetic)
            per = code["elements"]
            print(f"| {', '.join(map(str, sizes))} | {arithmetic} "
                  f"| {code['instructions']} ({code['instructions'] / per:.1f}) "
                  f"| {code['float64']} ({code['float64'] / per:.2f}) | {code['registers']} | {code['spills']} "
                  f"| {code['shared']} | {code['loads_before_angle']} of {code['vector_loads']} |")


def ptxas_usage(build) -> tuple:
    """(kernel, usage): the kernel ``build()`` compiles and its registers and spilled bytes as
    ptxas reports them when Triton runs it. The kernel is compiled afresh (Triton's cache would
    skip ptxas) with ptxas's log printed, and the log read back. ``spills`` is the bytes of spill
    stores plus loads: a spilling kernel keeps values in local memory (off chip, behind the L1
    cache), what a launch size should avoid.

    Args:
        build: a function of no arguments that compiles the kernel.

    Returns:
        ``(kernel, {"registers", "spills"})``.
    """
    knobs = triton.knobs
    saved = knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log
    log = io.StringIO()
    try:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = True, True
        with contextlib.redirect_stdout(log):
            kernel = build()
    finally:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = saved
    text = log.getvalue()
    stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text).groups())
    return kernel, dict(registers=int(re.search(r"Used (\d+) registers", text).group(1)), spills=stores + loads)


def spill_report(arch: int) -> list[tuple[str, dict]]:
    """(label, usage) of every launch size a GPU may run, for ``arch`` (usage as :func:`ptxas_usage`
    gives it): the rotary kernel's candidates and its few-token sizes (``few_token_launches``;
    bfloat16, head_dim 128, the half layout) in float-float math (the default for 16-bit dtypes),
    float64 math (on request) and float32 math (on request), float64 in float64 math, DeepSeek-V4's
    variant (interleaved, the last 64 coordinates rotated) in float-float math, and the attention
    kernels of :data:`ATTENTION_VARIANTS` at their launchers' GPU sizes.

    Args:
        arch: the target's compute capability, e.g. 90 for sm_90.
    """
    rows = []
    for dtype, arithmetic in (("bf16", "float-float"), ("bf16", "float64"), ("fp64", "float64"), ("bf16", "float32")):
        for sizes in candidates_of(arithmetic) + few_token_launches():
            label = f"rotary {dtype} {arithmetic} math sizes={sizes}"
            rows.append((label, ptxas_usage(lambda: compile_variant(arch, dtype, sizes, interleaved=False, tail=0,
                                                                    arithmetic=arithmetic))[1]))
    for sizes in candidates_of("float-float") + few_token_launches(32):
        label = f"rotary bf16 float-float math interleaved rotated=last tail=64 sizes={sizes}"
        rows.append((label, ptxas_usage(lambda: compile_variant(arch, "bf16", sizes, interleaved=True, tail=64,
                                                                arithmetic="float-float", rotated="last"))[1]))
    for variant in ATTENTION_VARIANTS:
        label = "attention dtype={} mode={} causal={} interleaved={} head_dim={} tail={} kernel={} logn={}".format(
            *variant)
        rows.append((label, ptxas_usage(lambda: compile_attention_variant(arch, *variant))[1]))
    return rows


PREFILL = (1, 4096, 32, 8, 128)
"""The shape of :func:`roofline_rows`: (batch, seq, heads_q, heads_k, head_dim), a prefill of 4096
tokens with 32 query and 8 key heads of 128 (Llama 3 8B's)."""

ROOFLINE_DTYPES = ("fp16", "bf16", "fp32")
"""The dtypes of q and k the roofline covers."""


def launch_grid(shape: tuple[int, int, int, int, int], sizes: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """(programs, threads per program, head blocks) of a launch of ``sizes`` (BLOCK_S, BLOCK_H,
    GROUP, num_warps) over ``shape`` (batch, seq, heads_q, heads_k, head_dim), as ``launch`` builds
    its grid; the head blocks are those of all programs together (up to GROUP per program)."""
    batch, seq, heads_q, heads_k, _ = shape
    block_s, block_h, group, warps = sizes
    head_blocks = triton.cdiv(heads_q, block_h) + triton.cdiv(heads_k, block_h)
    token_blocks = triton.cdiv(seq, block_s) * batch
    return token_blocks * triton.cdiv(head_blocks, group), 32 * warps, token_blocks * head_blocks


def roofline_rows(gpus=roofline.GPUS, dtypes=ROOFLINE_DTYPES, maths=tuple(MATHS), shape=PREFILL) -> list[dict]:
    """One row of :func:`rope.kernels.roofline.markdown_table` per GPU, dtype and math: the kernel
    compiled for the GPU at each launch size the autotuner may try for the shape, and the size
    whose estimated fraction of a copy is highest (the autotuner, which times them, keeps the
    fastest), fewer instructions per element breaking ties. A program of GROUP > 1 head blocks
    executes the code of its first block and, for each further block it has, the instructions
    each adds (the difference to the same sizes with GROUP 1, over GROUP - 1: the blocks are
    unrolled copies), so that a program at the end of the grid with fewer blocks is not charged
    for the ones it skips. ``default`` marks the math ``launch`` takes for the dtype
    (``triton_rotary.default_math``).

    Args:
        gpus: the GPUs (:data:`rope.kernels.roofline.GPUS`).
        dtypes: Triton types of q and k ("fp16", "bf16", "fp32").
        maths: names of ``triton_rotary.MATHS``.
        shape: (batch, seq, heads_q, heads_k, head_dim); head_dim 128 is what is compiled.
    """
    import torch

    elements = shape[0] * shape[1] * (shape[2] + shape[3]) * shape[4]
    compiled = {}

    def code(arch, dtype, math, sizes):
        if (arch, dtype, math, sizes) not in compiled:
            compiled[arch, dtype, math, sizes] = machine_code(arch, sizes, dtype, arithmetic=math)
        return compiled[arch, dtype, math, sizes]

    rows = []
    for gpu, dtype, math in itertools.product(gpus, dtypes, maths):
        best = None
        for sizes in candidates_of(math):
            programs, threads, head_blocks = launch_grid(shape, sizes)
            grouped = roofline.pipe_counts(code(gpu.arch, dtype, math, sizes)["opcodes"])
            first = roofline.pipe_counts(code(gpu.arch, dtype, math, (*sizes[:2], 1, sizes[3]))["opcodes"])
            block = {pipe: (grouped.get(pipe, 0) - first.get(pipe, 0)) / max(sizes[2] - 1, 1)
                     for pipe in grouped.keys() | first.keys()}
            counts = roofline.per_element(first, threads, programs, elements, block, head_blocks - programs)
            estimate = roofline.estimate(gpu, counts, itemsize=4 if dtype == "fp32" else 2)
            rank = (-estimate["fraction"], counts["issue"])
            if best is None or rank < best[0]:
                best = rank, sizes, counts, estimate
        _, sizes, counts, estimate = best
        chosen = code(gpu.arch, dtype, math, sizes)
        rows.append(dict(gpu=gpu.name, dtype=dtype, math=math, sizes=sizes, issue=counts["issue"],
                         fp64=counts.get("fp64", 0.0), registers=chosen["registers"], spills=chosen["spills"],
                         bound=estimate["bound"], fraction=estimate["fraction"],
                         default=default_math(getattr(torch, _TORCH_DTYPES[dtype])) == math))
    return rows


def roofline_report(gpus=roofline.GPUS) -> str:
    """The markdown document ``--roofline`` prints: what was compiled and the model's inputs, then
    the table of :func:`roofline_rows` (every dtype and math at :data:`PREFILL`)."""
    batch, seq, heads_q, heads_k, head_dim = PREFILL
    preamble = [
        "# Roofline of the rotary kernel from its machine code",
        "",
        f"Written by `python -m rope.kernels.targets --roofline` with Triton {triton.__version__} (no GPU: "
        "the kernel compiled for each GPU's architecture, the SASS counted).",
        f"Shape: batch {batch}, {seq} tokens, {heads_q} + {heads_k} heads, head_dim {head_dim}, half layout, "
        "out of place; the launch size the model rates fastest of the autotuner's candidates.",
        "Per element of q and k: SASS instructions and FP64 operations (DADD, DMUL, DFMA, DSETP) executed, "
        "a thread's count x threads / elements; `bound by`: the pipe of the longest time, or memory;",
        "fraction = memory time / max(memory time, compute time), a copy of the same bytes being 1 "
        "(rope/kernels/roofline.py: the model and what it leaves out).",
        "",
        *(f"* {gpu.name} ({gpu.model}, sm_{gpu.arch}): {gpu.sms} SMs at {gpu.clock_ghz} GHz, "
          f"{gpu.bandwidth_gbs:.0f} GB/s; per clock per SM {roofline.ISSUE} instructions issued, "
          f"{gpu.rates['fp64']} float64 and {gpu.rates['fp32']} float32 operations" for gpu in gpus),
    ]
    return roofline.markdown_table(roofline_rows(gpus), preamble)


def main(arches: list[int]) -> int:
    warnings.filterwarnings("ignore", category=UserWarning)
    failures = 0
    # (dtype, sizes, interleaved, tail, mrope, scale_after, arithmetic): each dtype in the math
    # `launch` gives it by default (float-float for 16-bit dtypes, float32 and float64 for theirs)
    # at attention factor 1 (bfloat16 in float-float math applies its power of two after), float32
    # math with a tail also with an attention factor above 1; then M-RoPE; float32 and float64 math
    # for bfloat16, float64 math for float32, float-float math for float16 with a factor above 1
    # and for bfloat16 with one below 1/2. The first and last candidate of the math's list each time.
    # Last, each dtype's default math with the last 64 coordinates rotated (rotated="last", interleaved:
    # DeepSeek-V4's variant).
    variants = [(dtype, sizes, interleaved, tail, False, True if tail > 0 and dtype == "fp32" else None,
                 default_arithmetic(dtype))
                for dtype, end, interleaved, tail in itertools.product(
                    ("bf16", "fp16", "fp32", "fp64"), (0, -1), (False, True), (0, 64))
                for sizes in [candidates_of(default_arithmetic(dtype))[end]]]
    variants += [(dtype, candidates_of(default_arithmetic(dtype))[-1], False, 0, True, None, default_arithmetic(dtype))
                 for dtype in ("bf16", "fp16", "fp32")]
    variants += [("bf16", TUNING_CANDIDATES[-1], False, 0, False, True, "float32"),
                 ("bf16", FLOAT64_TUNING_CANDIDATES[-1], False, 64, False, False, "float64"),
                 ("fp32", FLOAT64_TUNING_CANDIDATES[-1], False, 0, True, False, "float64"),
                 ("fp16", candidates_of("float-float")[-1], True, 0, False, True, "float-float"),
                 ("bf16", candidates_of("float-float")[0], False, 64, False, False, "float-float")]
    variants = [(*variant, "first") for variant in variants]
    variants += [(dtype, candidates_of(default_arithmetic(dtype))[0], True, 64, False, None, default_arithmetic(dtype),
                  "last") for dtype in ("bf16", "fp16", "fp32", "fp64")]
    for arch, (dtype, sizes, interleaved, tail, mrope, scale_after, arithmetic, rotated) in itertools.product(
            arches, variants):
        label = (f"sm_{arch} {dtype} sizes={sizes} interleaved={interleaved} tail={tail} mrope={mrope}"
                 + f" scale_after={scale_after}" * (scale_after is not None) + f" {arithmetic} math"
                 + f" rotated={rotated}" * (rotated != "first"))
        failures += _report(label, lambda: compile_variant(arch, dtype, sizes, interleaved, tail, mrope, scale_after,
                                                           arithmetic, rotated))
    for arch, variant in itertools.product(arches, ATTENTION_VARIANTS):
        label = ("sm_{} attention dtype={} mode={} causal={} interleaved={} head_dim={} tail={} kernel={} "
                 "logn={}").format(arch, *variant)
        failures += _report(label, lambda: compile_attention_variant(arch, *variant))
    return 1 if failures else 0


def _report(label: str, build) -> int:
    """Compile, print ``ok label`` or ``FAILED label: why``; 1 if it failed (every variant is tried)."""
    try:
        kernel = build()
        assert kernel.asm["cubin"], "empty cubin"
        print(f"ok {label}")
        return 0
    except Exception as err:
        print(f"FAILED {label}: {type(err).__name__}: {err}")
        return 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arches", type=int, nargs="*", default=[75, 80, 90], help="sm versions, e.g. 75 80 90")
    parser.add_argument("--code", action="store_true", help="print the machine code table for each arch instead")
    parser.add_argument("--spills", action="store_true",
                        help="print registers and spilled bytes of every GPU launch size; exit non-zero if any spills")
    parser.add_argument("--roofline", action="store_true",
                        help="print the roofline table of the GPUs of these arches (rope/kernels/roofline.py)")
    parser.add_argument("--out", help="with --roofline: also write the table to this file")
    args = parser.parse_args()
    if args.roofline:
        warnings.filterwarnings("ignore", category=UserWarning)
        report = roofline_report([gpu for gpu in roofline.GPUS if gpu.arch in args.arches])
        print(report, end="")
        if args.out:
            with open(args.out, "w") as out:
                out.write(report)
    elif args.spills:
        warnings.filterwarnings("ignore", category=UserWarning)
        spilled = 0
        for arch in args.arches:
            for label, usage in spill_report(arch):
                spilled += usage["spills"] > 0
                print(f"sm_{arch} {label}: {usage['registers']} registers, {usage['spills']} bytes spilled")
        sys.exit(1 if spilled else 0)
    elif args.code:
        warnings.filterwarnings("ignore", category=UserWarning)
        for arch in args.arches:
            print_machine_code(arch)
    else:
        sys.exit(main(args.arches))
