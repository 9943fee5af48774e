"""The float32 path of :mod:`.blockwise`: the same tiles and online softmax, as float32 BLAS matmuls.

:func:`.blockwise.rotary_attention` takes this path by default for float16, bfloat16 and float32
inputs (``compute_dtype=torch.float32``); ``compute_dtype=torch.float64`` keeps the exact float64
path, the reference this one is tested against. Like torch's own CPU attention kernels it
accumulates float16 and bfloat16 inputs in float32; its output and LSE are float32 whatever the
inputs' dtype (the caller rounds them once, if it wants), its gradients come in the dtypes of q,
k and v.

What changes against the float64 path is the arithmetic only; the tile rule, the online softmax
and the FlashAttention-2 backward are those of the module docstring of :mod:`.blockwise`:

* the angles are the same exactly reduced ones (:func:`rope.apply.exact_cos_sin`;
  :func:`rope.angles.cos_sin_of_sum` for Leaky ReRoPE's bent frame), the coordinates are turned in
  float64 and rounded to float32 once: the keys once per call (plain and bent frames), each query
  block once, each query row first multiplied, in float64, by its factor s c (s the softmax
  scale, c its log-n factor) and its rotary coordinates also by a^2. So the float32 logits
  ``x = q' . k'`` are already scaled, and the row maximum over them is the maximum of s c L (a
  positive factor keeps the order);
* a tile is one ``[heads_k, group x rows, d] x [heads_k, d, cols]`` float32 matmul (GQA's query
  heads of a key head stacked as rows: no key is copied per query head), and the softmax runs in
  place in a tile buffer reused by every tile: ``x - max x`` and ``exp`` in place, ``P V`` added
  by ``baddbmm``.

Range. The path takes a call when every float32 intermediate is finite, judged from the inputs
before the first tile, with ``A = sqrt 2 max |q| s max c max(a^2, 1)`` (a bound on the float32
queries' coordinates), ``K = sqrt 2 max |k|`` and ``V = max |v|``::

    A <= 2^120,   K <= 2^120,   d A K <= 2^120,   k_len V <= 2^120,

and the factors s a^2 and s (times c) normal float64 numbers. Then every logit and every gap
``x - max x`` is finite (at most 2^121 in magnitude), every weight at most 1 and every sum at most
``k_len V``. The backward also needs, with ``G = max |dO|`` and ``G_lse = max |grad_lse|``,
``v_dim G V``, ``|dS| <= 2 v_dim G V + G_lse``, and the sums ``dV`` (over ``q_len group`` rows),
``dS k'`` (over ``k_len`` keys) and ``dS^T q'`` (over ``q_len group`` rows) below 2^120, and a
finite LSE. A call outside this range is computed by the float64 path (its power-of-two frames:
the hard maximum under any scale) and its output and LSE rounded to float32, ±inf beyond
float32's range; its backward recomputes the float64 forward and differentiates it in float64.
So finite inputs never give NaN here either, and no float32 intermediate overflows.

Accuracy against the exact result (u = 2^-24). For query row i let q~_i be its turned query with
the rotary coordinates times a^2, ``S_i = s c_i ||q~_i|| max_j ||k_j||`` (2-norms: a turn keeps
them; j over the keys) and::

    E_i = (d + 6) u S_i + d 2^-147 (A + K),

a bound on the error of each of the row's computed scaled logits and gaps: the roundings of the
two turned operands to float32 and the d-term float32 dot product (within
``(d + 2) u sum |q' k'|``, at most ``(d + 2) u S_i`` by Cauchy-Schwarz), the gap's rounding
(``2 u S_i``), the float64 steps before (far below u), and float32's underflow of tiny
coordinates (the second term). With
B = ``block_size`` keys per tile, T the number of key tiles, ``p_ij`` the exact weights and each
coordinate of ``|v_j|``::

    |o^_i - o_i| <= (exp(2 E_i + 2 (B + 4 T + 8) u) - 1) sum_j p_ij |v_j|
                    + k_len 2^-146 V
    |LSE^_i - LSE_i| <= E_i + (B + 4 T + 10 + log2 k_len) u + 2 u |LSE_i|

Each unnormalised weight is within ``exp(E_i)`` of ``exp(x - max x)`` by its logit and within a
factor ``(1 + u)`` per rounding of the exponential (2 u), of its tile's rescalings (T of them,
3 u each) and of the sums (``B + 2 T``); the normaliser is off by as much, so each normalised
weight is within a factor ``exp(2 E_i + 2 (B + 4 T + 8) u)`` of ``p_ij``; the absolute term is
the underflow of tiny weights. The bound grows with S_i, the magnitude of the row's scaled
logits, as any float32 attention's error does: for logits of tens it is about 1e-5 of
``sum p |v|``; for logits of 10^4 it reaches percents. ``tests/test_blockwise_float32.py`` checks
both bounds on fresh random inputs against the float64 path, and the gradients against float64
autograd (no bound is proved for them: the tests hold them to a multiple of the same
``E_i + (B + 4 T) u`` relative to the largest gradient).
"""

from __future__ import annotations

import math

import torch

from ..angles import cos_sin_of_sum
from ..apply import exact_cos_sin
from ..rotation import rotate_pairs
from .rerope import below_window, bent_frame

LIMIT = 120
"""log2 of the largest magnitude a float32 intermediate may reach (float32 reaches 2^128)."""
_NORMAL = 1000  # s a^2 and s (times c) within 2^±_NORMAL: normal float64 factors, each product rounded once


def _log2_max(x: torch.Tensor) -> float:
    """log2 of max ``|x|``: -inf when x is empty or zero (inf or NaN when x holds them)."""
    if not x.numel():
        return -math.inf
    largest = float(x.detach().abs().amax())
    return math.log2(largest) if largest else -math.inf


def _log2(n: int) -> float:
    return math.log2(max(n, 1))


def _below_limit(*log2s: float) -> bool:
    return all(e <= LIMIT for e in log2s)  # NaN compares False: refused


class Plan:
    """The range test of one call (module docstring, "Range") and its float64 factors ``rotary`` = s a^2 and
    ``tail`` = s; ``row_scale`` the float64 log-n factors c of the query rows, or None."""

    def __init__(self, q, k, v, options, row_scale: torch.Tensor | None):
        log2_c = max(_log2_max(row_scale), 0.0) if row_scale is not None else 0.0
        log2_s, log2_a2 = math.log2(options.scale), 2 * math.log2(options.attention_factor)
        self.query = _log2_max(q) + 0.5 + log2_s + log2_c + max(log2_a2, 0.0)  # log2 A
        self.key = _log2_max(k) + 0.5  # log2 K
        self.value = _log2_max(v)  # log2 V
        self.k_len, self.group, self.row_scale = k.shape[1], q.shape[2] // k.shape[2], row_scale
        normal = all(-_NORMAL < e and e + log2_c < _NORMAL for e in (log2_s, log2_s + log2_a2))
        self.fits = normal and _below_limit(self.query, self.key, _log2(q.shape[3]) + self.query + self.key,
                                            self.value + _log2(self.k_len))
        mantissa_s, exponent_s = math.frexp(options.scale)
        mantissa_a, exponent_a = math.frexp(options.attention_factor)
        self.tail = options.scale
        self.rotary = math.ldexp(mantissa_s * mantissa_a * mantissa_a, exponent_s + 2 * exponent_a) if normal else 0.0

    def fits_backward(self, q_len: int, grad_out, grad_lse, lse) -> bool:
        """Whether the backward's float32 sums stay in range as well (module docstring, "Range")."""
        if not self.fits or not bool(torch.isfinite(lse).all()):
            return False
        rows, log2_g = _log2(q_len * self.group), _log2_max(grad_out)
        d_p = _log2(grad_out.shape[3]) + log2_g + self.value  # |dP| <= v_dim G V
        top = max(d_p + 1, _log2_max(grad_lse))
        d_s = top + 1 if top > -math.inf else top  # |dS| <= 2 v_dim G V + G_lse <= 2 max(...)
        return _below_limit(d_p + 1, d_s, rows + log2_g, _log2(self.k_len) + d_s + self.key,
                            rows + d_s + self.query)

    def row_factors(self, rows: slice, head_dim: int, rotary_dim: int, device) -> torch.Tensor:
        """``[rows, 1, head_dim]`` float64: s c a^2 on the rotary coordinates of each query row, s c on its tail."""
        c = (self.row_scale[rows] if self.row_scale is not None else torch.ones(1, dtype=torch.float64))[:, None]
        factors = torch.empty(c.shape[0], 1, head_dim, dtype=torch.float64, device=device)
        factors[..., :rotary_dim] = (self.rotary * c.to(device))[..., None]
        factors[..., rotary_dim:] = (self.tail * c.to(device))[..., None]
        return factors


def _angles(positions, inv_freq, options, bent: bool, query: bool):
    """float64 (cos, sin) ``[tokens, pairs]`` of the exactly reduced angles of the plain frame or, ``bent``, of
    pass 2's frame of query or key tokens (:func:`.rerope.bent_frame`), as :func:`.rerope.rotate_exactly`
    turns by them."""
    if bent:
        positions, inv_freq = bent_frame(positions, inv_freq, options.window, options.leaky_scale, query)
    if positions.dim() == 2:
        return cos_sin_of_sum(positions, inv_freq.to(positions.device))
    return exact_cos_sin(positions, inv_freq.to(positions.device))


def _turned(x, cos, sin, layout: str, rotary_dim: int) -> torch.Tensor:
    """x ``[batch, tokens, heads, d]`` turned in float64 by the angles ``[tokens, pairs]``
    (:func:`rope.rotation.rotate_pairs`: float64 in and out, nothing to round; no overflow guard, as
    the range test keeps every coordinate below 2^121)."""
    return rotate_pairs(x.to(torch.float64), cos[None, :, None], sin[None, :, None], layout, rotary_dim, safe=False)


class _Call:
    """One call's float32 operands: the angles (per frame and block of tokens, on first need), the turned keys
    ``[batch heads_k, k_len, d]``, the values ``[batch heads_k, k_len, v_dim]`` and two tile buffers reused by
    every tile."""

    def __init__(self, q, k, v, q_positions, k_positions, inv_freq, options, plan: Plan, tiles):
        self.q, self.k, self.options, self.plan = q, k, options, plan
        self.positions = {True: q_positions.to(torch.int64), False: k_positions.to(torch.int64)}
        self.inv_freq, self.rotary_dim = inv_freq, 2 * inv_freq.shape[0]
        batch, k_len, self.heads_k, self.v_dim = v.shape
        self.group = q.shape[2] // self.heads_k
        self.bh = batch * self.heads_k
        self.same_positions = q_positions.shape == k_positions.shape and torch.equal(*self.positions.values())
        self._angles, self._keys = {}, {}
        self.values = self._per_head(v, lambda x, t0, t1: x.to(torch.float32))
        rows = self.group * max((i1 - i0 for i0, i1, _ in tiles), default=0)
        cols = max((j1 - j0 for _, _, ts in tiles for j0, j1, _, _ in ts), default=0)
        # one tile buffer and a spare (pass 2's logits, dP) for the whole call: no allocation per tile
        self.buffers = [torch.empty(self.bh * rows * cols, dtype=torch.float32, device=q.device) for _ in range(2)]

    def angles(self, bent: bool, query: bool, t0: int, t1: int):
        """(cos, sin) of tokens t0..t1 of the queries or keys in a frame, computed a block at a time (the exact
        reduction's workspace stays per block) and kept for the call."""
        if not bent and not query and self.same_positions:
            query = True  # the keys' plain angles are the queries' (the same blocks: multiples of block_size)
        if (bent, query, t0, t1) not in self._angles:
            self._angles[bent, query, t0, t1] = _angles(self.positions[query][t0:t1], self.inv_freq, self.options,
                                                        bent, query)
        return self._angles[bent, query, t0, t1]

    def _per_head(self, x, convert):
        """x ``[batch, tokens, heads_k, dim]`` as float32 ``[batch heads_k, tokens, dim]``, converted by
        ``convert(chunk, t0, t1)`` a block of tokens at a time (the float64 temporaries stay per block)."""
        batch, tokens, heads, dim = x.shape
        y = torch.empty(batch, heads, tokens, dim, dtype=torch.float32, device=x.device)
        for t0 in range(0, tokens, self.options.block_size):
            t1 = min(t0 + self.options.block_size, tokens)
            y[:, :, t0:t1] = convert(x[:, t0:t1], t0, t1).transpose(1, 2)
        return y.view(batch * heads, tokens, dim)

    def keys(self, frame: int) -> torch.Tensor:
        """The keys turned in the plain (0) or bent (1) frame, float32 ``[batch heads_k, k_len, d]``."""
        if frame not in self._keys:
            self._keys[frame] = self._per_head(self.k, lambda x, t0, t1: _turned(
                x, *self.angles(frame == 1, False, t0, t1), self.options.layout, self.rotary_dim))
        return self._keys[frame]

    def queries(self, i0: int, i1: int, frame: int) -> torch.Tensor:
        """Query rows i0..i1 turned in the frame, times their factors, float32 ``[batch heads_k, group rows, d]``."""
        x = _turned(self.q[:, i0:i1], *self.angles(frame == 1, True, i0, i1), self.options.layout, self.rotary_dim)
        x *= self.plan.row_factors(slice(i0, i1), x.shape[3], self.rotary_dim, x.device)
        batch, rows, heads_q, d = x.shape
        y = torch.empty(batch, heads_q, rows, d, dtype=torch.float32, device=x.device)
        y.copy_(x.transpose(1, 2))  # the one rounding of the scaled, turned query
        return y.view(self.bh, self.group * rows, d)

    def tile(self, buffer: int, rows: int, cols: int) -> torch.Tensor:
        return self.buffers[buffer][: self.bh * self.group * rows * cols].view(self.bh, self.group * rows, cols)

    def logits(self, block: dict, i0: int, i1: int, tile) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tile's scaled logits in buffer 0 (``[batch heads_k, group rows, cols]``, -inf where masked) and
        the bent mask ``[rows, cols]`` (True where the pair takes pass 2; None for a plain or bent tile)."""
        j0, j1, kind, may_mask = tile
        rows, cols = i1 - i0, j1 - j0
        out, bent_mask = self.tile(0, rows, cols), None
        frame = 1 if kind == "bent" else 0
        torch.matmul(block[frame], self.keys(frame)[:, j0:j1].transpose(1, 2), out=out)
        m, n = self.positions[True][i0:i1], self.positions[False][j0:j1]
        by_row = out.view(self.bh, self.group, rows, cols)
        if kind == "both":
            bent = self.tile(1, rows, cols)
            torch.matmul(block[1], self.keys(1)[:, j0:j1].transpose(1, 2), out=bent)
            bent_mask = ~below_window(m, n, self.options.window)  # exact: int64 m - n would wrap around
            torch.where(bent_mask, bent.view(by_row.shape), by_row, out=by_row)
        if self.options.causal and may_mask:
            by_row.masked_fill_(n[None, :] > m[:, None], -math.inf)
        return out, bent_mask

    def block(self, i0: int, i1: int, tiles) -> dict:
        """The query block's float32 rows in each frame its tiles need (0 plain, 1 bent)."""
        frames = {f for _, _, kind, _ in tiles for f in {"plain": (0,), "bent": (1,), "both": (0, 1)}[kind]}
        return {f: self.queries(i0, i1, f) for f in sorted(frames)}

    def unblocked(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """``[batch heads_k, group rows, dim]`` -> ``[batch, rows, heads_q, dim]`` (a view)."""
        batch = self.bh // self.heads_k
        return x.view(batch, self.heads_k, self.group, rows, x.shape[-1]).permute(0, 3, 1, 2, 4).flatten(2, 3)

    def blocked(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, rows, heads_q, dim]`` -> float32 ``[batch heads_k, group rows, dim]`` (a copy)."""
        batch, rows, heads_q, dim = x.shape
        y = torch.empty(batch, heads_q, rows, dim, dtype=torch.float32, device=x.device)
        y.copy_(x.transpose(1, 2))
        return y.view(self.bh, self.group * rows, dim)


def forward(q, k, v, q_positions, k_positions, inv_freq, options, tiles: list, plan: Plan):
    """The float32 blockwise loop over ``tiles`` (:func:`.blockwise._tiles`' blocks, as a list): the float32
    output ``[batch, q_len, heads_q, v_dim]`` and LSE ``[batch, heads_q, q_len]``. The call must fit
    (``plan.fits``)."""
    call = _Call(q, k, v, q_positions, k_positions, inv_freq, options, plan, tiles)
    batch, q_len, heads_q, _ = q.shape
    out = torch.empty(batch, q_len, heads_q, call.v_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, heads_q, q_len, dtype=torch.float32, device=q.device)
    for i0, i1, block_tiles in tiles:
        block, rows = call.block(i0, i1, block_tiles), call.group * (i1 - i0)
        run_max = torch.full((call.bh, rows, 1), -math.inf, dtype=torch.float32, device=q.device)
        run_sum = torch.zeros_like(run_max)
        acc = torch.zeros(call.bh, rows, call.v_dim, dtype=torch.float32, device=q.device)
        for tile in block_tiles:
            x, _ = call.logits(block, i0, i1, tile)
            new_max = torch.maximum(run_max, x.amax(dim=-1, keepdim=True))
            # a row that has seen only masked keys keeps max -inf: shift by 0 there (never -inf - -inf)
            shift = torch.where(new_max == -math.inf, 0.0, new_max) if tile[3] else new_max
            rescale = torch.exp(run_max - shift)
            p = x.sub_(shift).exp_()  # in place: the tile buffer becomes the weights
            run_sum.mul_(rescale).add_(p.sum(dim=-1, keepdim=True))
            acc.mul_(rescale).baddbmm_(p, call.values[:, tile[0]:tile[1]])
            run_max = new_max
        out[:, i0:i1] = call.unblocked(acc.div_(run_sum), i1 - i0)
        lse[:, :, i0:i1] = (run_max + run_sum.log_()).view(batch, heads_q, i1 - i0)
    return out, lse


def backward(q, k, v, q_positions, k_positions, inv_freq, options, tiles: list, plan: Plan,
             out, lse, grad_out, grad_lse):
    """FlashAttention-2's backward (:mod:`.blockwise`) in float32 over the same tiles: (dq, dk, dv) in the dtypes
    of q, k and v. The sums over the turned frames are turned back in float64 (each frame by its own angles),
    dq multiplied by the rows' factors there. The call must fit (``plan.fits_backward``)."""
    call = _Call(q, k, v, q_positions, k_positions, inv_freq, options, plan, tiles)
    frames = sorted({f for _, _, ts in tiles for _, _, kind, _ in ts for f in {"plain": (0,), "bent": (1,),
                                                                              "both": (0, 1)}[kind]})
    k_len, d = k.shape[1], q.shape[3]
    dk = {f: torch.zeros(call.bh, k_len, d, dtype=torch.float32, device=q.device) for f in frames}
    dv = torch.zeros(call.bh, k_len, call.v_dim, dtype=torch.float32, device=q.device)
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    if not frames:  # no query row
        return dq, torch.zeros_like(k), torch.zeros_like(v)
    for i0, i1, block_tiles in tiles:
        rows = i1 - i0
        block = call.block(i0, i1, block_tiles)
        d_out = call.blocked(grad_out[:, i0:i1])
        # D_i - grad_lse_i (module docstring of .blockwise), in float64, rounded once
        delta = (grad_out[:, i0:i1].double() * out[:, i0:i1].double()).sum(dim=-1)
        delta = call.blocked((delta - grad_lse[:, :, i0:i1].double().transpose(1, 2))[..., None])
        row_lse = call.blocked(lse[:, :, i0:i1].transpose(1, 2)[..., None])
        dq_frames = {f: torch.zeros(call.bh, call.group * rows, d, dtype=torch.float32, device=q.device)
                     for f in block}
        for tile in block_tiles:
            j0, j1, kind, _ = tile
            x, bent_mask = call.logits(block, i0, i1, tile)
            p = x.sub_(row_lse).exp_()  # masked entries: exp(-inf) = 0
            dv[:, j0:j1].baddbmm_(p.transpose(1, 2), d_out)
            d_s = call.tile(1, rows, j1 - j0)
            torch.matmul(d_out, call.values[:, j0:j1].transpose(1, 2), out=d_s)
            d_s.sub_(delta).mul_(p)  # dS = P (dP - D)
            if kind == "both":  # split by the window: pass 2's part into the freed weights' buffer
                by_row = (call.bh, call.group, rows, j1 - j0)
                p.copy_(d_s).view(by_row).masked_fill_(~bent_mask, 0.0)
                d_s.view(by_row).masked_fill_(bent_mask, 0.0)
                parts = {0: d_s, 1: p}
            else:
                parts = {1 if kind == "bent" else 0: d_s}
            for f, part in parts.items():
                dq_frames[f].baddbmm_(part, call.keys(f)[:, j0:j1])
                dk[f][:, j0:j1].baddbmm_(part.transpose(1, 2), block[f])
        dq[:, i0:i1] = _turned_back(call, dq_frames, slice(i0, i1), query=True, rows=rows) * plan.row_factors(
            slice(i0, i1), d, call.rotary_dim, q.device)
    batch = call.bh // call.heads_k
    grad_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    for t0 in range(0, k_len, options.block_size):  # float64 a block of keys at a time
        t1 = min(t0 + options.block_size, k_len)
        parts = {f: g.view(batch, call.heads_k, k_len, d)[:, :, t0:t1].transpose(1, 2) for f, g in dk.items()}
        grad_k[:, t0:t1] = _turned_back(call, parts, slice(t0, t1), query=False)
    grad_v = dv.view(batch, call.heads_k, k_len, call.v_dim).transpose(1, 2).to(v.dtype)
    return dq, grad_k, grad_v


def _turned_back(call: _Call, parts: dict, tokens: slice, query: bool, rows: int | None = None) -> torch.Tensor:
    """The sum over frames of R^T g, float64 ``[batch, tokens, heads, d]``, each frame's float32 sums g
    (blocked ``[batch heads_k, group rows, d]`` with ``rows``, else ``[batch, tokens, heads_k, d]``) turned
    back by its own angles (the transposed turn: sin negated). Summed in float64 before any factor, so
    that two frames never give inf - inf."""
    total = None
    for f, g in parts.items():
        cos, sin = call.angles(f == 1, query, tokens.start, tokens.stop)
        g = call.unblocked(g, rows) if rows is not None else g
        turned = _turned(g, cos, -sin, call.options.layout, call.rotary_dim)
        total = turned if total is None else total + turned
    return total
