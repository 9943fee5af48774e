"""A roofline of the rotary kernel from its machine code: what fraction of a copy's bandwidth a GPU
could reach, estimated without the GPU.

A copy of q and k moves 2 b bytes per element (read and write, b bytes each) and computes
nothing, so its time per element is memory time, t_mem = 2 b / B for DRAM bandwidth B. The
kernel moves the same bytes and also issues instructions. Per element of q and k, let n_p be the
instructions of pipe p the threads of a launch execute (a thread's count from the SASS, times the
threads of a program and the programs of the grid, over the elements: the kernel has no loops, so
a thread executes each instruction at most once), and r_p the pipe's results per clock per SM.
On a GPU of N SMs at clock f, pipe p needs n_p / (r_p N f) per element, and

    t_compute = max_p n_p / (r_p N f),   fraction = t_mem / max(t_mem, t_compute)

(a copy: 1). The pipes (:data:`PIPES`): instruction issue (every instruction; four schedulers per
SM each issue one warp instruction of 32 threads a clock), float64 add/multiply/fma and compare,
float32 add/multiply/fma, 32-bit integer and logic, and type conversions, from and to 64-bit
types and others, at the rates of NVIDIA's throughput table (:data:`GPUS`).

What the model leaves out, each of which only lowers the fraction a GPU reaches: latency (a
program's dependent chain, memory latency not hidden by too few warps: registers limit the warps
an SM holds), the tail of the last wave of programs, shared-memory and L2 traffic, instructions of
a branch the program skips (counted as executed: an upper bound), and the pipes' interference
(each is taken as running in parallel with the others at full rate). So the fraction is an upper
bound of what the machine code permits, not a prediction of a measurement; where it is 1 the
kernel can be memory bound, where below 1 its instructions alone keep it from a copy's speed.
"""

from __future__ import annotations

import dataclasses
import re

ISSUE = 4 * 32
"""Thread instructions issued per clock per SM on sm_75, sm_80 and sm_90: four warp schedulers
(SM sub-partitions), each issuing one instruction of a 32-thread warp per clock (NVIDIA Turing,
A100 and H100 architecture whitepapers)."""


@dataclasses.dataclass(frozen=True)
class GPU:
    """A GPU's public specifications: what :func:`estimate` needs.

    Attributes:
        name: the short name the table's rows start with.
        model: the product the numbers are of.
        arch: the compute capability the kernel is compiled for (75 for sm_75).
        sms: streaming multiprocessors.
        clock_ghz: the boost clock, GHz.
        bandwidth_gbs: DRAM bandwidth, GB/s (10^9 bytes per second).
        rates: results per clock per SM of each pipe of :data:`PIPES` but issue (NVIDIA's CUDA C++
            Programming Guide, "Arithmetic Instructions", the throughput table of native arithmetic
            instructions, the column of the compute capability).
    """

    name: str
    model: str
    arch: int
    sms: int
    clock_ghz: float
    bandwidth_gbs: float
    rates: dict


# CUDA C++ Programming Guide, throughput of native arithmetic instructions (operations per clock
# per SM), compute capability 7.5 / 8.0 / 9.0: 64-bit floating-point add, multiply, multiply-add
# 2 / 32 / 64; 32-bit floating-point add, multiply, multiply-add 64 / 64 / 128; 32-bit integer
# multiply and multiply-add 64, add, logic, shift, compare, min/max 64 on all three; type
# conversions from and to 64-bit types 16, all other type conversions 16.
_TURING = dict(fp64=2, fp32=64, imad=64, alu=64, conversion64=16, conversion=16)
_AMPERE = dict(fp64=32, fp32=64, imad=64, alu=64, conversion64=16, conversion=16)
_HOPPER = dict(fp64=64, fp32=128, imad=64, alu=64, conversion64=16, conversion=16)

GPUS = (
    # NVIDIA T4 datasheet and Turing architecture whitepaper: 40 SMs (2560 CUDA cores), boost
    # 1590 MHz, 320 GB/s GDDR6, 8.1 TFLOPS float32 (= 40 x 64 x 2 x 1.59 GHz). Colab's GPU.
    GPU("T4", "Tesla T4", 75, 40, 1.59, 320.0, _TURING),
    # NVIDIA A100 datasheet and architecture whitepaper: 108 SMs, boost 1410 MHz, 1555 GB/s HBM2
    # (the 40 GB SXM4 card, Colab's A100; the 80 GB card has 2039 GB/s), 9.7 TFLOPS float64 without
    # tensor cores (= 108 x 32 x 2 x 1.41 GHz), 19.5 float32.
    GPU("A100", "A100-SXM4-40GB", 80, 108, 1.41, 1555.0, _AMPERE),
    # NVIDIA H100 datasheet and architecture whitepaper: SXM5, 132 SMs, boost 1980 MHz, 3.35 TB/s
    # HBM3, 34 TFLOPS float64 without tensor cores (= 132 x 64 x 2 x 1.98 GHz), 67 float32.
    GPU("H100", "H100-SXM5-80GB", 90, 132, 1.98, 3350.0, _HOPPER),
    # NVIDIA H200 datasheet: the H100's GH100 chip (132 SMs, 34 TFLOPS float64) with 4.8 TB/s HBM3e.
    GPU("H200", "H200-SXM-141GB", 90, 132, 1.98, 4800.0, _HOPPER),
)
"""The GPUs of the table, each with the sources of its numbers in a comment."""

PIPES = {
    "fp64": r"D(ADD|MUL|FMA|SETP|SET|MNMX)",
    "fp32": r"F(ADD|MUL|FMA)(32I)?",
    "imad": r"IMAD|IMUL|IMAD32I",
    "alu": r"IADD3|IADD|IADD32I|LOP3|LOP|LOP32I|SHF|SHL|SHR|LEA|LEA_HI|ISETP|ISCADD|IMNMX|VIMNMX|IABS|SEL|PRMT|SGXT"
           r"|BFE|BFI|VIADD|FSETP|FSEL|FMNMX|FSET|P2R|R2P|PLOP3",
    "conversion64": r"(F2F|F2I|I2F|FRND)\.(\S*\.)?[FSU]64",
    "conversion": r"F2F|F2I|I2F|FRND|F2FP|I2FP|F2IP",
}
"""The pipes besides issue, each the SASS opcodes it executes, as a regular expression of the
opcode (e.g. ``DFMA``, ``F2F.F64.F32``) before any further modifiers; an instruction counts in the
first pipe that matches (a 64-bit conversion not again as another): float64 add, multiply, fma
and compare; float32 add, multiply, fma; 32-bit integer multiply(-add), which ptxas also uses as
a move; 32-bit integer add, logic, shift, compare, select and min/max, and float32 compare,
select and min/max; type conversions from or to 64-bit types; all other conversions."""


def pipe_of(opcode: str) -> str | None:
    """The pipe of :data:`PIPES` a SASS opcode (with modifiers) runs on, or ``None`` (issue only:
    loads, stores, moves, branches, uniform-datapath instructions, ...)."""
    for pipe, pattern in PIPES.items():
        if re.fullmatch(f"({pattern})(\\..*)?", opcode):
            return pipe
    return None


def estimate(gpu: GPU, per_element: dict, itemsize: int) -> dict:
    """The roofline of one kernel on ``gpu``: times per element, the pipe that bounds them and the
    fraction of a copy's bandwidth (module docstring).

    Args:
        gpu: the GPU.
        per_element: instructions per element of q and k: ``"issue"`` (all of them) and any pipe of
            :data:`PIPES` (a missing pipe counts none).
        itemsize: bytes per element of q and k (2 for float16 and bfloat16).

    Returns:
        ``memory_ns`` and ``compute_ns`` (per element, in nanoseconds), ``bound`` (``"memory"`` or
        the pipe of the longest compute time) and ``fraction``.
    """
    clocks_per_ns = gpu.sms * gpu.clock_ghz  # SM clocks per nanosecond, all SMs together
    rates = {"issue": ISSUE, **gpu.rates}
    times = {pipe: per_element.get(pipe, 0) / (rates[pipe] * clocks_per_ns) for pipe in rates}
    memory_ns = 2 * itemsize / gpu.bandwidth_gbs
    bound = max(times, key=times.get)
    compute_ns = times[bound]
    return dict(memory_ns=memory_ns, compute_ns=compute_ns, bound=bound if compute_ns > memory_ns else "memory",
                fraction=memory_ns / max(memory_ns, compute_ns))


def pipe_counts(opcodes: list[str]) -> dict:
    """How many of ``opcodes`` there are (``"issue"``) and how many run on each pipe of :data:`PIPES`."""
    counts = {"issue": len(opcodes)}
    for opcode in opcodes:
        pipe = pipe_of(opcode)
        if pipe is not None:
            counts[pipe] = counts.get(pipe, 0) + 1
    return counts


def per_element(program: dict, threads: int, programs: int, elements: int, block: dict | None = None,
                blocks: int = 0) -> dict:
    """Instructions per element of q and k, ``"issue"`` and per pipe: ``programs`` programs of
    ``threads`` threads, each thread executing the instructions ``program`` counts
    (:func:`pipe_counts`) once, and ``blocks`` further head blocks done over the grid (a program of
    GROUP > 1 rotates up to GROUP blocks with one angle computation), each thread executing
    ``block``'s instructions for each; over ``elements`` elements."""
    block = block or {}
    return {pipe: threads * (programs * program.get(pipe, 0) + blocks * block.get(pipe, 0)) / elements
            for pipe in program.keys() | block.keys()}


HEADER = ["GPU", "dtype", "math", "BLOCK_S, BLOCK_H, GROUP, warps", "SASS / element", "FP64 / element",
          "registers", "spilled bytes", "bound by", "fraction of a copy"]
"""The columns of :func:`markdown_table`: a row starts with the GPU's name and ends with the fraction."""


def markdown_table(rows: list[dict], preamble: list[str]) -> str:
    """The roofline as a markdown document: ``preamble`` lines, then one table row per entry of
    ``rows`` (dicts with ``gpu``, ``dtype``, ``math``, ``default``, ``sizes``, ``issue``, ``fp64``,
    ``registers``, ``spills``, ``bound``, ``fraction``); the default math marked ``default``."""
    lines = [*preamble, "", "| " + " | ".join(HEADER) + " |", "| " + " | ".join(["---"] * len(HEADER)) + " |"]
    for row in rows:
        cells = [row["gpu"], row["dtype"], row["math"] + (" (default)" if row["default"] else ""),
                 ", ".join(map(str, row["sizes"])), f"{row['issue']:.1f}", f"{row['fp64']:.1f}",
                 str(row["registers"]), str(row["spills"]), row["bound"], f"{row['fraction']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
