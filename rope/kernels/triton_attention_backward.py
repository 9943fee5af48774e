"""The backward of :mod:`.triton_attention`: dq, dk and dv with q and k rotated on load.

FlashAttention-2's backward (Dao 2023, Algorithm 2), as :mod:`rope.attention.blockwise` derives
it, in two Triton kernels that recompute the tiles from the saved output O and row logsumexp
LSE instead of storing them. With dO the incoming gradient and, per query row i,
D_i = sum_d dO_id O_id - dLSE_i (the gradient of LSE enters here)::

    P_ij  = exp(s L_ij - LSE_i)      (0 where masked)
    dV_j  = sum_i P_ij dO_i
    dL_ij = s P_ij (dO_i . V_j - D_i)

and, the logits being bilinear in the rotated vectors, dq_rot = dL k_rot and dk_rot = dL^T q_rot
in each frame (pass 1: the tokens' own rotations; pass 2 of ReRoPE / Leaky ReRoPE: the bent
frame), turned back by the transposed rotations (the same angles, sin negated) and summed; the
unrotated tail's gradients need no turning back.

* :func:`attention_dkdv_kernel`: a program owns BLOCK_N keys of one key head, rotates them once
  per frame, and streams the query blocks of every query head of its group (GQA: the group's
  gradients are summed in registers, never in memory): dk and dv written once.
* :func:`attention_dq_kernel`: a program owns BLOCK_M queries of one head and streams the key
  blocks: dq written once.

The arithmetic is the forward's: rotations in float32 from exactly reduced angles, rounded to the
inputs' dtype as dot operands; P and dL rounded to the inputs' dtype for their products (float32
inputs: IEEE float32, no TF32), float32 accumulators, each gradient rounded once to its input's
dtype. The tiles follow the forward's rule (:func:`_tile_passes`): causal tiles with every key
after every query are skipped, a tile the window boundary does not cross takes the products of
its one frame (logits, dq or dk), and only the tiles it crosses take both, pair by pair.

At the float limits. P is recomputed from the float32 LSE, so its exponent s L - LSE carries an
error of about ``|LSE|`` 2^-24: the gradients lose accuracy as the scaled logits grow (beyond 2^20 or so
the weights are no longer the softmax's), and the exponent is taken at most 0 (P <= 1), so that the
rounding never makes P infinite. An LSE of ±inf (the forward's scaled logits beyond float32's
range), or one whose row holds logits beyond float32's range, leaves nothing to recompute P from:
:func:`launch_backward` recomputes the slices (batch row, key head) of such rows, and of any
non-finite gradient, in float64 (:func:`.triton_attention_repair.repair_backward`), so that finite
inputs never give NaN. Where softmax_scale times the largest log-n factor exceeds 1, s multiplies
the summed dq and dk rather than each tile's dL (``SCALE_AFTER``, :func:`scale_after_the_sums`), so
that a large scale cannot make dL infinite in the inputs' dtype and its products with zeros NaN.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import _checks
from ..limits import MAX_POSITION
from .emulation import fma, loop_bound
from .triton_attention import (
    frame_turns,
    load_head,
    prepare_launch,
    query_frames,
    query_head,
    rotated_tile,
    row_factors,
    scaled_tile,
    tile_dot,
    tile_logits,
    token_block,
)
from .triton_attention_repair import repair_backward
from .triton_rotary import cos_sin_of_int32_turns, interpreting, launch_device, pair_offsets, round_to_dtype

LOG2E_C = tl.constexpr(1.4426950408889634)


@triton.jit
def _turned_back(ga, gb, turns, factor, ROTATE: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    """a R^T g in float32 for the angles 2 pi turns / 2^64 and the attention factor a = ``factor``:
    a (g_a cos + g_b sin, g_b cos - g_a sin); g itself without ``ROTATE``."""
    if ROTATE:
        cos, sin = cos_sin_of_int32_turns(turns >> 32, FMA_BY_PARTS)
        cos = cos * factor
        sin = sin * factor
        ya = fma(ga, cos, gb * sin, FMA_BY_PARTS)
        yb = fma(gb, cos, -(ga * sin), FMA_BY_PARTS)
    else:
        ya, yb = ga, gb
    return ya, yb


@triton.jit
def _tile_passes(m_lo, m_hi, n_lo, n_hi, window, MODE: tl.constexpr):
    """(plain, bent): whether some pair of the tile takes pass 1 (r = m - n < w) and whether some
    takes pass 2 (r >= w), from its extreme positions: r spans [m_lo - n_hi, m_hi - n_lo]. Without a
    window (``MODE`` 0) every pair takes pass 1."""
    if MODE == 0:
        plain = m_lo == m_lo
        bent = m_lo != m_lo
    else:
        plain = m_lo - n_hi < window
        bent = m_hi - n_lo >= window
    return plain, bent


@triton.jit
def _key_frames(ka, kb, n, per, leaky_per, factor, plain, bent, MODE: tl.constexpr, BF16_BY_BITS: tl.constexpr,
                ROTATE: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    """(ka1, kb1, ka2, kb2): a key block rotated for pass 1 (n theta) where ``plain`` and for pass 2
    (ReRoPE: unrotated; Leaky ReRoPE: n theta / k) where ``bent``; a frame not asked for is the
    unrotated block (unused). Without a window pass 2 is pass 1."""
    ka1, kb1 = ka, kb
    if plain:
        ka1, kb1 = rotated_tile(ka, kb, n[:, None] * per, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
    if MODE == 0:
        ka2, kb2 = ka1, kb1
    else:
        ka2, kb2 = ka, kb
        if bent:
            if MODE == 1:
                ka2, kb2 = scaled_tile(ka, factor, BF16_BY_BITS, ROTATE), scaled_tile(kb, factor, BF16_BY_BITS, ROTATE)
            else:
                ka2, kb2 = rotated_tile(ka, kb, n[:, None] * leaky_per, factor, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
    return ka1, kb1, ka2, kb2


@triton.jit
def _probabilities_and_dlogits(qa1, qb1, qa2, qb2, qt, ka1, kb1, ka2, kb2, kt, v, do, m, n, valid, lse, delta,
                               factors, window, qk_scale, softmax_scale, plain, bent, MODE: tl.constexpr,
                               HAS_TAIL: tl.constexpr, PRECISION: tl.constexpr, BF16_BY_BITS: tl.constexpr,
                               SCALE_AFTER: tl.constexpr, ROT_SCALE: tl.constexpr):
    """(P, dL, bent_pairs) of one tile, [BLOCK_M, BLOCK_N] float32: the recomputed softmax weights,
    the logits' gradient s f P (dP - D) (f the rows' log-n ``factors``, else 1; without s where
    ``SCALE_AFTER``: the kernels multiply the accumulated gradients by s) and the mask of pairs
    that take pass 2 (False without a window). The logits take one product per frame the tile
    needs (:func:`_tile_passes`). P = exp(s f L - LSE) <= 1: the exponent is taken at most 0, as
    the float32 rounding of a large LSE could put it above (and P at inf)."""
    bent_pairs = (m[:, None] - n[None, :]) >= window
    if MODE != 0:
        if plain:
            x = tile_logits(qa1, qb1, qt, ka1, kb1, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
            if bent:  # the boundary r = w crosses the tile
                bent_x = tile_logits(qa2, qb2, qt, ka2, kb2, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
                x = tl.where(bent_pairs, bent_x, x)
        else:
            x = tile_logits(qa2, qb2, qt, ka2, kb2, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
    else:
        x = tile_logits(qa1, qb1, qt, ka1, kb1, kt, HAS_TAIL, PRECISION, BF16_BY_BITS, ROT_SCALE)
        bent_pairs = bent_pairs & (window < 0)  # no pair is bent (window is 0)
    p = tl.where(valid, tl.exp2(tl.minimum(x * (qk_scale * factors)[:, None] - lse[:, None] * LOG2E_C, 0.0)), 0.0)
    dp = tile_dot(do, tl.trans(v), tl.zeros((do.shape[0], v.shape[0]), tl.float32), PRECISION, BF16_BY_BITS)
    if SCALE_AFTER:
        d_logits = p * (dp - delta[:, None]) * factors[:, None]
    else:
        d_logits = p * (dp - delta[:, None]) * (softmax_scale * factors)[:, None]
    return p, d_logits, bent_pairs


@triton.jit
def _frame_gradients(dl, bent_pairs, xa1, xb1, xa2, xb2, xt, ga1, gb1, ga2, gb2, gt, plain, bent,
                     MODE: tl.constexpr, HAS_TAIL: tl.constexpr, PRECISION: tl.constexpr,
                     BF16_BY_BITS: tl.constexpr):
    """(ga1, gb1, ga2, gb2, gt) after one tile: the rotated gradients of each frame, g1 += dL1 x1 and
    g2 += dL2 x2 with dL split by ``bent_pairs`` into its pass-1 and pass-2 parts (each product only
    where the tile takes that pass), and the tail's g_t += dL x_t. ``dl`` is [rows of g, rows of x]
    in x's dtype: dL for dq (x the keys), dL^T for dk (x the queries)."""
    if plain:
        dl1 = tl.where(bent_pairs, 0.0, dl).to(xa1.dtype)
        ga1 = tile_dot(dl1, xa1, ga1, PRECISION, BF16_BY_BITS)
        gb1 = tile_dot(dl1, xb1, gb1, PRECISION, BF16_BY_BITS)
    if MODE != 0:
        if bent:
            dl2 = tl.where(bent_pairs, dl, 0.0).to(xa1.dtype)
            ga2 = tile_dot(dl2, xa2, ga2, PRECISION, BF16_BY_BITS)
            gb2 = tile_dot(dl2, xb2, gb2, PRECISION, BF16_BY_BITS)
    if HAS_TAIL:
        gt = tile_dot(dl, xt, gt, PRECISION, BF16_BY_BITS)
    return ga1, gb1, ga2, gb2, gt


@triton.jit
def _store_head(row, row_mask, ga, gb, gt, HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr,
                TAIL_PAD: tl.constexpr, INTERLEAVED: tl.constexpr, BF16_BY_BITS: tl.constexpr):
    """Write a float32 gradient (pairs' halves and tail) into the heads at ``row``, rounded to their dtype."""
    a, b, pair_mask = pair_offsets(HALF, HALF_PAD, INTERLEAVED)
    mask = row_mask[:, None] & pair_mask[None, :]
    dtype = row.dtype.element_ty
    tl.store(row[:, None] + a[None, :], round_to_dtype(ga, dtype, BF16_BY_BITS), mask=mask)
    tl.store(row[:, None] + b[None, :], round_to_dtype(gb, dtype, BF16_BY_BITS), mask=mask)
    if TAIL > 0:
        t = 2 * HALF + tl.arange(0, TAIL_PAD)
        tail_mask = row_mask[:, None] & (t < 2 * HALF + TAIL)[None, :]
        tl.store(row[:, None] + t[None, :], round_to_dtype(gt, dtype, BF16_BY_BITS), mask=tail_mask)


@triton.jit
def attention_dkdv_kernel(
    # Tensors: q, k, v, dO; the row logsumexp and D (float32 [batch, heads_q, q_len]); dk, dv;
    # positions and frequencies as the forward kernel takes them
    Q, K, V, DO,
    LSE, DELTA,
    DK, DV,
    Q_POS, K_POS, FREQ, LEAKY_FREQ, ROW_SCALE,
    # Strides (batch, token, head) in elements; the last dimension of each is contiguous
    sq_b, sq_s, sq_h,
    sk_b, sk_s, sk_h,
    sv_b, sv_s, sv_h,
    sdo_b, sdo_s, sdo_h,
    sdk_b, sdk_s, sdk_h,
    sdv_b, sdv_s, sdv_h,
    # Batch strides of the positions and of the log-n factors (0: one row shared by the batch)
    spq_b, spk_b, srs_b,
    # Sizes, log2(e) softmax_scale, the window; softmax_scale itself and the attention factor
    q_len, k_len, heads_q, group,
    qk_scale, window,
    softmax_scale, factor,
    # Compile time: as the forward kernel (triton_attention.kernel_constants)
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    V_DIM: tl.constexpr, V_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, CAUSAL: tl.constexpr, MODE: tl.constexpr, PRECISION: tl.constexpr,
    BF16_BY_BITS: tl.constexpr, ROTATE: tl.constexpr, LOGN: tl.constexpr, FMA_BY_PARTS: tl.constexpr,
    PYTHON_LOOPS: tl.constexpr, ROT_SCALE: tl.constexpr,
    # softmax_scale applied to the accumulated dq, dk (not to each tile's dL): _probabilities_and_dlogits
    SCALE_AFTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (j, b h_k): dk and dv of keys [j BLOCK_N, (j + 1) BLOCK_N) of key head h_k of batch
    row b, summed over the query heads h_k group .. (h_k + 1) group - 1 and all their query blocks."""
    heads_k = heads_q // group
    bh = tl.program_id(1)
    batch = (bh // heads_k).to(tl.int64)
    head_k = (bh % heads_k).to(tl.int64)
    HAS_TAIL: tl.constexpr = TAIL > 0
    per, leaky_per = frame_turns(FREQ, LEAKY_FREQ, HALF, HALF_PAD, MODE)

    cols, col_mask, n, n_lo, n_hi = token_block(K_POS + batch * spk_b, tl.program_id(0) * BLOCK_N, k_len, BLOCK_N)
    ka, kb, kt = load_head(K + batch * sk_b + cols * sk_s + head_k * sk_h, col_mask, HALF, HALF_PAD, TAIL, TAIL_PAD,
                           INTERLEAVED)
    # Both frames of the keys, once for all the query blocks
    ka1, kb1, ka2, kb2 = _key_frames(ka, kb, n, per, leaky_per, factor, True, True, MODE, BF16_BY_BITS, ROTATE,
                                     FMA_BY_PARTS)
    d = tl.arange(0, V_PAD)
    v = tl.load(V + batch * sv_b + head_k * sv_h + cols[:, None] * sv_s + d[None, :],
                mask=col_mask[:, None] & (d < V_DIM)[None, :], other=0.0)

    dv = tl.zeros((BLOCK_N, V_PAD), tl.float32)
    dka1 = tl.zeros((BLOCK_N, HALF_PAD), tl.float32)
    dkb1 = tl.zeros((BLOCK_N, HALF_PAD), tl.float32)
    dka2 = tl.zeros((BLOCK_N, HALF_PAD), tl.float32)
    dkb2 = tl.zeros((BLOCK_N, HALF_PAD), tl.float32)
    dkt = tl.zeros((BLOCK_N, TAIL_PAD), tl.float32)
    for g in range(0, loop_bound(group, PYTHON_LOOPS)):
        head = head_k * group + g
        q_head = Q + batch * sq_b + head * sq_h
        do_head = DO + batch * sdo_b + head * sdo_h
        row_head = (batch * heads_q + head) * q_len
        for start in range(0, loop_bound(q_len, PYTHON_LOOPS), BLOCK_M):
            rows, row_mask, m, m_lo, m_hi = token_block(Q_POS + batch * spq_b, start, q_len, BLOCK_M)
            if (not CAUSAL) or n_lo <= m_hi:  # else every key follows every query: skipped
                qa, qb, qt = load_head(q_head + rows * sq_s, row_mask, HALF, HALF_PAD, TAIL, TAIL_PAD, INTERLEAVED)
                plain, bent = _tile_passes(m_lo, m_hi, n_lo, n_hi, window, MODE)
                qa1, qb1, qa2, qb2, bent_turns = query_frames(qa, qb, m, window, per, leaky_per, factor, plain,
                                                              bent, MODE, BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
                valid = row_mask[:, None] & col_mask[None, :]
                if CAUSAL:
                    valid = valid & (n[None, :] <= m[:, None])
                lse = tl.load(LSE + row_head + rows, mask=row_mask, other=0.0)
                delta = tl.load(DELTA + row_head + rows, mask=row_mask, other=0.0)
                factors = row_factors(ROW_SCALE + batch * srs_b, rows, row_mask, LOGN)
                do_mask = row_mask[:, None] & (d < V_DIM)[None, :]
                do = tl.load(do_head + rows[:, None] * sdo_s + d[None, :], mask=do_mask, other=0.0)
                p, d_logits, bent_pairs = _probabilities_and_dlogits(
                    qa1, qb1, qa2, qb2, qt, ka1, kb1, ka2, kb2, kt, v, do, m, n, valid, lse, delta, factors, window,
                    qk_scale, softmax_scale, plain, bent, MODE, HAS_TAIL, PRECISION, BF16_BY_BITS, SCALE_AFTER,
                    ROT_SCALE)
                dv = tile_dot(tl.trans(round_to_dtype(p, do.dtype, BF16_BY_BITS)), do, dv, PRECISION, BF16_BY_BITS)
                dl = round_to_dtype(d_logits, qa.dtype, BF16_BY_BITS)
                dka1, dkb1, dka2, dkb2, dkt = _frame_gradients(
                    tl.trans(dl), tl.trans(bent_pairs), qa1, qb1, qa2, qb2, qt, dka1, dkb1, dka2, dkb2, dkt, plain,
                    bent, MODE, HAS_TAIL, PRECISION, BF16_BY_BITS)

    dka, dkb = _turned_back(dka1, dkb1, n[:, None] * per, factor, ROTATE, FMA_BY_PARTS)
    if MODE == 1:  # ReRoPE's keys: unrotated, times the attention factor
        dka += dka2 * factor
        dkb += dkb2 * factor
    elif MODE == 2:
        dka2, dkb2 = _turned_back(dka2, dkb2, n[:, None] * leaky_per, factor, ROTATE, FMA_BY_PARTS)
        dka += dka2
        dkb += dkb2
    if ROT_SCALE != 1.0:  # the rotated operands' prescale (float16)
        dka, dkb = dka * ROT_SCALE, dkb * ROT_SCALE
    if SCALE_AFTER:  # s times the finite sums: ±inf beyond float32's range, never 0 * inf
        dka, dkb, dkt = dka * softmax_scale, dkb * softmax_scale, dkt * softmax_scale
    _store_head(DK + batch * sdk_b + cols * sdk_s + head_k * sdk_h, col_mask, dka, dkb, dkt, HALF, HALF_PAD, TAIL,
                TAIL_PAD, INTERLEAVED, BF16_BY_BITS)
    dv_row = DV + batch * sdv_b + cols * sdv_s + head_k * sdv_h
    tl.store(dv_row[:, None] + d[None, :], round_to_dtype(dv, DV.dtype.element_ty, BF16_BY_BITS),
             mask=col_mask[:, None] & (d < V_DIM)[None, :])


@triton.jit
def attention_dq_kernel(
    # Tensors: as attention_dkdv_kernel, with dq the output
    Q, K, V, DO,
    LSE, DELTA,
    DQ,
    Q_POS, K_POS, FREQ, LEAKY_FREQ, ROW_SCALE,
    # Strides (batch, token, head) in elements
    sq_b, sq_s, sq_h,
    sk_b, sk_s, sk_h,
    sv_b, sv_s, sv_h,
    sdo_b, sdo_s, sdo_h,
    sdq_b, sdq_s, sdq_h,
    # Batch strides of the positions and of the log-n factors (0: one row shared by the batch)
    spq_b, spk_b, srs_b,
    # Sizes, log2(e) softmax_scale, the window; softmax_scale itself and the attention factor
    q_len, k_len, heads_q, group,
    qk_scale, window,
    softmax_scale, factor,
    # Compile time: as the forward kernel
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    V_DIM: tl.constexpr, V_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, CAUSAL: tl.constexpr, MODE: tl.constexpr, PRECISION: tl.constexpr,
    BF16_BY_BITS: tl.constexpr, ROTATE: tl.constexpr, LOGN: tl.constexpr, FMA_BY_PARTS: tl.constexpr,
    PYTHON_LOOPS: tl.constexpr, ROT_SCALE: tl.constexpr,
    # softmax_scale applied to the accumulated dq, dk (not to each tile's dL): _probabilities_and_dlogits
    SCALE_AFTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (i, b h): dq of queries [i BLOCK_M, (i + 1) BLOCK_M) of query head h of batch row b."""
    bh = tl.program_id(1)
    batch, head, head_k = query_head(bh, heads_q, group)
    HAS_TAIL: tl.constexpr = TAIL > 0
    per, leaky_per = frame_turns(FREQ, LEAKY_FREQ, HALF, HALF_PAD, MODE)

    rows, row_mask, m, m_lo, m_hi = token_block(Q_POS + batch * spq_b, tl.program_id(0) * BLOCK_M, q_len, BLOCK_M)
    qa, qb, qt = load_head(Q + batch * sq_b + rows * sq_s + head * sq_h, row_mask, HALF, HALF_PAD, TAIL, TAIL_PAD,
                           INTERLEAVED)
    qa1, qb1, qa2, qb2, bent_turns = query_frames(qa, qb, m, window, per, leaky_per, factor, True, True, MODE,
                                                  BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
    d = tl.arange(0, V_PAD)
    do = tl.load(DO + batch * sdo_b + head * sdo_h + rows[:, None] * sdo_s + d[None, :],
                 mask=row_mask[:, None] & (d < V_DIM)[None, :], other=0.0)
    row_head = bh.to(tl.int64) * q_len
    lse = tl.load(LSE + row_head + rows, mask=row_mask, other=0.0)
    delta = tl.load(DELTA + row_head + rows, mask=row_mask, other=0.0)
    factors = row_factors(ROW_SCALE + batch * srs_b, rows, row_mask, LOGN)

    dqa1 = tl.zeros((BLOCK_M, HALF_PAD), tl.float32)
    dqb1 = tl.zeros((BLOCK_M, HALF_PAD), tl.float32)
    dqa2 = tl.zeros((BLOCK_M, HALF_PAD), tl.float32)
    dqb2 = tl.zeros((BLOCK_M, HALF_PAD), tl.float32)
    dqt = tl.zeros((BLOCK_M, TAIL_PAD), tl.float32)
    k_head = K + batch * sk_b + head_k * sk_h
    v_head = V + batch * sv_b + head_k * sv_h
    for start in range(0, loop_bound(k_len, PYTHON_LOOPS), BLOCK_N):
        cols, col_mask, n, n_lo, n_hi = token_block(K_POS + batch * spk_b, start, k_len, BLOCK_N)
        if (not CAUSAL) or n_lo <= m_hi:  # else every key follows every query: skipped
            ka, kb, kt = load_head(k_head + cols * sk_s, col_mask, HALF, HALF_PAD, TAIL, TAIL_PAD, INTERLEAVED)
            # The keys rotated only into the frames the tile takes
            plain, bent = _tile_passes(m_lo, m_hi, n_lo, n_hi, window, MODE)
            ka1, kb1, ka2, kb2 = _key_frames(ka, kb, n, per, leaky_per, factor, plain, bent, MODE, BF16_BY_BITS,
                                             ROTATE, FMA_BY_PARTS)
            v = tl.load(v_head + cols[:, None] * sv_s + d[None, :], mask=col_mask[:, None] & (d < V_DIM)[None, :],
                        other=0.0)
            valid = row_mask[:, None] & col_mask[None, :]
            if CAUSAL:
                valid = valid & (n[None, :] <= m[:, None])
            p, d_logits, bent_pairs = _probabilities_and_dlogits(
                qa1, qb1, qa2, qb2, qt, ka1, kb1, ka2, kb2, kt, v, do, m, n, valid, lse, delta, factors, window,
                qk_scale, softmax_scale, plain, bent, MODE, HAS_TAIL, PRECISION, BF16_BY_BITS, SCALE_AFTER,
                ROT_SCALE)
            dl = round_to_dtype(d_logits, qa.dtype, BF16_BY_BITS)
            dqa1, dqb1, dqa2, dqb2, dqt = _frame_gradients(
                dl, bent_pairs, ka1, kb1, ka2, kb2, kt, dqa1, dqb1, dqa2, dqb2, dqt, plain, bent, MODE, HAS_TAIL,
                PRECISION, BF16_BY_BITS)

    dqa, dqb = _turned_back(dqa1, dqb1, m[:, None] * per, factor, ROTATE, FMA_BY_PARTS)
    if MODE != 0:
        dqa2, dqb2 = _turned_back(dqa2, dqb2, bent_turns, factor, ROTATE, FMA_BY_PARTS)
        dqa += dqa2
        dqb += dqb2
    if ROT_SCALE != 1.0:
        dqa, dqb = dqa * ROT_SCALE, dqb * ROT_SCALE
    if SCALE_AFTER:
        dqa, dqb, dqt = dqa * softmax_scale, dqb * softmax_scale, dqt * softmax_scale
    _store_head(DQ + batch * sdq_b + rows * sdq_s + head * sdq_h, row_mask, dqa, dqb, dqt, HALF, HALF_PAD, TAIL,
                TAIL_PAD, INTERLEAVED, BF16_BY_BITS)


DKDV_LAUNCH = (16, 16, 8, 1)
"""(BLOCK_M, BLOCK_N, num_warps, num_stages) of the dk/dv kernel on a GPU unless given. Each
program holds more than the forward's (a key block, its rotations in both frames and their
gradients), and the software pipelining of the query loop (num_stages above 1) holds the next
blocks' loads besides: these sizes compile without register spills for sm_80 and sm_90 in every
variant of ``rope.kernels.targets``, with Triton 3.6 and 3.9 (``--spills``; the forward's former
64 x 32 x 8 spilled up to 6 KB per thread, 16 x 16 x 8 in 3 stages up to 208 bytes with Triton
3.6; untimed: no GPU ran it)."""

DQ_LAUNCH = (16, 32, 4, 3)
"""(BLOCK_M, BLOCK_N, num_warps, num_stages) of the dq kernel on a GPU unless given: no register
spills for sm_80 and sm_90 in every variant of ``rope.kernels.targets`` (64 x 32 x 8 spilled up
to 1.4 KB per thread; untimed)."""


def _kernel_launch(run, default, block_m, block_n, num_warps, num_stages) -> dict:
    """The sizes and launch options of one backward kernel: the caller's where given, else
    ``default`` on a GPU (the interpreter's are :func:`.triton_attention.prepare_launch`'s)."""
    chosen = dict(**run.sizes, **run.launch_options)
    if interpreting():
        return chosen
    given = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages)
    return chosen | {name: value for name, value in zip(given, default) if given[name] is None}


def launch_backward(q, k, v, q_positions, k_positions, inv_freq, out, lse, grad_out, grad_lse=None, *,
                    layout: str = "half", causal: bool = True, window: int | None = None,
                    leaky_scale: float | None = None, softmax_scale: float | None = None,
                    block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                    num_stages: int | None = None, rotate: bool = True, logn_length: int | None = None,
                    attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in the dtypes of q, k and v: the gradients of :func:`.triton_attention.launch`
    for its ``out`` and ``lse`` and the incoming ``grad_out`` (out's shape) and ``grad_lse``
    (lse's shape, float32; None for zero). The other arguments as the forward's, the same values
    (``rotate=False``: the gradients of the forward without rotation, the benchmark's baseline),
    except the launch sizes: on a GPU those not given are :data:`DKDV_LAUNCH` and :data:`DQ_LAUNCH`.
    The slices (batch row, key head) of a row whose lse leaves the kernels no float32 softmax to
    recompute (±inf, or logits beyond float32's range), or of a non-finite gradient, are recomputed
    in float64 and rounded once (:mod:`.triton_attention_repair`), except those that read a
    non-finite input (a NaN stays in its rows)."""
    run = prepare_launch(q, k, v, q_positions, k_positions, inv_freq, layout=layout, causal=causal, window=window,
                         leaky_scale=leaky_scale, softmax_scale=softmax_scale, block_m=block_m, block_n=block_n,
                         num_warps=num_warps, num_stages=num_stages, rotate=rotate, logn_length=logn_length,
                         attention_factor=attention_factor)
    check_saved(q, v, out, lse, grad_out, grad_lse)
    # contiguous, as the fake implementation's (the kernels take the strides; empty_like would keep
    # a permuted q's layout, which torch.compile's traced graph would not expect)
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    if dq.numel() == 0 or q.shape[1] == 0:
        return dq, dk.zero_(), dv.zero_()
    delta = (grad_out.float() * out.float()).sum(dim=-1).transpose(1, 2)  # D, [batch, heads_q, q_len]
    if grad_lse is not None:
        delta = delta - grad_lse
    delta = delta.contiguous()
    lse = lse.contiguous()
    batch, q_len, heads_q, _ = q.shape
    common = (run.q_positions, run.k_positions, run.inv_freq, run.leaky, run.row_scale)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3])
    scalars = (*run.runtime_scalars(q, k), run.options.scale, run.factor)
    scale_after = dict(SCALE_AFTER=scale_after_the_sums(run.options))
    dkdv = _kernel_launch(run, DKDV_LAUNCH, block_m, block_n, num_warps, num_stages)
    dq_sizes = _kernel_launch(run, DQ_LAUNCH, block_m, block_n, num_warps, num_stages)
    with launch_device(q):
        grid = (triton.cdiv(k.shape[1], dkdv["BLOCK_N"]), batch * k.shape[2])
        attention_dkdv_kernel[grid](q, k, v, grad_out, lse, delta, dk, dv, *common, *strides, *dk.stride()[:3],
                                    *dv.stride()[:3], *run.batch_strides, *scalars, **run.constants, **scale_after,
                                    **dkdv, enable_fp_fusion=False)
        grid = (triton.cdiv(q_len, dq_sizes["BLOCK_M"]), batch * heads_q)
        attention_dq_kernel[grid](q, k, v, grad_out, lse, delta, dq, *common, *strides, *dq.stride()[:3],
                                  *run.batch_strides, *scalars, **run.constants, **scale_after, **dq_sizes,
                                  enable_fp_fusion=False)
    # the slices of a row whose lse leaves no float32 softmax to recompute (±inf, or logits beyond float32's
    # range) or of a non-finite gradient, in float64
    repair_backward(run, q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv)
    return dq, dk, dv


def scale_after_the_sums(options) -> bool:
    """Whether the backward kernels apply softmax_scale s to the accumulated dq and dk rather than to each
    tile's dL: where s times the largest log-n factor exceeds 1, so that a large s (up to float32's range,
    :func:`.triton_attention.check_logit_scale`) cannot make a dL infinite in the inputs' dtype, whose
    products with zeros would give NaN. Ordinary scales keep dL = s f P (dP - D) rounded once."""
    logn = 1.0 if options.logn_length is None else max(1.0, math.log(MAX_POSITION) / math.log(options.logn_length))
    return options.scale * logn > 1.0


def check_saved(q, v, out, lse, grad_out, grad_lse) -> None:
    """The forward's outputs and their gradients: out and grad_out of q's dtype and out's shape with a
    contiguous last dimension, lse and grad_lse float32 [batch, heads_q, q_len], all on q's device."""
    batch, q_len, heads_q, _ = q.shape
    shapes = dict(out=(batch, q_len, heads_q, v.shape[3]), lse=(batch, heads_q, q_len))
    tensors = dict(out=out, lse=lse, grad_out=grad_out) | ({} if grad_lse is None else dict(grad_lse=grad_lse))
    for name, t in tensors.items():
        dtype = torch.float32 if name.endswith("lse") else q.dtype
        _checks.float_tensor(name, t, dtypes=(dtype,))
        expected = shapes[name.removeprefix("grad_")]
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must have shape {list(expected)}, got {list(t.shape)}")
    if grad_out.numel() and grad_out.stride(3) != 1:
        raise ValueError(f"grad_out must have a contiguous last dimension, got strides {grad_out.stride()}")
    _checks.same_device("q", q, **tensors)
