"""Machine code of the fused kernel per autotuner candidate, without a GPU.

    python benchmarks/kernel_code_size.py [--arch 90] [--dtype bf16]

Builds the kernel for head_dim 128 (half layout, no tail) with each launch size the autotuner
may pick (rope.triton_rotary._CANDIDATES) using Triton's bundled ptxas, disassembles it with the
bundled cuobjdump, and prints per candidate: SASS instructions, registers per thread, shared
memory, and the count of the instruction kinds that mark the angle computation (DMUL and the
64-bit conversions building T_i) and the memory traffic (LDG, STG) and barriers (BAR). A
decode step is one wave of programs, so its time is close to one program's latency, which
grows with the instructions a thread executes; these counts are the offline half of that
story (the other half is bench_rotary.py on a GPU). Run with ``TRITON_INTERPRET`` unset.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile
import warnings

import triton

from rope.kernel_targets import compile_variant
from rope.triton_rotary import _CANDIDATES

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
KINDS = ["DMUL", "F2I", "I2F", "LDG", "STG", "BAR", "BRA"]


def sass_summary(arch: int, dtype: str, sizes: tuple[int, int, int, int]) -> dict:
    """Instruction count, kinds, registers and shared memory of one compiled variant."""
    kernel = compile_variant(arch, dtype, sizes, interleaved=False, tail=0)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-sass", cubin.name],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "-res-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    opcodes = collections.Counter()
    for line in sass.splitlines():
        match = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if match:
            opcodes[match.group(1)] += 1
    return dict(instructions=sum(opcodes.values()), registers=int(re.search(r"REG:(\d+)", usage).group(1)),
                shared=kernel.metadata.shared, **{kind: opcodes[kind] for kind in KINDS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "fp64"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    print(f"sm_{args.arch}, {args.dtype}, head_dim 128, triton {triton.__version__}")
    print("| BLOCK_S, BLOCK_H, GROUP, warps | SASS | regs | shared B | " + " | ".join(KINDS) + " |")
    print("| --- | --- | --- | --- | " + " | ".join(["---"] * len(KINDS)) + " |")
    for sizes in _CANDIDATES:
        row = sass_summary(args.arch, args.dtype, sizes)
        print(f"| {', '.join(map(str, sizes))} | {row['instructions']} | {row['registers']} | {row['shared']} | "
              + " | ".join(str(row[kind]) for kind in KINDS) + " |")


if __name__ == "__main__":
    main()
