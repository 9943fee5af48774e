"""rope: Rotary Position Embedding, every variant real models use, exact and tested.

Entry points:

* :func:`inv_freq` — frequencies and attention factor of a Hugging Face style RoPE config;
* :func:`apply_rotary` — rotate q and k (both layouts, partial rotary, GQA, any positions);
* :mod:`rope.hf` — a drop-in ``rotary_emb`` module and ``apply_rotary_pos_emb`` for transformers;
* :mod:`rope.layouts` — half-split vs interleaved pairing and checkpoint weight permutation;
* :mod:`rope.reference` — float64 matrix, complex and elementwise forms (the book's reference).
"""

from . import hf, layouts, reference
from .apply import apply_rotary
from .config import ROPE_TYPES, RopeConfig, parse_config
from .frequencies import FREQUENCY_FUNCTIONS, inv_freq
from .layouts import permute_qk_weight

__all__ = [
    "FREQUENCY_FUNCTIONS",
    "ROPE_TYPES",
    "RopeConfig",
    "apply_rotary",
    "hf",
    "inv_freq",
    "layouts",
    "parse_config",
    "permute_qk_weight",
    "reference",
]
__version__ = "0.1.0"
