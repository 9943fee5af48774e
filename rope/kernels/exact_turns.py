"""float64 cos and sin of m * theta_i inside a Triton kernel, with the angle reduced exactly.

The device-side twin of the torch path's :func:`rope.angles.cos_sin` (same limbs, same steps),
for the kernel's float64 math. For a float32 theta_i = +-M 2^e (M < 2^24) and an int64 position m:

1. :func:`turns_per_position`: T_i = frac(theta_i / (2 pi)) as six 21-bit limbs (126 bits),
   +-M times the window of 1/(2 pi) for exponent e (:func:`rope.angles.inverse_two_pi_windows`,
   read from global memory, eight int64 per pair), carries propagated: exact to 2^-124 turns.
2. :func:`turns`: (m T_i) mod 1 in the same limbs, m split into 21, 21 and 22 signed bits; every
   column of limb products stays below 2^44, so int64 arithmetic never overflows. Exact for every
   int64 m: for ``|m|`` < 2^63 the angle is within 2^-59 rad of m theta_i modulo 2 pi.
3. :func:`cos_sin_of_turns`: the quadrant from the top bits (an integer), the rest x in
   [-1/8, 1/8] turns as a float64 pair, the angle 2 pi x as a double-float (Dekker's product by a
   fused multiply-add with 2 pi to 106 bits), then cos and sin of the head by Taylor polynomials
   (:func:`cos_sin_near_zero`) and the first-order correction for the tail.

Accuracy: cos and sin within 2^-52 of the exact values (measured in tests/test_exact_turns.py against
mpmath, where the bound is asserted). Everything is integer arithmetic and explicit fused
multiply-adds, so Triton's CPU interpreter computes what the GPU computes, bit for bit.
"""

from __future__ import annotations

import math
from fractions import Fraction

import triton
import triton.language as tl

from ..angles import LIMB_BITS, TWO_PI, WINDOW_EXPONENTS
from .emulation import fma

_MASK = tl.constexpr((1 << LIMB_BITS) - 1)
_E_MIN = tl.constexpr(WINDOW_EXPONENTS[0])
_ROWS = tl.constexpr(WINDOW_EXPONENTS[1] - WINDOW_EXPONENTS[0] + 1)
_TWO_PI_HI = tl.constexpr(float(TWO_PI))
_TWO_PI_LO = tl.constexpr(float(TWO_PI - Fraction(float(TWO_PI))))

# Taylor coefficients (-1)^k / n!, rounded to float64: sine through x^17, cosine through x^18.
# On |x| <= pi/4 + 2^-40 the first omitted terms are below 2^-63 (x^19/19!) and 2^-68 (x^20/20!).
_S3, _S5, _S7, _S9, _S11, _S13, _S15, _S17 = (
    tl.constexpr((-1) ** (n // 2) / math.factorial(n)) for n in (3, 5, 7, 9, 11, 13, 15, 17))
_C2, _C4, _C6, _C8, _C10, _C12, _C14, _C16, _C18 = (
    tl.constexpr((-1) ** (n // 2) / math.factorial(n)) for n in (2, 4, 6, 8, 10, 12, 14, 16, 18))


@triton.jit
def _limb(value):
    """(value mod 2^21, value >> 21): one step of carry propagation (arithmetic shift: a negative
    value borrows, and the limb is the non-negative residue)."""
    return value & _MASK, value >> 21


@triton.jit
def turns_per_position(theta, WINDOWS):
    """The six limbs (least significant first) of T = frac(theta / (2 pi)) 2^126 for float32
    ``theta`` (finite; any shape), ``WINDOWS`` the int64 ``[rows, 8]`` table of
    :func:`rope.angles.inverse_two_pi_windows`. The product +-M window is carried through its
    eight limbs; the two lowest are guard limbs and are dropped."""
    bits = theta.to(tl.int32, bitcast=True).to(tl.int64)
    field = (bits >> 23) & 0xFF
    significand = bits & 0x7FFFFF
    normal = field != 0
    m_int = tl.where(normal, significand | 0x800000, significand)
    row = tl.where(normal, field - 150, _E_MIN) - _E_MIN
    row = tl.minimum(tl.maximum(row, 0), _ROWS - 1)  # finite theta is in range; never read outside
    signed = tl.where(bits < 0, -m_int, m_int)
    window = WINDOWS + row * 8
    _, carry = _limb(signed * tl.load(window))
    _, carry = _limb(signed * tl.load(window + 1) + carry)
    t0, carry = _limb(signed * tl.load(window + 2) + carry)
    t1, carry = _limb(signed * tl.load(window + 3) + carry)
    t2, carry = _limb(signed * tl.load(window + 4) + carry)
    t3, carry = _limb(signed * tl.load(window + 5) + carry)
    t4, carry = _limb(signed * tl.load(window + 6) + carry)
    t5, _ = _limb(signed * tl.load(window + 7) + carry)
    return t0, t1, t2, t3, t4, t5


@triton.jit
def turns(m, t0, t1, t2, t3, t4, t5):
    """The six limbs of (m T) mod 1 for int64 positions ``m``, broadcast against the limbs of T.
    m = l0 + l1 2^21 + l2 2^42 with l0, l1 in [0, 2^21) and l2 = m >> 42 signed; column n of the
    product is sum_k l_k t_(n - k), below 2^44 in magnitude."""
    l0 = m & _MASK
    l1 = (m >> 21) & _MASK
    l2 = m >> 42
    c0, carry = _limb(l0 * t0)
    c1, carry = _limb(l0 * t1 + l1 * t0 + carry)
    c2, carry = _limb(l0 * t2 + l1 * t1 + l2 * t0 + carry)
    c3, carry = _limb(l0 * t3 + l1 * t2 + l2 * t1 + carry)
    c4, carry = _limb(l0 * t4 + l1 * t3 + l2 * t2 + carry)
    c5, _ = _limb(l0 * t5 + l1 * t4 + l2 * t3 + carry)
    return c0, c1, c2, c3, c4, c5


@triton.jit
def cos_sin_near_zero(x, FMA_BY_PARTS: tl.constexpr):
    """float64 cos x and sin x for ``|x|`` <= pi/4 (plus a little): Taylor polynomials by Horner's
    rule in fused multiply-adds, sin x = x + x^3 p(x^2), cos x = 1 + x^2 q(x^2). The polynomial
    parts are at most 0.08 (sine) and 0.31 (cosine) of 1, so their few roundings weigh little
    beside the final one."""
    x2 = x * x
    p = fma(x2, _S17, _S15, FMA_BY_PARTS)
    p = fma(p, x2, _S13, FMA_BY_PARTS)
    p = fma(p, x2, _S11, FMA_BY_PARTS)
    p = fma(p, x2, _S9, FMA_BY_PARTS)
    p = fma(p, x2, _S7, FMA_BY_PARTS)
    p = fma(p, x2, _S5, FMA_BY_PARTS)
    p = fma(p, x2, _S3, FMA_BY_PARTS)
    q = fma(x2, _C18, _C16, FMA_BY_PARTS)
    q = fma(q, x2, _C14, FMA_BY_PARTS)
    q = fma(q, x2, _C12, FMA_BY_PARTS)
    q = fma(q, x2, _C10, FMA_BY_PARTS)
    q = fma(q, x2, _C8, FMA_BY_PARTS)
    q = fma(q, x2, _C6, FMA_BY_PARTS)
    q = fma(q, x2, _C4, FMA_BY_PARTS)
    q = fma(q, x2, _C2, FMA_BY_PARTS)
    return fma(x2, q, 1.0, FMA_BY_PARTS), fma(x * x2, p, x, FMA_BY_PARTS)


@triton.jit
def by_quadrant(quadrant, cos, sin):
    """cos and sin of x + q pi/2 from those of x, q = ``quadrant`` (an integer, taken mod 4):
    swapped and negated, no branch."""
    q = quadrant & 3
    odd = (q & 1) == 1
    cos_q = tl.where(odd, sin, cos)
    sin_q = tl.where(odd, cos, sin)
    return tl.where((q == 1) | (q == 2), -cos_q, cos_q), tl.where(q >= 2, -sin_q, sin_q)


@triton.jit
def cos_sin_of_turns(c1, c2, c3, c4, c5, FMA_BY_PARTS: tl.constexpr):
    """float64 cos and sin of 2 pi (turns in limbs; the lowest limb is below float64's reach and
    not needed). The quadrant q = round(4 turns) mod 4 and the rest x = turns - q/4 in
    [-1/8, 1/8]: its top 40 bits are exact in float64 (``head``), the next 63 add with one rounding
    (``tail``, below 2^-42), so x = x_hi + x_lo to about 2^-105. The angle 2 pi x is
    a + d with a = RN(2 pi_hi x_hi) and d the rest of the product (Dekker's, exact by an fma) plus
    the low terms; cos(a + d) = cos a - d sin a and sin(a + d) = sin a + d cos a, since d^2 is
    below 2^-104. Then cos and sin are swapped and negated by the quadrant."""
    quadrant = (c5 + (1 << 18)) >> 19  # 0 .. 4
    head = ((c5 - (quadrant << 19)) * (1 << 21) + c4).to(tl.float64) * 2.2737367544323206e-13  # 2^-42, exact
    tail = fma(c3.to(tl.float64), 1.0842021724855044e-19,  # 2^-63
               fma(c2.to(tl.float64), 5.169878828456423e-26, c1.to(tl.float64) * 2.465190328815662e-32, FMA_BY_PARTS),
               FMA_BY_PARTS)
    x_hi = head + tail
    x_lo = tail - (x_hi - head)  # exact: head is a multiple of 2^-42 and |tail| < 2^-42
    a = x_hi * _TWO_PI_HI
    d = fma(x_hi, _TWO_PI_HI, -a, FMA_BY_PARTS) + fma(x_hi, _TWO_PI_LO, x_lo * _TWO_PI_HI, FMA_BY_PARTS)
    cos_a, sin_a = cos_sin_near_zero(a, FMA_BY_PARTS)
    return by_quadrant(quadrant, fma(-d, sin_a, cos_a, FMA_BY_PARTS), fma(d, cos_a, sin_a, FMA_BY_PARTS))


@triton.jit
def exact_cos_sin(m, theta, WINDOWS, FMA_BY_PARTS: tl.constexpr):
    """float64 cos(m theta) and sin(m theta), each within 2^-52, for int64 positions ``m`` and
    float32 ``theta`` of broadcastable shapes (the kernel: ``[BLOCK_S, HALF_PAD]`` and
    ``[1, HALF_PAD]``); T is built once per frequency and reused for every position."""
    t0, t1, t2, t3, t4, t5 = turns_per_position(theta, WINDOWS)
    _, c1, c2, c3, c4, c5 = turns(m, t0, t1, t2, t3, t4, t5)
    return cos_sin_of_turns(c1, c2, c3, c4, c5, FMA_BY_PARTS)
