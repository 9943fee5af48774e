"""float-float math: the fused kernel's default for float16 and bfloat16, without float64.

GPUs with slow float64 (a T4 runs it at 1/32 of float32's rate) cannot afford the float64 math
of :mod:`rope.kernels.exact_turns` per element. This math keeps its exactness where it is cheap
and replaces float64 by pairs of float32 numbers ("float-float", Dekker 1971) where it is not:

1. The turns. (m T_i) mod 1 from the 126-bit turns per position of :mod:`.exact_turns` (integer
   arithmetic, any int64 m, any finite float32 theta_i), limbs 3 to 5 only
   (:func:`top_turns`): dropping the two lowest columns of the product leaves the turns at
   most 3 units of 2^-63 low.
2. cos and sin, once per (token, pair) and reused by every head of the program
   (:func:`cos_sin_float_float`): the quadrant and the rest x in [-1/8, 1/8] turns from the
   integer; x = j 2^-11 + r with the integer j in [-256, 256] and ``|r|`` <= 2^-12 turns; cos and
   sin of 2 pi j 2^-11 from a table of float32 pairs (:func:`cos_sin_table`, built exactly in
   integer arithmetic) and of a = 2 pi r (``|a|`` <= 0.0016) from three Taylor terms, joined by
   the angle-addition formulas in float-float arithmetic. The attention factor's sigma (itself
   a float32 pair) multiplies them: c_hi + c_lo = sigma cos, s_hi + s_lo = sigma sin, within
   2^-45 sigma.
3. Each output, from float16/bfloat16 x_a, x_b (:func:`rotated_pair`): y_a = x_a c - x_b s as
   P1 + E1 = x_a c_hi and P2 + E2 = x_b s_hi (Dekker's products by fused multiply-adds: exact),
   S + e = P1 - P2 (Knuth's TwoSum: exact), the small terms L = (E1 + x_a c_lo) - (E2 + x_b s_lo)
   + e, and Z + r = S + L (Fast2Sum: exact, since S dominates L or is a multiple of its unit).
   Z is rounded to odd by r (the float32 neighbour toward r where Z is even and r is not 0), so that
   rounding it to float16 or bfloat16, which keep at most 11 of float32's 24 bits, is rounding
   Z + r once (Boldo and Melquiond, "When double rounding is odd", 2005).

The result is RN(v), the output dtype's rounding to nearest even of v = 2^k (Z + r), with
``|v - y|`` <= Delta = 2^-43 ``|pair|`` + 2^-145 max(1, s) (chapter 18 proves 2^-43.88 ``|pair|``
and the underflow terms; :mod:`rope.kernels.triton_rotary` states the bound): correctly rounded
unless y lies within Delta of a rounding tie of the output dtype. No float64 operation anywhere
(``python -m rope.kernels.targets --code`` counts them), and every multiply-add is an explicit fma
(:func:`.emulation.fma`), so Triton's CPU interpreter computes what a GPU computes, bit for bit.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import torch
import triton
import triton.language as tl

from ..angles import TWO_PI, constant_on
from .emulation import fma, two_sum
from .exact_turns import by_quadrant, turns_per_position

TABLE_BITS = 11
"""The table's step is 2^-TABLE_BITS turns: the rest angle a after it is at most pi 2^-11 = 0.0015,
where three Taylor terms of sine and cosine are exact to 2^-70."""

TABLE_ROWS = 2 ** (TABLE_BITS - 3) + 1
"""j = 0, ..., 256: the eighth of a turn on either side of each quadrant's centre (sine is odd)."""

_BITS = 200  # the fixed-point precision of the table's construction


def nearest_float32(value: Fraction) -> float:
    """``value`` rounded to the nearest float32 number (ties to even), exactly: float32's 24 bits
    are taken from the rational number itself (``float()`` would round to float64 first)."""
    if value == 0:
        return 0.0
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    if abs(value) >= Fraction(2) ** exponent * 2:
        exponent += 1
    elif abs(value) < Fraction(2) ** exponent:
        exponent -= 1
    unit = Fraction(2) ** (max(exponent, -126) - 23)  # 2^exponent <= |value| < 2^(exponent + 1)
    return float(round(value / unit) * unit)  # round(): ties to even; at most 24 bits, exact in float64


def _cos_sin_fixed(angle: Fraction) -> tuple[Fraction, Fraction]:
    """cos and sin of ``angle`` (``|angle|`` < 1) within 2^-190, by their Taylor series in
    integer arithmetic on multiples of 2^-200 (each truncating division loses less than one unit)."""
    one = 1 << _BITS
    a = round(angle * one)  # within 2^-201 of angle
    cos, sin, term, n = 0, 0, one, 0
    while term:
        if n % 2 == 0:
            cos += term if n % 4 == 0 else -term
        else:
            sin += term if n % 4 == 1 else -term
        n += 1
        term = term * a // one // n
    return Fraction(cos, one), Fraction(sin, one)


def cos_sin_rows() -> list[tuple[float, float, float, float]]:
    """The rows (cos_hi, cos_lo, sin_hi, sin_lo) of :func:`cos_sin_table`, as Python floats: for
    j = 0, ..., 256 and A = 2 pi j 2^-11, hi = RN(cos A) and lo = RN(cos A - hi) in float32 (the
    same for sin), so hi + lo is within 2^-24 ``|lo|`` + 2^-190 <= 2^-49 of cos A."""
    rows = []
    for j in range(TABLE_ROWS):
        cos, sin = _cos_sin_fixed(TWO_PI * j / 2**TABLE_BITS)
        cos_hi, sin_hi = nearest_float32(cos), nearest_float32(sin)
        rows.append((cos_hi, nearest_float32(cos - Fraction(cos_hi)), sin_hi, nearest_float32(sin - Fraction(sin_hi))))
    return rows


@functools.cache
def _table() -> torch.Tensor:
    return torch.tensor(cos_sin_rows(), dtype=torch.float32)


def cos_sin_table(device: torch.device) -> torch.Tensor:
    """float32 ``[TABLE_ROWS, 4]`` on ``device`` (copied there once): row j holds cos and sin of
    2 pi j 2^-11 as float32 pairs (:func:`cos_sin_rows`), what the float-float math reads.

    Args:
        device: the device to hold the table.
    """
    return constant_on(_table(), device)


# float32 constants of the kernel: 2 pi as a pair, the Taylor coefficients.
_TWO_PI_HI = tl.constexpr(nearest_float32(TWO_PI))
_TWO_PI_LO = tl.constexpr(nearest_float32(TWO_PI - Fraction(_TWO_PI_HI.value)))
_SIXTH = tl.constexpr(nearest_float32(Fraction(1, 6)))
_ONE_120TH = tl.constexpr(nearest_float32(Fraction(1, 120)))
_ONE_24TH = tl.constexpr(nearest_float32(Fraction(1, 24)))
_MASK = tl.constexpr((1 << 21) - 1)
_STEP_SHIFT = tl.constexpr(63 - TABLE_BITS)  # a table step in units of 2^-63 turns, as a shift
_HALF_STEP = tl.constexpr(1 << (62 - TABLE_BITS))
_REST_SHIFT = tl.constexpr(39 - TABLE_BITS)  # the rest's bits below its top 24 (it is below 2^(62 - TABLE_BITS))
_REST_UNIT = tl.constexpr(2.0 ** (39 - TABLE_BITS - 63))
_REST_MASK = tl.constexpr((1 << (39 - TABLE_BITS)) - 1)


@triton.jit
def _wide(a, b):
    """a b as int64, for int32 ``a`` and ``b``: one 32 x 32 -> 64-bit multiply, exact."""
    return a.to(tl.int64) * b.to(tl.int64)


@triton.jit
def top_turns(m, t0, t1, t2, t3, t4, t5):
    """Limbs 3, 4, 5 of (m T) mod 1 (:func:`.exact_turns.turns`), for int64 positions ``m`` and
    the six 21-bit limbs of T (:func:`.exact_turns.turns_per_position`), without the columns 0 and
    1 of the product: their carry into column 2 is below 2^22 + 1 units of it, so the turns
    (c5 2^-21 + c4 2^-42 + c3 2^-63) are between 3 units of 2^-63 below the exact ones and the
    exact ones. Each limb product is a 32 x 32 -> 64-bit multiply (limbs below 2^21, the top
    limb of m signed), each column below 2^44 in magnitude."""
    l0 = (m & _MASK).to(tl.int32)
    l1 = ((m >> 21) & _MASK).to(tl.int32)
    l2 = (m >> 42).to(tl.int32)
    t0, t1, t2, t3, t4, t5 = (t0.to(tl.int32), t1.to(tl.int32), t2.to(tl.int32), t3.to(tl.int32),
                              t4.to(tl.int32), t5.to(tl.int32))
    carry = (_wide(l0, t2) + _wide(l1, t1) + _wide(l2, t0)) >> 21
    column = _wide(l0, t3) + _wide(l1, t2) + _wide(l2, t1) + carry
    c3 = column & _MASK
    column = _wide(l0, t4) + _wide(l1, t3) + _wide(l2, t2) + (column >> 21)
    c4 = column & _MASK
    c5 = (_wide(l0, t5) + _wide(l1, t4) + _wide(l2, t3) + (column >> 21)) & _MASK
    return c3, c4, c5


@triton.jit
def _two_product(a, b, FMA_BY_PARTS: tl.constexpr):
    """(p, e): p = RN(a b), p + e = a b exactly (Dekker's product by an fma; unless a b underflows)."""
    p = a * b
    return p, fma(a, b, -p, FMA_BY_PARTS)


@triton.jit
def _fast_two_sum(a, b):
    """(s, e): s = RN(a + b), s + e = a + b exactly, where ``|a|`` >= ``|b|`` or a is a multiple of
    the unit in the last place of b (Dekker's Fast2Sum)."""
    s = a + b
    return s, b - (s - a)


@triton.jit
def _angle_sum(big, big_lo, other, other_lo, cm_hi, cm_lo, sn_hi, sn_lo, FMA_BY_PARTS: tl.constexpr):
    """big (1 + cm) + other sn as a normalized float32 pair (hi, lo), for the table's pairs
    big + big_lo and other + other_lo, cm = cm_hi + cm_lo = cos a - 1 and sn = sn_hi + sn_lo = sin a
    of the rest angle a: cos(A + a) with big = cos A, other = -sin A; sin(A + a) with big = sin A,
    other = cos A.

    The products of the high parts are exact (Dekker's), their sums with big are Fast2Sums (big
    dominates them, or is 0; big cm_hi first, which keeps a cosine's partial sum at most 1), the
    small terms are summed before the errors of those sums, and a last Fast2Sum normalizes."""
    q, q_err = _two_product(big, cm_hi, FMA_BY_PARTS)
    p, p_err = _two_product(other, sn_hi, FMA_BY_PARTS)
    hi, err = _fast_two_sum(big, q)
    hi, err2 = _fast_two_sum(hi, p)
    small = fma(other, sn_lo, p_err, FMA_BY_PARTS)
    small = fma(other_lo, sn_hi, small, FMA_BY_PARTS)
    small = fma(big, cm_lo, small, FMA_BY_PARTS)
    small = fma(big_lo, cm_hi, small + q_err, FMA_BY_PARTS)
    return _fast_two_sum(hi, ((big_lo + err) + err2) + small)


@triton.jit
def cos_sin_float_float(c3, c4, c5, TABLE, FMA_BY_PARTS: tl.constexpr):
    """cos and sin of 2 pi (c5 2^-21 + c4 2^-42 + c3 2^-63) as normalized float32 pairs (cos_hi,
    cos_lo, sin_hi, sin_lo): the quadrant q and the rest x in
    [-1/8, 1/8] turns from the integer; x = j 2^-11 + r with j = round(x 2^11) in [-256, 256];
    cos and sin of A = 2 pi j 2^-11 from ``TABLE`` (:func:`cos_sin_table`, row ``|j|``, the sine
    negated for j < 0); a = 2 pi r = a_hi + a_lo (normalized by a TwoSum; ``|a|`` <= pi 2^-11),
    cos a - 1 = -a^2/2 + a^4/24 and sin a = a - a^3/6 + a^5/120 as pairs; the angle-addition
    formulas (:func:`_angle_sum`);
    and cos and sin of x + q/4 turns by swapping and negating them (:func:`.exact_turns.by_quadrant`)."""
    quadrant = (c5 + (1 << 18)) >> 19  # round(4 turns), 0 .. 4
    head = ((c5 - (quadrant << 19)) << 42) + (c4 << 21) + c3  # x in units of 2^-63, |head| <= 2^60
    j = (head + _HALF_STEP) >> _STEP_SHIFT  # round(x 2^11), in [-256, 256]
    rest = head - (j << _STEP_SHIFT)  # r in units of 2^-63, in [-2^51, 2^51)
    r_hi = (rest >> _REST_SHIFT).to(tl.int32).to(tl.float32) * _REST_UNIT  # at most 24 bits, exact
    r_lo = (rest & _REST_MASK).to(tl.int32).to(tl.float32) * 1.0842021724855044e-19  # 2^-63
    a_hi = r_hi * _TWO_PI_HI
    a_hi, a_lo = two_sum(a_hi, fma(r_hi, _TWO_PI_HI, -a_hi, FMA_BY_PARTS)
                          + fma(r_hi, _TWO_PI_LO, r_lo * _TWO_PI_HI, FMA_BY_PARTS))  # normalized
    t = a_hi * a_hi
    t_err = fma(a_hi, a_hi, -t, FMA_BY_PARTS)
    cm_hi = -0.5 * t  # exact
    cm_lo = fma(t * _ONE_24TH, t, -fma(a_hi, a_lo, 0.5 * t_err, FMA_BY_PARTS), FMA_BY_PARTS)
    sn_lo = fma(a_hi * t, fma(t, _ONE_120TH, -_SIXTH, FMA_BY_PARTS), a_lo * fma(-0.5, t, 1.0, FMA_BY_PARTS),
                FMA_BY_PARTS)
    row = TABLE + tl.abs(j).to(tl.int32) * 4
    cos_hi = tl.load(row)
    cos_lo = tl.load(row + 1)
    sin_hi = tl.load(row + 2)
    sin_lo = tl.load(row + 3)
    sin_hi = tl.where(j < 0, -sin_hi, sin_hi)
    sin_lo = tl.where(j < 0, -sin_lo, sin_lo)
    c_hi, c_lo = _angle_sum(cos_hi, cos_lo, -sin_hi, -sin_lo, cm_hi, cm_lo, a_hi, sn_lo, FMA_BY_PARTS)
    s_hi, s_lo = _angle_sum(sin_hi, sin_lo, cos_hi, cos_lo, cm_hi, cm_lo, a_hi, sn_lo, FMA_BY_PARTS)
    c_hi, s_hi = by_quadrant(quadrant, c_hi, s_hi)
    c_lo, s_lo = by_quadrant(quadrant, c_lo, s_lo)
    return c_hi, c_lo, s_hi, s_lo


@triton.jit
def _scaled(hi, lo, sigma_hi, sigma_lo, FMA_BY_PARTS: tl.constexpr):
    """sigma (hi + lo) as a normalized float32 pair (``|lo|`` <= half an ulp of hi)."""
    p, err = _two_product(sigma_hi, hi, FMA_BY_PARTS)
    return _fast_two_sum(p, fma(sigma_hi, lo, fma(sigma_lo, hi, err, FMA_BY_PARTS), FMA_BY_PARTS))


@triton.jit
def scaled_cos_sin(m, theta, WINDOWS, TABLE, sigma_hi, sigma_lo, FMA_BY_PARTS: tl.constexpr):
    """(c_hi, c_lo, s_hi, s_lo): sigma cos(m theta) and sigma sin(m theta) as normalized float32
    pairs, for int64 positions ``m`` and float32 ``theta`` of broadcastable shapes (the kernel:
    ``[BLOCK_S, HALF_PAD]`` and ``[1, HALF_PAD]``) and the attention factor's sigma = sigma_hi +
    sigma_lo; the turns T of theta are built once per frequency, from ``WINDOWS``
    (:func:`rope.angles.inverse_two_pi_windows`)."""
    t0, t1, t2, t3, t4, t5 = turns_per_position(theta, WINDOWS)
    c3, c4, c5 = top_turns(m, t0, t1, t2, t3, t4, t5)
    cos_hi, cos_lo, sin_hi, sin_lo = cos_sin_float_float(c3, c4, c5, TABLE, FMA_BY_PARTS)
    c_hi, c_lo = _scaled(cos_hi, cos_lo, sigma_hi, sigma_lo, FMA_BY_PARTS)
    s_hi, s_lo = _scaled(sin_hi, sin_lo, sigma_hi, sigma_lo, FMA_BY_PARTS)
    return c_hi, c_lo, s_hi, s_lo


@triton.jit
def difference_of_products(xa, xb, c_hi, c_lo, s_hi, s_lo, FMA_BY_PARTS: tl.constexpr):
    """(z, r): z + r = v exactly and z = RN(v), for v the float-float value of x_a (c_hi + c_lo) -
    x_b (s_hi + s_lo) (float32 operands; ``|c_lo|`` <= 2^-24 ``|c_hi|``, the same for s): P1 + E1 = x_a c_hi
    and P2 + E2 = x_b s_hi (Dekker), S + e = P1 - P2 (TwoSum), L = RN(RN(RN(E1 + x_a c_lo) -
    RN(E2 + x_b s_lo)) + e), and (z, r) = Fast2Sum(S, L), exact since S dominates L or is a
    multiple of its unit in the last place. Within 7.0000005 2^-48 (``|x_a c_hi|`` + ``|x_b s_hi|``)
    of the value with exact products (chapter 18), plus 6 2^-150 where products underflow."""
    p1, e1 = _two_product(xa, c_hi, FMA_BY_PARTS)
    p2, e2 = _two_product(xb, s_hi, FMA_BY_PARTS)
    s, e = two_sum(p1, -p2)
    return _fast_two_sum(s, (fma(xa, c_lo, e1, FMA_BY_PARTS) - fma(xb, s_lo, e2, FMA_BY_PARTS)) + e)


@triton.jit
def round_to_odd(z, r):
    """z + r rounded to odd in float32, for z = RN(z + r): z where r is 0 or z is odd, else the
    float32 neighbour of z toward r (on the bit pattern: 1 toward zero where r has the other sign,
    then the last bit set). Rounding it to a format of at most 22 significant bits (float16:
    11, bfloat16: 8) is rounding z + r once (Boldo and Melquiond, "When double rounding is odd", 2005)."""
    bits = z.to(tl.int32, bitcast=True)
    inexact = r != 0
    bits = tl.where(inexact & ((bits ^ r.to(tl.int32, bitcast=True)) < 0), bits - 1, bits)
    return tl.where(inexact, bits | 1, bits).to(tl.float32, bitcast=True)


@triton.jit
def rotated_pair(xa, xb, c_hi, c_lo, s_hi, s_lo, FMA_BY_PARTS: tl.constexpr):
    """x_a (c_hi + c_lo) - x_b (s_hi + s_lo) in float-float arithmetic, rounded to odd in float32
    (:func:`difference_of_products`, :func:`round_to_odd`): what the kernel rounds to float16 or
    bfloat16."""
    z, r = difference_of_products(xa, xb, c_hi, c_lo, s_hi, s_lo, FMA_BY_PARTS)
    return round_to_odd(z, r)
