"""Blockwise RoPE / ReRoPE attention: softmax(s L + mask) V without ever forming the q_len x k_len matrix.

:func:`rotary_attention` is a float64 *reference* (exact, not fast) of what a FlashAttention-style
kernel for RoPE, ReRoPE and Leaky ReRoPE computes (:mod:`rope.kernels.triton_attention` is one).
Queries and keys are cut into blocks of ``block_size`` tokens; each (query block, key block) tile
is rotated on the fly, its logits formed, and folded into the output with the online softmax, so
the memory is O(block_size^2) logits per batch and head plus the output, whatever the sequence
lengths.

Online softmax (Milakov and Gimelshein, "Online normalizer calculation for softmax", 2018; Dao et
al., "FlashAttention: fast and memory-efficient exact attention with IO-awareness", NeurIPS 2022).
For one query row with key blocks B_1 .. B_T, scaled and masked logits x_j = s L_j (-inf where
masked) and values v_j, start from m = -inf, l = 0, a = 0 and for t = 1 .. T::

    m_t = max(m_{t-1}, max_{j in B_t} x_j)
    l_t = exp(m_{t-1} - m_t) l_{t-1} + sum_{j in B_t} exp(x_j - m_t)
    a_t = exp(m_{t-1} - m_t) a_{t-1} + sum_{j in B_t} exp(x_j - m_t) v_j

then ``a_T / l_T = sum_j softmax(x)_j v_j``. While a row has seen only masked keys, m = -inf and
its rescale factor is taken as 0 (not exp(-inf + inf) = NaN).

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
from ..layouts import check_layout
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


def _turn(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, options: AttentionOptions,
          conjugate: bool = False) -> torch.Tensor:
    """a R_p x (a R_p^T x with ``conjugate``), float64: the rotation of :func:`.rerope.rotate_exactly` with
    the attention factor a on the rotated coordinates (the first rotary_dim; the tail is not scaled)."""
    turned = rotate_exactly(x, positions, inv_freq, options.layout, conjugate=conjugate)
    if options.attention_factor != 1.0:
        turned[..., : 2 * inv_freq.shape[0]] *= options.attention_factor
    return turned


def _bent(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, options: AttentionOptions,
          query: bool) -> torch.Tensor:
    """The pass-2 rotation of a query or key block, float64."""
    return _turn(x, *bent_frame(positions, inv_freq, options.window, options.leaky_scale, query), options)


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


def _check_options(head_dim, layout, causal, window, leaky_scale, softmax_scale, block_size,
                   logn_length=None, attention_factor=1.0) -> AttentionOptions:
    """The options, checked (the package's errors) and completed (the default scale 1 / sqrt(head_dim))."""
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
    return AttentionOptions(layout, causal, window, leaky_scale, scale, block_size, logn_length, attention_factor)


def check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                    softmax_scale, block_size, logn_length=None, attention_factor=1.0) -> AttentionOptions:
    """Everything but tensor values (the real and the fake implementations alike); return the options."""
    _check_tensors(q, k, v, q_positions, k_positions, inv_freq)
    return _check_options(q.shape[3], layout, causal, window, leaky_scale, softmax_scale, block_size, logn_length,
                          attention_factor)


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


def _row_scale(m: torch.Tensor, options: AttentionOptions):
    """The factor of each query row's logits: s, or with log-n scaling s max(1, ln(m + 1) / ln L), [i, 1]."""
    if options.logn_length is None:
        return options.scale
    return options.scale * logn_factors(m, options.logn_length)[:, None]


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
    attention_factor: float = 1.0,
) -> torch.Tensor | tuple[torch.Tensor, TileStats]:
    """Attention ``softmax(s L + mask) V`` with RoPE, ReRoPE or Leaky ReRoPE logits L, block by block, in float64.

    Shapes::

        q            [batch, q_len, heads_q, d]         float16/bfloat16/float32/float64
        k            [batch, k_len, heads_k, d]         heads_q a multiple of heads_k
        v            [batch, k_len, heads_k, v_dim]     v_dim may differ from d
        q_positions  [q_len] or [batch, q_len]          integers: any order, gaps, offsets
        k_positions  [k_len] or [batch, k_len]          (shared, or one row each)
        inv_freq     [rotary_dim / 2]                   float32/float64, rotary_dim <= d
        returns      [batch, q_len, heads_q, v_dim]     float64

    L is the plain RoPE logit (``window=None``), ReRoPE's (``window=w``) or Leaky ReRoPE's
    (``window=w, leaky_scale=k``) exactly as :func:`.rerope.rerope_scores_two_pass` defines it,
    with the exactly reduced angles of :func:`.rerope.rotate_exactly`. ``s`` is ``softmax_scale``, by
    default ``1 / sqrt(d)``; with ``logn_length`` L (log-n scaling, :mod:`.logn`) the logits of the
    query at position m are also multiplied by ``max(1, ln(m + 1) / ln L)`` (positions from 0).
    ``attention_factor`` a (YaRN's, :func:`rope.inv_freq`'s second value) scales the rotated
    coordinates of q and k, as transformers' cos and sin tables carry it: the rotary part of each
    logit by a^2, the unrotated tail not at all.
    ``causal`` masks every key whose position exceeds the query's. The output is float64 whatever
    the inputs' dtype: the inputs are taken exactly as given and every operation is float64, which
    makes this a reference for kernels, not a fast path.

    Memory: at most a ``block_size x block_size`` tile of logits per batch and head exists at a
    time (see the module docstring for the online softmax and the tile rule); ``return_stats=True``
    also returns the :class:`TileStats` of the tiles computed.

    The computation is the operator ``torch.ops.rope.blockwise_attention`` (:func:`blockwise_attention`,
    with a fake implementation and an autograd formula), so ``torch.compile(fullgraph=True)`` traces
    this function without a graph break, except with ``return_stats=True``: the statistics are Python
    integers counted on the host from the positions, after the operator.

    Differentiable in q, k and v: the backward recomputes the tiles (FlashAttention-2, see the
    module docstring) instead of storing them, so it too holds O(block_size^2) logits at a time,
    and returns the float64 gradients rounded once to the inputs' dtypes.

    A query row with no key to attend to (no keys at all, or ``causal`` with a query position
    below every key position) raises ``ValueError``, where ``torch.nn.functional.
    scaled_dot_product_attention`` would return NaN. ``q_len = 0`` returns an empty output.
    """
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor)
    _checks.flag("return_stats", return_stats)
    out, _ = blockwise_attention(q, k, v, q_positions, k_positions, inv_freq, layout=layout, causal=causal,
                                 window=options.window, leaky_scale=options.leaky_scale,
                                 softmax_scale=options.scale, block_size=options.block_size,
                                 logn_length=options.logn_length, attention_factor=options.attention_factor)
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


def _tile_logits(q_rot, k_rot, m, n, kind, may_mask, options: AttentionOptions):
    """Scaled, masked logits x of one tile ([batch, heads_q, i, j], -inf where masked) and the bent mask
    (True where the pair takes pass 2; None for a plain or bent tile)."""
    (q_plain, q_bent), (k_plain, k_bent) = q_rot, k_rot
    bent_mask = None
    if kind in ("plain", "both"):
        logits = head_logits(q_plain, k_plain)
    if kind in ("bent", "both"):
        bent = head_logits(q_bent, k_bent)
        if kind == "bent":
            logits = bent
        else:
            bent_mask = ~below_window(m, n, options.window)  # exact: int64 m - n would wrap around
            logits = torch.where(bent_mask, bent, logits)
    x = logits * _row_scale(m, options)
    if options.causal and may_mask:  # some key of the tile may follow some query
        x = x.masked_fill(n[None, :] > m[:, None], -math.inf)
    return x, bent_mask


def _block_rotations(x, positions, inv_freq, kind, options: AttentionOptions, query: bool):
    """(plain, bent) rotated copies of a block, float64, each None where the tile kind needs none."""
    plain = _turn(x, positions, inv_freq, options) if kind in ("plain", "both") else None
    bent = _bent(x, positions, inv_freq, options, query) if kind in ("bent", "both") else None
    return plain, bent


def _forward(q, k, v, q_positions, k_positions, inv_freq, options: AttentionOptions, stats: TileStats):
    """The blockwise loop: the float64 output [batch, q_len, heads_q, v_dim] and the row logsumexp
    LSE = run_max + log(run_sum), [batch, heads_q, q_len]."""
    batch, q_len, heads_q, _ = q.shape
    group = heads_q // k.shape[2]
    out = torch.empty(batch, q_len, heads_q, v.shape[3], dtype=torch.float64, device=q.device)
    lse = torch.empty(batch, heads_q, q_len, dtype=torch.float64, device=q.device)
    q_positions, k_positions = q_positions.to(torch.int64), k_positions.to(torch.int64)  # no narrow m - n
    for i0, i1, tiles in _tiles(q_positions, k_positions, options, stats):
        m = q_positions[i0:i1]
        q_rot = [None, None]
        run_max = torch.full((batch, heads_q, i1 - i0), -math.inf, dtype=torch.float64, device=q.device)
        run_sum = torch.zeros_like(run_max)
        acc = torch.zeros(batch, heads_q, i1 - i0, v.shape[3], dtype=torch.float64, device=q.device)
        for j0, j1, kind, may_mask in tiles:
            n = k_positions[j0:j1]
            q_rot = _query_rotations(q_rot, q[:, i0:i1], m, inv_freq, kind, options)
            k_rot = _block_rotations(k[:, j0:j1], n, inv_freq, kind, options, query=False)
            x, _ = _tile_logits(q_rot, k_rot, m, n, kind, may_mask, options)
            new_max = torch.maximum(run_max, x.amax(dim=-1))
            shift = torch.where(new_max == -math.inf, 0.0, new_max)  # rows that have seen only masked keys
            p = torch.exp(x - shift[..., None])
            rescale = torch.exp(run_max - shift)
            values = v[:, j0:j1].to(torch.float64).repeat_interleave(group, dim=2)
            run_sum = rescale * run_sum + p.sum(dim=-1)
            acc = rescale[..., None] * acc + torch.einsum("bhij,bjhd->bhid", p, values)
            run_max = new_max
        out[:, i0:i1] = (acc / run_sum[..., None]).transpose(1, 2)
        lse[..., i0:i1] = run_max + torch.log(run_sum)
    return out, lse


def _query_rotations(q_rot, q_block, m, inv_freq, kind, options: AttentionOptions):
    """The query block's (plain, bent) rotations, each computed on first need and kept for its key blocks."""
    plain, bent = q_rot
    if kind in ("plain", "both") and plain is None:
        plain = _turn(q_block, m, inv_freq, options)
    if kind in ("bent", "both") and bent is None:
        bent = _bent(q_block, m, inv_freq, options, query=True)
    return [plain, bent]


def _unrotate(g, positions, inv_freq, options: AttentionOptions, bent: bool, query: bool):
    """a R^T g for the rotation a R a (plain or bent) pass applied to these tokens: the same angles, sin
    negated, and the attention factor a."""
    if bent:
        positions, inv_freq = bent_frame(positions, inv_freq, options.window, options.leaky_scale, query)
    return _turn(g, positions, inv_freq, options, conjugate=True)


def _group_sum(g, group):
    """[batch, seq, heads_q, dim] -> [batch, seq, heads_k, dim]: sum over the query heads of each key head."""
    return g.unflatten(2, (g.shape[2] // group, group)).sum(dim=3)


def _backward(q, k, v, q_positions, k_positions, inv_freq, options: AttentionOptions, out, lse, grad_out, grad_lse):
    """FlashAttention-2 backward (module docstring): float64 dq, dk, dv, the tiles recomputed one at a time.
    ``grad_lse`` (the gradient of LSE, d LSE_i / d x_ij = P_ij) enters as ``D_i - grad_lse_i``."""
    group = q.shape[2] // k.shape[2]
    q_positions, k_positions = q_positions.to(torch.int64), k_positions.to(torch.int64)
    grad_out = grad_out.to(torch.float64)
    frames = 2 if options.window is not None else 1  # the gradients in the plain and the bent rotated frames
    dq_rot = [torch.zeros(q.shape, dtype=torch.float64, device=q.device) for _ in range(frames)]
    dk_rot = [torch.zeros(k.shape, dtype=torch.float64, device=q.device) for _ in range(frames)]
    dv = torch.zeros(v.shape, dtype=torch.float64, device=q.device)
    for i0, i1, tiles in _tiles(q_positions, k_positions, options):
        m = q_positions[i0:i1]
        q_rot = [None, None]
        d_out = grad_out[:, i0:i1].transpose(1, 2)  # [batch, heads_q, i, v_dim]
        delta = (grad_out[:, i0:i1] * out[:, i0:i1]).sum(dim=-1).transpose(1, 2)  # D, [batch, heads_q, i]
        delta = delta - grad_lse[..., i0:i1].to(torch.float64)
        for j0, j1, kind, may_mask in tiles:
            n = k_positions[j0:j1]
            q_rot = _query_rotations(q_rot, q[:, i0:i1], m, inv_freq, kind, options)
            k_rot = _block_rotations(k[:, j0:j1], n, inv_freq, kind, options, query=False)
            x, bent_mask = _tile_logits(q_rot, k_rot, m, n, kind, may_mask, options)
            p = torch.exp(x - lse[..., i0:i1, None])  # masked entries: exp(-inf) = 0
            values = v[:, j0:j1].to(torch.float64).repeat_interleave(group, dim=2)
            dv[:, j0:j1] += _group_sum(torch.einsum("bhij,bhid->bjhd", p, d_out), group)
            d_p = torch.einsum("bhid,bjhd->bhij", d_out, values)
            d_logits = p * (d_p - delta[..., None]) * _row_scale(m, options)  # dL = s dS
            parts = {"plain": [d_logits, None], "bent": [None, d_logits]}.get(kind)
            if parts is None:  # both: split by the window mask
                parts = [d_logits.masked_fill(bent_mask, 0.0), d_logits.masked_fill(~bent_mask, 0.0)]
            for f, d_part in enumerate(parts):
                if d_part is None:
                    continue
                k_f = k_rot[f].repeat_interleave(group, dim=2)
                dq_rot[f][:, i0:i1] += torch.einsum("bhij,bjhd->bihd", d_part, k_f)
                dk_rot[f][:, j0:j1] += _group_sum(torch.einsum("bhij,bihd->bjhd", d_part, q_rot[f]), group)
    return _unrotated(dq_rot, q_positions, inv_freq, options, query=True), \
        _unrotated(dk_rot, k_positions, inv_freq, options, query=False), dv


def _unrotated(frames, positions, inv_freq, options: AttentionOptions, query: bool):
    """The sum over the (plain, bent) frames of R^T g, block by block (the angles' workspace stays per block)."""
    grad = torch.empty_like(frames[0])
    for t0 in range(0, grad.shape[1], options.block_size):
        t1, p = t0 + options.block_size, positions[t0 : t0 + options.block_size]
        grad[:, t0:t1] = sum(_unrotate(g[:, t0:t1], p, inv_freq, options, f == 1, query) for f, g in enumerate(frames))
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): the float64 output ``[batch, q_len, heads_q, v_dim]`` of :func:`rotary_attention` and the
    float64 row logsumexp of the scaled, masked logits ``[batch, heads_q, q_len]``. Differentiable in q, k and
    v (and through lse): the backward is :func:`blockwise_attention_backward`.

    Raises:
        TypeError, ValueError: for any bad argument, naming it (as :func:`rotary_attention`).
    """
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor)
    _check_values(q_positions, k_positions, inv_freq, causal, options.logn_length)
    with torch.no_grad():
        if q_positions.dim() == k_positions.dim() == 1:
            return _forward(q, k, v, q_positions, k_positions, inv_freq, options, None)
        rows = [_forward(q[b:b + 1], k[b:b + 1], v[b:b + 1], _row(q_positions, b), _row(k_positions, b), inv_freq,
                         options, None) for b in range(q.shape[0])]
        return _stacked(rows, q.new_empty(0, q.shape[1], q.shape[2], v.shape[3], dtype=torch.float64),
                        q.new_empty(0, q.shape[2], q.shape[1], dtype=torch.float64))


@blockwise_attention.register_fake
def _(q, k, v, q_positions, k_positions, inv_freq, layout="half", causal=True, window=None, leaky_scale=None,
      softmax_scale=None, block_size=128, logn_length=None, attention_factor=1.0):
    check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                    softmax_scale, block_size, logn_length, attention_factor)
    batch, q_len, heads_q, _ = q.shape
    return (q.new_empty(batch, q_len, heads_q, v.shape[3], dtype=torch.float64),
            q.new_empty(batch, heads_q, q_len, dtype=torch.float64))


def _check_saved(q, v, out, lse, grad_out, grad_lse) -> None:
    """The forward's outputs and their gradients: float64, of the forward's shapes, on q's device."""
    batch, q_len, heads_q, _ = q.shape
    shapes = dict(out=(batch, q_len, heads_q, v.shape[3]), lse=(batch, heads_q, q_len))
    for name, t in dict(out=out, lse=lse, grad_out=grad_out, grad_lse=grad_lse).items():
        _checks.float_tensor(name, t, dtypes=(torch.float64,))
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in the dtypes of q, k and v: the FlashAttention-2 backward of :func:`blockwise_attention`
    (module docstring) for its saved ``out``, ``lse`` and the incoming ``grad_out``, ``grad_lse``."""
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, block_size, logn_length, attention_factor)
    _check_saved(q, v, out, lse, grad_out, grad_lse)
    with torch.no_grad():
        if q_positions.dim() == k_positions.dim() == 1:
            grads = _backward(q, k, v, q_positions, k_positions, inv_freq, options, out, lse, grad_out, grad_lse)
        else:  # row by row: each batch row has its own tiles
            rows = [_backward(q[b:b + 1], k[b:b + 1], v[b:b + 1], _row(q_positions, b), _row(k_positions, b),
                              inv_freq, options, out[b:b + 1], lse[b:b + 1], grad_out[b:b + 1], grad_lse[b:b + 1])
                    for b in range(q.shape[0])]
            grads = _stacked(rows, *(torch.zeros_like(t, dtype=torch.float64) for t in (q, k, v)))
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


def _stacked(rows: list[tuple], *empty: torch.Tensor) -> tuple:
    """The per-row results (tuples of tensors with a batch dimension of 1) joined along the batch;
    ``empty`` (the results of a batch of 0) when there is no row."""
    return tuple(torch.cat(parts) for parts in zip(*rows)) if rows else empty


@blockwise_attention_backward.register_fake
def _(q, k, v, q_positions, k_positions, inv_freq, out, lse, grad_out, grad_lse, layout="half", causal=True,
      window=None, leaky_scale=None, softmax_scale=None, block_size=128, logn_length=None, attention_factor=1.0):
    check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                    softmax_scale, block_size, logn_length, attention_factor)
    _check_saved(q, v, out, lse, grad_out, grad_lse)
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
