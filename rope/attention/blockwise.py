"""Blockwise RoPE / ReRoPE attention: softmax(s L + mask) V without ever forming the q_len x k_len matrix.

:func:`rotary_attention` computes what a FlashAttention-style kernel for RoPE, ReRoPE and Leaky
ReRoPE computes (:mod:`rope.kernels.triton_attention` is one), on any device torch runs on, in one
of two arithmetics (``compute_dtype``): float64, the exact *reference* described below (the default
for float64 inputs), or float32, the same tiles as float32 BLAS matmuls (the default for float16,
bfloat16 and float32 inputs: :mod:`.blockwise_float32` states its range and its accuracy bound
against the float64 result; on one CPU thread it takes about 1.3 times the time of torch's
``scaled_dot_product_attention`` on pre-rotated inputs, ``rope/data/bench_blockwise.md``).
Queries and keys are cut into blocks of ``block_size`` tokens; each (query block, key block) tile
is rotated on the fly, its logits formed, and folded into the output with the online softmax, so
the memory is O(block_size^2) logits per batch and head plus the output, whatever the sequence
lengths. What follows describes the float64 path; the float32 path changes its arithmetic only.

Online softmax (Milakov and Gimelshein, "Online normalizer calculation for softmax", 2018; Dao et
al., "FlashAttention: fast and memory-efficient exact attention with IO-awareness", NeurIPS 2022).
For one query row with key blocks B_1 .. B_T, scaled and masked logits x_j = s L_j (-inf where
masked) and values v_j, start from m = -inf, l = 0, a = 0 and for t = 1 .. T::

    m_t = max(m_{t-1}, max_{j in B_t} x_j)
    l_t = exp(m_{t-1} - m_t) l_{t-1} + sum_{j in B_t} exp(x_j - m_t)
    a_t = exp(m_{t-1} - m_t) a_{t-1} + sum_{j in B_t} exp(x_j - m_t) v_j

then ``a_T / l_T = sum_j softmax(x)_j v_j``. While a row has seen only masked keys, m = -inf and
its rescale factor is taken as 0 (not exp(-inf + inf) = NaN).

Range. The row's scale s > 0 (times its log-n factor c) does not move its maximum, so the maximum is
taken over the logits L *before* the scale and each gap x_j - m = s c (L_j - max L) is formed from a
finite L_j - max L <= 0: 0 at the maximum whatever s (never inf * 0 or inf - inf), so that a scale
beyond any logit's range gives the hard maximum, the mean of v over each row's largest logits, as
softmax(s L) V does in the limit. The logits themselves are formed in power-of-two frames, exact in
binary: each query row is scaled by 2^-G (its largest coordinate, with the attention factor a^2 =
ma^2 2^(2 ea) on the rotated coordinates, about 1), the keys by 2^-K (K > 0 only where max ``|k|`` >= 2^900),
so L' = L 2^-(G + K) is finite for every finite q, k and a (a^2 alone may be beyond float64's range); then
x - m = M 2^F (L' - max L') with M = ms c (s = ms 2^es) and F = es + K + G, the power of two applied last
(:func:`_ldexp`: ±inf beyond float64's range, never 0 * inf). The values are scaled by 2^-V only where a
sum of k_len of them could overflow. LSE = M 2^F max L' + log l is ±inf where it is beyond float64's
range. The frames change no rounding of ordinary inputs beyond a few float64 ulps (a power of two
times a float64 number is exact unless it leaves the normal range).

The logits L (unscaled, as :mod:`.rerope` defines them; GQA: query head h reads key head
``h // (heads_q // heads_k)``):

* RoPE (``window=None``): ``L_mn = (R_m q)^T (R_n k)``, queries and keys at their own positions;
* ReRoPE / Leaky ReRoPE (``window=w``, ``leaky_scale=k``): the two-pass form of
  :func:`.rerope.rerope_scores_two_pass`, ``L = pass1 where r = m - n < w, else pass2``, with
  pass 1 the plain RoPE logit above and pass 2 the *bent* logit: ReRoPE rotates queries as if at
  position w and leaves keys unrotated (relative position w); Leaky ReRoPE rotates with the
  frequencies theta_i / k, queries at m + w (k - 1) and keys at n (relative position
  w + (r - w) / k).

The tile rule. Positions are arbitrary integers (unsorted, gapped, offset), so a tile is described
by the extreme positions of its blocks: queries in [m_lo, m_hi], keys in [n_lo, n_hi]. Over the
tile's pairs r = m - n spans exactly [m_lo - n_hi, m_hi - n_lo] (both ends are reached: take the
extreme query with the extreme key; Python integers, so no difference wraps around at 2^63, and
inside a tile :func:`.rerope.below_window` selects the pass exactly). Hence:

* causal and n_lo > m_hi: every key follows every query, the tile is masked out: *skipped*;
* no window, or m_hi - n_lo < w: every pair has r < w: pass 1 only (*plain*);
* m_lo - n_hi >= w: every pair has r >= w: pass 2 only (*bent*);
* otherwise the boundary r = w crosses the tile: both passes, selected pair by pair (*both*).

Keys after their query (r < 0 < w) take pass 1, as in :mod:`.rerope`; the causal mask removes
them. With contiguous positions a *both* tile holds pairs at r = w - 1 and r = w, and at most two
key blocks per query block are *both* tiles: the rest of the work is a single pass, as for RoPE.
``return_stats=True`` returns the counts as :class:`TileStats`.

The backward (Dao, "FlashAttention-2: faster attention with better parallelism and work
partitioning", 2023, Algorithm 2). The forward keeps no tile: it saves q, k, v, the positions,
inv_freq, the float64 output O and, per query row, ``LSE = m_T + log(l_T)`` (the online softmax's
final max and sum). The backward visits the same tiles under the same rule and recomputes each
one's scaled, masked logits x = s L, so at most one ``block_size x block_size`` tile exists at a
time. With dO the incoming gradient (float64) and, per query row i, ``D_i = sum_d dO_id O_id``::

    P_ij   = exp(x_ij - LSE_i)                  (0 where masked)
    dV_j  += sum_i P_ij dO_i
    dP_ij  = dO_i . V_j
    dS_ij  = P_ij (dP_ij - D_i)

The logits are bilinear in the rotated vectors: for a plain pair ``L_ij = (R_m q_i) . (R_n k_j)``,
so with ``dL = s dS`` the rotated gradients are ``dq_rot_i += sum_j dL_ij k_rot_j`` and
``dk_rot_j += sum_i dL_ij q_rot_i``, and ``dq = R_m^T dq_rot``, ``dk = R_n^T dk_rot`` (the
transposed rotation: the same angles with sin negated). A bent pair does the same with the
pass-2 rotations (ReRoPE: queries at w, keys unrotated; Leaky ReRoPE: frequencies theta / k,
queries at m + w (k - 1), keys at n); a *both* tile splits dL by the mask r < w into its plain and
bent parts, each through its own rotations. The rotated gradients are accumulated per frame
(plain, bent) over the whole sequence and turned back once, block by block. GQA: a key head's
gradients (dk, dv) are summed over the query heads of its group. The float64 gradients are
rounded once to the dtypes of q, k and v.

The backward works in the forward's frames: v, dO and grad_lse are scaled by powers of two so that
dS = 2^E dS'' with every factor of dS'' at most 1; dq and dk are accumulated from M dS'' and the
frames' q and k and multiplied by their powers of two once, at the end (±inf beyond the range of
float64, 0 where the sum is 0: a saturated softmax gives the limit's zero gradients in q and k
whatever the scale). A row whose LSE is ±inf (beyond float64's range) has no exp(x - LSE) to recompute:
for it the backward recomputes the row's maximum and sum over its tiles, P = exp(x - max x) / l.

Operators. The forward and the backward are ``torch.ops.rope.blockwise_attention`` (returning O and
LSE, both differentiable) and ``torch.ops.rope.blockwise_attention_backward``, registered with
``torch.library.custom_op``, fake implementations and an autograd formula, so that
``torch.compile(fullgraph=True)`` traces :func:`rotary_attention` as one opaque call (the tile
classification reads the positions on the host inside the real implementation). Arguments are
checked as in :mod:`rope.kernels.operators`: metadata in the real and the fake implementations,
values (finite frequencies, a key for every query) in the real one only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.types import Number

from .. import _checks
from ..layouts import ROTATED, check_layout, rotated_block_first
from . import blockwise_float32
from .rerope import below_window, bent_frame, check_qk, check_window, head_logits, rotate_exactly


@dataclass
class TileStats:
    """How many (query block, key block) tiles of :func:`rotary_attention` took each path."""

    tiles_plain: int = 0
    """pass 1 only: every pair of the tile has r = m - n < window (every tile without a window)."""
    tiles_bent: int = 0
    """pass 2 only: every pair has r >= window."""
    tiles_both: int = 0
    """both passes, selected pair by pair: the boundary r = window crosses the tile."""
    tiles_skipped: int = 0
    """causal and every key after every query: nothing computed."""


def _tile_kind(m_lo: int, m_hi: int, n_lo: int, n_hi: int, causal: bool, window: int | None) -> str:
    """``"skipped"``, ``"plain"``, ``"bent"`` or ``"both"``: the tile rule of the module docstring."""
    if causal and n_lo > m_hi:
        return "skipped"
    if window is None or m_hi - n_lo < window:
        return "plain"
    if m_lo - n_hi >= window:
        return "bent"
    return "both"


def _rotated(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, options: AttentionOptions,
             bent: bool, query: bool, conjugate: bool = False) -> torch.Tensor:
    """R x (R^T x with ``conjugate``) on the rotary coordinates (the first rotary_dim; the tail is kept), float64,
    by :func:`.rerope.rotate_exactly`: the plain rotation at the tokens' positions, or with ``bent`` the pass-2
    rotation of query or key tokens (:func:`.rerope.bent_frame`). No attention factor: the frames carry it."""
    if bent:
        positions, inv_freq = bent_frame(positions, inv_freq, options.window, options.leaky_scale, query)
    return rotate_exactly(x, positions, inv_freq, options.layout, conjugate=conjugate)


def position_rows(name: str, positions, batch: int, length: int) -> torch.Tensor:
    """Integer positions ``[length]`` (shared by the batch) or ``[batch, length]`` (one row per
    sequence), checked; returned as they are."""
    _checks.integer_tensor(name, positions)
    if tuple(positions.shape) not in ((length,), (batch, length)):
        raise ValueError(f"{name} must have shape [{length}] (shared by the batch) or [batch, {length}] = "
                         f"[{batch}, {length}], got {list(positions.shape)}")
    return positions


def first_row(positions: torch.Tensor) -> torch.Tensor:
    """A 1-D stand-in of the same dtype, device and length, for the checks written for 1-D positions."""
    if positions.dim() == 1:
        return positions
    return positions[0] if positions.shape[0] else positions.new_zeros(positions.shape[1])


def _row(positions: torch.Tensor, b: int) -> torch.Tensor:
    """Batch row b's positions: row b of ``[batch, seq]`` positions, or the shared ``[seq]`` ones."""
    return positions[b] if positions.dim() == 2 else positions


def _check_tensors(q, k, v, q_positions, k_positions, inv_freq) -> None:
    """The tensors' metadata (dtypes, shapes, devices) without reading any value
    (:func:`.rerope.check_qk` with ``values=False``): it runs in the fake implementation and while
    torch.compile traces. Positions are ``[seq]`` (shared) or ``[batch, seq]``."""
    _checks.head_tensors(q=q, k=k)
    q_positions = position_rows("q_positions", q_positions, q.shape[0], q.shape[1])
    k_positions = position_rows("k_positions", k_positions, k.shape[0], k.shape[1])
    check_qk(q, k, first_row(q_positions), first_row(k_positions), inv_freq, values=False)
    _checks.head_tensors(v=v)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} in batch, seq and heads")
    _checks.same_device("q", q, v=v)


COMPUTE_DTYPES = (torch.float32, torch.float64)
"""The dtypes ``compute_dtype`` takes: float32 (:mod:`.blockwise_float32`) and float64 (the exact path)."""


def compute_dtype_of(compute_dtype, *tensors: torch.Tensor) -> torch.dtype:
    """``compute_dtype`` checked (None, or one of :data:`COMPUTE_DTYPES`) and resolved: None is float64 where
    q, k or v is float64, float32 otherwise (float16, bfloat16 and float32 inputs)."""
    if compute_dtype is not None:
        return _checks.dtype_choice("compute_dtype", compute_dtype, COMPUTE_DTYPES)
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_options(head_dim, layout, causal, window, leaky_scale, softmax_scale, block_size,
                   logn_length=None, attention_factor=1.0, compute_dtype=torch.float64) -> AttentionOptions:
    """The options, checked (the package's errors) and completed (the default scale 1 / sqrt(head_dim));
    ``compute_dtype`` already resolved (:func:`compute_dtype_of`)."""
    check_layout(layout)
    _checks.flag("causal", causal)
    if window is not None:
        # an int64 at most: the operators' Scalar arguments (a larger int is a bare OverflowError in the dispatcher)
        _checks.integer("window", window, minimum=1, maximum=_checks.INT64_MAX)
        window, leaky_scale = check_window(window, leaky_scale)
    elif leaky_scale is not None:
        raise ValueError(f"leaky_scale = {leaky_scale!r} needs a window (it bends the positions beyond it)")
    if softmax_scale is None:
        scale = 1 / math.sqrt(head_dim)
    else:
        scale = _checks.number("softmax_scale", softmax_scale, positive=True)
    block_size = _checks.integer("block_size", block_size, minimum=1, maximum=_checks.INT64_MAX)
    # ln L > 0; the integer options are at most INT64_MAX: the operators take int64 scalars
    logn_length = _checks.optional_integer("logn_length", logn_length, minimum=2, maximum=_checks.INT64_MAX)
    attention_factor = _checks.number("attention_factor", attention_factor, positive=True)
    return AttentionOptions(layout, causal, window, leaky_scale, scale, block_size, logn_length, attention_factor,
                            compute_dtype)


def check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                    softmax_scale, block_size, logn_length=None, attention_factor=1.0,
                    compute_dtype=None) -> AttentionOptions:
    """Everything but tensor values (the real and the fake implementations alike); return the options,
    ``compute_dtype`` resolved from the dtypes of q, k and v where it is None."""
    _check_tensors(q, k, v, q_positions, k_positions, inv_freq)
    return _check_options(q.shape[3], layout, causal, window, leaky_scale, softmax_scale, block_size, logn_length,
                          attention_factor, compute_dtype_of(compute_dtype, q, k, v))


def _check_values(q_positions, k_positions, inv_freq, causal: bool, logn_length=None) -> None:
    """What only the real implementation can see: finite frequencies, a key for every query row, and
    with log-n scaling no negative query position."""
    _checks.finite_frequencies("inv_freq", inv_freq, dtypes=_checks.FREQUENCY_DTYPES)
    if logn_length is not None:
        check_logn_positions(q_positions)
    if q_positions.dim() == 2 or k_positions.dim() == 2:  # a key for every query of every batch row
        for b in range(max(q_positions.shape[0] if q_positions.dim() == 2 else 1,
                           k_positions.shape[0] if k_positions.dim() == 2 else 1)):
            _check_every_query_sees_a_key(_row(q_positions, b).tolist(), _row(k_positions, b).tolist(), causal)
        return
    _check_every_query_sees_a_key(q_positions.tolist(), k_positions.tolist(), causal)


def check_logn_positions(q_positions: torch.Tensor) -> None:
    """Log-n scaling counts the keys a query sees from position 0: no negative query position
    (eager ``ValueError`` off CUDA, a device assertion on it)."""
    if q_positions.numel():
        _checks.assert_values("q_positions", q_positions.min() >= 0,
                              "no negative position with logn_length (log-n scaling counts keys from position 0)")


def logn_factors(q_positions: torch.Tensor, logn_length: int) -> torch.Tensor:
    """float64 ``max(1, ln(m + 1) / ln L)`` per query position m (:func:`rope.attention.logn.logn_scale`,
    without its host-side check: the positions are checked by :func:`check_logn_positions`)."""
    return (torch.log(q_positions.to(torch.float64) + 1) / math.log(logn_length)).clamp(min=1.0)


def _check_every_query_sees_a_key(m: list[int], n: list[int], causal: bool) -> None:
    """Refuse a query row with no key to attend to (SDPA would return NaN there)."""
    if m and not n:
        raise ValueError("k_positions is empty: the queries have no key to attend to")
    if m and causal and min(m) < min(n):
        raise ValueError(f"causal: the query at q_positions {min(m)} precedes every key (k_positions start at "
                         f"{min(n)}), so its attention row is entirely masked")


def rotary_attention(
    q, k, v, q_positions, k_positions, inv_freq, *, layout: str = "half", causal: bool = True,
    window: int | None = None, leaky_scale: float | None = None, softmax_scale: float | None = None,
    block_size: int = 128, return_stats: bool = False, logn_length: int | None = None,
    attention_factor: float = 1.0, compute_dtype: torch.dtype | None = None, rotated: str = "first",
) -> torch.Tensor | tuple[torch.Tensor, TileStats]:
    """Attention ``softmax(s L + mask) V`` with RoPE, ReRoPE or Leaky ReRoPE logits L, block by block, in float32
    or, exactly, in float64.

    Shapes::

        q            [batch, q_len, heads_q, d]         float16/bfloat16/float32/float64
        k            [batch, k_len, heads_k, d]         heads_q a multiple of heads_k
        v            [batch, k_len, heads_k, v_dim]     v_dim may differ from d
        q_positions  [q_len] or [batch, q_len]          integers: any order, gaps, offsets
        k_positions  [k_len] or [batch, k_len]          (shared, or one row each)
        inv_freq     [rotary_dim / 2]                   float32/float64, rotary_dim <= d
        returns      [batch, q_len, heads_q, v_dim]     compute_dtype: float32 or float64

    L is the plain RoPE logit (``window=None``), ReRoPE's (``window=w``) or Leaky ReRoPE's
    (``window=w, leaky_scale=k``) exactly as :func:`.rerope.rerope_scores_two_pass` defines it,
    with the exactly reduced angles of :func:`.rerope.rotate_exactly`. ``s`` is ``softmax_scale``, by
    default ``1 / sqrt(d)``; with ``logn_length`` L (log-n scaling, :mod:`.logn`) the logits of the
    query at position m are also multiplied by ``max(1, ln(m + 1) / ln L)`` (positions from 0).
    ``attention_factor`` a (YaRN's, :func:`rope.inv_freq`'s second value) scales the rotated
    coordinates of q and k, as transformers' cos and sin tables carry it: the rotary part of each
    logit by a^2, the unrotated tail not at all.
    ``causal`` masks every key whose position exceeds the query's. ``rotated="last"`` rotates the
    last rotary_dim coordinates of each head instead of the first (DeepSeek-V4, :mod:`rope.layouts`):
    both q and k have that block moved to the front first (one copy of each), which leaves every
    logit q . k as it was.

    ``compute_dtype`` chooses the arithmetic, and the output's dtype:

    * ``torch.float64``, the default for float64 inputs: the inputs are taken exactly as given and
      every operation is float64 (the power-of-two frames of the module docstring), which makes
      this the reference for kernels (and for the float32 path), not a fast path;
    * ``torch.float32``, the default for float16, bfloat16 and float32 inputs: the same tiles as
      float32 BLAS matmuls, the angles still exactly reduced and each turned coordinate rounded to
      float32 once (:mod:`.blockwise_float32`, which states its range and its accuracy bound
      against the float64 result: about 1e-5 of ``sum p |v|`` for logits of tens). Calls beyond
      its range (a scale, attention factor or input magnitude that float32 logits cannot hold)
      are computed by the float64 path and rounded to float32, never returned overflowed.

    Memory: at most a ``block_size x block_size`` tile of logits per batch and head exists at a
    time (see the module docstring for the online softmax and the tile rule); ``return_stats=True``
    also returns the :class:`TileStats` of the tiles computed.

    The computation is the operator ``torch.ops.rope.blockwise_attention`` (:func:`blockwise_attention`,
    with a fake implementation and an autograd formula), so ``torch.compile(fullgraph=True)`` traces
    this function without a graph break, except with ``return_stats=True``: the statistics are Python
    integers counted on the host from the positions, after the operator.

    Differentiable in q, k and v: the backward recomputes the tiles (FlashAttention-2, see the
    module docstring) instead of storing them, so it too holds O(block_size^2) logits at a time,
    in the same ``compute_dtype``, and returns the gradients rounded once to the inputs' dtypes.

    A query row with no key to attend to (no keys at all, or ``causal`` with a query position
    below every key position) raises ``ValueError``, where ``torch.nn.functional.
    scaled_dot_product_attention`` would return NaN. ``q_len = 0`` returns an empty output.

    Finite inputs never give NaN, at any ``softmax_scale``, ``attention_factor`` and magnitude of q,
    k and v (module docstring, "Range"): where s a^2 ``|q . k|`` is beyond float64's range the output is
    the limit of the softmax, the mean of v over each row's largest logits, as exact as the logits'
    float64 rounding allows; LSE and the gradients are ±inf where they are beyond the range of
    their dtype (float32's for the LSE of ``compute_dtype=torch.float32``).

    Raises:
        TypeError, ValueError: for any bad argument, naming it (``compute_dtype``: a ``torch.dtype``,
            float32 or float64, or None).
    """
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor, compute_dtype)
    _checks.flag("return_stats", return_stats)
    _checks.choice("rotated", rotated, ROTATED)
    q, k = (rotated_block_first(x, 2 * inv_freq.shape[-1], rotated) for x in (q, k))
    out, _ = blockwise_attention(q, k, v, q_positions, k_positions, inv_freq, layout=layout, causal=causal,
                                 window=options.window, leaky_scale=options.leaky_scale,
                                 softmax_scale=options.scale, block_size=options.block_size,
                                 logn_length=options.logn_length, attention_factor=options.attention_factor,
                                 compute_dtype=options.compute_dtype)
    if not return_stats:
        return out
    stats = TileStats()  # counted on the host from the positions alone (a graph break under torch.compile)
    for b in _batch_rows(q, q_positions, k_positions):
        for _ in _tiles(_row(q_positions, b), _row(k_positions, b), options, stats):
            pass
    return out, stats


def _batch_rows(q, q_positions, k_positions):
    """The batch rows whose tiles differ: every row where some positions are per row, else one (the
    shared positions give every row the same tiles)."""
    return range(q.shape[0]) if 2 in (q_positions.dim(), k_positions.dim()) else range(1)


@dataclass(frozen=True)
class AttentionOptions:
    """The checked options of one call, shared by the forward and the backward."""

    layout: str
    causal: bool
    window: int | None
    leaky_scale: float | None
    scale: float
    block_size: int
    logn_length: int | None = None
    attention_factor: float = 1.0
    compute_dtype: torch.dtype = torch.float64


def _tiles(q_positions, k_positions, options: AttentionOptions, stats: TileStats | None = None):
    """Yield (i0, i1, tiles) per query block, tiles a list of (j0, j1, kind, may_mask), may_mask whether some
    key of the tile follows some query (Python-int positions: the tile bounds' differences never wrap around)."""
    m_host, n_host = q_positions.tolist(), k_positions.tolist()
    q_len, k_len, size = len(m_host), len(n_host), options.block_size
    key_blocks = [(j, min(j + size, k_len)) for j in range(0, k_len, size)]
    key_ranges = [(min(n_host[j0:j1]), max(n_host[j0:j1])) for j0, j1 in key_blocks]
    for i0 in range(0, q_len, size):
        i1 = min(i0 + size, q_len)
        m_lo, m_hi = min(m_host[i0:i1]), max(m_host[i0:i1])
        tiles = []
        for (j0, j1), (n_lo, n_hi) in zip(key_blocks, key_ranges):
            kind = _tile_kind(m_lo, m_hi, n_lo, n_hi, options.causal, options.window)
            if stats is not None:
                setattr(stats, f"tiles_{kind}", getattr(stats, f"tiles_{kind}") + 1)
            if kind != "skipped":
                tiles.append((j0, j1, kind, n_hi > m_lo))
        yield i0, i1, tiles


# --- power-of-two frames (module docstring, "Range") -----------------------------------------------------------------

_ABSENT = -(1 << 20)  # the exponent given to a maximum of 0: below every float64 exponent
_ROOM = 900  # keys (and queries, in the frame of the key gradients) are scaled below 2^_ROOM when larger


def _exponents(maxima: torch.Tensor) -> torch.Tensor:
    """int64 e with 2^(e-1) <= maxima < 2^e (frexp's exponent), ``_ABSENT`` where a maximum is 0."""
    return torch.where(maxima == 0, _ABSENT, torch.frexp(maxima).exponent.to(torch.int64))


def _exponent(x: torch.Tensor) -> int | None:
    """The exponent e of max |x| as a Python int (2^(e-1) <= max |x| < 2^e), None when x is empty or all zero."""
    if not x.numel():
        return None
    e = int(_exponents(x.detach().abs().amax().to(torch.float64)))
    return None if e == _ABSENT else e


def _pow2(e) -> list[torch.Tensor]:
    """float64 powers of two whose product is 2^e, for integer exponents e of any size (an int or an int64
    tensor): one factor per 1000 of |e|, each exact (no factor leaves float64's normal range)."""
    e = torch.as_tensor(e, dtype=torch.int64)
    factors = []
    for _ in range(-(-int(e.abs().max()) // 1000) if e.numel() else 0):
        step = e.clamp(-1000, 1000)
        factors.append(((step + 1023) << 52).view(torch.float64))
        e = e - step
    return factors


def _ldexp(y: torch.Tensor, e, factors: list[torch.Tensor] | None = None) -> torch.Tensor:
    """y 2^e (``factors``: ``_pow2(e)``, shaped to broadcast with y), rounded once (at most twice in the subnormal
    range): ±inf where y 2^e is beyond float64's range, and 0 and ±inf stay as they are (never 0 * inf)."""
    for f in _pow2(e) if factors is None else factors:
        y = y * f.to(y.device)
    return y


@dataclass(frozen=True)
class _Frames:
    """The power-of-two frames of one call. A query row's turned rotary coordinates are multiplied by a^2 =
    ``factor_mantissa`` 2^``factor_exponent``, and its whole vector by 2^-G (``rows``, per row: largest
    coordinate below ~1.5); keys by 2^-K (``keys``: K > 0 only where max |k| >= 2^_ROOM). So the logit in
    the frames is L' = L 2^-(G + K), at most 2 head_dim 2^_ROOM in magnitude, and the scaled logit is
    x = s c L = ``M`` 2^``F`` L' with s = ms 2^es, M = ms c (c the log-n factor, below 64) and
    F = es + K + G: every gap M (L' - max L') is finite and 2^F is applied last."""

    rot: torch.Tensor  # [batch, q_len, heads_q] exponent of each row's largest rotary coordinate (_ABSENT if 0)
    rows: torch.Tensor  # G [batch, q_len, heads_q]
    keys: int  # K
    factor_mantissa: float  # ma^2, a = ma 2^ea
    factor_exponent: int  # 2 ea
    scale_mantissa: float  # ms
    scale_exponent: int  # es


def _frames(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, options: AttentionOptions) -> _Frames:
    """The frames of a call (:class:`_Frames`), read from q, k and the options."""
    rotary_dim, x = 2 * inv_freq.shape[0], q.detach().to(torch.float64).abs()
    absent = torch.full(q.shape[:3], _ABSENT, dtype=torch.int64, device=q.device)
    rot = _exponents(x[..., :rotary_dim].amax(-1)) if rotary_dim and x.numel() else absent
    tail = _exponents(x[..., rotary_dim:].amax(-1)) if rotary_dim < q.shape[3] and x.numel() else absent
    factor_mantissa, factor_exponent = math.frexp(options.attention_factor)
    rows = torch.maximum(torch.where(rot == _ABSENT, _ABSENT, rot + 2 * factor_exponent), tail)
    scale_mantissa, scale_exponent = math.frexp(options.scale)
    return _Frames(rot, torch.where(rows == _ABSENT, 0, rows), max(0, (_exponent(k) or 0) - _ROOM),
                   factor_mantissa**2, 2 * factor_exponent, scale_mantissa, scale_exponent)


class _QueryBlock:
    """One query block in the frames: its turned rows (plain and bent, each on first need), and the factors
    M and 2^F of its rows' scaled logits."""

    def __init__(self, q, m, i0, i1, inv_freq, options: AttentionOptions, frames: _Frames):
        self.q, self.m, self.inv_freq, self.options, self.frames = q[:, i0:i1], m, inv_freq, options, frames
        self.rot, self.rows = frames.rot[:, i0:i1], frames.rows[:, i0:i1]
        self.turned, self.common = [None, None], [None, None]
        mantissa = frames.scale_mantissa
        if options.logn_length is not None:
            mantissa = mantissa * logn_factors(m, options.logn_length)  # [i]: c < 64
        self.mantissa = torch.as_tensor(mantissa, dtype=torch.float64, device=q.device)
        exponent = frames.scale_exponent + frames.keys + self.rows.transpose(1, 2)  # F [batch, heads_q, i]
        self.factors = _pow2(exponent)

    def frame(self, f: int) -> torch.Tensor:
        """The block's queries in the frames, [batch, i, heads_q, d] float64: turned (plain f = 0, bent f = 1),
        the rotary coordinates times a^2, each row times 2^-G."""
        if self.turned[f] is None:
            rotary_dim, frames = 2 * self.inv_freq.shape[0], self.frames
            rot = torch.where(self.rot == _ABSENT, 0, self.rot)[..., None]
            x = self.q.to(torch.float64).clone()
            x[..., :rotary_dim] = _ldexp(x[..., :rotary_dim], -rot)  # below 1 before the rotation
            x = _rotated(x, self.m, self.inv_freq, self.options, bent=f == 1, query=True)
            x[..., :rotary_dim] = _ldexp(x[..., :rotary_dim] * frames.factor_mantissa,
                                         rot + frames.factor_exponent - self.rows[..., None])
            x[..., rotary_dim:] = _ldexp(x[..., rotary_dim:], -self.rows[..., None])
            self.turned[f] = x
        return self.turned[f]

    def common_frame(self, f: int, exponent: int) -> torch.Tensor:
        """The block's queries as :meth:`frame`, every row times 2^(G - exponent) instead of 2^-G: one frame
        shared by all rows, for the key gradients (a sum over rows)."""
        if self.common[f] is None:
            self.common[f] = _ldexp(self.frame(f), (self.rows - exponent)[..., None])
        return self.common[f]

    def scaled(self, y: torch.Tensor) -> torch.Tensor:
        """M 2^F y for y in the frames, per row: ``[batch, heads_q, i]`` or a tile ``[batch, heads_q, i, j]``."""
        tile = y.dim() == 4
        mantissa = self.mantissa[:, None] if tile and self.mantissa.dim() else self.mantissa
        return _ldexp(mantissa * y, None, [f[..., None] for f in self.factors] if tile else self.factors)


def _key_frames(k_block, n, inv_freq, kind, options: AttentionOptions, frames: _Frames):
    """(plain, bent) turned copies of a key block times 2^-K, float64, each None where the tile kind needs none."""
    k_block = _ldexp(k_block.to(torch.float64), -frames.keys)
    plain = _rotated(k_block, n, inv_freq, options, False, False) if kind in ("plain", "both") else None
    bent = _rotated(k_block, n, inv_freq, options, True, False) if kind in ("bent", "both") else None
    return plain, bent


def _tile_logits(block: _QueryBlock, k_rot, n, kind, may_mask, options: AttentionOptions):
    """The logits of one tile in the frames, L' = L 2^-(G + K) ([batch, heads_q, i, j], -inf where masked), and
    the bent mask (True where the pair takes pass 2; None for a plain or bent tile)."""
    k_plain, k_bent = k_rot
    bent_mask = None
    if kind in ("plain", "both"):
        logits = head_logits(block.frame(0), k_plain)
    if kind in ("bent", "both"):
        bent = head_logits(block.frame(1), k_bent)
        if kind == "bent":
            logits = bent
        else:
            bent_mask = ~below_window(block.m, n, options.window)  # exact: int64 m - n would wrap around
            logits = torch.where(bent_mask, bent, logits)
    if options.causal and may_mask:  # some key of the tile may follow some query
        logits = logits.masked_fill(n[None, :] > block.m[:, None], -math.inf)
    return logits, bent_mask


def _online_softmax(block: _QueryBlock, tiles, k, k_positions, inv_freq, options, frames, values=None):
    """The online softmax of one query block over its tiles, the row maximum taken in the frames (before the
    scale): (run_max, the maximum of L' per row; run_sum, sum_j exp(x_j - max x); acc, sum_j exp(x_j - max x)
    v_j, with ``values`` [batch, k_len, heads_q, v_dim] float64, else None). A gap x_j - max x = M 2^F (L'_j -
    max L') is 0 where L'_j is the maximum, whatever the scale, and -inf where masked: never inf - inf or 0 * inf."""
    run_max = torch.full(block.rows.transpose(1, 2).shape, -math.inf, dtype=torch.float64, device=k.device)
    run_sum, acc = torch.zeros_like(run_max), None
    if values is not None:
        acc = torch.zeros(*run_max.shape, values.shape[3], dtype=torch.float64, device=k.device)
    for j0, j1, kind, may_mask in tiles:
        n = k_positions[j0:j1]
        logits, _ = _tile_logits(block, _key_frames(k[:, j0:j1], n, inv_freq, kind, options, frames), n, kind,
                                 may_mask, options)
        new_max = torch.maximum(run_max, logits.amax(dim=-1))
        shift = torch.where(new_max == -math.inf, 0.0, new_max)  # rows that have seen only masked keys
        p = torch.exp(block.scaled(logits - shift[..., None]))
        rescale = torch.exp(block.scaled(run_max - shift))
        run_sum = rescale * run_sum + p.sum(dim=-1)
        if values is not None:
            group = block.q.shape[2] // values.shape[2]
            acc = rescale[..., None] * acc + torch.einsum("bhij,bjhd->bhid", p,
                                                          values[:, j0:j1].repeat_interleave(group, dim=2))
        run_max = new_max
    return run_max, run_sum, acc


def _forward(q, k, v, q_positions, k_positions, inv_freq, options: AttentionOptions, stats: TileStats):
    """The blockwise loop: the float64 output [batch, q_len, heads_q, v_dim] and the row logsumexp
    LSE = max x + log(run_sum), [batch, heads_q, q_len]."""
    batch, q_len, heads_q, _ = q.shape
    out = torch.empty(batch, q_len, heads_q, v.shape[3], dtype=torch.float64, device=q.device)
    lse = torch.empty(batch, heads_q, q_len, dtype=torch.float64, device=q.device)
    q_positions, k_positions = q_positions.to(torch.int64), k_positions.to(torch.int64)  # no narrow m - n
    frames = _frames(q, k, inv_freq, options)
    # values times 2^-V (V > 0 only near float64's range) so that a sum of k_len of them stays finite
    value_exponent = max(0, (_exponent(v) or 0) + max(k.shape[1], 1).bit_length() + 1 - 1023)
    values = _ldexp(v.to(torch.float64), -value_exponent)
    for i0, i1, tiles in _tiles(q_positions, k_positions, options, stats):
        block = _QueryBlock(q, q_positions[i0:i1], i0, i1, inv_freq, options, frames)
        run_max, run_sum, acc = _online_softmax(block, tiles, k, k_positions, inv_freq, options, frames, values)
        out[:, i0:i1] = _ldexp(acc / run_sum[..., None], value_exponent).transpose(1, 2)
        lse[..., i0:i1] = block.scaled(run_max) + torch.log(run_sum)
    return out, lse


def _float32_plan(q, k, v, q_positions, options: AttentionOptions) -> blockwise_float32.Plan:
    """The float32 path's range test and factors for one call (:class:`.blockwise_float32.Plan`)."""
    row_scale = None
    if options.logn_length is not None:
        row_scale = logn_factors(q_positions.to(torch.int64), options.logn_length)
    return blockwise_float32.Plan(q, k, v, options, row_scale)


def _forward_in(q, k, v, q_positions, k_positions, inv_freq, options: AttentionOptions):
    """(out, lse) in ``options.compute_dtype``: the float64 loop, or the float32 one where the call fits its range
    (else the float64 result rounded to float32)."""
    if options.compute_dtype == torch.float64:
        return _forward(q, k, v, q_positions, k_positions, inv_freq, options, None)
    plan = _float32_plan(q, k, v, q_positions, options)
    if not plan.fits:
        return tuple(t.to(torch.float32) for t in _forward(q, k, v, q_positions, k_positions, inv_freq, options, None))
    tiles = list(_tiles(q_positions.to(torch.int64), k_positions.to(torch.int64), options))
    return blockwise_float32.forward(q, k, v, q_positions, k_positions, inv_freq, options, tiles, plan)


def _backward_in(q, k, v, q_positions, k_positions, inv_freq, options: AttentionOptions, out, lse, grad_out,
                 grad_lse):
    """(dq, dk, dv) in ``options.compute_dtype``'s arithmetic: float64, or float32 where the call fits the float32
    path's range (else the float64 forward recomputed and differentiated in float64)."""
    if options.compute_dtype == torch.float64:
        return _backward(q, k, v, q_positions, k_positions, inv_freq, options, out, lse, grad_out, grad_lse)
    plan = _float32_plan(q, k, v, q_positions, options)
    if plan.fits_backward(q.shape[1], grad_out, grad_lse, lse):
        tiles = list(_tiles(q_positions.to(torch.int64), k_positions.to(torch.int64), options))
        return blockwise_float32.backward(q, k, v, q_positions, k_positions, inv_freq, options, tiles, plan, out, lse,
                                          grad_out, grad_lse)
    out, lse = _forward(q, k, v, q_positions, k_positions, inv_freq, options, None)
    return _backward(q, k, v, q_positions, k_positions, inv_freq, options, out, lse, grad_out.to(torch.float64),
                     grad_lse.to(torch.float64))


def _group_sum(g, group):
    """[batch, seq, heads_q, dim] -> [batch, seq, heads_k, dim]: sum over the query heads of each key head."""
    return g.unflatten(2, (g.shape[2] // group, group)).sum(dim=3)


def _backward(q, k, v, q_positions, k_positions, inv_freq, options: AttentionOptions, out, lse, grad_out, grad_lse):
    """FlashAttention-2 backward (module docstring): float64 dq, dk, dv, the tiles recomputed one at a time, in
    the frames. ``grad_lse`` (the gradient of LSE, d LSE_i / d x_ij = P_ij) enters as ``D_i - grad_lse_i``."""
    group = q.shape[2] // k.shape[2]
    q_positions, k_positions = q_positions.to(torch.int64), k_positions.to(torch.int64)
    frames = _frames(q, k, inv_freq, options)
    # dS = 2^E dS'' with v'' = v 2^-ev, dO'' = dO 2^(ev - E) and grad_lse'' = grad_lse 2^-E all at most 1
    ev, eo, eg = _exponent(v), _exponent(grad_out), _exponent(grad_lse)
    e_ds = max([e for e in (None if None in (ev, eo) else ev + eo, eg) if e is not None], default=0)
    ev = ev or 0
    values = _ldexp(v.to(torch.float64), -ev)
    grad_out = _ldexp(grad_out.to(torch.float64), ev - e_ds)
    delta_all = (grad_out * _ldexp(out, -ev)).sum(dim=-1).transpose(1, 2) - _ldexp(grad_lse.to(torch.float64), -e_ds)
    common = max(0, int(frames.rows.max()) - _ROOM) if frames.rows.numel() else 0  # the key gradients' query frame
    n_frames = 2 if options.window is not None else 1  # the gradients in the plain and the bent turned frames
    dq_rot = [torch.zeros(q.shape, dtype=torch.float64, device=q.device) for _ in range(n_frames)]
    dk_rot = [torch.zeros(k.shape, dtype=torch.float64, device=q.device) for _ in range(n_frames)]
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    for i0, i1, tiles in _tiles(q_positions, k_positions, options):
        block = _QueryBlock(q, q_positions[i0:i1], i0, i1, inv_freq, options, frames)
        d_out = grad_out[:, i0:i1].transpose(1, 2)  # dO'', [batch, heads_q, i, v_dim]
        delta = delta_all[..., i0:i1]  # (D - grad_lse) 2^-E, [batch, heads_q, i]
        row_lse = lse[..., i0:i1]
        lost = ~torch.isfinite(row_lse)
        if lost.any():  # an LSE beyond float64's range: that row's maximum and sum again, in the frames
            run_max, run_sum, _ = _online_softmax(block, tiles, k, k_positions, inv_freq, options, frames)
            log_sum = torch.log(run_sum)
        for j0, j1, kind, may_mask in tiles:
            n = k_positions[j0:j1]
            k_rot = _key_frames(k[:, j0:j1], n, inv_freq, kind, options, frames)
            logits, bent_mask = _tile_logits(block, k_rot, n, kind, may_mask, options)
            p = torch.exp(block.scaled(logits) - row_lse[..., None])  # masked entries: exp(-inf) = 0
            if lost.any():
                p = torch.where(lost[..., None], torch.exp(block.scaled(logits - run_max[..., None]) -
                                                           log_sum[..., None]), p)
            dv[:, j0:j1] += _group_sum(torch.einsum("bhij,bhid->bjhd", p, d_out), group)
            d_p = torch.einsum("bhid,bjhd->bhij", d_out, values[:, j0:j1].repeat_interleave(group, dim=2))
            d_logits = p * (d_p - delta[..., None])  # dS'' = dS 2^-E
            d_logits = d_logits * (block.mantissa[:, None] if block.mantissa.dim() else block.mantissa)  # M dS''
            parts = {"plain": [d_logits, None], "bent": [None, d_logits]}.get(kind)
            if parts is None:  # both: split by the window mask
                parts = [d_logits.masked_fill(bent_mask, 0.0), d_logits.masked_fill(~bent_mask, 0.0)]
            for f, d_part in enumerate(parts):
                if d_part is None:
                    continue
                k_f = k_rot[f].repeat_interleave(group, dim=2)
                dq_rot[f][:, i0:i1] += torch.einsum("bhij,bjhd->bihd", d_part, k_f)
                q_f = block.common_frame(f, common)
                dk_rot[f][:, j0:j1] += _group_sum(torch.einsum("bhij,bihd->bjhd", d_part, q_f), group)
    # dq = s c a^2 R^T sum_j dS k_rot (rotary part; the tail without a^2), dk = R^T sum_i s c dS (a^2-scaled q_rot)
    rotary_dim, exponent = 2 * inv_freq.shape[0], frames.scale_exponent + e_ds
    dq = _unrotated(dq_rot, q_positions, inv_freq, options, query=True)
    dq[..., :rotary_dim] = _ldexp(dq[..., :rotary_dim] * frames.factor_mantissa,
                                  exponent + frames.keys + frames.factor_exponent)
    dq[..., rotary_dim:] = _ldexp(dq[..., rotary_dim:], exponent + frames.keys)
    dk = _ldexp(_unrotated(dk_rot, k_positions, inv_freq, options, query=False), exponent + common)
    return dq, dk, _ldexp(dv, e_ds - ev)


def _unrotated(frames, positions, inv_freq, options: AttentionOptions, query: bool):
    """The sum over the (plain, bent) frames of R^T g, block by block (the angles' workspace stays per block)."""
    grad = torch.empty_like(frames[0])
    for t0 in range(0, grad.shape[1], options.block_size):
        t1, p = t0 + options.block_size, positions[t0 : t0 + options.block_size]
        grad[:, t0:t1] = sum(_rotated(g[:, t0:t1], p, inv_freq, options, bent=f == 1, query=query, conjugate=True)
                             for f, g in enumerate(frames))
    return grad


# --- the operators ---------------------------------------------------------------------------------------------------
# As rope.kernels.operators: the flags are declared Scalar (Number), not bool, so that the dispatcher passes 0, 2 or
# None through unchanged and _checks.flag refuses them; window, leaky_scale, softmax_scale and block_size are
# Scalar too (optional where None means something), so that 2.0 or True reach _checks.integer / _checks.number and
# get the package's TypeError instead of a silent conversion. Metadata is checked in the real and the fake
# implementations alike; the values (finite inv_freq, a key for every query: the positions are read on the host)
# only in the real one, which the compiler treats as opaque.


@torch.library.custom_op("rope::blockwise_attention", mutates_args=())
def blockwise_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: str = "half",
    causal: Number = True,
    window: Number | None = None,
    leaky_scale: Number | None = None,
    softmax_scale: Number | None = None,
    block_size: Number = 128,
    logn_length: Number | None = None,
    attention_factor: Number = 1.0,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): the output ``[batch, q_len, heads_q, v_dim]`` of :func:`rotary_attention` and the row
    logsumexp of the scaled, masked logits ``[batch, heads_q, q_len]`` (±inf where it is beyond the range of
    its dtype), both in ``compute_dtype`` (None: float64 for float64 inputs, float32 otherwise).
    Differentiable in q, k and v (and through lse): the backward is :func:`blockwise_attention_backward`.

    Raises:
        TypeError, ValueError: for any bad argument, naming it (as :func:`rotary_attention`).
    """
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor, compute_dtype)
    _check_values(q_positions, k_positions, inv_freq, causal, options.logn_length)
    with torch.no_grad():
        if q_positions.dim() == k_positions.dim() == 1:
            return _forward_in(q, k, v, q_positions, k_positions, inv_freq, options)
        rows = [_forward_in(q[b:b + 1], k[b:b + 1], v[b:b + 1], _row(q_positions, b), _row(k_positions, b), inv_freq,
                            options) for b in range(q.shape[0])]
        return _stacked(rows, q.new_empty(0, q.shape[1], q.shape[2], v.shape[3], dtype=options.compute_dtype),
                        q.new_empty(0, q.shape[2], q.shape[1], dtype=options.compute_dtype))


@blockwise_attention.register_fake
def _(q, k, v, q_positions, k_positions, inv_freq, layout="half", causal=True, window=None, leaky_scale=None,
      softmax_scale=None, block_size=128, logn_length=None, attention_factor=1.0, compute_dtype=None):
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor, compute_dtype)
    batch, q_len, heads_q, _ = q.shape
    return (q.new_empty(batch, q_len, heads_q, v.shape[3], dtype=options.compute_dtype),
            q.new_empty(batch, heads_q, q_len, dtype=options.compute_dtype))


def _check_saved(q, v, out, lse, grad_out, grad_lse, dtype: torch.dtype) -> None:
    """The forward's outputs and their gradients: of the compute dtype, of the forward's shapes, on q's device."""
    batch, q_len, heads_q, _ = q.shape
    shapes = dict(out=(batch, q_len, heads_q, v.shape[3]), lse=(batch, heads_q, q_len))
    for name, t in dict(out=out, lse=lse, grad_out=grad_out, grad_lse=grad_lse).items():
        _checks.float_tensor(name, t, dtypes=(dtype,))
        expected = shapes[name.removeprefix("grad_")]
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must have shape {list(expected)}, got {list(t.shape)}")
    _checks.same_device("q", q, out=out, lse=lse, grad_out=grad_out, grad_lse=grad_lse)


@torch.library.custom_op("rope::blockwise_attention_backward", mutates_args=())
def blockwise_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor,
    layout: str = "half",
    causal: Number = True,
    window: Number | None = None,
    leaky_scale: Number | None = None,
    softmax_scale: Number | None = None,
    block_size: Number = 128,
    logn_length: Number | None = None,
    attention_factor: Number = 1.0,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in the dtypes of q, k and v: the FlashAttention-2 backward of :func:`blockwise_attention`
    (module docstring) for its saved ``out``, ``lse`` (an LSE of ±inf included: those rows are recomputed)
    and the incoming ``grad_out``, ``grad_lse``, all four in the forward's compute dtype, computed in it
    (the float32 path's range is :mod:`.blockwise_float32`'s: beyond it the float64 forward is recomputed
    and differentiated in float64). Finite inputs give finite gradients, or ±inf beyond the range of their
    dtype, never NaN."""
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor, compute_dtype)
    _check_saved(q, v, out, lse, grad_out, grad_lse, options.compute_dtype)
    with torch.no_grad():
        if q_positions.dim() == k_positions.dim() == 1:
            grads = _backward_in(q, k, v, q_positions, k_positions, inv_freq, options, out, lse, grad_out, grad_lse)
        else:  # row by row: each batch row has its own tiles
            rows = [_backward_in(q[b:b + 1], k[b:b + 1], v[b:b + 1], _row(q_positions, b), _row(k_positions, b),
                                 inv_freq, options, out[b:b + 1], lse[b:b + 1], grad_out[b:b + 1],
                                 grad_lse[b:b + 1]) for b in range(q.shape[0])]
            grads = _stacked(rows, *(torch.zeros_like(t) for t in (q, k, v)))
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


def _stacked(rows: list[tuple], *empty: torch.Tensor) -> tuple:
    """The per-row results (tuples of tensors with a batch dimension of 1) joined along the batch;
    ``empty`` (the results of a batch of 0) when there is no row."""
    return tuple(torch.cat(parts) for parts in zip(*rows)) if rows else empty


@blockwise_attention_backward.register_fake
def _(q, k, v, q_positions, k_positions, inv_freq, out, lse, grad_out, grad_lse, layout="half", causal=True,
      window=None, leaky_scale=None, softmax_scale=None, block_size=128, logn_length=None, attention_factor=1.0,
      compute_dtype=None):
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor, compute_dtype)
    _check_saved(q, v, out, lse, grad_out, grad_lse, options.compute_dtype)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def setup_context(ctx, inputs, output):
    """What an attention operator ``(q, k, v, q_positions, k_positions, inv_freq, *options) -> (out,
    lse)`` saves for its backward: the tensors, the outputs and the options (defaults included)."""
    q, k, v, q_positions, k_positions, inv_freq, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, q_positions, k_positions, inv_freq, out, lse)
    ctx.options = options


def backward_formula(backward_operator):
    """The autograd formula of such an operator, given its backward operator ``(q, k, v, q_positions,
    k_positions, inv_freq, out, lse, grad_out, grad_lse, *options) -> (dq, dk, dv)``: a missing
    gradient of out or lse is zero, and only q, k and v get gradients."""

    def formula(ctx, grad_out, grad_lse):
        q, k, v, q_positions, k_positions, inv_freq, out, lse = ctx.saved_tensors
        grad_out = torch.zeros_like(out) if grad_out is None else grad_out.contiguous()
        grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse
        grads = backward_operator(q, k, v, q_positions, k_positions, inv_freq, out, lse, grad_out, grad_lse,
                                  *ctx.options)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)),
                *[None] * (3 + len(ctx.options)))

    return formula


blockwise_attention.register_autograd(backward_formula(blockwise_attention_backward), setup_context=setup_context)
