"""rope: Rotary Position Embedding, every variant real models use, exact and tested.

The library (``import rope``):

* :func:`inv_freq` — frequencies and attention factor of a Hugging Face style RoPE config, for
  every ``rope_type`` of the registry (:func:`register_rope_type` adds one);
* :func:`apply_rotary` — rotate q and k (both layouts, partial rotary, GQA, any positions), on the
  fused kernel for CUDA tensors; :func:`apply_mrope` (t, h, w positions, one path with
  :func:`apply_rotary`), :func:`apply_xdrope` (HunYuan-VL's four axes) and :func:`apply_rotary_2d`
  for multimodal and image positions; :func:`apply_xpos` (XPos) and :func:`apply_fope` (FoPE's
  learned per-head mixtures of the frequencies);
* :mod:`rope.layouts` — half-split vs interleaved pairing and checkpoint weight permutation;
* :mod:`rope.angles` — rotation angles reduced modulo 2 pi exactly (fixed-point turns);
* :mod:`rope.reference` — float64 matrix, complex and elementwise forms;
* :mod:`rope.positions` — position ids for packed batches and context parallelism;
* :mod:`rope.mrope`, :mod:`rope.axial` — multimodal (Qwen2-VL, Qwen3-VL) and 2D (image) RoPE.

Subpackages, each imported on first use:

* :mod:`rope.hf` — transformers drop-ins, and :func:`rope.hf.patch` to patch a model in one call;
* :mod:`rope.kernels` — the fused Triton kernel and its ``torch.ops.rope`` operators;
* :mod:`rope.attention` — attention-side methods: ReRoPE, log-n, Dual Chunk Attention, dynamic NTK
  with a KV cache, RoPE in linear attention, and the encodings before RoPE;
* :mod:`rope.analysis` — what the book derives: decay bounds, precision studies, scaling and
  extrapolation analysis, the general rotations exp(nB) and O^n;
* :mod:`rope.experiment` — the length-extrapolation experiment, ``python -m rope.experiment``.
"""

import importlib

from .apply import apply_rotary
from .axial import apply_rotary_2d
from .config import RopeConfig, RopeConfigWarning, parse_config
from .fope import apply_fope
from .frequencies import inv_freq, register_rope_type, rope_types
from .layouts import permute_qk_weight
from .mrope import apply_mrope
from .xdrope import apply_xdrope
from .xpos import apply_xpos

__all__ = [
    "RopeConfig",
    "RopeConfigWarning",
    "apply_fope",
    "apply_mrope",
    "apply_rotary",
    "apply_rotary_2d",
    "apply_xdrope",
    "apply_xpos",
    "inv_freq",
    "parse_config",
    "permute_qk_weight",
    "register_rope_type",
    "rope_types",
]
__version__ = "0.1.0"

_SUBMODULES = frozenset({
    "analysis", "angles", "attention", "axial", "config", "experiment", "fope", "frequencies", "hf", "kernels",
    "layouts", "mrope", "positions", "reference", "xdrope", "xpos",
})


def __getattr__(name: str):
    """Import a subpackage on first use (``rope.hf``, ``rope.analysis``, ...), as PEP 562 allows."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
