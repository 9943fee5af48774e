"""Blockwise RoPE / ReRoPE attention: softmax(s L + mask) V without ever forming the q_len x k_len matrix.

:func:`rotary_attention` is a float64 *reference* (exact, not fast) of what a FlashAttention-style
kernel for RoPE, ReRoPE and Leaky ReRoPE computes. Queries and keys are cut into blocks of
``block_size`` tokens; each (query block, key block) tile is rotated on the fly, its logits formed,
and folded into the output with the online softmax, so the memory is O(block_size^2) logits per
batch and head plus the output, whatever the sequence lengths.

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
extreme query with the extreme key). Hence:

* causal and n_lo > m_hi: every key follows every query, the tile is masked out: *skipped*;
* no window, or m_hi - n_lo < w: every pair has r < w: pass 1 only (*plain*);
* m_lo - n_hi >= w: every pair has r >= w: pass 2 only (*bent*);
* otherwise the boundary r = w crosses the tile: both passes, selected pair by pair (*both*).

Keys after their query (r < 0 < w) take pass 1, as in :mod:`.rerope`; the causal mask removes
them. With contiguous positions a *both* tile holds pairs at r = w - 1 and r = w, and at most two
key blocks per query block are *both* tiles: the rest of the work is a single pass, as for RoPE.
``return_stats=True`` returns the counts as :class:`TileStats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import _checks
from ..layouts import check_layout
from .rerope import _check_window, _logits, _rotated, check_qk


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


def _bent(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, layout: str, window: int,
          leaky_scale: float | None, query: bool) -> torch.Tensor:
    """The pass-2 rotation of a query or key block, float64 (as :func:`.rerope.rerope_scores_two_pass`)."""
    if leaky_scale is None:  # ReRoPE: queries at w, keys at 0
        return _rotated(x, torch.full_like(positions, window if query else 0), inv_freq, layout)
    shift = window * (leaky_scale - 1) if query else 0.0
    return _rotated(x, positions.to(torch.float64) + shift, inv_freq.to(torch.float64) / leaky_scale, layout)


def _check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                     softmax_scale, block_size, return_stats):
    """Validate every argument; return (scale, window, leaky_scale, block_size)."""
    check_qk(q, k, q_positions, k_positions, inv_freq)
    _checks.head_tensors(v=v)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} must match k {tuple(k.shape)} in batch, seq and heads")
    _checks.same_device("q", q, v=v)
    check_layout(layout)
    _checks.flag("causal", causal)
    _checks.flag("return_stats", return_stats)
    if window is not None:
        window, leaky_scale = _check_window(window, leaky_scale)
    elif leaky_scale is not None:
        raise ValueError(f"leaky_scale = {leaky_scale!r} needs a window (it bends the positions beyond it)")
    if softmax_scale is None:
        scale = 1 / math.sqrt(q.shape[3])
    else:
        scale = _checks.number("softmax_scale", softmax_scale, positive=True)
    block_size = _checks.integer("block_size", block_size, minimum=1)
    return scale, window, leaky_scale, block_size


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
    block_size: int = 128, return_stats: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, TileStats]:
    """Attention ``softmax(s L + mask) V`` with RoPE, ReRoPE or Leaky ReRoPE logits L, block by block, in float64.

    Shapes::

        q            [batch, q_len, heads_q, d]         float16/bfloat16/float32/float64
        k            [batch, k_len, heads_k, d]         heads_q a multiple of heads_k
        v            [batch, k_len, heads_k, v_dim]     v_dim may differ from d
        q_positions  [q_len]                            integers: any order, gaps, offsets
        k_positions  [k_len]
        inv_freq     [rotary_dim / 2]                   float32/float64, rotary_dim <= d
        returns      [batch, q_len, heads_q, v_dim]     float64

    L is the plain RoPE logit (``window=None``), ReRoPE's (``window=w``) or Leaky ReRoPE's
    (``window=w, leaky_scale=k``) exactly as :func:`.rerope.rerope_scores_two_pass` defines it,
    with the exactly reduced angles of :func:`.rerope._rotated`. ``s`` is ``softmax_scale``, by
    default ``1 / sqrt(d)``. ``causal`` masks every key whose position exceeds the query's.
    The output is float64 whatever the inputs' dtype: the inputs are taken exactly as given and
    every operation is float64, which makes this a reference for kernels, not a fast path.

    Memory: at most a ``block_size x block_size`` tile of logits per batch and head exists at a
    time (see the module docstring for the online softmax and the tile rule); ``return_stats=True``
    also returns the :class:`TileStats` of the tiles computed.

    A query row with no key to attend to (no keys at all, or ``causal`` with a query position
    below every key position) raises ``ValueError``, where ``torch.nn.functional.
    scaled_dot_product_attention`` would return NaN. ``q_len = 0`` returns an empty output.
    """
    scale, window, leaky_scale, block_size = _check_arguments(
        q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale, softmax_scale, block_size,
        return_stats)
    m_host, n_host = q_positions.tolist(), k_positions.tolist()
    _check_every_query_sees_a_key(m_host, n_host, causal)
    batch, q_len, heads_q, _ = q.shape
    k_len, group = k.shape[1], heads_q // k.shape[2]
    out = torch.empty(batch, q_len, heads_q, v.shape[3], dtype=torch.float64, device=q.device)
    stats = TileStats()
    q_positions, k_positions = q_positions.to(torch.int64), k_positions.to(torch.int64)  # no narrow m - n
    key_blocks = [(j, min(j + block_size, k_len)) for j in range(0, k_len, block_size)]
    key_ranges = [(min(n_host[j0:j1]), max(n_host[j0:j1])) for j0, j1 in key_blocks]
    for i0 in range(0, q_len, block_size):
        i1 = min(i0 + block_size, q_len)
        m = q_positions[i0:i1]
        m_lo, m_hi = min(m_host[i0:i1]), max(m_host[i0:i1])
        q_plain = q_bent = None
        run_max = torch.full((batch, heads_q, i1 - i0), -math.inf, dtype=torch.float64, device=q.device)
        run_sum = torch.zeros_like(run_max)
        acc = torch.zeros(batch, heads_q, i1 - i0, v.shape[3], dtype=torch.float64, device=q.device)
        for (j0, j1), (n_lo, n_hi) in zip(key_blocks, key_ranges):
            kind = _tile_kind(m_lo, m_hi, n_lo, n_hi, causal, window)
            setattr(stats, f"tiles_{kind}", getattr(stats, f"tiles_{kind}") + 1)
            if kind == "skipped":
                continue
            n = k_positions[j0:j1]
            if kind in ("plain", "both"):
                q_plain = _rotated(q[:, i0:i1], m, inv_freq, layout) if q_plain is None else q_plain
                logits = _logits(q_plain, _rotated(k[:, j0:j1], n, inv_freq, layout))
            if kind in ("bent", "both"):
                if q_bent is None:
                    q_bent = _bent(q[:, i0:i1], m, inv_freq, layout, window, leaky_scale, query=True)
                bent = _logits(q_bent, _bent(k[:, j0:j1], n, inv_freq, layout, window, leaky_scale, query=False))
                logits = bent if kind == "bent" else torch.where(m[:, None] - n[None, :] < window, logits, bent)
            x = logits * scale
            if causal and n_hi > m_lo:  # some key of the tile may follow some query
                x = x.masked_fill(n[None, :] > m[:, None], -math.inf)
            new_max = torch.maximum(run_max, x.amax(dim=-1))
            shift = torch.where(new_max == -math.inf, 0.0, new_max)  # rows that have seen only masked keys
            p = torch.exp(x - shift[..., None])
            rescale = torch.exp(run_max - shift)
            values = v[:, j0:j1].to(torch.float64).repeat_interleave(group, dim=2)
            run_sum = rescale * run_sum + p.sum(dim=-1)
            acc = rescale[..., None] * acc + torch.einsum("bhij,bjhd->bhid", p, values)
            run_max = new_max
        out[:, i0:i1] = (acc / run_sum[..., None]).transpose(1, 2)
    return (out, stats) if return_stats else out
