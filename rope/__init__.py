"""rope: Rotary Position Embedding, every variant real models use, exact and tested.

Entry points:

* :func:`inv_freq` — frequencies and attention factor of a Hugging Face style RoPE config;
* :func:`apply_rotary` — rotate q and k (both layouts, partial rotary, GQA, any positions);
* :mod:`rope.hf` — transformers drop-ins: the ``rotary_emb`` module, the apply functions, ``install``;
* :mod:`rope.layouts` — half-split vs interleaved pairing and checkpoint weight permutation;
* :mod:`rope.reference` — float64 matrix, complex and elementwise forms (the book's reference);
* :mod:`rope.angles` — rotation angles reduced modulo 2 pi exactly (fixed-point turns);
* :mod:`rope.precision` — the usual float32 recipe, bf16 tables and position-digit tables, for error studies;
* :mod:`rope.axial` — 2D (image) RoPE, axial and mixed frequencies;
* :mod:`rope.mrope` — multimodal RoPE (Qwen2-VL, Qwen3-VL): time, row and column positions;
* :mod:`rope.general` — the general rotations exp(nB) and O^n, and block-diagonalizing B;
* :mod:`rope.encodings` — the encodings before RoPE: sinusoidal, Shaw, T5 buckets, DeBERTa, ALiBi;
* :mod:`rope.decay` — the long-term decay bound and the base needed for a context length;
* :mod:`rope.linear_attention` — RoPE in linear attention, O(N) and the O(N^2) reference;
* :mod:`rope.positions` — position ids for packed batches and context parallelism;
* :mod:`rope.extrapolation_analysis` — unseen angles and the interpolation bounds of length extension;
* :mod:`rope.scaling_analysis` — what frequency scaling does to each pair: NTK bases, YaRN ramps, temperatures;
* :mod:`rope.rerope`, :mod:`rope.logn`, :mod:`rope.dual_chunk` — ReRoPE and Leaky ReRoPE, log-n scaling,
  Dual Chunk Attention's positions;
* :mod:`rope.kv_cache` — dynamic NTK with a KV cache: keys cached before or after rotation;
* :mod:`rope.experiment` — the length-extrapolation experiment, ``python -m rope.experiment`` (imported on demand);
* :mod:`rope.fused` — the Triton kernel as ``torch.ops.rope.rotary`` (imported on demand).
"""

from . import (
    angles,
    axial,
    decay,
    dual_chunk,
    encodings,
    extrapolation_analysis,
    general,
    hf,
    kv_cache,
    layouts,
    linear_attention,
    logn,
    mrope,
    positions,
    precision,
    reference,
    rerope,
    scaling_analysis,
)
from .apply import apply_rotary
from .config import ROPE_TYPES, RopeConfig, RopeConfigWarning, parse_config
from .frequencies import FREQUENCY_FUNCTIONS, inv_freq
from .layouts import permute_qk_weight

__all__ = [
    "FREQUENCY_FUNCTIONS",
    "ROPE_TYPES",
    "RopeConfig",
    "RopeConfigWarning",
    "angles",
    "apply_rotary",
    "axial",
    "decay",
    "dual_chunk",
    "encodings",
    "extrapolation_analysis",
    "general",
    "hf",
    "inv_freq",
    "kv_cache",
    "layouts",
    "linear_attention",
    "logn",
    "mrope",
    "parse_config",
    "permute_qk_weight",
    "positions",
    "precision",
    "reference",
    "rerope",
    "scaling_analysis",
]
__version__ = "0.1.0"
