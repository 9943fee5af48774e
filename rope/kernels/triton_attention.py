"""RoPE, ReRoPE and Leaky ReRoPE inside attention: one Triton kernel that rotates q and k on load.

FlashAttention-2's forward pass (Dao, "FlashAttention-2: faster attention with better parallelism
and work partitioning", 2023, Algorithm 1) with the rotation moved into the tiles: a program holds
BLOCK_M queries of one head, rotates them once, then streams the keys and values of its key head
in blocks of BLOCK_N, rotating each key block as it arrives. No rotated copy of q or k is ever
written to memory, and the logits exist one BLOCK_M x BLOCK_N tile at a time. The arithmetic is
that of :mod:`rope.attention.blockwise` (its module docstring derives the online softmax and the
tile rule), in float32 with the dot products on the inputs' dtype:

* angles: turns per position T_i = frac(theta_i / 2 pi) 2^64 in int64 fixed point
  (:func:`.triton_rotary.fixed_point_phase`, exact reduction for ``|theta_i|`` < 2^16), the
  wrapping product m T_i, float32 cos and sin of its top 32 bits
  (:func:`.triton_rotary.cos_sin_of_int32_turns`, within 1.35 2^-24 for ``|m|`` < 2^31);
* the rotated pairs y_a = x_a cos - x_b sin, y_b = x_b cos + x_a sin in float32 (fused
  multiply-adds), rounded to q's dtype: the operands of ``tl.dot``, exactly what a separate
  rotary pass would have written to memory (float32 inputs: IEEE float32 products, no TF32).
  float16 excepted: a turned pair reaches sqrt(2) a max ``|x|``, beyond float16's range for ``|x|`` near
  65504, so its operands are y 2^-c with c = ceil(log2(sqrt(2) a)) (:func:`operand_prescale`; the
  same rounding, halved exactly, except in float16's subnormal range) and the rotary part of each
  logit (of dq and dk in the backward) is multiplied back by 2^2c in float32;
* logits L = q_a . k_a + q_b . k_b + q_tail . k_tail (three dot products: the pairs' two halves
  and the unrotated coordinates past ``rotary_dim``), accumulated in float32;
* online softmax in base 2 with the running maximum taken over the logits before the scale r = s log2 e
  (times the row's log-n factor; r > 0 moves no maximum): P = 2^(r (L - max L)), whose exponent is 0 at
  the maximum and finite or -inf elsewhere for every scale the options accept, so that a scale whose
  scaled logits are beyond float32's range gives the hard maximum (not 0 * inf or inf - inf);
  P rounded to v's dtype for P V, float32 accumulator; the output rounded once to q's dtype, and the
  row logsumexp (natural log) in float32, ±inf where it is beyond float32's range.

ReRoPE and Leaky ReRoPE (:mod:`rope.attention.rerope`): the second pass's logit is a plain RoPE
logit in a *bent frame* (:func:`rope.attention.rerope.bent_frame`), so it too is one dot product
of rotated vectors:

* ReRoPE: queries turned by w theta_i (every query the same angle), keys unrotated;
* Leaky ReRoPE (scale k): the frame's frequencies theta_i / k, queries at m + w (k - 1), keys at
  n. With integer arithmetic only, the query angle is written (m - w) theta_i / k + w theta_i
  (the same number), and theta_i / k, a float64 value, as the sum of two float32 numbers
  hi_i + lo_i (48 significant bits; :func:`leaky_frequencies`): its turns T'_i = T(hi_i) +
  T(lo_i). The angle differs from the exact one by at most ``|p| |theta_i / k - hi_i - lo_i|``
  <= ``|p|`` theta_i 2^-48 / k beside the fixed-point rounding: below 2^-17 rad for ``|p|`` < 2^31
  and theta_i / k <= 1.

Log-n scaling (``logn_length`` L, :mod:`rope.attention.logn`): each query row's logits are also
multiplied by max(1, ln(m + 1) / ln L), a float32 factor per query computed on the host.

A tile takes pass 1, pass 2 or both by the rule of :mod:`rope.attention.blockwise`, evaluated in
the kernel from the extreme positions of its query and key blocks (one dot product per tile except
where the boundary r = m - n = w crosses it); causal tiles with every key after every query are
skipped.

Domain (:func:`launch` refuses the rest with ``ValueError``): float16, bfloat16 or float32 q, k
and v of one dtype; float32 inv_freq with ``|theta_i|`` < 2^16 (and theta_i / k, Leaky ReRoPE);
positions (any integer dtype), one row for the batch or one per sequence, with ``|m|`` < 2^31, so
that every angle is reduced exactly and every difference m - n is an int64; every query with a key to
attend to; log2(e) softmax_scale attention_factor^2 within float32's range and log2(e) softmax_scale
at least 2^-120 (:func:`check_logit_scale`); float16 q and k with attention_factor below 2^62.5 (the
prescale's 2^2c is a float32 constant); CUDA tensors, or CPU tensors in Triton's interpreter.
The values of q, k and v are not read before the kernel runs (a pass over them would cost a
decoding step as much memory traffic as the kernel): the rows whose float32 arithmetic may have
overflowed (a logit or a sum P V beyond float32's range, an lse beyond it) are found from the
results and recomputed in float64, so that finite inputs never give NaN
(:mod:`.triton_attention_repair` states which rows, why that suffices, and the cost).

The backward is :mod:`.triton_attention_backward`; both are differentiable operators in
:mod:`.attention_operators` (:func:`.attention_operators.fused_rotary_attention`). No GPU ran these
kernels: the tests run them in Triton's interpreter against float64 references, and
:mod:`.targets` compiles them for sm_75, sm_80 and sm_90.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _checks
from ..attention.blockwise import AttentionOptions, check_arguments, check_logn_positions, logn_factors
from ..limits import MAX_FREQUENCY, MAX_POSITION
from .emulation import fma, loop_bound
from .triton_attention_repair import repair_forward
from .triton_rotary import (
    check_launch_device,
    check_positions_in_range,
    cos_sin_of_int32_turns,
    fixed_point_phase,
    interpreting,
    launch_device,
    needs_fma_by_parts,
    pair_offsets,
    round_to_dtype,
    widened,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The dtypes of q, k and v the kernel takes (one for all three)."""

_LN2 = math.log(2.0)
_LOG2E = 1 / _LN2
FLOAT32_MAX = torch.finfo(torch.float32).max
SMALLEST_LOG2_SCALE = 2.0**-120
"""The smallest log2(e) softmax_scale the kernels take: a logit their float32 arithmetic loses (beyond float32's
range, 2^127 below its row's maximum or more) then weighs at most 2^-128 of the maximum's weight
(:mod:`.triton_attention_repair`); below it such a weight could matter, and no row check could tell."""
MAX_POSITION_C = tl.constexpr(MAX_POSITION)  # the jit functions read constexpr globals only
LN2_C = tl.constexpr(_LN2)

GPU_LAUNCH = (32, 16, 4)
"""(BLOCK_M, BLOCK_N, num_warps) on a GPU unless given: tiles that compile without register spills
for sm_80 and sm_90 in every variant of ``rope.kernels.targets``, with Triton 3.6 and 3.9
(``--spills``; 64 x 32 x 8 spilled up to 18 KB per thread on sm_80, 64 x 16 x 8 12 bytes with
Triton 3.6; untimed: no GPU ran it)."""


PLAIN, RE_ROPE, LEAKY = 0, 1, 2
"""The kernel's MODE: RoPE only, ReRoPE, Leaky ReRoPE."""


@triton.jit
def load_head(row, row_mask, HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr,
              TAIL_PAD: tl.constexpr, INTERLEAVED: tl.constexpr):
    """(x_a, x_b, x_tail): the pairs' two halves [R, HALF_PAD] and the unrotated tail [R, TAIL_PAD]
    of the heads at ``row`` (pointers to coordinate 0, [R]), zero where masked or padded."""
    a, b, pair_mask = pair_offsets(HALF, HALF_PAD, INTERLEAVED)
    mask = row_mask[:, None] & pair_mask[None, :]
    xa = tl.load(row[:, None] + a[None, :], mask=mask, other=0.0)
    xb = tl.load(row[:, None] + b[None, :], mask=mask, other=0.0)
    t = 2 * HALF + tl.arange(0, TAIL_PAD)
    tail = tl.load(row[:, None] + t[None, :], mask=row_mask[:, None] & (t < 2 * HALF + TAIL)[None, :], other=0.0)
    return xa, xb, tail


@triton.jit
def rotated_tile(xa, xb, turns, factor, BF16_BY_BITS: tl.constexpr, ROTATE: tl.constexpr,
                 FMA_BY_PARTS: tl.constexpr):
    """a R x for the angles 2 pi turns / 2^64 (int64, wrapping) and the attention factor a =
    ``factor``, in float32, rounded to x's dtype; x itself without ``ROTATE`` (the benchmark's
    baseline: the same kernel without RoPE, where launch() requires a = 1)."""
    if ROTATE:
        cos, sin = cos_sin_of_int32_turns(turns >> 32, FMA_BY_PARTS)
        cos = cos * factor
        sin = sin * factor
        a = widened(xa, tl.float32, BF16_BY_BITS)
        b = widened(xb, tl.float32, BF16_BY_BITS)
        ya = round_to_dtype(fma(a, cos, -(b * sin), FMA_BY_PARTS), xa.dtype, BF16_BY_BITS)
        yb = round_to_dtype(fma(b, cos, a * sin, FMA_BY_PARTS), xb.dtype, BF16_BY_BITS)
    else:
        ya, yb = xa, xb
    return ya, yb


@triton.jit
def scaled_tile(x, factor, BF16_BY_BITS: tl.constexpr, ROTATE: tl.constexpr):
    """a x rounded to x's dtype (ReRoPE's unrotated keys with the attention factor a = ``factor``);
    x itself when a = 1 or without ``ROTATE``."""
    if ROTATE:
        y = round_to_dtype(widened(x, tl.float32, BF16_BY_BITS) * factor, x.dtype, BF16_BY_BITS)
    else:
        y = x
    return y


@triton.jit
def tile_dot(a, b, acc, PRECISION: tl.constexpr, BF16_BY_BITS: tl.constexpr):
    """acc + a b with float32 accumulation. Triton's interpreter multiplies bfloat16 matrices
    wrongly: there (``BF16_BY_BITS``) they are widened to float32 first (exactly), and the float32
    products of bfloat16 numbers are exact, which is what the GPU's bfloat16 dot computes."""
    if BF16_BY_BITS and a.dtype == tl.bfloat16:
        a = widened(a, tl.float32, BF16_BY_BITS)
        b = widened(b, tl.float32, BF16_BY_BITS)
        result = tl.dot(a, b, acc, input_precision="ieee")
    else:
        result = tl.dot(a, b, acc, input_precision=PRECISION)
    return result


@triton.jit
def tile_logits(qa, qb, qt, ka, kb, kt, HAS_TAIL: tl.constexpr, PRECISION: tl.constexpr,
                BF16_BY_BITS: tl.constexpr, ROT_SCALE: tl.constexpr):
    """q . k for every (query, key) of the tile, float32 [BLOCK_M, BLOCK_N]: the pairs' halves and the tail.
    ``ROT_SCALE`` 2^2c undoes the prescale 2^-c of each rotated operand (float16, :func:`operand_prescale`)."""
    x = tile_dot(qa, tl.trans(ka), tl.zeros((qa.shape[0], ka.shape[0]), tl.float32), PRECISION, BF16_BY_BITS)
    x = tile_dot(qb, tl.trans(kb), x, PRECISION, BF16_BY_BITS)
    if ROT_SCALE != 1.0:
        x = x * ROT_SCALE
    if HAS_TAIL:
        x = tile_dot(qt, tl.trans(kt), x, PRECISION, BF16_BY_BITS)
    return x


@triton.jit
def query_head(bh, heads_q, group):
    """(batch row, query head, key head), int64, of program axis value ``bh`` = batch heads_q + head."""
    head = bh % heads_q
    return (bh // heads_q).to(tl.int64), head.to(tl.int64), (head // group).to(tl.int64)


@triton.jit
def row_factors(ROW_SCALE, rows, row_mask, LOGN: tl.constexpr):
    """The log-n factors of the query rows, float32 [BLOCK_M]: loaded with LOGN, else 1."""
    if LOGN:
        factors = tl.load(ROW_SCALE + rows, mask=row_mask, other=1.0)
    else:
        factors = tl.full(rows.shape, 1.0, tl.float32)
    return factors


@triton.jit
def token_block(POS, start, length, BLOCK: tl.constexpr):
    """(index, mask, positions, lowest, highest) of the tokens [start, start + BLOCK) of a sequence
    of ``length``: int64 indices and positions [BLOCK], and the extreme positions of the real ones
    (the tile rule's m_lo, m_hi or n_lo, n_hi)."""
    index = start + tl.arange(0, BLOCK)
    mask = index < length
    index = index.to(tl.int64)
    positions, lowest, highest = load_positions(POS, index, mask)
    return index, mask, positions, lowest, highest


@triton.jit
def load_positions(POS, index, mask):
    """(positions, lowest, highest): the int64 positions at ``index`` where ``mask`` (0 elsewhere)
    and the extreme positions of those (the tile rule's m_lo, m_hi or n_lo, n_hi)."""
    positions = tl.load(POS + index, mask=mask, other=0).to(tl.int64)
    lowest = tl.min(tl.where(mask, positions, MAX_POSITION_C), 0)
    highest = tl.max(tl.where(mask, positions, -MAX_POSITION_C), 0)
    return positions, lowest, highest


@triton.jit
def frame_turns(FREQ, LEAKY_FREQ, HALF: tl.constexpr, HALF_PAD: tl.constexpr, MODE: tl.constexpr):
    """(T, T') [1, HALF_PAD]: the turns per position of theta_i and, for Leaky ReRoPE, of theta_i / k
    (T(hi_i) + T(lo_i)); T' is T for the other modes (unused)."""
    j = tl.arange(0, HALF_PAD)
    theta = tl.load(FREQ + j, mask=j < HALF, other=0.0).to(tl.float64)
    per = fixed_point_phase(theta)[None, :]
    if MODE == 2:
        hi = tl.load(LEAKY_FREQ + j, mask=j < HALF, other=0.0).to(tl.float64)
        lo = tl.load(LEAKY_FREQ + HALF + j, mask=j < HALF, other=0.0).to(tl.float64)
        leaky_per = (fixed_point_phase(hi) + fixed_point_phase(lo))[None, :]
    else:
        leaky_per = per
    return per, leaky_per


@triton.jit
def query_frames(qa, qb, m, window, per, leaky_per, factor, plain, bent, MODE: tl.constexpr,
                 BF16_BY_BITS: tl.constexpr, ROTATE: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    """(qa1, qb1, qa2, qb2, bent_turns): a query block rotated for pass 1 (m theta) where ``plain``
    and for pass 2 (ReRoPE: w theta for every query; Leaky ReRoPE: (m - w) theta / k + w theta)
    where ``bent``, and the turns of pass 2; a frame not asked for is the unrotated block (unused).
    Without a window pass 2 is pass 1."""
    turns = m[:, None] * per
    qa1, qb1 = qa, qb
    if plain:
        qa1, qb1 = rotated_tile(qa, qb, turns, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
    if MODE == 0:
        qa2, qb2, bent_turns = qa1, qb1, turns
    else:
        if MODE == 1:
            bent_turns = tl.zeros_like(m)[:, None] + window * per
        else:
            bent_turns = (m - window)[:, None] * leaky_per + window * per
        qa2, qb2 = qa, qb
        if bent:
            qa2, qb2 = rotated_tile(qa, qb, bent_turns, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
    return qa1, qb1, qa2, qb2, bent_turns


@triton.jit
def attend_key_block(m_run, l_run, acc, qa1, qb1, qa2, qb2, qt, m, m_lo, m_hi, row_scale, k_head, v_head, K_POS,
                     start, end, sk_s, sv_s, per, leaky_per, factor, window,
                     HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
                     V_DIM: tl.constexpr, V_PAD: tl.constexpr, INTERLEAVED: tl.constexpr, CAUSAL: tl.constexpr,
                     MODE: tl.constexpr, PRECISION: tl.constexpr, BF16_BY_BITS: tl.constexpr,
                     ROTATE: tl.constexpr, FMA_BY_PARTS: tl.constexpr, BLOCK_N: tl.constexpr,
                     ROT_SCALE: tl.constexpr):
    """(m_run, l_run, acc) after folding the keys [start, start + BLOCK_N) before ``end`` into the
    online softmax of the query rows (their frames, positions m in [m_lo, m_hi], log2(e) s times
    their log-n factors ``row_scale``): the tile rule, each key frame rotated only where the tile
    takes that pass, one product per frame, the causal mask, then the running max (``m_run``: of the
    logits before the scale), sum and P V."""
    HAS_TAIL: tl.constexpr = TAIL > 0
    d = tl.arange(0, V_PAD)
    cols, col_mask, n, n_lo, n_hi = token_block(K_POS, start, end, BLOCK_N)
    if (not CAUSAL) or n_lo <= m_hi:  # else every key follows every query: skipped
        ka, kb, kt = load_head(k_head + cols * sk_s, col_mask, HALF, HALF_PAD, TAIL, TAIL_PAD, INTERLEAVED)
        # Each frame's keys are rotated only where the tile takes that pass
        if MODE == 0:
            ka1, kb1 = rotated_tile(ka, kb, n[:, None] * per, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
            x = tile_logits(qa1, qb1, qt, ka1, kb1, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
        else:
            if m_hi - n_lo < window:  # plain: every pair has r < w
                ka1, kb1 = rotated_tile(ka, kb, n[:, None] * per, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
                x = tile_logits(qa1, qb1, qt, ka1, kb1, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
            else:
                if MODE == 1:  # ReRoPE: keys unrotated (times the attention factor)
                    ka2 = scaled_tile(ka, factor, BF16_BY_BITS, ROTATE)
                    kb2 = scaled_tile(kb, factor, BF16_BY_BITS, ROTATE)
                else:
                    ka2, kb2 = rotated_tile(ka, kb, n[:, None] * leaky_per, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
                x = tile_logits(qa2, qb2, qt, ka2, kb2, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
                if m_lo - n_hi < window:  # both: the boundary r = w crosses the tile
                    ka1, kb1 = rotated_tile(ka, kb, n[:, None] * per, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
                    plain = tile_logits(qa1, qb1, qt, ka1, kb1, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
                    x = tl.where((m[:, None] - n[None, :]) < window, plain, x)
        valid = col_mask[None, :]
        if CAUSAL:
            valid = valid & (n[None, :] <= m[:, None])
        # the running maximum of the unscaled logits (row_scale > 0): the gaps x - max are finite (or -inf where
        # masked) and their scaled values never inf - inf or 0 * inf, whatever the scale
        x = tl.where(valid, x, float("-inf"))
        m_new = tl.maximum(m_run, tl.max(x, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen only masked keys
        p = tl.exp2((x - shift[:, None]) * row_scale[:, None])
        rescale = tl.exp2((m_run - shift) * row_scale)
        l_run = l_run * rescale + tl.sum(p, 1)
        v_mask = col_mask[:, None] & (d < V_DIM)[None, :]
        v = tl.load(v_head + cols[:, None] * sv_s + d[None, :], mask=v_mask, other=0.0)
        p_v = round_to_dtype(p, v.dtype, BF16_BY_BITS)
        acc = tile_dot(p_v, v, acc * rescale[:, None], PRECISION, BF16_BY_BITS)
        m_run = m_new
    return m_run, l_run, acc


@triton.jit
def attention_forward_kernel(
    # Tensors: q, k, v; the outputs (out in q's dtype, lse float32); positions and frequencies
    # (LEAKY_FREQ: the two float32 pieces hi, lo of theta / k, [2, HALF], Leaky ReRoPE only); with
    # LOGN, ROW_SCALE: each query's log-n factor max(1, ln(m + 1) / ln L), float32 [q_len]
    Q, K, V,
    OUT, LSE,
    Q_POS, K_POS, FREQ, LEAKY_FREQ, ROW_SCALE,
    # Strides (batch, token, head) in elements; the last dimension of each is contiguous
    sq_b, sq_s, sq_h,
    sk_b, sk_s, sk_h,
    sv_b, sv_s, sv_h,
    so_b, so_s, so_h,
    # Batch strides of the positions and of the log-n factors (0: one row shared by the batch)
    spq_b, spk_b, srs_b,
    # Sizes
    q_len, k_len, heads_q, group,
    # softmax_scale * log2(e), the ReRoPE window w, the attention factor a (on the rotated coordinates)
    qk_scale, window, factor,
    # Compile time: widths, layout, options (kernel_constants)
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    V_DIM: tl.constexpr, V_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, CAUSAL: tl.constexpr, MODE: tl.constexpr, PRECISION: tl.constexpr,
    BF16_BY_BITS: tl.constexpr, ROTATE: tl.constexpr, LOGN: tl.constexpr, FMA_BY_PARTS: tl.constexpr,
    PYTHON_LOOPS: tl.constexpr, ROT_SCALE: tl.constexpr,
    # Launch sizes
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (i, b h): queries [i BLOCK_M, (i + 1) BLOCK_M) of query head h of batch row b,
    against every key block of key head h // group. Launched by :func:`launch`."""
    bh = tl.program_id(1)
    batch, head, head_k = query_head(bh, heads_q, group)

    rows, row_mask, m, m_lo, m_hi = token_block(Q_POS + batch * spq_b, tl.program_id(0) * BLOCK_M, q_len, BLOCK_M)
    per, leaky_per = frame_turns(FREQ, LEAKY_FREQ, HALF, HALF_PAD, MODE)
    # The query block, rotated once per frame (pass 1; pass 2 for ReRoPE / Leaky ReRoPE)
    qa, qb, qt = load_head(Q + batch * sq_b + rows * sq_s + head * sq_h, row_mask, HALF, HALF_PAD, TAIL, TAIL_PAD,
                           INTERLEAVED)
    qa1, qb1, qa2, qb2, bent_turns = query_frames(qa, qb, m, window, per, leaky_per, factor, True, True, MODE,
                                                  BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
    # log2(e) s, times the log-n factors
    row_scale = row_factors(ROW_SCALE + batch * srs_b, rows, row_mask, LOGN) * qk_scale

    m_run = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_run = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, V_PAD), tl.float32)
    d = tl.arange(0, V_PAD)
    k_head = K + batch * sk_b + head_k * sk_h
    v_head = V + batch * sv_b + head_k * sv_h
    for start in range(0, loop_bound(k_len, PYTHON_LOOPS), BLOCK_N):
        m_run, l_run, acc = attend_key_block(
            m_run, l_run, acc, qa1, qb1, qa2, qb2, qt, m, m_lo, m_hi, row_scale, k_head, v_head,
            K_POS + batch * spk_b, start, k_len, sk_s, sv_s, per, leaky_per, factor, window,
            HALF, HALF_PAD, TAIL, TAIL_PAD, V_DIM, V_PAD, INTERLEAVED, CAUSAL, MODE, PRECISION, BF16_BY_BITS, ROTATE,
            FMA_BY_PARTS, BLOCK_N, ROT_SCALE)

    seen = l_run != 0  # every real row (launch() refuses queries without a key), NaN sums included
    out = acc / tl.where(seen, l_run, 1.0)[:, None]
    o_row = OUT + batch * so_b + rows * so_s + head * so_h
    o_mask = row_mask[:, None] & (d < V_DIM)[None, :]
    tl.store(o_row[:, None] + d[None, :], round_to_dtype(out, OUT.dtype.element_ty, BF16_BY_BITS), mask=o_mask)
    lse = m_run * (row_scale * LN2_C) + tl.log2(tl.where(seen, l_run, 1.0)) * LN2_C  # ±inf beyond float32's range
    tl.store(LSE + bh.to(tl.int64) * q_len + rows, lse, mask=row_mask)


def kernel_constants(head_dim: int, rotary_dim: int, v_dim: int, *, interleaved: bool, causal: bool, mode: int,
                     dtype: torch.dtype, bf16_by_bits: bool = False, rotate: bool = True, logn: bool = False,
                     fma_by_parts: bool = False, python_loops: bool = False, attention_factor: float = 1.0) -> dict:
    """The ``tl.constexpr`` arguments of :func:`attention_forward_kernel` other than the launch sizes.
    ``tl.dot`` needs every dimension of at least 16: the pads are powers of two from 16. ``ROT_SCALE``:
    2^2c for the prescale 2^-c of :func:`operand_prescale`."""
    half, tail = rotary_dim // 2, head_dim - rotary_dim
    pad = lambda width: max(16, triton.next_power_of_2(max(width, 1)))  # noqa: E731
    return dict(
        HALF=half, HALF_PAD=pad(half), TAIL=tail, TAIL_PAD=pad(tail), V_DIM=v_dim, V_PAD=pad(v_dim),
        INTERLEAVED=interleaved, CAUSAL=causal, MODE=mode,
        PRECISION="ieee" if dtype == torch.float32 else "tf32",  # float32: no TF32 rounding of the operands
        BF16_BY_BITS=bf16_by_bits, ROTATE=rotate, LOGN=logn, FMA_BY_PARTS=fma_by_parts, PYTHON_LOOPS=python_loops,
        ROT_SCALE=4.0 ** operand_prescale(dtype, attention_factor if rotate else None),
    )


def operand_prescale(dtype: torch.dtype, attention_factor: float | None) -> int:
    """c >= 0 such that the rotated operands a R x 2^-c of float16 q and k stay within float16's range for
    every finite x: |a R x| <= sqrt(2) a 65504 (each coordinate of a turned pair), so c = ceil(log2(sqrt(2) a)).
    The kernels pass a 2^-c as the factor of their rotations (so the operands are a R x 2^-c rounded to
    float16: the rounding of a R x, halved exactly, above float16's subnormal range) and multiply the
    rotary part of each logit by 2^2c (``ROT_SCALE``) and the rotary part of dq and dk likewise. 0 for
    bfloat16 and float32, whose operands overflow only beyond float32's logits, and without rotation
    (``attention_factor`` None)."""
    if dtype != torch.float16 or attention_factor is None:
        return 0
    return max(0, math.ceil(math.log2(math.sqrt(2.0) * attention_factor)))


def leaky_frequencies(inv_freq: torch.Tensor, leaky_scale: float) -> torch.Tensor:
    """float32 ``[2, rotary_dim / 2]``: hi_i = RN(theta_i / k) and lo_i = RN(theta_i / k - hi_i),
    theta_i / k computed in float64 (exact to 2^-53 relative), so hi_i + lo_i is within 2^-48
    of it relative."""
    scaled = inv_freq.to(torch.float64) / leaky_scale
    hi = scaled.to(torch.float32)
    lo = (scaled - hi.to(torch.float64)).to(torch.float32)
    return torch.stack([hi, lo])


def check_kernel_dtypes(q, k, v, inv_freq) -> None:
    """The kernel's dtypes (metadata only, as a fake implementation may check): float16, bfloat16 or
    float32 q, k and v of one dtype, float32 inv_freq."""
    if q.dtype not in DTYPES:
        raise TypeError(f"q must be float16, bfloat16 or float32 for the kernel, got {q.dtype} "
                        "(float64: rope.attention.blockwise.rotary_attention)")
    for name, t in dict(k=k, v=v).items():
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    _checks.float_tensor("inv_freq", inv_freq, dtypes=(torch.float32,), dim=1)


def _check_kernel_domain(q, k, v, q_positions, k_positions, inv_freq, causal: bool,
                         leaky: torch.Tensor | None) -> None:
    """What the kernel adds to :func:`rope.attention.blockwise.check_arguments`: its dtypes,
    float32 frequencies (and the pieces of theta / k, ``leaky``) below 2^16, positions below 2^31,
    a key for every query."""
    check_kernel_dtypes(q, k, v, inv_freq)
    _checks.finite_frequencies("inv_freq", inv_freq)
    _checks.assert_values("inv_freq", (inv_freq.abs() < MAX_FREQUENCY).all(), "values below 2^16 in magnitude")
    if leaky is not None:
        _checks.assert_values("inv_freq", (leaky[0].abs() < MAX_FREQUENCY).all(),
                              "values with |theta| / leaky_scale below 2^16 (Leaky ReRoPE's second pass)")
    for name, positions in dict(q_positions=q_positions, k_positions=k_positions).items():
        check_positions_in_range(name, positions)  # |m| < 2^31: float32 angles, int64 differences
    # a key for every query, checked on the device (no host synchronisation on CUDA), row by row
    if q_positions.numel() and not k_positions.shape[-1]:
        raise ValueError("k_positions is empty: the queries have no key to attend to")
    if causal and q_positions.numel():
        first_query, first_key = q_positions.amin(dim=-1), k_positions.amin(dim=-1)
        _checks.assert_values("q_positions", (first_query >= first_key).all(),
                              "no position before every key position of its batch row (causal: such a query "
                              "precedes every key and has nothing to attend to)")


def check_metadata(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale, softmax_scale,
                   logn_length, attention_factor) -> AttentionOptions:
    """Every check that reads no tensor value (a fake implementation runs it too); the options:
    :func:`rope.attention.blockwise.check_arguments` (positions of one row or one per batch row)
    and the kernel's dtypes."""
    options = check_arguments(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                              softmax_scale, 16, logn_length, attention_factor)  # block_size 16: unused here
    check_kernel_dtypes(q, k, v, inv_freq)
    check_logit_scale(options, softmax_scale is None)
    rot_scale = 4.0 ** operand_prescale(q.dtype, options.attention_factor)
    if rot_scale > FLOAT32_MAX:
        raise ValueError(f"attention_factor = {options.attention_factor!r} is too large for float16 q and k in the "
                         f"kernel: their rotated operands are prescaled by 2^-c, c = ceil(log2(sqrt(2) "
                         f"attention_factor)), and the logits multiplied back by 2^2c = {rot_scale:.3g}, which must "
                         f"not exceed float32's largest number (attention_factor below 2^62.5; "
                         f"rope.attention.blockwise.rotary_attention takes any)")
    return options


def check_logit_scale(options: AttentionOptions, softmax_scale_is_default: bool = False) -> None:
    """Refuse a softmax_scale s and attention_factor a whose largest logit factor, log2(e) s a^2
    times the largest log-n factor (positions below 2^31), exceeds float32's range: the kernels
    hold log2(e) s (times the log-n factors) and a in float32 and scale the gaps between float32 logits
    and their row's maximum by them, which a finite factor keeps 0 at the maximum (an infinite one
    would give inf * 0 = NaN). Only the options are read; any finite factor is taken, however far
    s a^2 ``|q . k|`` lies beyond float32's range (the output is then the hard maximum, :func:`launch`).
    Refuse too a softmax_scale whose log2(e) s is below :data:`SMALLEST_LOG2_SCALE` 2^-120: below float32's
    smallest normal number 2^-126 it would be 0 or subnormal (flushed to 0 on the GPU), and 0 times a masked
    logit's -inf is NaN; below 2^-120 a logit the float32 arithmetic loses (beyond float32's range) could
    carry weight, which no check of the results could see (:mod:`.triton_attention_repair`)."""
    logn = 1.0 if options.logn_length is None else max(1.0, math.log(MAX_POSITION) / math.log(options.logn_length))
    a = options.attention_factor
    largest = _LOG2E * options.scale * logn * a * a  # products: inf beyond float64, not OverflowError (a**2)
    if not (largest <= FLOAT32_MAX and a <= FLOAT32_MAX):  # a itself is a float32 argument of the kernels
        name = ("softmax_scale" if options.attention_factor == 1.0 else
                "attention_factor" if softmax_scale_is_default else "softmax_scale * attention_factor^2")
        times = "" if logn == 1.0 else " times the largest log-n factor"
        raise ValueError(f"{name} is too large for the kernel's float32 logits: log2(e) softmax_scale "
                         f"attention_factor^2{times} = {largest:.3g} (and attention_factor) must not exceed "
                         f"float32's largest number {FLOAT32_MAX:.6g}; got softmax_scale = {options.scale!r}, "
                         f"attention_factor = {a!r}")
    if not _LOG2E * options.scale >= SMALLEST_LOG2_SCALE:
        raise ValueError(f"softmax_scale is too small for the kernel's float32 logits: log2(e) softmax_scale = "
                         f"{_LOG2E * options.scale:.3g} must be at least 2^-120 = {SMALLEST_LOG2_SCALE:.6g} "
                         f"(rope.attention.blockwise.rotary_attention takes any); got softmax_scale = "
                         f"{options.scale!r}")


@dataclass(frozen=True)
class Launch:
    """The checked arguments of one call, as the forward and the backward kernels take them."""

    options: AttentionOptions
    mode: int
    q_positions: torch.Tensor  # int64, contiguous, [q_len] or [batch, q_len]
    k_positions: torch.Tensor
    batch_strides: tuple  # of q_positions, k_positions and row_scale (0: shared by the batch)
    inv_freq: torch.Tensor  # float32, contiguous
    leaky: torch.Tensor  # the pieces of theta / k (Leaky ReRoPE), else inv_freq (unused)
    row_scale: torch.Tensor  # float32 log-n factors per query (logn_length), q_positions' shape; else inv_freq
    constants: dict
    sizes: dict  # BLOCK_M, BLOCK_N
    launch_options: dict  # num_warps (num_stages)

    @property
    def factor(self) -> float:
        """The factor of the kernels' rotations: a 2^-c (exact), c the float16 operands' prescale
        (:func:`operand_prescale`; ``ROT_SCALE`` = 2^2c)."""
        return self.options.attention_factor / math.sqrt(self.constants["ROT_SCALE"])

    def runtime_scalars(self, q: torch.Tensor, k: torch.Tensor) -> tuple:
        """q_len, k_len, heads_q, group, qk_scale = softmax_scale log2(e), window."""
        return (q.shape[1], k.shape[1], q.shape[2], q.shape[2] // k.shape[2], self.options.scale * _LOG2E,
                self.options.window or 0)

    def row_scales(self) -> torch.Tensor:
        """Each query row's log2(e) s times its log-n factor, float32 as the kernels compute it, broadcasting
        with ``[batch, heads_q, q_len]``: a 0-D CPU tensor without log-n scaling (a scalar to the device's
        operations: no copy to the device, which a captured CUDA graph could not hold)."""
        scale = torch.tensor(self.options.scale * _LOG2E, dtype=torch.float32)
        if not self.constants["LOGN"]:
            return scale
        factors = self.row_scale if self.row_scale.dim() == 2 else self.row_scale[None]  # [batch or 1, q_len]
        return factors[:, None, :] * scale


def prepare_launch(q, k, v, q_positions, k_positions, inv_freq, *, layout, causal, window, leaky_scale,
                   softmax_scale, block_m, block_n, num_warps, num_stages, rotate=True, logn_length=None,
                   attention_factor=1.0) -> Launch:
    """Check every argument of :func:`launch` (the package's errors, naming the argument) and
    derive what the kernels take."""
    options = check_metadata(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                             softmax_scale, logn_length, attention_factor)
    check_launch_device("q", q)  # q, k, v, the positions and inv_freq share its device (check_metadata)
    leaky = None
    if options.leaky_scale is not None and inv_freq.is_floating_point():
        leaky = leaky_frequencies(inv_freq, options.leaky_scale)
    _check_kernel_domain(q, k, v, q_positions, k_positions, inv_freq, options.causal, leaky)
    row_scale = inv_freq.contiguous()
    if options.logn_length is not None:
        check_logn_positions(q_positions)
        row_scale = logn_factors(q_positions, options.logn_length).to(torch.float32).contiguous()
    for name, value, minimum in (("block_m", block_m, 16), ("block_n", block_n, 16), ("num_warps", num_warps, 1)):
        if value is not None:
            value = _checks.integer(name, value, minimum=minimum)
            if value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
    for name, t in dict(q=q, k=k, v=v).items():
        if t.numel() and t.stride(3) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")
    mode = PLAIN if options.window is None else RE_ROPE if options.leaky_scale is None else LEAKY
    interpreted = interpreting()
    default = (16, 16, 4) if interpreted else GPU_LAUNCH  # the interpreter runs programs at a fixed cost each
    constants = kernel_constants(q.shape[3], 2 * inv_freq.numel(), v.shape[3],
                                 interleaved=options.layout == "interleaved", causal=options.causal, mode=mode,
                                 dtype=q.dtype, bf16_by_bits=interpreted, fma_by_parts=needs_fma_by_parts(),
                                 python_loops=interpreted, attention_factor=options.attention_factor,
                                 rotate=_checks.flag("rotate", rotate), logn=options.logn_length is not None)
    if not constants["ROTATE"] and options.attention_factor != 1.0:
        raise ValueError(f"attention_factor = {options.attention_factor} scales the rotation: rotate=False takes 1")
    if not constants["ROTATE"] and options.window is not None:  # both passes would be the same logits
        raise ValueError(f"window = {options.window} (and leaky_scale) choose between rotations: rotate=False "
                         "takes window=None")
    q_positions, k_positions = q_positions.to(torch.int64).contiguous(), k_positions.to(torch.int64).contiguous()
    return Launch(
        options=options, mode=mode, q_positions=q_positions, k_positions=k_positions,
        batch_strides=tuple(t.stride(0) if t.dim() == 2 else 0 for t in (q_positions, k_positions, row_scale)),
        inv_freq=inv_freq.contiguous(), leaky=inv_freq.contiguous() if leaky is None else leaky, row_scale=row_scale,
        constants=constants, sizes=dict(BLOCK_M=default[0] if block_m is None else block_m,
                                        BLOCK_N=default[1] if block_n is None else block_n),
        launch_options=dict(num_warps=default[2] if num_warps is None else num_warps) | (
            {} if num_stages is None else dict(num_stages=_checks.integer("num_stages", num_stages, minimum=1))),
    )


def launch(q, k, v, q_positions, k_positions, inv_freq, *, layout: str = "half", causal: bool = True,
           window: int | None = None, leaky_scale: float | None = None, softmax_scale: float | None = None,
           block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
           num_stages: int | None = None, rotate: bool = True, logn_length: int | None = None,
           attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): attention with RoPE, ReRoPE or Leaky ReRoPE logits, q and k rotated on load.

    Shapes (as :func:`rope.attention.blockwise.rotary_attention`)::

        q            [batch, q_len, heads_q, d]      float16/bfloat16/float32
        k            [batch, k_len, heads_k, d]      heads_q a multiple of heads_k
        v            [batch, k_len, heads_k, v_dim]
        q_positions  [q_len] or [batch, q_len]       integers, |m| < 2^31, any order
        k_positions  [k_len] or [batch, k_len]       (one row per sequence, or shared)
        inv_freq     [rotary_dim / 2]                float32, |theta_i| < 2^16
        out          [batch, q_len, heads_q, v_dim]  q's dtype
        lse          [batch, heads_q, q_len]         float32, natural log

    q, k and v share one dtype and have a contiguous last dimension (strided views, e.g. slices
    of a packed projection, are read in place); rotary_dim <= d; ``lse`` is the log of each row's
    softmax normaliser, sum_j exp(s L_ij), over its unmasked keys.

    The logits and options are those of :func:`rope.attention.blockwise.rotary_attention` (which
    is the float64 reference of this kernel); the arithmetic is in the module docstring.
    ``block_m`` and ``block_n`` (powers of two, at least 16) and ``num_warps``, ``num_stages``
    fix the launch; by default 16 x 16 in Triton's interpreter and :data:`GPU_LAUNCH` on a GPU.
    ``attention_factor`` a multiplies the rotated coordinates of q and k (the rotary part of each
    logit by a^2), as :func:`rope.attention.blockwise.rotary_attention` defines it.
    ``logn_length`` L multiplies the logits of the query at position m by
    ``max(1, ln(m + 1) / ln L)`` (log-n scaling, :mod:`rope.attention.logn`; positions from 0).
    ``rotate=False`` skips the rotations (attention on q and k as given): the same kernel without
    RoPE, the benchmark's baseline. It takes no window (both passes would be the same logits) and
    the attention factor 1 (it scales the rotation): the others are refused by name, not ignored.

    The logits are float32 (module docstring): ``ValueError`` where the factor they are scaled by,
    log2(e) ``softmax_scale`` a^2 (times the largest log-n factor), or a itself, exceeds float32's
    range, where log2(e) ``softmax_scale`` is below 2^-120, or where float16's prescale 2^2c does
    (a from 2^62.5) (:func:`check_metadata`, :func:`check_logit_scale`, from the options alone).
    Every other call is computed, and finite q, k and v never give NaN: the running maximum is taken
    before the scale, so scaled logits beyond float32's range give the hard maximum (the mean of v
    over each row's largest logits, the limit of the softmax), and the rows whose float32
    arithmetic may have overflowed (a logit ``q . k`` a^2 or a sum P V beyond float32's range, an
    lse beyond it) are recomputed in float64 and rounded once (:mod:`.triton_attention_repair`:
    one check of out and lse per call, a host synchronisation on CUDA).
    ``v_dim = 0`` gives an empty output and every row's lse. CPU tensors need Triton's interpreter
    (``TRITON_INTERPRET=1``; ``ValueError`` naming q's device otherwise,
    :func:`rope.kernels.triton_rotary.check_launch_device`).

    Non-finite inputs are not refused (checking them would cost a pass over q, k and v), and no
    row whose q, or whose key head's k or v, holds one is recomputed. A NaN in q reaches its own
    row only; one in k reaches the output and lse of the rows that attend to that key (a masked
    key's logit is dropped); one in v reaches the output of those rows and may reach the other
    rows of the query blocks that load its key block, whose zero weights meet it in the tile's
    product.
    """
    run = prepare_launch(q, k, v, q_positions, k_positions, inv_freq, layout=layout, causal=causal, window=window,
                         leaky_scale=leaky_scale, softmax_scale=softmax_scale, block_m=block_m, block_n=block_n,
                         num_warps=num_warps, num_stages=num_stages, rotate=rotate, logn_length=logn_length,
                         attention_factor=attention_factor)
    batch, q_len, heads_q, _ = q.shape
    out = q.new_empty(batch, q_len, heads_q, v.shape[3])
    lse = torch.empty(batch, heads_q, q_len, dtype=torch.float32, device=q.device)
    if lse.numel() == 0:  # no query row (v_dim = 0 still has every row's lse: the masks drop the values)
        return out, lse
    grid = (triton.cdiv(q_len, run.sizes["BLOCK_M"]), batch * heads_q)
    with launch_device(q):
        attention_forward_kernel[grid](
            q, k, v,
            out, lse,
            run.q_positions, run.k_positions, run.inv_freq, run.leaky, run.row_scale,
            *q.stride()[:3],
            *k.stride()[:3],
            *v.stride()[:3],
            *out.stride()[:3],
            *run.batch_strides,
            *run.runtime_scalars(q, k), run.factor,
            **run.constants, **run.sizes, **run.launch_options, enable_fp_fusion=False,
        )
    repair_forward(run, q, k, v, out, lse)  # the rows the float32 arithmetic may have lost, in float64
    return out, lse
