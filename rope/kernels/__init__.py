"""The fused Triton kernels (Triton is optional: ``import rope`` does not load this package).

* :mod:`.triton_rotary` — the rotary kernel and its launcher; :mod:`.exact_turns` and
  :mod:`.float_float` — the device arithmetic of its float64 and float-float maths;
* :mod:`.triton_attention` — RoPE, ReRoPE and Leaky ReRoPE inside attention: q and k rotated on
  load in a FlashAttention-2 style forward kernel, and its launcher;
  :mod:`.triton_attention_backward` its backward kernels; :mod:`.triton_attention_decode` the
  decoding kernel (few queries, the keys split across programs); :mod:`.triton_attention_repair`
  the rows whose float32 arithmetic overflowed, found from the results and recomputed in float64;
* :mod:`.attention_operators` — those kernels as differentiable operators,
  ``torch.ops.rope.fused_attention`` and :func:`.attention_operators.fused_rotary_attention`;
* :mod:`.operators` — the kernel as ``torch.ops.rope.rotary`` and ``torch.ops.rope.rotary_``,
  with fake implementations, autograd and the argument checks;
* :mod:`.emulation` — fma and loop bounds for Triton interpreters that round an fma twice or
  take no tensor as a loop bound (Triton 3.6's), behind ``tl.constexpr`` switches;
* :mod:`.targets` — compiles the kernels for GPU targets without a GPU and checks the rotary
  kernel's machine code
  (``python -m rope.kernels.targets``);
* :mod:`.roofline` — the GPUs' specifications and the model that turns that machine code into an
  estimated fraction of a copy's bandwidth (``python -m rope.kernels.targets --roofline``).

:func:`rope.apply_rotary` imports :mod:`.operators` when it first takes the kernel path.
Importing this package checks Triton's version (:data:`MIN_TRITON`): the kernels run on Triton 3.6
and newer, compiled and in the CPU interpreter (:mod:`.emulation` covers what an older interpreter
does differently); an older Triton is refused with an ``ImportError`` naming both versions.
"""

import re

import triton

MIN_TRITON = (3, 6)
"""The oldest Triton (major, minor) the kernels take."""


def check_triton_version(version: str) -> None:
    """Raise ``ImportError`` unless ``version`` (a Triton version string, e.g. "3.6.0" or
    "3.9.0+git1a2b3c") is :data:`MIN_TRITON` or newer."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) < MIN_TRITON:
        raise ImportError(f"rope.kernels needs Triton {MIN_TRITON[0]}.{MIN_TRITON[1]} or newer, found Triton {version} "
                          "(pip install -U triton)")


check_triton_version(triton.__version__)
