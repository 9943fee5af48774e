"""What an older Triton CPU interpreter does not run as a GPU does, rebuilt from operations it does.

The kernels take two ``tl.constexpr`` switches for this, False when compiled for a GPU (so the GPU's
code is unchanged) and set by the launchers from :func:`fma_by_parts` and :func:`python_loops`:

* ``FMA_BY_PARTS``: :func:`fma` computes a correctly rounded fused multiply-add from exact
  operations instead of ``tl.fma``. A GPU's fma rounds once; Triton 3.6's interpreter computes
  ``x * y + z`` in NumPy, two roundings (3.9's calls a true fma), and the kernels' error bounds
  and error-free products (Dekker's product ``fma(a, b, -RN(a b))``) rest on the single rounding.
* ``PYTHON_LOOPS``: :func:`loop_bound` hands a loop's runtime bound to the interpreter as a Python
  ``int``. The interpreter runs ``for i in range(start, stop, step)`` in Python, and Triton 3.6's
  converts a tensor bound (a one-element array) with ``int()``, which NumPy 2.4 refuses for arrays
  of one dimension.

The float32 fma (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
algorithms using rounding to odd", IEEE Transactions on Computers 57(4), 2008): the
float64 product of two float32 numbers is exact (24 + 24 significant bits), the sum with z is rounded
to odd in float64 (TwoSum gives its error; an even result with an error moves to the odd neighbour on
the error's side), and the final rounding to float32 is then the single rounding of x y + z, since
float64 carries more than 24 + 1 bits. The float64 fma (their emulated FMA): the
exact product x y = u_h + u_l (Dekker's product with Veltkamp's splitting, no fma), TwoSum
z + u_h = t_h + t_l, v = RO(t_l + u_l) rounded to odd, and the result RN(t_h + v). Both are exact
as long as nothing overflows and the product's error is not below float64's normal range
(|x y| above about 2^-969); infinities and NaNs give what ``x * y + z`` gives (IEEE 754's fma too).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_SPLITTER = tl.constexpr(134217729.0)  # 2^27 + 1: Veltkamp's splitting of 53 significant bits into 26 + 27
_SPLIT_LIMIT = tl.constexpr(2.0**995)  # above this the splitter's product could overflow
_DOWN = tl.constexpr(2.0**-32)
_UP = tl.constexpr(2.0**32)


@triton.jit
def two_sum(a, b):
    """(s, e): s = RN(a + b) and s + e = a + b exactly (Knuth's TwoSum, any order of magnitudes),
    in the dtype of a and b (float64 here; float32 in :mod:`rope.kernels.float_float`)."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


@triton.jit
def _odd(s, e):
    """float64 s + e rounded to odd, for (s, e) from :func:`two_sum`: s where e is 0 or s is odd,
    else s's neighbour toward e (the odd one of the two numbers around s + e). s is not 0 where e
    is not: a sum that rounds to 0 is exact. A NaN error (infinite s) leaves s."""
    bits = s.to(tl.int64, bitcast=True)
    inexact = (e > 0) | (e < 0)
    step = tl.where((e > 0) == (s > 0), 1, -1)  # on the bit pattern: away from zero, or toward it
    return tl.where(inexact & ((bits & 1) == 0), bits + step, bits).to(tl.float64, bitcast=True)


@triton.jit
def _split(a):
    """(hi, lo), a = hi + lo with 26 and 27 significant bits (Veltkamp), for ``|a|`` <= 2^995 (the
    splitter's product stays finite)."""
    c = a * _SPLITTER
    hi = c - (c - a)
    return hi, a - hi


@triton.jit
def _two_product(a, b):
    """(p, e): p = RN(a b) and p + e = a b exactly, without an fma (Dekker's product). A factor above
    2^995 is split at 2^-32 of its size and the product and its error scaled back by 2^32, exactly
    (the error's scale is far above the subnormal range there)."""
    big_a = tl.abs(a) > _SPLIT_LIMIT
    big_b = tl.abs(b) > _SPLIT_LIMIT
    a = tl.where(big_a, a * _DOWN, a)
    b = tl.where(big_b, b * _DOWN, b)
    scale = tl.where(big_a, _UP, 1.0) * tl.where(big_b, _UP, 1.0)
    p = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p * scale, e * scale


@triton.jit
def _fma32_by_parts(x, y, z):
    """RN_float32(x y + z) for float32 x, y, z: RO_float64(x y + z) rounded to float32."""
    s, e = two_sum(x.to(tl.float64) * y.to(tl.float64), z.to(tl.float64))
    return _odd(s, e).to(tl.float32)


@triton.jit
def _fma64_by_parts(x, y, z):
    """RN(x y + z) for float64 x, y, z (Boldo and Melquiond's emulated fma). Where the two-rounding
    ``x * y + z`` is not finite (infinite or NaN operands) it is the answer; where the result is 0
    it is too, with the sign IEEE 754 gives an exact zero sum."""
    u_hi, u_lo = _two_product(x, y)
    t_hi, t_lo = two_sum(z, u_hi)
    v, v_err = two_sum(t_lo, u_lo)
    fused = t_hi + _odd(v, v_err)
    plain = x * y + z
    return tl.where((plain - plain == 0) & (fused != 0), fused, plain)


@triton.jit
def fma(x, y, z, FMA_BY_PARTS: tl.constexpr):
    """x y + z rounded once: ``tl.fma``, or with ``FMA_BY_PARTS`` the same value from exact
    operations (float32 and float64; module docstring). The operands promote as ``tl.fma``'s do
    (Python numbers take the other operands' dtype)."""
    r = tl.fma(x, y, z)
    if FMA_BY_PARTS:
        # the operands in tl.fma's dtype and shape (a where() converts a number to it exactly)
        x = tl.where(True, x, r)
        y = tl.where(True, y, r)
        z = tl.where(True, z, r)
        if r.dtype == tl.float64:
            r = _fma64_by_parts(x, y, z)
        else:
            tl.static_assert(r.dtype == tl.float32, "fma by parts takes float32 and float64")
            r = _fma32_by_parts(x, y, z)
    return r


@triton.jit
def loop_bound(n, PYTHON_LOOPS: tl.constexpr):
    """The runtime loop bound ``n`` (an integer scalar) as ``range()`` takes it: itself when
    compiled, with ``PYTHON_LOOPS`` (Triton's interpreter only) its value as a Python ``int``."""
    if PYTHON_LOOPS:
        # the interpreter's scalar holds a one-element NumPy array; returned, not assigned: the
        # interpreter turns every assigned value back into a tensor
        return n.handle.data.item()
    return n


@triton.jit
def _fma_probe(X32, X64):
    a = tl.load(X32)
    b = tl.load(X64)
    tl.store(X32, tl.fma(a, a, -(a * a)))
    tl.store(X64, tl.fma(b, b, -(b * b)))


@functools.cache
def interpreter_rounds_fma_twice() -> bool:
    """Whether Triton's CPU interpreter (which must be running: ``TRITON_INTERPRET=1`` when the
    kernels were imported) rounds ``tl.fma`` twice, in float32 or float64: a probe of
    fma(a, a, -RN(a^2)), the rounding error of a^2 (2^-24 for a = 1 + 2^-12 in float32, 2^-54 for
    a = 1 + 2^-27 in float64), which two roundings give as 0."""
    x32 = torch.tensor([1 + 2**-12], dtype=torch.float32)
    x64 = torch.tensor([1 + 2**-27], dtype=torch.float64)
    _fma_probe[(1,)](x32, x64)
    return x32.item() != 2**-24 or x64.item() != 2**-54
