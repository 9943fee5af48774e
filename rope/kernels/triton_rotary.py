"""The fused Triton RoPE kernel: q and k rotated in one launch.

For pair i = (x_a, x_b) of a head of the token at integer position m (RoFormer eq. 34),

    y_a = s (x_a cos(m theta_i) - x_b sin(m theta_i)),   y_b = s (x_b cos(m theta_i) + x_a sin(m theta_i)),

with s the attention factor and the sign of the sines flipped for the conjugate (transpose)
rotation, which is also the backward pass. The pairs are those of the ``rotary_dim`` coordinates
from ``ROTARY_START`` (0, or head_dim - rotary_dim for ``rotated="last"``: DeepSeek-V4,
:mod:`rope.layouts`), a compile-time offset added to the pointers; the other coordinates are copied.

Three compile-time variants of the arithmetic (the ``MATH`` constexpr, :data:`MATHS`), none with a
table of cos/sin per position (float-float math reads one 4 KB table of 257 angles):

* **float32 math** (float32 inputs, or ``launch(..., float64_math=False)``). The angle is reduced
  exactly (see :mod:`rope.angles`): the kernel turns float32 theta_i into the 64-bit fixed-point
  turns T_i, multiplies by the int64 position (wrapping modulo 2^64), and evaluates cos/sin of the
  angle, already in [-pi, pi), from its quarter turn and Taylor polynomials
  (:func:`cos_sin_of_int32_turns`).
* **float-float math** (float16 and bfloat16 inputs, by default): no float64 arithmetic at all
  (:mod:`rope.kernels.float_float`). T_i to 126 bits and (m T_i) mod 1 in integer arithmetic, for
  every int64 m; sigma cos and sigma sin of the exactly reduced angle as pairs of float32 numbers,
  once per (token, pair) and shared by the program's heads (a 257-row table of 2 pi j 2^-11 and
  three Taylor terms of the rest, joined by the angle-addition formulas); per element Dekker's
  products by fused multiply-adds, a TwoSum and a Fast2Sum give the float-float value z + r of
  the rotation, z rounded to odd by r, and the float32 -> float16/bfloat16 conversion rounds that
  once: correctly rounded except within a stated distance of a rounding tie.
* **float64 math** (float64 inputs, or ``float64_math=True`` for the others): the kernel computes
  T_i to 126 bits and float64 cos/sin of the exactly reduced angle, each within 2^-52
  (:mod:`rope.kernels.exact_turns`, the torch path's arithmetic); the attention factor and the
  products are applied without rounding error (Dekker's products by fused multiply-adds, a
  TwoSum), so the only errors are those of cos/sin and one rounding: float16 and bfloat16 outputs
  are correctly rounded, as on the torch path, at the price of about 25 float64 operations per
  element, which GPUs with slow float64 (a T4: 1/32 of float32's rate) cannot afford; no launch
  takes it for them unless asked.

Every multiply-add is an explicit ``tl.fma`` and the kernel is compiled with
``enable_fp_fusion=False``, so the compiler contracts nothing else: Triton's CPU interpreter,
which the test suite runs, performs the GPU's float arithmetic operation for operation. The
exceptions are the bfloat16 conversions, which the interpreter gets wrong (it truncates float32
to bfloat16 and loses bfloat16 subnormals on the way back): under the interpreter the kernel
converts by bit arithmetic instead (``BF16_BY_BITS``), the same functions as the GPU's; and an
interpreter whose fma rounds twice (Triton 3.6's) gets a correctly rounded one computed by parts
(``FMA_BY_PARTS``, :mod:`rope.kernels.emulation`).

Accuracy. Let y be the exact value of an output (exact angle m theta_i for the float32 value
theta_i, exact cos/sin, exact products), |pair| = s sqrt(x_a^2 + x_b^2), and u = 2^-24. For
attention factors s in :data:`rope.limits.KERNEL_SCALE_RANGE` (float32 math: and |m| < 2^31;
the others take every int64 m), every output is RN(v), the output dtype's rounding to nearest
even of a number v with |v - y| <= Delta:

    float32 math:      Delta = c u |pair| + 2^-148 max(1, s),  c = 5 (float32), 6 (float16, bfloat16);
    float-float math:  Delta = 2^-43 |pair| + 2^-145 max(1, s)   (float16, bfloat16);
    float64 math:      Delta = 2^-51 |pair| + 2^-1070 s.

Hence |out - y| <= ulp(y)/2 + 2 Delta (float64 math: half an ulp plus 2^-50 |pair|, the torch
path's promise, away from float64's subnormal range), an output is +-inf only where |y| is beyond
the dtype's range or within Delta of its edge, and a finite input never gives NaN. An output is
the correct rounding of y unless y lies within Delta of a tie between two numbers of the output
dtype, where it may be the other one: for float32 math's float16/bfloat16 outputs
(``float64_math=False``) that is 6 u |pair|, for their default float-float math 2^-43 |pair|
(2^-35 of a bfloat16 ulp of a pair's largest output: about one output in 10^10 of random data),
for float64 math 2^-51 |pair|. Why:

* cos/sin. T_i is within 8 units of 2^-64 turns (theta_i < 2^16) and the top 32 bits of
  (m T_i) mod 2^64 are kept, so the angle is off by less than 2 pi (2^-30 + 2^-32) = 0.123 u;
  the float32 evaluation is within 1.22 u of cos and sin of that angle (a sweep over all 2^30
  remainders, tests/test_triton_rotary.py): E = 1.35 u bounds both errors.
* products. c = RN(sigma cos), s' = RN(sigma sin) with sigma = RN(s) for s <= 1, or for s > 1
  sigma = RN(s 2^-k) in [1/2, 1] and the result times 2^k (``SCALE_AFTER``; exact), so that
  |c|, |s'| <= 1 and no intermediate overflows; then y_a = fma(x_a, c, -RN(x_b s')) and
  y_b = fma(x_b, c, RN(x_a s')). Each coefficient is within s (2u + E) of s cos, s sin, and
  |x_a cos| + |x_b sin| <= |pair| / s, |x_a| + |x_b| <= sqrt 2 |pair| / s, so the value the fma
  rounds is within (3u + sqrt 2 E) |pair| = 4.91 u |pair| of y, plus 2^-150 2^k where RN(x_b s')
  or, before the scaling by 2^k, the result underflows. A float16/bfloat16 output is rounded from
  the float32 result: one more u |pair| (and 2^-150 2^k).
* float-float math (chapter 18 proves each step, with interval bounds in exact rational
  arithmetic, ending in 2^-43.88 |pair|). The turns are exact but for their 126-bit T_i and the
  two lowest columns of m T_i (below 2^-60 turns); the rest angle a = a_hi + a_lo is within 2^-54;
  cos a - 1 and sin a by three Taylor terms within 2^-52.8 (|a| <= pi 2^-11); the table's pairs
  within 2^-49; the angle-addition formulas, whose products of high parts are exact and whose sums
  with the table's value are Fast2Sums, add roundings of their low parts: the pairs are within
  2^-46.5 of cos and sin; the attention factor's sigma = s 2^-k (a float32 pair within 2^-49
  sigma of it) times them, within 2^-45.1 sigma = eps. Per element, with W = |x_a c_hi| +
  |x_b s_hi| <= (1 + 2u)(1 + sqrt 2 eps) |pair|: x_a c_hi and x_b s_hi as exact sums P + E
  (Dekker), their difference as S + e (TwoSum), the small terms E1 + x_a c_lo, E2 + x_b s_lo,
  their difference and e rounded in four roundings of at most 2u W, 2u W, 3u W: 7.0000005 u^2 W;
  then (z, r) = Fast2Sum(S, L) is exact (S dominates L, or, where P1 - P2 cancels, S is exact and a
  multiple of L's unit in the last place). The error of the pairs adds sqrt 2 eps |pair|. z rounded
  to odd by r, then to float16 or bfloat16 (at most 11 of float32's 24 bits), is RN(z + r) (Boldo
  and Melquiond). Headroom: sigma <= 1 for float16 and <= 1/2 for bfloat16 (``SCALE_AFTER``
  applies 2^k, exactly, where s exceeds that), so no float32 sum overflows. Underflow: six
  roundings of at most 2^-150 where products are below float32's normal range, and the rounding
  to odd on float32's subnormal grid, times 2^k <= max(1, 4 s): 2^-145 max(1, s).
* float64 math. cos and sin are within 2^-52, so (|x_a| + |x_b|) s 2^-52 <= 2^-51.5 |pair|; the
  attention factor enters as s = sigma 2^k with sigma in [1/4, 1/2) (exact) and the products are
  exact (Dekker's product by an fma, TwoSum), which keeps every intermediate finite; the scaling
  by 2^k adds at most one float64 rounding, 2^-53 |pair|, where the result is subnormal. Underflow
  in the error-free products adds a few 2^-1075 (times 2^k).

M-RoPE (:mod:`rope.mrope`) is the same kernel with a position per pair: pair i of a token reads
row ``axes[i]`` (t, h or w) of ``[3, ...]`` position ids.

Grid: (token blocks, head blocks of q then of k, batch). Each program computes its
``BLOCK_S x rotary_dim/2`` angles once and rotates ``BLOCK_S x BLOCK_H`` heads with them. At
decode (one token per sequence) the batch is read as the token axis, so that a program still
holds BLOCK_S tokens. q and k may be strided views (e.g. slices of a packed qkv projection);
only the last dimension must be contiguous.

No GPU ran this version: the interpreter tests check the arithmetic, ``rope.kernels.targets``
that it compiles for sm_75/80/90; speed is untimed. Per element of bfloat16 a thread issues, on
sm_90 (``python -m rope.kernels.targets --code 90``), about 13 instructions in float32 math (0.8
of them float64: its 64-bit turns), 41 in float-float math (37 where a program takes 5 blocks of
8 heads, sharing one angle computation among 40 heads) with none on float64, and 73 in float64
math, 33 of them float64 arithmetic or conversions.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import struct
from fractions import Fraction

import torch
import triton
import triton.language as tl

from .. import _checks
from ..angles import INV_TWO_PI_PIECES, TWO_PI, inverse_two_pi_windows
from ..layouts import ROTATED, rotary_start
from ..limits import KERNEL_SCALE_RANGE, MAX_POSITION
from .emulation import fma, interpreter_rounds_fma_twice
from .exact_turns import by_quadrant, exact_cos_sin
from .float_float import cos_sin_table, rotated_pair, scaled_cos_sin


def _float32(value) -> float:
    """``value`` rounded to the nearest float32 number (IEEE 754 round-to-nearest-even of the packing)."""
    return struct.unpack("f", struct.pack("f", float(value)))[0]


# The four pieces of 1/(2 pi), compiled in as float64 immediates (no load on the angle's path).
_PIECE_0, _PIECE_1, _PIECE_2, _PIECE_3 = (tl.constexpr(piece) for piece in INV_TWO_PI_PIECES)

# 2 pi / 2^32 as a float32 sum hi + lo (relative error 1e-15), the radians of one unit of t.
_UNIT_HI = tl.constexpr(_float32(TWO_PI / 2**32))
_UNIT_LO = tl.constexpr(_float32(TWO_PI / 2**32 - Fraction(_UNIT_HI.value)))

# Taylor coefficients of cos_sin_of_int32_turns, +-1/n! rounded to float32.
_S3, _S5, _S7, _S9 = (tl.constexpr(_float32((-1) ** (n // 2) / math.factorial(n))) for n in (3, 5, 7, 9))
_C2, _C4, _C6, _C8, _C10 = (tl.constexpr(_float32((-1) ** (n // 2) / math.factorial(n))) for n in (2, 4, 6, 8, 10))


@triton.jit
def _phase_part(theta, piece):
    """frac(theta * piece) in units of 2^-64 turns, as int64 (wrapping)."""
    x = theta * piece  # exact: 24-bit times 26-bit significands
    fraction = x - x.to(tl.int64).to(tl.float64)  # exact, in (-1, 1)
    return (fraction * 9223372036854775808.0).to(tl.int64) * 2  # 2^63 units, times 2, wraps


@triton.jit
def fixed_point_phase(theta):
    """T = frac(theta / 2 pi) * 2^64 mod 2^64 as int64, within 8 units (two per truncated piece);
    theta float64 holding a float32 value below 2^16."""
    return (_phase_part(theta, _PIECE_0) + _phase_part(theta, _PIECE_1) + _phase_part(theta, _PIECE_2)
            + _phase_part(theta, _PIECE_3))


@triton.jit
def cos_sin_of_int32_turns(turns, FMA_BY_PARTS: tl.constexpr):
    """float32 cos and sin of 2 pi turns / 2^32, for int64 ``turns`` in [-2^31, 2^31): the
    kernel's cos and sin (a device function, for ``@triton.jit`` code).

    The quadrant q = round(turns / 2^30) comes from the integer, exactly; the rest r, |r| <= 2^29,
    is split into a multiple of 256 and the low byte (both exact in float32) so that the angle
    x = r 2 pi / 2^32 in [-pi/4, pi/4] is formed with one rounding. There Taylor polynomials
    through x^9 (sine) and x^10 (cosine) are within 2e-9 of the functions (the next terms,
    (pi/4)^11/11! and (pi/4)^12/12!), evaluated by Horner's rule in fused multiply-adds. Then
    cos(x + q pi/2) and sin(x + q pi/2) are cos x and sin x swapped and negated by q mod 4. No
    range reduction, no branch: the accurate library sine would reduce an angle that is already
    reduced. Within 1.22 2^-24 of cos and sin of 2 pi turns / 2^32 for every ``turns``."""
    quadrant = (turns + (1 << 29)) >> 30  # in {-2, ..., 2}
    rest = (turns - (quadrant << 30)).to(tl.int32)  # in [-2^29, 2^29]
    low = rest & 255
    high = (rest - low).to(tl.float32)  # at most 22 significant bits: exact
    x = fma(high, _UNIT_HI, fma(low.to(tl.float32), _UNIT_HI, high * _UNIT_LO, FMA_BY_PARTS), FMA_BY_PARTS)
    x2 = x * x
    p = fma(x2, _S9, _S7, FMA_BY_PARTS)
    p = fma(p, x2, _S5, FMA_BY_PARTS)
    p = fma(p, x2, _S3, FMA_BY_PARTS)
    sin = fma(x * x2, p, x, FMA_BY_PARTS)
    q = fma(x2, _C10, _C8, FMA_BY_PARTS)
    q = fma(q, x2, _C6, FMA_BY_PARTS)
    q = fma(q, x2, _C4, FMA_BY_PARTS)
    q = fma(q, x2, _C2, FMA_BY_PARTS)
    cos = fma(x2, q, 1.0, FMA_BY_PARTS)
    return by_quadrant(quadrant, cos, sin)


@triton.jit
def _computed_cos_sin(pos, FREQ, HALF: tl.constexpr, HALF_PAD: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    """float32 cos(m theta_i) and sin(m theta_i), [BLOCK_S, HALF_PAD], from exactly reduced
    angles; ``pos`` is the int64 [BLOCK_S, HALF_PAD] position of each pair (:func:`_positions`)."""
    j = tl.arange(0, HALF_PAD)
    theta = tl.load(FREQ + j, mask=j < HALF, other=0.0).to(tl.float32).to(tl.float64)
    turns = pos * fixed_point_phase(theta)[None, :]  # (m T) mod 2^64, signed: [-pi, pi)
    return cos_sin_of_int32_turns(turns >> 32, FMA_BY_PARTS)  # the top 32 bits suffice for float32


@triton.jit
def _product(a, b, FMA_BY_PARTS: tl.constexpr):
    """(p, e) with p = RN(a b) and p + e = a b exactly (unless a b underflows)."""
    p = a * b
    return p, fma(a, b, -p, FMA_BY_PARTS)


@triton.jit
def _difference_of_products(a, c_hi, c_lo, b, s_hi, s_lo, FMA_BY_PARTS: tl.constexpr):
    """a (c_hi + c_lo) - b (s_hi + s_lo) in float64, rounded once up to a few 2^-106 (|a c| + |b s|):
    the products a c_hi, b s_hi and their difference are error-free transformations (Dekker's
    product by an fma, Knuth's TwoSum), the remaining terms are below 2^-52 of the result's scale."""
    p, p_err = _product(a, c_hi, FMA_BY_PARTS)
    q, q_err = _product(b, s_hi, FMA_BY_PARTS)
    d = p - q
    z = d - p
    d_err = (p - (d - z)) - (q + z)
    return d + (d_err + ((p_err - q_err) + (a * c_lo - b * s_lo)))


@triton.jit
def _round_to_odd_float32(y, BFLOAT16: tl.constexpr):
    """float64 ``y`` rounded to float32 *to odd* (toward zero, the last bit set if anything was
    dropped), so that rounding the result to float16 or bfloat16 is rounding ``y`` once (Boldo
    and Melquiond, "When double rounding is odd", 2005). On the bit pattern: clear the 29
    significand bits float32 lacks and set the lowest kept one if any was set (NaN stays NaN).
    Below 2^-126 float32 is subnormal; only bfloat16 reaches there, and gets the same on the
    float32 subnormal grid (multiples of 2^-149)."""
    bits = y.to(tl.int64, bitcast=True)
    dropped = bits & 0x1FFFFFFF
    sticky = (dropped + 0x1FFFFFFF) & 0x20000000  # bit 29 set iff a dropped bit was
    odd = ((bits - dropped) | sticky).to(tl.float64, bitcast=True).to(tl.float32)
    if BFLOAT16:
        small = tl.abs(y) < 1.1754943508222875e-38  # 2^-126
        magnitude = tl.where(small, tl.abs(y), 0.0) * 7.1362384635297994e44  # in units of 2^-149: below 2^23
        units = magnitude.to(tl.int64)
        units = units | (units.to(tl.float64) != magnitude).to(tl.int64)
        tiny = (units.to(tl.float64) * 7.888609052210118e-31 * 1.7763568394002505e-15).to(tl.float32)  # 2^-149
        odd = tl.where(small, tl.where(y < 0, -tiny, tiny), odd)
    return odd


@triton.jit
def _bfloat16_by_bits(y):
    """float32 ``y`` rounded to bfloat16, to nearest even, by integer arithmetic on its bits
    (overflow gives inf, NaN stays NaN): what a GPU's conversion does, for Triton's interpreter."""
    bits = y.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(y != y, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def widened(x, dtype: tl.constexpr, BF16_BY_BITS: tl.constexpr):
    """``x`` converted (exactly) to float32 or float64; bfloat16 with ``BF16_BY_BITS`` as the upper
    half of a float32 bit pattern (Triton's interpreter loses bfloat16 subnormals)."""
    if x.dtype == tl.bfloat16 and BF16_BY_BITS:
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def round_to_dtype(y, dtype: tl.constexpr, BF16_BY_BITS: tl.constexpr):
    """float32 or float64 ``y`` rounded once to ``dtype``, to nearest even: how the kernel writes
    its outputs (a device function, for ``@triton.jit`` code). float64 to float16 or bfloat16
    goes through float32 rounded to odd (:func:`_round_to_odd_float32`), which makes the second
    rounding exact; ``BF16_BY_BITS`` converts to bfloat16 by integer arithmetic
    (:func:`_bfloat16_by_bits`), as Triton's interpreter must."""
    if y.dtype == tl.float64:
        if dtype == tl.float16 or dtype == tl.bfloat16:
            y = _round_to_odd_float32(y, dtype == tl.bfloat16)
    if dtype == tl.bfloat16 and BF16_BY_BITS:
        out = _bfloat16_by_bits(y)
    else:
        out = y.to(dtype)
    return out


@triton.jit
def _head_block(Q, K, QO, KO, block, blocks_q, batch, s, s_mask, heads_q, heads_k,
                sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h,
                BLOCK_H: tl.constexpr):
    """Pointers to coordinate 0 of the [BLOCK_S, BLOCK_H] heads of head block ``block`` (q's
    blocks first, then k's), in the input and the output, and the mask of real rows."""
    if block < blocks_q:
        h = (block * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
        row_mask = s_mask[:, None, None] & (h < heads_q)[None, :, None]
        x_row = Q + batch * sq_b + s[:, None, None] * sq_s + h[None, :, None] * sq_h
        o_row = QO + batch * sqo_b + s[:, None, None] * sqo_s + h[None, :, None] * sqo_h
    else:
        h = ((block - blocks_q) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
        row_mask = s_mask[:, None, None] & (h < heads_k)[None, :, None]
        x_row = K + batch * sk_b + s[:, None, None] * sk_s + h[None, :, None] * sk_h
        o_row = KO + batch * sko_b + s[:, None, None] * sko_s + h[None, :, None] * sko_h
    return x_row, o_row, row_mask


@triton.jit
def pair_offsets(HALF: tl.constexpr, HALF_PAD: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Offsets (a_i, b_i) of the two coordinates of pair i, and the mask of real pairs, [HALF_PAD]
    (the attention kernels use it too)."""
    j = tl.arange(0, HALF_PAD)
    if INTERLEAVED:
        a = 2 * j
        b = 2 * j + 1
    else:
        a = j
        b = j + HALF
    return a, b, j < HALF


@triton.jit
def _rotate_and_store(x_row, o_row, row_mask, xa, xb, c_hi, c_lo, s_hi, s_lo, power, power64,
                      HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
                      INTERLEAVED: tl.constexpr, COPY_TAIL: tl.constexpr, MATH: tl.constexpr,
                      SCALE_AFTER: tl.constexpr, BF16_BY_BITS: tl.constexpr, FMA_BY_PARTS: tl.constexpr,
                      ROTARY_START: tl.constexpr):
    """Write the rotated pairs (xa, xb were loaded from x_row + ROTARY_START) and, out of place,
    the TAIL coordinates that pass through: after the block, or before it where ROTARY_START > 0.

    float32 math: y_a = fma(x_a, c, -RN(x_b s')), y_b = fma(x_b, c, RN(x_a s')), times 2^k with
    SCALE_AFTER. float-float math: :func:`.float_float.rotated_pair` (rounded to odd), times 2^k
    with SCALE_AFTER. float64 math: :func:`_difference_of_products` with the coefficients
    c_hi + c_lo, s_hi + s_lo, times 2^k."""
    a, b, j_mask = pair_offsets(HALF, HALF_PAD, INTERLEAVED)
    a, b, j_mask = a[None, None, :], b[None, None, :], j_mask[None, None, :]
    mask = row_mask & j_mask
    if MATH == "float-float":
        ca, cb, sa, sb = c_hi[:, None, :], c_lo[:, None, :], s_hi[:, None, :], s_lo[:, None, :]
        xa32 = widened(xa, tl.float32, BF16_BY_BITS)
        xb32 = widened(xb, tl.float32, BF16_BY_BITS)
        ya = rotated_pair(xa32, xb32, ca, cb, sa, sb, FMA_BY_PARTS)
        yb = rotated_pair(xb32, -xa32, ca, cb, sa, sb, FMA_BY_PARTS)
        if SCALE_AFTER:
            ya = ya * power  # 2^k: exact, or beyond the range (then so is y)
            yb = yb * power
    elif MATH == "float64":
        ca, cb, sa, sb = c_hi[:, None, :], c_lo[:, None, :], s_hi[:, None, :], s_lo[:, None, :]
        xa64 = widened(xa, tl.float64, BF16_BY_BITS)
        xb64 = widened(xb, tl.float64, BF16_BY_BITS)
        ya = _difference_of_products(xa64, ca, cb, xb64, sa, sb, FMA_BY_PARTS) * power64
        yb = _difference_of_products(xb64, ca, cb, -xa64, sa, sb, FMA_BY_PARTS) * power64
    else:
        c = c_hi[:, None, :]
        s = s_hi[:, None, :]
        xa32 = widened(xa, tl.float32, BF16_BY_BITS)
        xb32 = widened(xb, tl.float32, BF16_BY_BITS)
        ya = fma(xa32, c, -(xb32 * s), FMA_BY_PARTS)
        yb = fma(xb32, c, xa32 * s, FMA_BY_PARTS)
        if SCALE_AFTER:
            ya = ya * power
            yb = yb * power
    tl.store(o_row + ROTARY_START + a, round_to_dtype(ya, xa.dtype, BF16_BY_BITS), mask=mask)
    tl.store(o_row + ROTARY_START + b, round_to_dtype(yb, xb.dtype, BF16_BY_BITS), mask=mask)
    if COPY_TAIL:
        if ROTARY_START:  # the block is last: the coordinates before it pass through
            t = tl.arange(0, TAIL_PAD)
        else:
            t = 2 * HALF + tl.arange(0, TAIL_PAD)
        tail_mask = row_mask & (tl.arange(0, TAIL_PAD) < TAIL)[None, None, :]
        tail = tl.load(x_row + t[None, None, :], mask=tail_mask)
        tl.store(o_row + t[None, None, :], tail, mask=tail_mask)


@triton.jit
def _load_pairs(x_row, row_mask, HALF: tl.constexpr, HALF_PAD: tl.constexpr, INTERLEAVED: tl.constexpr,
                ROTARY_START: tl.constexpr):
    a, b, j_mask = pair_offsets(HALF, HALF_PAD, INTERLEAVED)
    a, b, j_mask = a[None, None, :] + ROTARY_START, b[None, None, :] + ROTARY_START, j_mask[None, None, :]
    mask = row_mask & j_mask
    return tl.load(x_row + a, mask=mask, other=0.0), tl.load(x_row + b, mask=mask, other=0.0)


@triton.jit
def _positions(POS, AXES, batch, s, s_mask, sp_b, sp_s, sp_a, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
               MROPE: tl.constexpr):
    """int64 [BLOCK_S, HALF_PAD]: the position pair i of each token turns by, the token's own, or
    with M-RoPE row AXES[i] (0 t, 1 h, 2 w) of the [3, ...] position ids. Loaded in the shape of
    the angles, the positions need no layout conversion through shared memory before the product
    with the turns (``python -m rope.kernels.targets --code`` shows the machine code)."""
    j = tl.arange(0, HALF_PAD)
    if MROPE:
        row_of_pair = tl.load(AXES + j, mask=j < HALF, other=0).to(tl.int64) * sp_a
    else:
        row_of_pair = tl.zeros((HALF_PAD,), dtype=tl.int64)
    pos = tl.load((POS + batch * sp_b + s * sp_s)[:, None] + row_of_pair[None, :], mask=s_mask[:, None], other=0)
    return pos.to(tl.int64)


@triton.jit
def _coefficients(POS, FREQ, AXES, WINDOWS, TABLE, batch, s, s_mask, sp_b, sp_s, sp_a, scale, scale_lo, scale64,
                  HALF: tl.constexpr, HALF_PAD: tl.constexpr, CONJUGATE: tl.constexpr, MATH: tl.constexpr,
                  MROPE: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    """(c_hi, c_lo, s_hi, s_lo), [BLOCK_S, HALF_PAD]: the attention factor's sigma times cos and
    (negated for the conjugate) sin. float32 math: RN(sigma cos) and RN(sigma sin), the low parts
    unused; float-float math: float32 pairs within 2^-46 sigma (:func:`.float_float.scaled_cos_sin`,
    sigma = scale + scale_lo); float64 math: sigma cos = c_hi + c_lo exactly, and the same for sin."""
    pos = _positions(POS, AXES, batch, s, s_mask, sp_b, sp_s, sp_a, HALF, HALF_PAD, MROPE)
    if MATH == "float-float":
        j = tl.arange(0, HALF_PAD)
        theta = tl.load(FREQ + j, mask=j < HALF, other=0.0).to(tl.float32)
        c_hi, c_lo, s_hi, s_lo = scaled_cos_sin(pos, theta[None, :], WINDOWS, TABLE, scale, scale_lo, FMA_BY_PARTS)
    elif MATH == "float64":
        j = tl.arange(0, HALF_PAD)
        theta = tl.load(FREQ + j, mask=j < HALF, other=0.0).to(tl.float32)
        cos, sin = exact_cos_sin(pos, theta[None, :], WINDOWS, FMA_BY_PARTS)
        c_hi, c_lo = _product(cos, scale64, FMA_BY_PARTS)
        s_hi, s_lo = _product(sin, scale64, FMA_BY_PARTS)
    else:
        cos, sin = _computed_cos_sin(pos, FREQ, HALF, HALF_PAD, FMA_BY_PARTS)
        c_hi = cos * scale
        s_hi = sin * scale
        c_lo = c_hi
        s_lo = s_hi
    if CONJUGATE:
        s_hi = -s_hi
        s_lo = -s_lo
    return c_hi, c_lo, s_hi, s_lo


@triton.jit
def rotary_kernel(
    # Tensors: q and k; their outputs (q and k themselves in place); what the angles are made of:
    # the positions, the frequencies, with MROPE each pair's row of the positions, and for float64
    # math the windows of 1/(2 pi) (rope.angles.inverse_two_pi_windows)
    Q, K,
    QO, KO,
    POS, FREQ, AXES,
    WINDOWS, TABLE,
    # Strides (batch, token, head) of q, k, q_out and k_out, in elements; their last dimension is contiguous
    sq_b, sq_s, sq_h,
    sk_b, sk_s, sk_h,
    sqo_b, sqo_s, sqo_h,
    sko_b, sko_s, sko_h,
    # Strides of the positions (batch, token, M-RoPE row)
    sp_b, sp_s, sp_a,
    # Sizes
    seq_len, heads_q, heads_k,
    tokens_bucket,  # batch * seq_len rounded up to a power of two: only keys the autotuning cache
    # The attention factor: float32 math (scale, power = 2^k), float-float math (scale + scale_lo,
    # power = 2^k), float64 math (scale64, power64)
    scale, scale_lo, power,
    scale64: tl.float64, power64: tl.float64,
    # Compile time: widths, layout, variants of the arithmetic (kernel_constants)
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, COPY_TAIL: tl.constexpr, MATH: tl.constexpr,
    SCALE_AFTER: tl.constexpr, MROPE: tl.constexpr, BF16_BY_BITS: tl.constexpr, FMA_BY_PARTS: tl.constexpr,
    ROTARY_START: tl.constexpr,
    # Launch sizes (autotuned on a GPU)
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, GROUP: tl.constexpr,
):
    """Program (i, g, b): tokens [i BLOCK_S, (i + 1) BLOCK_S) of batch row b, head blocks
    [g GROUP, (g + 1) GROUP) of the list (q's head blocks, then k's). The first block's loads are
    issued before the angle arithmetic, so that memory latency and the math overlap. Both reads
    POS, FREQ (and AXES with MROPE); float32 math (MATH "float32") takes the float32 ``scale`` and
    ``power``, float-float math ("float-float") the WINDOWS of 1/(2 pi), the cos/sin TABLE and the
    float32 ``scale``, ``scale_lo`` and ``power``, float64 math ("float64") the WINDOWS and the
    float64 ``scale64`` and ``power64``.
    Launched by :func:`launch`, which documents the arguments."""
    batch = tl.program_id(2).to(tl.int64)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = s < seq_len
    s = s.to(tl.int64)
    blocks_q = tl.cdiv(heads_q, BLOCK_H)
    blocks = blocks_q + tl.cdiv(heads_k, BLOCK_H)

    first = tl.program_id(1) * GROUP  # always < blocks: the grid has cdiv(blocks, GROUP) columns
    x_row, o_row, row_mask = _head_block(Q, K, QO, KO, first, blocks_q, batch, s, s_mask, heads_q, heads_k,
                                         sq_b, sq_s, sq_h, sk_b, sk_s, sk_h,
                                         sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h, BLOCK_H)
    xa, xb = _load_pairs(x_row, row_mask, HALF, HALF_PAD, INTERLEAVED, ROTARY_START)
    c_hi, c_lo, s_hi, s_lo = _coefficients(POS, FREQ, AXES, WINDOWS, TABLE, batch, s, s_mask, sp_b, sp_s, sp_a,
                                           scale, scale_lo, scale64, HALF, HALF_PAD, CONJUGATE, MATH, MROPE,
                                           FMA_BY_PARTS)
    _rotate_and_store(x_row, o_row, row_mask, xa, xb, c_hi, c_lo, s_hi, s_lo, power, power64, HALF, HALF_PAD,
                      TAIL, TAIL_PAD, INTERLEAVED, COPY_TAIL, MATH, SCALE_AFTER, BF16_BY_BITS, FMA_BY_PARTS,
                      ROTARY_START)
    for i in tl.static_range(1, GROUP):
        if first + i < blocks:
            x_row, o_row, row_mask = _head_block(Q, K, QO, KO, first + i, blocks_q, batch, s, s_mask, heads_q,
                                                 heads_k, sq_b, sq_s, sq_h, sk_b, sk_s, sk_h,
                                                 sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h, BLOCK_H)
            xa, xb = _load_pairs(x_row, row_mask, HALF, HALF_PAD, INTERLEAVED, ROTARY_START)
            _rotate_and_store(x_row, o_row, row_mask, xa, xb, c_hi, c_lo, s_hi, s_lo, power, power64, HALF,
                              HALF_PAD, TAIL, TAIL_PAD, INTERLEAVED, COPY_TAIL, MATH, SCALE_AFTER,
                              BF16_BY_BITS, FMA_BY_PARTS, ROTARY_START)


TUNING_CANDIDATES = [(1, 16, 1, 2), (2, 8, 1, 2), (4, 4, 1, 2), (8, 4, 1, 2), (2, 16, 1, 4), (2, 32, 1, 4),
                     (2, 16, 4, 4), (4, 8, 2, 4)]
"""(BLOCK_S, BLOCK_H, GROUP, num_warps) tried for float32 math on first use of a shape on a GPU:
the leaders of a sweep over the benchmark shapes on an H100 (benchmarks/tune_blocks.py)."""

FLOAT64_TUNING_CANDIDATES = [(1, 16, 1, 4), (2, 8, 1, 4), (4, 4, 1, 4), (4, 8, 1, 8), (2, 16, 1, 8), (1, 32, 1, 8),
                             (1, 16, 2, 4), (2, 8, 2, 4)]
"""The candidates for float64 math: tiles of 8 pairs per thread (BLOCK_S x BLOCK_H x 64 pairs of a
128-wide head over 32 num_warps threads), about 128 registers and no spills on sm_80 and sm_90.
float64 math keeps several times float32 math's live values per pair: at 16 pairs per thread,
the tiles of :data:`TUNING_CANDIDATES`, it takes all 255 registers and 5 of those 8 spill to local
memory on sm_90, 6 on sm_80 (``python -m rope.kernels.targets --spills``; untimed: no GPU ran it)."""


AUTOTUNE_FROM_TOKENS = 256
"""The fewest tokens (batch x seq) :func:`launch` autotunes for on a GPU; fewer take
:func:`few_token_sizes`, chosen without a sweep (launch latency dominates there)."""


FLOAT_FLOAT_TUNING_CANDIDATES = [(1, 16, 1, 2), (2, 8, 1, 2), (1, 8, 5, 2), (1, 8, 5, 1), (2, 8, 5, 4),
                                 (4, 8, 5, 8), (2, 8, 2, 2), (1, 16, 2, 2)]
"""The candidates for float-float math. Its per-(token, pair) work (the exact turns, the cos/sin
pairs) is shared by the BLOCK_H x GROUP heads of a program, so programs of 5 blocks of 8 heads
(the 32 + 8 heads of a grouped-query model in one program) join float32 math's tiles: with them
the roofline of ``python -m rope.kernels.targets --roofline`` rates the prefill shape memory-bound
on a T4, an A100 and an H100 (about 34 to 37 instructions per element; no spills on sm_75, sm_80,
sm_90). Untimed: no GPU ran it."""

MATHS = ("float32", "float-float", "float64")
"""The kernel's arithmetic (its ``MATH`` constexpr; module docstring)."""


def default_math(dtype: torch.dtype, float64_math: bool | None = None) -> str:
    """The math :func:`launch` takes for q/k of ``dtype``: with ``float64_math`` None, float32 math
    for float32, float-float math for float16 and bfloat16, float64 math for float64; True takes
    float64 math and False float32 math for any of them but float64 (refused: ``ValueError``)."""
    if float64_math is None:
        return {torch.float32: "float32", torch.float64: "float64"}.get(dtype, "float-float")
    if _checks.flag("float64_math", float64_math):
        return "float64"
    if dtype == torch.float64:
        raise ValueError("float64_math=False: float64 q and k take float64 math (expected True or None)")
    return "float32"


def candidates_of(arithmetic: str) -> list[tuple[int, int, int, int]]:
    """The launch sizes (BLOCK_S, BLOCK_H, GROUP, num_warps) the autotuner tries for ``arithmetic``,
    one of :data:`MATHS`."""
    return {"float32": TUNING_CANDIDATES, "float-float": FLOAT_FLOAT_TUNING_CANDIDATES,
            "float64": FLOAT64_TUNING_CANDIDATES}[arithmetic]


def _candidates_of_the_math(configs, named_args, **kwargs):
    """The candidates of the launch's math (:func:`candidates_of`)."""
    by_size = {(config.kwargs["BLOCK_S"], config.kwargs["BLOCK_H"], config.kwargs["GROUP"], config.num_warps): config
               for config in configs}
    return [by_size[size] for size in candidates_of(kwargs["MATH"]) if size in by_size]


tuned_kernel = triton.autotune(
    configs=[triton.Config({"BLOCK_S": s, "BLOCK_H": h, "GROUP": g}, num_warps=w)
             for s, h, g, w in dict.fromkeys(TUNING_CANDIDATES + FLOAT_FLOAT_TUNING_CANDIDATES
                                             + FLOAT64_TUNING_CANDIDATES)],
    key=["tokens_bucket", "heads_q", "heads_k", "HALF", "TAIL", "INTERLEAVED", "MATH", "MROPE", "ROTARY_START"],
    prune_configs_by={"early_config_prune": _candidates_of_the_math},
    restore_value=["QO", "KO"],  # in place, QO is Q: tuning must not rotate it several times
)(rotary_kernel)
""":func:`rotary_kernel` with its launch sizes autotuned over :data:`TUNING_CANDIDATES` (float32
math), :data:`FLOAT_FLOAT_TUNING_CANDIDATES` (float-float math) or :data:`FLOAT64_TUNING_CANDIDATES`
(float64 math) on a GPU; ``tuned_kernel.best_config`` is the last choice."""


def _launch_sizes(batch: int, seq_len: int, heads_q: int, heads_k: int, *, interpreted: bool) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_H, GROUP) where no autotuning runs: the sizes a caller of :func:`launch`
    leaves open on a GPU, and all of them in Triton's interpreter. The interpreter runs every
    program in Python at a fixed cost, so there one program takes up to 16 tokens and all their
    heads (the results do not depend on the sizes: each output is computed on its own)."""
    block_h = min(triton.next_power_of_2(max(heads_q, heads_k)), 16)
    if interpreted:
        head_blocks = triton.cdiv(heads_q, block_h) + triton.cdiv(heads_k, block_h)
        return min(triton.next_power_of_2(seq_len), 16), block_h, head_blocks
    return (2 if batch * seq_len >= 2048 else 1), block_h, 1


def few_token_sizes(tokens: int, heads_q: int, heads_k: int, half_pad: int,
                    processors: int) -> tuple[int, int, int, int]:
    """(BLOCK_S, BLOCK_H, GROUP, num_warps) for fewer than :data:`AUTOTUNE_FROM_TOKENS` tokens (a
    decode step: one token per sequence) on a GPU with ``processors`` SMs: deterministic, no sweep.

    Such a launch is a single wave, so its time is one program's latency, which grows with the
    instructions each thread issues. One token per program, and the largest head block (a power of
    two up to 16) that still gives every SM a program: tokens x head blocks >= ``processors``, or
    one head per program when even that gives fewer. Smaller blocks would only repeat the angles
    (each program computes its token's ``half_pad`` angles once, which costs float64 arithmetic
    where it is slow, as on a T4); larger ones leave SMs idle. Warps: ``BLOCK_H x half_pad / 64``,
    1 to 4, which for 64 pairs a head is two pairs per thread up to 4 heads a program, then 4 and
    (at 16 heads) 8 with 4 warps, the first of :data:`FLOAT64_TUNING_CANDIDATES`, which does not spill.
    Decode with 32 + 8 heads of 128 on an H100 (132 SMs): one head per program, 40 programs of one warp.
    """
    block_h = min(triton.next_power_of_2(max(heads_q, heads_k)), 16)
    while block_h > 1 and tokens * (triton.cdiv(heads_q, block_h) + triton.cdiv(heads_k, block_h)) < processors:
        block_h //= 2
    return 1, block_h, 1, max(1, min(4, block_h * half_pad // 64))


def few_token_launches(half_pad: int = 64) -> list[tuple[int, int, int, int]]:
    """Every launch size :func:`few_token_sizes` may choose for pairs padded to ``half_pad``
    (what ``python -m rope.kernels.targets --spills`` compiles)."""
    return sorted({few_token_sizes(1, heads, heads, half_pad, 1) for heads in (1, 2, 4, 8, 16)})


@functools.cache
def _processors(device: torch.device) -> int:
    """The SM count of a CUDA device (asked once per device)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def interpreting() -> bool:
    """Whether Triton's CPU interpreter runs the kernel (its bfloat16 conversions are not the GPU's)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def needs_fma_by_parts() -> bool:
    """Whether the kernels compute fma by parts (``FMA_BY_PARTS``, :mod:`.emulation`): in an
    interpreter whose own ``tl.fma`` rounds twice."""
    return interpreting() and interpreter_rounds_fma_twice()


def check_positions_in_range(name: str, positions: torch.Tensor, expected: str = "values in (-2^31, 2^31)") -> None:
    """Refuse positions outside (-:data:`rope.limits.MAX_POSITION`, :data:`rope.limits.MAX_POSITION`),
    compared in int64 on both sides (``abs()`` of int64's minimum overflows, and 2^31 wraps in an int32
    comparison): through :func:`rope._checks.assert_values`, eager off CUDA."""
    wide = positions.to(torch.int64)
    _checks.assert_values(name, ((wide > -MAX_POSITION) & (wide < MAX_POSITION)).all(), expected)


def check_launch_device(name: str, x: torch.Tensor) -> None:
    """Raise ``ValueError`` unless the kernels can run on ``x``'s device: CUDA, or the CPU under
    Triton's interpreter (``TRITON_INTERPRET=1``; Triton's own error is "0 active drivers"). The
    one device check of every launcher, rotary and attention, before anything is launched."""
    if not (x.is_cuda or (x.device.type == "cpu" and interpreting())):
        raise ValueError(f"{name} is on {x.device}: the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 "
                         "for Triton's CPU interpreter (with CPU tensors)")


def launch_device(x: torch.Tensor):
    """The context every launcher enters around its launches: ``x``'s CUDA device made current.
    Triton launches on the current device, not on its tensors' (a kernel given tensors on cuda:1
    while cuda:0 is current would run on cuda:0 and read cuda:1's addresses there); torch's own
    operators switch devices the same way. A no-op for CPU tensors (Triton's interpreter)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def kernel_constants(head_dim: int, rotary_dim: int, *, interleaved: bool, conjugate: bool, arithmetic: str,
                     copy_tail: bool, mrope: bool = False, scale_after: bool = False,
                     bf16_by_bits: bool = False, fma_by_parts: bool = False, rotated: str = "first") -> dict:
    """The ``tl.constexpr`` arguments of :func:`rotary_kernel` other than the launch sizes;
    ``arithmetic`` is one of :data:`MATHS`, ``rotated`` one of :data:`rope.layouts.ROTATED`."""
    if arithmetic not in MATHS:
        raise ValueError(f"arithmetic={arithmetic!r}: expected one of {MATHS}")
    _checks.choice("rotated", rotated, ROTATED)
    half, tail = rotary_dim // 2, head_dim - rotary_dim
    return dict(
        HALF=half, HALF_PAD=triton.next_power_of_2(half), TAIL=tail, TAIL_PAD=triton.next_power_of_2(max(tail, 1)),
        INTERLEAVED=interleaved, CONJUGATE=conjugate, COPY_TAIL=copy_tail and tail > 0, MATH=arithmetic,
        SCALE_AFTER=scale_after and arithmetic != "float64", MROPE=mrope, BF16_BY_BITS=bf16_by_bits,
        FMA_BY_PARTS=fma_by_parts, ROTARY_START=rotary_start(head_dim, rotary_dim, rotated),
    )


def scale_arguments(scale: float, *, arithmetic: str,
                    bfloat16: bool = False) -> tuple[float, float, float, float, float, bool]:
    """(scale, scale_lo, power, scale64, power64, scale_after): the attention factor s as the kernel
    takes it, for ``arithmetic`` one of :data:`MATHS` and q/k of bfloat16 or not.

    float32 math: s <= 1 is the float32 ``scale`` RN(s), folded into cos and sin; s > 1 is
    RN(s 2^-k) in [1/2, 1] and ``power`` = 2^k applied to the result (``scale_after``), so that
    no intermediate overflows. float-float math: s = sigma 2^k, sigma = ``scale`` + ``scale_lo``
    (float32 numbers, within 2^-49 sigma: float64's 53 bits of s in 48) folded into cos and sin,
    2^k = ``power`` applied to the result where k > 0; sigma <= 1 for float16 and sigma <= 1/2 for
    bfloat16, whose values reach float32's range: no intermediate sum of two products overflows.
    float64 math: s = ``scale64`` * ``power64`` exactly, with ``scale64`` in [1/4, 1/2) (the exact
    products then stay finite too).
    """
    low, high = KERNEL_SCALE_RANGE
    scale = _checks.number("scale (the attention factor)", scale, minimum=low, maximum=high)
    fraction, exponent = math.frexp(scale)  # scale = fraction 2^exponent, fraction in [1/2, 1)
    if arithmetic == "float64":
        return 1.0, 0.0, 1.0, fraction / 2, 2.0 ** (exponent + 1), False
    if arithmetic == "float-float":
        headroom = 1 if bfloat16 else 0  # sigma <= 1/2 or <= 1
        if scale <= 2.0**-headroom:
            sigma, power = scale, 1.0
        else:
            sigma, power = fraction / 2**headroom, 2.0 ** (exponent + headroom)
        sigma_hi = _float32(sigma)
        return sigma_hi, _float32(sigma - sigma_hi), power, 1.0, 1.0, power != 1.0
    if scale <= 1.0:
        return _float32(scale), 0.0, 1.0, 1.0, 1.0, False
    return _float32(fraction), 0.0, 2.0**exponent, 1.0, 1.0, True


def _row_strides(positions: torch.Tensor) -> tuple[int, int]:
    """(batch, token) strides of ``[seq]`` or ``[batch, seq]`` positions (0 for a shared batch)."""
    return (0, positions.stride(0)) if positions.dim() == 1 else (positions.stride(0), positions.stride(1))


def _decode_as_tokens(q, k, q_out, k_out, positions, *, mrope: bool):
    """Decode, one token per sequence (seq = 1): q, k, q_out, k_out and the positions with the batch
    read as the token axis (views, no copies), so that one program rotates BLOCK_S sequences and
    builds the turns T_i once for all of them."""
    batch = q.shape[0]
    q, k, q_out, k_out = (t.transpose(0, 1) for t in (q, k, q_out, k_out))
    shared = positions.dim() == (2 if mrope else 1)  # [seq] or [3, seq]: one row for the batch
    positions = positions.expand(*positions.shape[:-1], batch) if shared else positions.transpose(-2, -1)
    return q, k, q_out, k_out, positions


def _runtime_arguments(q, k, q_out, k_out, positions, inv_freq, axes, *, arithmetic: str, factor) -> tuple:
    """The runtime arguments of :func:`rotary_kernel`, in its order and groups; ``factor`` is
    (scale, scale_lo, power, scale64, power64) from :func:`scale_arguments`. An unused pointer
    (AXES without M-RoPE, WINDOWS with float32 math, TABLE without float-float math) is given
    inv_freq, and unused strides 0."""
    batch, seq_len, heads_q = q.shape[:3]
    token_positions = positions if axes is None else positions[0]  # [seq] or [batch, seq]
    return (
        # Tensors
        q, k,
        q_out, k_out,
        positions, inv_freq.contiguous(), inv_freq if axes is None else axes.contiguous(),
        inverse_two_pi_windows(q.device) if arithmetic != "float32" else inv_freq,
        cos_sin_table(q.device) if arithmetic == "float-float" else inv_freq,
        # Strides of q, k, q_out, k_out
        *q.stride()[:3],
        *k.stride()[:3],
        *q_out.stride()[:3],
        *k_out.stride()[:3],
        # Strides of the positions
        *_row_strides(token_positions), 0 if axes is None else positions.stride(0),
        # Sizes
        seq_len, heads_q, k.shape[2],
        triton.next_power_of_2(batch * seq_len),
        # The attention factor
        *factor,
    )


def launch(q, k, q_out, k_out, positions, inv_freq, *, interleaved, rotary_dim, scale, conjugate, axes=None,
           rotated="first", block_s=None, block_h=None, group=None, num_warps=4, float64_math=None):
    """Rotate q into q_out and k into k_out (the outputs may alias the inputs: in place).

    q ``[batch, seq, heads_q, head_dim]``, k ``[batch, seq, heads_k, head_dim]``, last dimension
    contiguous; positions integer ``[seq]`` or ``[batch, seq]``; inv_freq float32
    ``[rotary_dim/2]``, every theta_i below 2^16 (float32 math); ``scale`` the attention factor,
    in :data:`rope.limits.KERNEL_SCALE_RANGE`. M-RoPE: ``axes`` (int64 ``[rotary_dim/2]``, values 0, 1, 2) gives
    each pair's row of the positions, then ``[3, seq]`` or ``[3, batch, seq]`` (:mod:`rope.mrope`).
    ``rotated``: ``"first"`` or ``"last"``, which rotary_dim coordinates of a head are rotated
    (:mod:`rope.layouts`; the others are copied).
    ``float64_math``: the arithmetic (see the module docstring, :func:`default_math`). None (the
    default) chooses by dtype: float-float math for float16 and bfloat16 (correctly rounded except
    within 2^-43 ``|pair|`` of a rounding tie), float32 math for float32 (within the stated bound),
    float64 math for float64; True takes float64 math (float16 and bfloat16 then correctly rounded,
    at the price of float64 arithmetic per element), False float32 math. float64 inputs always take
    float64 math (False is refused).
    On a GPU the launch sizes are autotuned per (token count rounded up to a power of two, heads,
    widths, layout) on first use from :data:`AUTOTUNE_FROM_TOKENS` tokens (batch x seq) up, and
    chosen by :func:`few_token_sizes` below; ``block_s``, ``block_h``, ``group`` and ``num_warps``
    fix them. A call is one launch (after the autotuner's timed ones on a shape's first use), with
    nothing else run on the device.
    """
    check_launch_device("q", q)
    arithmetic = default_math(q.dtype, float64_math)
    *factor, scale_after = scale_arguments(scale, arithmetic=arithmetic, bfloat16=q.dtype == torch.bfloat16)
    batch, seq_len, heads_q, head_dim = q.shape
    if seq_len == 1 and batch > 1:
        q, k, q_out, k_out, positions = _decode_as_tokens(q, k, q_out, k_out, positions, mrope=axes is not None)
        batch, seq_len = 1, batch
    heads_k = k.shape[2]

    def grid(meta):
        head_blocks = triton.cdiv(heads_q, meta["BLOCK_H"]) + triton.cdiv(heads_k, meta["BLOCK_H"])
        return triton.cdiv(seq_len, meta["BLOCK_S"]), triton.cdiv(head_blocks, meta["GROUP"]), batch

    args = _runtime_arguments(q, k, q_out, k_out, positions, inv_freq, axes, arithmetic=arithmetic, factor=factor)
    options = kernel_constants(
        head_dim, rotary_dim, interleaved=interleaved, conjugate=conjugate, arithmetic=arithmetic,
        copy_tail=q_out.data_ptr() != q.data_ptr() or k_out.data_ptr() != k.data_ptr(), mrope=axes is not None,
        scale_after=scale_after, bf16_by_bits=interpreting(), fma_by_parts=needs_fma_by_parts(), rotated=rotated,
    )
    fixed = block_s or block_h or group
    if q.is_cuda and not fixed and not interpreting():
        if batch * seq_len >= AUTOTUNE_FROM_TOKENS:
            with launch_device(q):
                tuned_kernel[grid](*args, **options, enable_fp_fusion=False)
            return
        block_s, block_h, group, num_warps = few_token_sizes(batch * seq_len, heads_q, heads_k, options["HALF_PAD"],
                                                             _processors(q.device))
    default = _launch_sizes(batch, seq_len, heads_q, heads_k, interpreted=interpreting())
    sizes = dict(BLOCK_S=block_s or default[0], BLOCK_H=block_h or default[1], GROUP=group or default[2])
    with launch_device(q):
        rotary_kernel[grid](*args, **options, **sizes, num_warps=num_warps, enable_fp_fusion=False)
