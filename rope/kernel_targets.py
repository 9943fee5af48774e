"""Compile the fused RoPE kernel to machine code for named GPU architectures, without a GPU.

    python -m rope.kernel_targets 75 80 90

Triton's NVIDIA backend and the ptxas it bundles build a cubin for any target on any machine,
so a machine without a GPU can check what only a GPU would otherwise show: that the kernel uses
no feature its targets lack (sm_75 is the T4 of a Colab runtime, with no native bfloat16; sm_80
the A100; sm_90 the H100). Run it as a separate process with ``TRITON_INTERPRET`` unset: Triton's
interpreter, which the CPU test suite switches on, replaces the compiler. Prints one line per
variant and exits non-zero if any fails. Not imported by ``import rope`` (it imports Triton).
"""

from __future__ import annotations

import itertools
import sys
import warnings

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .triton_rotary import _CANDIDATES, _rotary_kernel, kernel_constants

STRIDES = ["sq_b", "sq_s", "sq_h", "sk_b", "sk_s", "sk_h", "sqo_b", "sqo_s", "sqo_h", "sko_b", "sko_s", "sko_h"]


def compile_variant(arch: int, dtype: str, sizes: tuple[int, int, int, int], interleaved: bool, tail: int):
    """The kernel for q/k of Triton type ``dtype`` (e.g. "bf16"), head_dim 128 with ``tail``
    unrotated coordinates, launch ``sizes`` = (BLOCK_S, BLOCK_H, GROUP, num_warps)."""
    block_s, block_h, group, warps = sizes
    signature = {name: "*" + dtype for name in ("Q", "K", "QO", "KO")}
    signature.update(POS="*i64", FREQ="*fp32", seq_len="i32", heads_q="i32", heads_k="i32",
                     scale_hi="fp32", scale_lo="fp32", tokens_bucket="i32")
    signature.update({name: "i64" for name in STRIDES + ["sp_b", "sp_s"]})
    constants = kernel_constants(128, 128 - tail, interleaved=interleaved, conjugate=False, fp64=dtype == "fp64",
                                 copy_tail=True)
    constants.update(BLOCK_S=block_s, BLOCK_H=block_h, GROUP=group)
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    # What Triton's launcher assumes of typical arguments: 16-aligned pointers and strides.
    aligned = ["Q", "K", "QO", "KO", "POS", "FREQ"] + STRIDES
    source = ASTSource(
        fn=_rotary_kernel, signature=signature,
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs={(names.index(k),): [["tt.divisibility", 16]] for k in aligned},
    )
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


def main(arches: list[int]) -> int:
    warnings.filterwarnings("ignore", category=UserWarning)
    failures = 0
    variants = itertools.product(("bf16", "fp16", "fp32", "fp64"), (_CANDIDATES[0], _CANDIDATES[-1]),
                                 (False, True), (0, 64))
    for arch, (dtype, sizes, interleaved, tail) in itertools.product(arches, variants):
        label = f"sm_{arch} {dtype} sizes={sizes} interleaved={interleaved} tail={tail}"
        try:
            kernel = compile_variant(arch, dtype, sizes, interleaved, tail)
            assert kernel.asm["cubin"], "empty cubin"
            print(f"ok {label}")
        except Exception as err:  # report every failing variant, then fail
            failures += 1
            print(f"FAILED {label}: {type(err).__name__}: {err}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [75, 80, 90]))
