"""transformers-compatible rotation functions, to patch in for a model's own.

Each has the signature of a transformers function and its result: the model's formula on the
tables it is given, computed in float32 or better (float64 where q, k or a table is float64) and
rounded once to the dtype of each input. Where the tables are provably the untouched ones
:class:`rope.hf.RotaryEmbedding` returned (:mod:`rope.hf.provenance`: the same tensors, returned
together, not edited since) and the inputs have the batch and sequence they were made for, the
rotation runs instead from the exact positions and float32 frequencies behind them, with
:func:`rope.apply_rotary` or :func:`rope.mrope.apply_mrope` (the fused kernel on CUDA, float64 on
the CPU): the same formula on tables of unrounded values. Any other tables (sliced, negated,
scaled, converted, edited in place, paired with a table of another call, or someone else's) are
used as given.

transformers' models follow one of these conventions (tables as their rotary module lays them
out, :data:`rope.hf.TABLE_FORMS`; pairs of coordinates rotated together):

==========================================  ======================  ============  ==================
function                                    models                  tables        pairs
==========================================  ======================  ============  ==================
:func:`apply_rotary_pos_emb`                Llama and most models   rotate_half   (i, i + d/2)
:func:`apply_rotary_pos_emb_conjugate`      NanoChat                rotate_half   (i, i + d/2), by
                                                                                  -m theta_i
:func:`apply_rotary_pos_emb_interleaved`    GLM, GLM-4, ERNIE 4.5,  rotate_half   (2i, 2i + 1)
                                            Helium                  (first half)
:func:`apply_rotary_pos_emb_interleaved_    Cohere, Cohere 2,       interleaved   (2i, 2i + 1)
tables`                                     GLM-4V, ERNIE 4.5 VL
:func:`apply_rotary_pos_emb_pair_tables`    GPT-OSS                 pairs         (i, i + d/2)
:func:`apply_rotary_pos_emb_pair_tables_    OpenAI privacy filter   pairs         (2i, 2i + 1)
interleaved`
:func:`apply_rotary_pos_emb_interleave`     DeepSeek-V3, GLM-5,     rotate_half   (2i, 2i + 1), out
                                            Mistral Large 4         (first half)  half-split
:func:`apply_rotary_pos_emb_single`         Gemma 4 (one tensor)    rotate_half   (i, i + d/2)
:func:`apply_rotary_pos_emb_keys_optional`  Qwen4-Exp (k may be     rotate_half   (i, i + d/2)
                                            None)
:func:`apply_rotary_pos_emb_last_queries`   Muse Glimmer's          rotate_half   (i, i + d/2), q by
                                            assistant                             the last rows
:func:`apply_rotary_pos_emb_trailing`       DeepSeek-V4 (one        pairs         (2i, 2i + 1) of
                                            tensor)                               the last d
:func:`apply_rotary_pos_emb_every_two`      GPT-J, CodeGen          pairs (sin,   (2i, 2i + 1)
                                                                    cos)
:func:`apply_rotary_emb_complex`            Llama 4                 complex       (2i, 2i + 1)
:func:`apply_rotary_emb_complex_heads_      DeepSeek-V2 (heads      complex       (2i, 2i + 1)
first`                                      before seq)
:func:`apply_rotary_pos_emb_vision`         Qwen2-VL's, GLM-4V's    rotate_half   (i, i + d/2)
                                            vision towers
:func:`apply_rotary_pos_emb_vision_         Inkling 2's vision      interleaved   (2i, 2i + 1)
pairwise`                                   tower
:func:`apply_rotary_pos_emb_2d`             SAM 2, SAM 3            interleaved   (2i, 2i + 1)
:func:`apply_rotary_pos_emb_patches`        DINOv3, Sapiens2,       rotate_half   (i, i + d/2) of
                                            EoMT-DINOv3                           the last tokens
==========================================  ======================  ============  ==================

Llama 4's vision tower and EdgeTAM video's memory attention have theirs in
:mod:`rope.hf.functions_2d`.

Where the tables are narrower than the head, the first ``d`` coordinates rotate (``d`` the
table width, twice that for pair tables) and the rest pass through (partial rotary: Phi,
GPT-NeoX, GLM, GLM-4V); DeepSeek-V4's function rotates the last ``d`` instead (``rotated="last"``
of :func:`rope.apply_rotary`). A function handed rope's tables of another form raises, naming the
function that reads them.

GPT-J and CodeGen look their tables up in a buffer of the attention (``embed_positions``, one row
per position), which :func:`rope.hf.install` replaces by rope's exactly rounded table: their
function never sees the positions, so it always rotates by the tables (the formula in float32 or
better on exactly rounded cos and sin); DeepSeek-V4 undoes its rotation of the attention output
with ``(cos, -sin)``, a new tensor, which is likewise used as given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import _checks
from ..apply import apply_rotary, check_inputs, rotate_by_cos_sin, use_kernel
from ..layouts import interleaved_to_half
from ..mrope import apply_mrope
from ..rotation import round_once
from . import provenance
from .provenance import TableSource


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension.

    Args:
        x: a tensor whose last dimension is even.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(x_0, x_1, x_2, x_3, ..) -> (-x_1, x_0, -x_3, x_2, ..): the pairs (2i, 2i + 1) turned by 90 degrees.

    Args:
        x: a tensor whose last dimension is even.
    """
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _first_half_twice(table: torch.Tensor) -> torch.Tensor:
    """GLM's reading of a rotate_half table: its first half, each entry twice in a row."""
    return table[..., : table.shape[-1] // 2].repeat_interleave(2, dim=-1)


def _llama_formula(x, cos, sin):
    """x cos + rotate_half(x) sin (Llama's ``apply_rotary_pos_emb``)."""
    return x * cos + rotate_half(x) * sin


def _glm_formula(x, cos, sin):
    """x c + rotate_pairs_interleaved(x) s with c, s the first half of the tables, each entry
    twice (GLM's ``apply_rotary_pos_emb``)."""
    return x * _first_half_twice(cos) + rotate_pairs_interleaved(x) * _first_half_twice(sin)


def _cohere_formula(x, cos, sin):
    """x cos + rotate_pairs_interleaved(x) sin (Cohere's ``apply_rotary_pos_emb``)."""
    return x * cos + rotate_pairs_interleaved(x) * sin


def _gpt_oss_formula(x, cos, sin):
    """(x1 cos - x2 sin, x2 cos + x1 sin) on the halves x1, x2 (GPT-OSS's ``_apply_rotary_emb``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _nanochat_formula(x, cos, sin):
    """x cos - rotate_half(x) sin: NanoChat's ``apply_rotary_pos_emb``, whose ``rotate_half`` is
    (x1, x2) -> (x2, -x1), turning each pair by the negated angle."""
    return x * cos - rotate_half(x) * sin


def _pair_tables_interleaved_formula(x, cos, sin):
    """(x_a c - x_b s, x_b c + x_a s) on the pairs (x_a, x_b) = (x_2i, x_2i+1), back in place, with
    c, s the tables of each angle once (the OpenAI privacy filter's ``_apply_rotary_emb``;
    DeepSeek-V4's and GPT-J's ``x cos + rotate_every_two(x) sin`` on tables repeated twice in a row)."""
    x_a, x_b = x[..., 0::2], x[..., 1::2]
    return torch.stack((x_a * cos - x_b * sin, x_b * cos + x_a * sin), dim=-1).flatten(-2)


def _deepseek_formula(x, cos, sin):
    """(x1 c - x2 s, x2 c + x1 s) with x1, x2 the even and odd coordinates and c, s the first
    half of the tables (DeepSeek-V3's ``apply_rotary_pos_emb_interleave``)."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@dataclass(frozen=True)
class _Convention:
    """How one transformers function reads its tables: ``form``, the :data:`rope.hf.TABLE_FORMS`
    entry of rope's tables it takes; ``layout``, the pairs rotated from the exact source (after
    reordering the input from interleaved to half-split with ``reorder``); ``formula`` on the
    rotated coordinates and the unsqueezed tables; ``whole_head``, whether the tables must span
    the head; ``rotated``, which coordinates the tables rotate (``"first"`` or ``"last"``);
    ``conjugate``, whether the exact source turns by the negated angles; ``promote``, whether the
    result takes the dtype of the input and the tables promoted (as torch computes the model's
    formula) rather than the input's; ``float64``, whether the formula runs in float64 whatever
    the dtypes (the vision functions: exact on float32 inputs and tables, then rounded once)."""

    function: str
    form: str
    layout: str
    formula: Callable
    reorder: bool = False
    whole_head: bool = False
    rotated: str = "first"
    conjugate: bool = False
    promote: bool = False
    float64: bool = False

    def rotated_width(self, table_width: int) -> int:
        """The coordinates a table of ``table_width`` entries rotates."""
        return 2 * table_width if self.form == "pairs" else table_width


_LLAMA = _Convention("apply_rotary_pos_emb", "rotate_half", "half", _llama_formula)
_NANOCHAT = _Convention("apply_rotary_pos_emb_conjugate", "rotate_half", "half", _nanochat_formula, conjugate=True)
_GEMMA4 = _Convention("apply_rotary_pos_emb_single", "rotate_half", "half", _llama_formula)
_KEYS_OPTIONAL = _Convention("apply_rotary_pos_emb_keys_optional", "rotate_half", "half", _llama_formula)
_LAST_QUERIES = _Convention("apply_rotary_pos_emb_last_queries", "rotate_half", "half", _llama_formula)
_GLM = _Convention("apply_rotary_pos_emb_interleaved", "rotate_half", "interleaved", _glm_formula)
_COHERE = _Convention("apply_rotary_pos_emb_interleaved_tables", "interleaved", "interleaved", _cohere_formula)
_GPT_OSS = _Convention("apply_rotary_pos_emb_pair_tables", "pairs", "half", _gpt_oss_formula, whole_head=True)
_PRIVACY_FILTER = _Convention("apply_rotary_pos_emb_pair_tables_interleaved", "pairs", "interleaved",
                              _pair_tables_interleaved_formula, whole_head=True)
_DEEPSEEK = _Convention("apply_rotary_pos_emb_interleave", "rotate_half", "half", _deepseek_formula, reorder=True)
_DEEPSEEK_V4 = _Convention("apply_rotary_pos_emb_trailing", "pairs", "interleaved", _pair_tables_interleaved_formula,
                           rotated="last")
_GPTJ = _Convention("apply_rotary_pos_emb_every_two", "pairs", "interleaved", _pair_tables_interleaved_formula,
                    whole_head=True, promote=True)
_VISION = _Convention("apply_rotary_pos_emb_vision", "rotate_half", "half", _llama_formula, float64=True)
_SAM = _Convention("apply_rotary_pos_emb_2d", "interleaved", "interleaved", _cohere_formula, float64=True)
_PATCHES = _Convention("apply_rotary_pos_emb_patches", "rotate_half", "half", _llama_formula, float64=True)
_VISION_PAIRWISE = _Convention("apply_rotary_pos_emb_vision_pairwise", "interleaved", "interleaved", _cohere_formula,
                               float64=True)

_READERS = {
    "rotate_half": "rope.hf.apply_rotary_pos_emb (or, where the model pairs (2i, 2i + 1) as GLM does, "
                   "rope.hf.apply_rotary_pos_emb_interleaved)",
    "interleaved": "rope.hf.apply_rotary_pos_emb_interleaved_tables",
    "pairs": "rope.hf.apply_rotary_pos_emb_pair_tables (or, where the model pairs (2i, 2i + 1), "
             "rope.hf.apply_rotary_pos_emb_pair_tables_interleaved, rope.hf.apply_rotary_pos_emb_trailing or "
             "rope.hf.apply_rotary_pos_emb_every_two)",
}
_FORM_NAMES = {
    "rotate_half": "each angle in both halves (rotate_half tables)",
    "interleaved": "each angle twice in a row (the tables of Cohere, GLM-4V, ERNIE 4.5 VL)",
    "pairs": "each angle once (the tables of GPT-OSS, DeepSeek-V4, the OpenAI privacy filter)",
}


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """transformers-compatible (Llama and most models): ``q cos + rotate_half(q) sin`` on the
    first ``cos.shape[-1]`` coordinates (the rest pass through), tables unsqueezed at
    ``unsqueeze_dim`` (1 for q ``[batch, heads, seq, head_dim]``, 2 for ``[batch, seq, heads,
    head_dim]``). ``position_ids`` belongs to an older signature, whose tables it indexed: it
    must be ``None``.

    Args:
        q: queries, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the cos table, ``[batch, seq, width]``, width even and at most head_dim.
        sin: the sin table, of cos's shape.
        position_ids: must be ``None`` (an older signature's argument).
        unsqueeze_dim: where the tables get the heads dimension: 1 or 2, as above.

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    _no_position_ids(position_ids)
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _LLAMA)


def apply_rotary_pos_emb_conjugate(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with NanoChat, whose ``rotate_half`` is (x1, x2) -> (x2, -x1):
    ``q cos - rotate_half(q) sin`` on the first ``cos.shape[-1]`` coordinates, each pair (i, i +
    d/2) turned by the negated angle, -m theta_i (``conjugate=True`` of :func:`rope.apply_rotary`
    on the exact path).

    Args:
        q: queries, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the ``rotate_half`` cos table, ``[batch, seq, width]``.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _NANOCHAT)


def apply_rotary_pos_emb_interleaved(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible for the models that pair coordinates (2i, 2i + 1) but build
    ``rotate_half`` tables (GLM, GLM-4, ERNIE 4.5, Helium): pair i of the first
    ``cos.shape[-1]`` coordinates turns by the angle of ``cos[..., i]``, as their
    ``apply_rotary_pos_emb`` does by taking the first half of the table, each entry twice.

    Args:
        q: queries, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the ``rotate_half`` cos table, ``[batch, seq, width]``.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _GLM)


def apply_rotary_pos_emb_interleaved_tables(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible for the models whose tables hold each angle twice in a row and
    that pair coordinates (2i, 2i + 1) (Cohere, Cohere 2, GLM-4V, ERNIE 4.5 VL):
    ``q cos + rotate_pairs_interleaved(q) sin`` on the first ``cos.shape[-1]`` coordinates.

    Args:
        q: queries, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the interleaved cos table (each angle twice in a row), ``[batch, seq, width]``.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _COHERE)


def apply_rotary_pos_emb_pair_tables(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with GPT-OSS, whose tables hold each angle once: the halves
    (x1, x2) of the head become (x1 cos - x2 sin, x2 cos + x1 sin); the tables span half the head.

    Args:
        q: queries, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the cos table (each angle once), ``[batch, seq, head_dim / 2]``.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _GPT_OSS)


def apply_rotary_pos_emb_pair_tables_interleaved(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with the OpenAI privacy filter, whose tables hold each angle once
    and whose ``_apply_rotary_emb`` pairs (2i, 2i + 1): pair i becomes (x_2i c_i - x_2i+1 s_i,
    x_2i+1 c_i + x_2i s_i), in place; the tables span half the head.

    Args:
        q: queries, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the cos table (each angle once), ``[batch, seq, head_dim / 2]``.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _PRIVACY_FILTER)


def apply_rotary_pos_emb_single(x, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with the one-tensor ``apply_rotary_pos_emb(x, cos, sin)`` of
    Gemma 4: :func:`apply_rotary_pos_emb` on x alone.

    Args:
        x: queries or keys, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``.
        cos: the cos table, ``[batch, seq, width]``.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        x rotated, in its dtype.
    """
    return _rotate({"x": x}, cos, sin, unsqueeze_dim, _GEMMA4)[0]


def apply_rotary_pos_emb_keys_optional(q, k=None, cos=None, sin=None, unsqueeze_dim: int = 1):
    """transformers-compatible with Qwen4-Exp's ``apply_rotary_pos_emb(q, k=None, cos=None,
    sin=None)``: :func:`apply_rotary_pos_emb` on q and k, or, with ``k`` ``None`` (its indexer
    rotates queries and pooled keys one at a time), on q alone, returned alone.

    Args:
        q: queries (or keys), ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``.
        k: keys, laid out as q (heads may differ), or ``None``.
        cos: the cos table, ``[batch, seq, width]`` (or ``[seq, width]`` for q ``[seq, 1, head_dim]``).
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype; ``q_out`` alone for ``k`` ``None``.
    """
    if cos is None or sin is None:
        raise TypeError("cos and sin are required (they default to None only to follow Qwen4-Exp's signature)")
    if k is None:
        return _rotate({"q": q}, cos, sin, unsqueeze_dim, _KEYS_OPTIONAL)[0]
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _KEYS_OPTIONAL)


def apply_rotary_pos_emb_last_queries(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with the ``apply_rotary_pos_emb`` of Muse Glimmer's assistant (a
    drafter whose keys span the main model's context before its queries): Llama's formula on k
    with the whole tables and on q with their last ``q.size(-2)`` rows, ``cos.unsqueeze(
    unsqueeze_dim)[..., -q_len:, :]`` as the model slices them (the sequence rows for tables
    ``[batch, seq, width]`` unsqueezed at 1; for ``unsqueeze_dim`` 2 the dimension sliced is the
    heads' one of size 1, which keeps every row, as in the model).

    Args:
        q: queries, ``[batch, heads, q_len, head_dim]`` (or ``[batch, seq, heads, head_dim]``).
        k: keys, laid out as q, their sequence as long as the tables'.
        cos: the cos table, ``[batch, seq, width]``.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    k_out = _rotate({"k": k}, cos, sin, unsqueeze_dim, _LAST_QUERIES)[0]
    _checks.float_tensor("q", q)
    dim = _checks.integer("unsqueeze_dim", unsqueeze_dim, minimum=-cos.dim() - 1, maximum=cos.dim()) % (cos.dim() + 1)
    rows = q.size(-2) if q.dim() >= 2 else 0
    if dim < cos.dim() - 1 and rows < cos.shape[-2]:  # the unsqueezed -2 is the tables' -2: keep the last rows
        cos, sin = cos[..., -rows:, :], sin[..., -rows:, :]
    return _rotate({"q": q}, cos, sin, unsqueeze_dim, _LAST_QUERIES)[0], k_out


def apply_rotary_pos_emb_trailing(x, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with DeepSeek-V4's one-tensor ``apply_rotary_pos_emb(x, cos, sin)``:
    its tables hold each angle once, and pair i is (h - d + 2i, h - d + 2i + 1) of the last d = 2
    ``cos.shape[-1]`` coordinates of the head (of h), turned by the angle of ``cos[..., i]``; the
    first h - d coordinates pass through. On the exact path, :func:`rope.apply_rotary` with
    ``layout="interleaved", rotated="last"``.

    Args:
        x: queries or keys, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``.
        cos: the cos table (each angle once), ``[batch, seq, width]``, 2 width at most head_dim.
        sin: the sin table, of cos's shape.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        x rotated, in its dtype.
    """
    return _rotate({"x": x}, cos, sin, unsqueeze_dim, _DEEPSEEK_V4)[0]


def apply_rotary_pos_emb_every_two(tensor, sin, cos):
    """transformers-compatible with GPT-J's and CodeGen's ``apply_rotary_pos_emb(tensor, sin,
    cos)`` (sin first): ``tensor cos' + rotate_every_two(tensor) sin'`` with sin' and cos' the
    tables (each angle once) repeated twice in a row, that is pair (2i, 2i + 1) turned by the
    angle of ``cos[..., i]``. The tables are unsqueezed at 2 (``tensor`` ``[batch, seq, heads,
    dim]``) and span the whole ``tensor``, which the attention narrowed to its rotary part. As
    torch computes their formula, the result takes the dtype of ``tensor`` and the tables promoted
    (CodeGen's float32 table keeps half-precision keys in float32).

    Args:
        tensor: queries or keys ``[batch, seq, heads, dim]``, floating.
        sin: the sin table (each angle once), ``[batch, seq, dim / 2]``.
        cos: the cos table, of sin's shape.

    Returns:
        tensor rotated, in the promoted dtype.
    """
    return _rotate({"tensor": tensor}, cos, sin, 2, _GPTJ)[0]


def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """transformers-compatible with DeepSeek-V3's ``apply_rotary_pos_emb_interleave``
    (``rope_interleave``; GLM-5's and Mistral Large 4's are the same): pair i is (2i, 2i + 1) of
    the input, turned by the angle of ``cos[..., i]`` (the first half of ``rotate_half`` tables),
    and the rotated pairs come out half-split (y_a of every pair, then y_b of every pair): the
    half-split rotation of the input reordered by :func:`rope.layouts.interleaved_to_half`, which
    is how the exact path computes it. ``position_ids`` must be ``None``, as in
    :func:`apply_rotary_pos_emb`. ``k`` may be ``None`` (Mistral Large 4's layers that share
    another layer's keys rotate only queries).

    Args:
        q: queries, ``[batch, heads, seq, head_dim]`` or ``[batch, seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ), or ``None``.
        cos: the ``rotate_half`` cos table, ``[batch, seq, width]``.
        sin: the sin table, of cos's shape.
        position_ids: must be ``None``.
        unsqueeze_dim: where the tables get the heads dimension (1 or 2).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype, the rotated pairs half-split (``k_out``
        ``None`` for ``k`` ``None``).
    """
    _no_position_ids(position_ids)
    if k is None:
        return _rotate({"q": q}, cos, sin, unsqueeze_dim, _DEEPSEEK)[0], None
    return _rotate({"q": q, "k": k}, cos, sin, unsqueeze_dim, _DEEPSEEK)


def apply_rotary_emb_complex(xq, xk, freqs_cis):
    """transformers-compatible with Llama 4's ``apply_rotary_emb``: xq and xk ``[batch, seq,
    heads, head_dim]``, pairs (2i, 2i + 1) read as complex numbers and multiplied by
    ``freqs_cis[b, s, i]`` (``[batch, seq, head_dim / 2]``), in complex64 or better, rounded once
    to each input's dtype. From the untouched ``freqs_cis`` of :class:`RotaryEmbedding`
    (``tables="complex"``) it rotates from the exact angles.

    Args:
        xq: queries ``[batch, seq, heads, head_dim]``, floating.
        xk: keys ``[batch, seq, heads, head_dim]`` (heads may differ).
        freqs_cis: complex ``[batch, seq, head_dim / 2]``, s exp(i m theta_i) per pair.

    Returns:
        ``(xq_out, xk_out)``, each in its input's dtype.
    """
    return _complex_rotation({"xq": xq, "xk": xk}, freqs_cis, heads_dim=2)


def apply_rotary_emb_complex_heads_first(xq, xk, freqs_cis):
    """transformers-compatible with DeepSeek-V2's ``apply_rotary_emb``: :func:`apply_rotary_emb_complex`
    on xq and xk ``[batch, heads, seq, head_dim]`` (``freqs_cis`` unsqueezed at 1).

    Args:
        xq: queries ``[batch, heads, seq, head_dim]``, floating.
        xk: keys ``[batch, heads, seq, head_dim]`` (heads may differ).
        freqs_cis: complex ``[batch, seq, head_dim / 2]``, s exp(i m theta_i) per pair.

    Returns:
        ``(xq_out, xk_out)``, each in its input's dtype.
    """
    return _complex_rotation({"xq": xq, "xk": xk}, freqs_cis, heads_dim=1)


def apply_rotary_pos_emb_vision(q, k, cos, sin):
    """transformers-compatible with the vision towers' ``apply_rotary_pos_emb_vision`` (Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL, GLM-4V, GLM-OCR, MLCD, Kimi-K2.5, LFM3-VL, VideoLLaMA 3 and the others
    whose modeling module defines it with ``rotate_half``): ``q cos + rotate_half(q) sin`` with
    the tables ``[seq, head_dim]`` unsqueezed at -2 (q, k ``[seq, heads, head_dim]``, or with a
    batch in front). transformers computes it in float32, rounding each product and sum; here the
    formula runs in float64 on the tables as given, exact for float32 inputs and tables, and each
    output is rounded once to its input's dtype (:func:`rope.rotation.round_once`). The tables
    are used as given: a vision tower's rotary module hands them to its attention directly, and
    rope's (:mod:`rope.hf.vision`) are exactly rounded.

    Args:
        q: queries ``[..., seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the cos table ``[..., seq, width]``, width even and at most head_dim (the rest of the
            head passes through).
        sin: the sin table, of cos's shape.

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    return _rotate({"q": q, "k": k}, cos, sin, -2, _VISION)


def apply_rotary_pos_emb_vision_pairwise(q, k, cos, sin):
    """transformers-compatible with Inkling 2's ``apply_rotary_pos_emb_vision``, whose
    ``rotate_pairwise`` pairs (2i, 2i + 1): ``q cos + rotate_pairs_interleaved(q) sin`` on tables
    ``[seq, head_dim]`` holding each angle twice in a row, unsqueezed at -2; in float64, each
    output rounded once to its input's dtype, as :func:`apply_rotary_pos_emb_vision`.

    Args:
        q: queries ``[..., seq, heads, head_dim]``, floating.
        k: keys, laid out as q (heads may differ).
        cos: the interleaved cos table (each angle twice in a row), ``[..., seq, width]``.
        sin: the sin table, of cos's shape.

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    return _rotate({"q": q, "k": k}, cos, sin, -2, _VISION_PAIRWISE)


def apply_rotary_pos_emb_2d(q, k, cos, sin, num_k_exclude_rope=0, repeat_freqs_k=False):
    """transformers-compatible with SAM 2's and SAM 3's ``apply_rotary_pos_emb_2d`` (its
    ``rotate_pairwise`` pairs (2i, 2i + 1)): ``q cos + rotate_pairs_interleaved(q) sin`` with the
    tables ``[seq, head_dim]`` (each angle twice in a row) broadcast to q as they are, no heads
    dimension added (q ``[..., seq, head_dim]``); in float64, each output rounded once to its
    input's dtype, as :func:`apply_rotary_pos_emb_vision`.

    The video trackers' memory attention (SAM 2 Video's, SAM 3 Tracker Video's) also passes
    ``num_k_exclude_rope``: the last keys (object pointers, which have no position) pass through
    unrotated; and ``repeat_freqs_k``: keys of ``r`` frames of memory, ``r`` times as many as the
    queries, each frame rotated by the queries' tables (the tables tiled ``r`` times along the
    sequence). Both default to transformers' (none excluded, tables as given).

    Args:
        q: queries ``[..., seq, head_dim]``, floating.
        k: keys, laid out as q.
        cos: the interleaved cos table, ``[seq, width]`` (or any shape that broadcasts to q).
        sin: the sin table, of cos's shape.
        num_k_exclude_rope: how many of the last keys pass through unrotated, in ``[0, k's seq]``.
        repeat_freqs_k: tile the tables along the sequence to the rotated keys' length, which
            must then be a multiple of q's (where it differs from q's).

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    _checks.float_tensor("k", k)
    if k.dim() < 2:
        raise ValueError(f"k must have shape [..., seq, head_dim], got {tuple(k.shape)}")
    excluded = _checks.integer("num_k_exclude_rope", num_k_exclude_rope, minimum=0, maximum=k.shape[-2])
    if not _checks.flag("repeat_freqs_k", repeat_freqs_k) and not excluded:
        return _rotate({"q": q, "k": k}, cos, sin, 0, _SAM)  # unsqueezed at 0: broadcast as given
    (q_out,) = _rotate({"q": q}, cos, sin, 0, _SAM)
    rotated, passed = k[..., : k.shape[-2] - excluded, :], k[..., k.shape[-2] - excluded :, :]
    if not rotated.shape[-2]:  # every key excluded
        return q_out, torch.cat([rotated, passed], dim=-2)
    if repeat_freqs_k and rotated.shape[-2] != q.shape[-2]:
        if q.dim() < 2 or rotated.shape[-2] % q.shape[-2]:
            raise ValueError(f"k has {rotated.shape[-2]} rotated keys (num_k_exclude_rope={excluded} excluded), "
                             f"expected a multiple of the {q.shape[-2] if q.dim() > 1 else 0} positions of q "
                             f"{tuple(q.shape)} (repeat_freqs_k tiles their tables)")
        if cos.dim() < 2:
            raise ValueError(f"cos must have shape [seq, width] to be tiled for repeat_freqs_k, got {tuple(cos.shape)}")
        factor = rotated.shape[-2] // q.shape[-2]
        cos, sin = (torch.cat([table] * factor, dim=-2) for table in (cos, sin))
    (k_out,) = _rotate({"k": rotated}, cos, sin, 0, _SAM)
    return q_out, torch.cat([k_out, passed], dim=-2)


def apply_rotary_pos_emb_patches(q, k, cos, sin):
    """transformers-compatible with DINOv3's ``apply_rotary_pos_emb`` (and Sapiens2's,
    EoMT-DINOv3's): an image grid's tables ``[patches, head_dim]`` (:mod:`rope.hf.grid`) rotate
    the last ``patches`` tokens of q and k, ``q cos + rotate_half(q) sin`` with the tables
    broadcast as they are (q ``[batch, heads, tokens, head_dim]``), and the tokens before them
    (class and register tokens, EoMT's queries) pass through unchanged. transformers computes it
    in q's dtype; here the formula runs in float64 on the tables as given, exact for float32
    inputs and tables, and each output is rounded once to its input's dtype, as
    :func:`apply_rotary_pos_emb_vision`. q and k each rotate their own last ``patches`` tokens.

    Args:
        q: queries ``[..., tokens, head_dim]``, floating, with at least ``patches`` tokens.
        k: keys, laid out as q.
        cos: the cos table ``[patches, width]`` (or any shape ``[..., patches, width]`` that
            broadcasts to the patches of q), width even and at most head_dim (the rest of the
            head passes through).
        sin: the sin table, of cos's shape.

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    for name, value in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _checks.float_tensor(name, value)
    if cos.dim() < 2:
        raise ValueError(f"cos must be [..., patches, width], got shape {tuple(cos.shape)}")
    patches = cos.shape[-2]
    for name, x in (("q", q), ("k", k)):
        if x.dim() < 2 or x.shape[-2] < patches:
            raise ValueError(f"cos has {patches} rows (patches), more than the tokens of {name} {tuple(x.shape)} "
                             "([..., tokens, head_dim])")
    rotated = _rotate({"q": q[..., q.shape[-2] - patches:, :], "k": k[..., k.shape[-2] - patches:, :]}, cos, sin, 0,
                      _PATCHES)  # unsqueezed at 0: broadcast as given
    return tuple(torch.cat((x[..., : x.shape[-2] - patches, :], y), dim=-2) for x, y in zip((q, k), rotated))


def _complex_rotation(xs: dict, freqs_cis, *, heads_dim: int) -> tuple:
    """The complex product of every tensor of ``xs`` (heads at ``heads_dim``) by ``freqs_cis``:
    from the exact source where it is rope's untouched table made for these inputs."""
    _check_complex(xs, freqs_cis, heads_dim)
    source = provenance.untouched_source(freqs_cis)
    if source is not None and _matches_source(xs.values(), source, heads_dim=heads_dim):
        return _from_source(tuple(xs.values()), source, heads_dim=heads_dim, layout="interleaved")
    return tuple(_complex_product(x, freqs_cis.unsqueeze(heads_dim)) for x in xs.values())


def _no_position_ids(position_ids) -> None:
    if position_ids is not None:
        raise ValueError("position_ids must be None: cos and sin are already the tables of the positions "
                         "(the older transformers signature indexed the tables with it)")


def _rotate(xs: dict, cos, sin, unsqueeze_dim, convention: _Convention) -> tuple:
    """``convention``'s function on every tensor of ``xs``: from the exact source where the
    tables are provably rope's untouched pair made for these inputs, else from the tables given."""
    unsqueeze_dim, width = _check_tables(xs, cos, sin, unsqueeze_dim, convention)
    if convention.promote:  # exact: the promoted dtype holds every value of both
        xs = {name: x.to(torch.promote_types(x.dtype, cos.dtype)) for name, x in xs.items()}
    source = provenance.untouched_source(cos, sin)
    heads_dim = unsqueeze_dim + 4 if unsqueeze_dim < 0 else unsqueeze_dim
    if source is not None and cos.dim() == 3 and heads_dim in (1, 2) and _matches_source(xs.values(), source,
                                                                                          heads_dim=heads_dim):
        inputs = tuple(xs.values())
        if convention.reorder:  # DeepSeek: the half-split rotation of the input reordered to half-split
            inputs = tuple(x[..., interleaved_to_half(x.shape[-1], width).to(x.device)] for x in inputs)
        return _from_source(inputs, source, heads_dim=heads_dim, layout=convention.layout,
                            rotated=convention.rotated, conjugate=convention.conjugate)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return tuple(_from_tables(x, cos, sin, width, convention) for x in xs.values())


def _check_tables(xs: dict, cos, sin, unsqueeze_dim, convention: _Convention) -> tuple[int, int]:
    """Raise unless the inputs and tables fit ``convention`` (README, "Errors"); return
    ``unsqueeze_dim`` as an int and the number of rotated coordinates."""
    for name, x in xs.items():
        _checks.float_tensor(name, x)
    _checks.float_tensor("cos", cos)
    _checks.float_tensor("sin", sin)
    first = next(iter(xs))
    _checks.same_device(first, xs[first], **{name: x for name, x in xs.items() if name != first}, cos=cos, sin=sin)
    if cos.dim() == 0:
        raise ValueError("cos must have at least one dimension (the table width), got a 0-D tensor")
    if sin.shape != cos.shape:
        raise ValueError(f"sin {tuple(sin.shape)} must have the shape of cos {tuple(cos.shape)}")
    unsqueeze_dim = _checks.integer("unsqueeze_dim", unsqueeze_dim, minimum=-cos.dim() - 1, maximum=cos.dim())
    form = provenance.recorded_form(cos)
    if form is not None and form != convention.form:
        raise ValueError(f"cos holds {_FORM_NAMES[form]}, which rope.hf.{convention.function} does not read: "
                         f"use {_READERS[form]}")
    width = convention.rotated_width(cos.shape[-1])
    table_shape = cos.unsqueeze(unsqueeze_dim).shape[:-1]
    for name, x in xs.items():
        head_dim = x.shape[-1] if x.dim() else 0
        if convention.whole_head and width != head_dim:
            raise ValueError(f"cos has width {cos.shape[-1]}, expected half the head_dim of {name} "
                             f"({tuple(x.shape)}): {convention.function} rotates the whole head")
        if width % 2 or not 0 < width <= head_dim:
            raise ValueError(f"cos has width {cos.shape[-1]}, expected an even width in [2, head_dim] "
                             f"(head_dim of {name} {tuple(x.shape)})")
        if not _broadcasts_to(table_shape, x.shape[:-1]):
            raise ValueError(f"cos {tuple(cos.shape)} unsqueezed at unsqueeze_dim={unsqueeze_dim} does not broadcast "
                             f"to {name} {tuple(x.shape)}")
    return unsqueeze_dim, width


_HEAD_LAYOUTS = {1: "[batch, heads, seq, head_dim]", 2: "[batch, seq, heads, head_dim]"}


def _check_complex(xs: dict, freqs_cis, heads_dim: int) -> None:
    """Raise unless xq, xk are 4-D float tensors with their heads at ``heads_dim`` and
    ``freqs_cis`` a complex ``[batch, seq, head_dim / 2]`` tensor that broadcasts to them."""
    for name, x in xs.items():
        _checks.float_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape {_HEAD_LAYOUTS[heads_dim]}, got {tuple(x.shape)}")
    _checks.tensor("freqs_cis", freqs_cis)
    if not freqs_cis.dtype.is_complex:
        raise TypeError(f"freqs_cis must be a complex tensor (complex64 or complex128), got {freqs_cis.dtype}")
    _checks.same_device("xq", xs["xq"], xk=xs["xk"], freqs_cis=freqs_cis)
    if freqs_cis.dim() != 3:
        raise ValueError(f"freqs_cis must have shape [batch, seq, head_dim / 2], got {tuple(freqs_cis.shape)}")
    for name, x in xs.items():
        if x.shape[-1] % 2 or freqs_cis.shape[-1] != x.shape[-1] // 2:
            raise ValueError(f"freqs_cis has {freqs_cis.shape[-1]} entries per token, expected head_dim / 2 of {name} "
                             f"{tuple(x.shape)} (an even head_dim)")
        if not _broadcasts_to(freqs_cis.unsqueeze(heads_dim).shape[:-1], x.shape[:-1]):
            raise ValueError(f"freqs_cis {tuple(freqs_cis.shape)} does not broadcast to the batch and seq of {name} "
                             f"{tuple(x.shape)} (laid out {_HEAD_LAYOUTS[heads_dim]})")


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without enlarging it."""
    try:
        return torch.broadcast_shapes(shape, target) == tuple(target)
    except RuntimeError:
        return False


def _matches_source(xs, source: TableSource, *, heads_dim: int) -> bool:
    """Whether every input is ``[batch, heads, seq, dim]`` (``heads_dim`` 1) or ``[batch, seq,
    heads, dim]`` (2), non-empty, with the seq of the source positions and their batch (or
    any batch, for one shared row of positions)."""
    batch, seq = source.position_ids.shape[-2:]
    return all(x.dim() == 4 and x.numel() and x.shape[3 - heads_dim] == seq and batch in (1, x.shape[0])
               for x in xs)


def _from_source(xs: tuple, source: TableSource, *, heads_dim: int, layout: str, rotated: str = "first",
                 conjugate: bool = False) -> tuple:
    """The inputs rotated from the source positions and frequencies by :func:`rope.apply_rotary`
    (:func:`rope.mrope.apply_mrope` with M-RoPE axes), on ``[batch, seq, heads, dim]`` views; q
    and k in one call where they agree in dtype and shape (heads aside), else each on its own.
    ``rotated`` and ``conjugate`` are :func:`rope.apply_rotary`'s."""
    views = [x.transpose(1, 2) if heads_dim == 1 else x for x in xs]
    options = dict(layout=layout, rotated=rotated, conjugate=conjugate)
    if len(views) == 2 and views[0].dtype == views[1].dtype and (
            views[0].shape[:2] + views[0].shape[3:] == views[1].shape[:2] + views[1].shape[3:]):
        outs = _exact(views[0], views[1], source, **options)
    else:  # each on its own, with one head of itself in k's place
        outs = tuple(_exact(view, view.narrow(2, 0, 1), source, **options)[0] for view in views)
    return tuple(out.transpose(1, 2) if heads_dim == 1 else out for out in outs)


def _exact(q: torch.Tensor, k: torch.Tensor, source: TableSource, *, layout: str, rotated: str,
           conjugate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k ``[batch, seq, heads, dim]`` rotated by the source's positions (one row shared
    by the batch where the source has one) and frequencies, times its attention factor. Where
    the torch path runs, by the float64 cos and sin the tables were rounded from: computed once
    per forward for every layer, as transformers' tables are."""
    positions, axes, factor = source.position_ids, source.mrope_axes, source.attention_factor
    shared = positions.shape[-2] == 1 and q.shape[0] != 1  # one row of positions for the whole batch
    if shared:
        positions = positions[0] if axes is None else positions[:, 0]
    options = dict(layout=layout, rotated=rotated, conjugate=conjugate, attention_factor=factor)
    if use_kernel(q, "auto", source.inv_freq, factor):
        if axes is None:
            return apply_rotary(q, k, positions, source.inv_freq, **options)
        return apply_mrope(q, k, positions, source.inv_freq, axes, **options)
    rotary_dim = check_inputs(q, k, positions, source.inv_freq, None, axes=axes, values=False)
    cos, sin = (table[0] for table in source.exact) if shared else source.exact  # [(batch,) seq, pairs]
    return rotate_by_cos_sin(q, k, cos, sin, rotary_dim=rotary_dim, **options)


def _working_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 where any of ``tensors`` is float64 (or complex128)."""
    return torch.float64 if any(t.dtype in (torch.float64, torch.complex128) for t in tensors) else torch.float32


def _from_tables(x, cos, sin, width: int, convention: _Convention) -> torch.Tensor:
    """The convention's formula on its ``width`` coordinates of x (the first, or the last) and the
    unsqueezed tables, in :func:`_working_dtype`, rounded once to x's dtype; the other
    coordinates pass through."""
    dtype = torch.float64 if convention.float64 else _working_dtype(x, cos)
    start = x.shape[-1] - width if convention.rotated == "last" else 0
    y = round_once(convention.formula(x.narrow(-1, start, width).to(dtype), cos.to(dtype), sin.to(dtype)), x.dtype)
    parts = (x[..., :start], y) if convention.rotated == "last" else (y, x[..., width:])
    return torch.cat(parts, dim=-1)


def _complex_product(x, freqs_cis) -> torch.Tensor:
    """Llama 4's product: pairs (2i, 2i + 1) of x as complex numbers times ``freqs_cis``, already
    unsqueezed at the heads dimension, in complex64 or complex128 (:func:`_working_dtype`), rounded
    once to x's dtype."""
    dtype = _working_dtype(x, freqs_cis)
    pairs = torch.view_as_complex(x.to(dtype).reshape(*x.shape[:-1], -1, 2).contiguous())
    product = pairs * freqs_cis.to(pairs.dtype)
    return round_once(torch.view_as_real(product).flatten(3), x.dtype)
