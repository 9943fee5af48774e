"""How accurate are cos(m theta_i) and sin(m theta_i)? The usual recipe, the reference, two exact methods.

RoPE needs cos and sin of m * theta_i for integer positions m (RoFormer, Su et al. 2021, eq. 34).
Only the angle modulo 2 pi matters, yet the usual recipe (transformers' ``LlamaRotaryEmbedding``
and most other stacks) forms the floating-point product and takes cos/sin of it:

    angle = fl(fl(m) * fl(theta_i)),        fl = rounding to float32 (or to the model's dtype).

The product reaches m * theta_0 = m, and a float32 number in [2^k, 2^(k+1)) has spacing 2^(k-23),
so the angle is off by up to 2^(k-24) radians: 0.03 rad for m below 2^20, 0.5 rad below 2^24.
From 2^24 on, float32 cannot even hold every integer position. The error depends on m, not on
m - n, so q_m . k_n stops being a function of the offset alone.

The functions here:

* :func:`recipe_angles` and :func:`table_cos_sin`: the usual recipe in a chosen dtype, and cos/sin
  tables rounded to a storage dtype (bfloat16 as many stacks keep them);
* :func:`reference_cos_sin`: float64 cos/sin of angles reduced with 96-bit fixed-point turns
  (the method of :mod:`rope.angles` with 32 more bits), accurate to float64 rounding;
* :func:`fixed_point_cos_sin`: the float32 path of the Triton kernel (:mod:`rope.kernels.triton_rotary`),
  in torch: 64-bit fixed-point turns, top 32 bits to float32, cos/sin of an angle in [-pi, pi);
* :func:`digit_table_cos_sin`: m written in base beta, m = sum_k d_k beta^k, and
  e^{i m theta} = prod_k e^{i d_k beta^k theta} from small tables, combined by angle addition;
* :func:`cos_sin_error`, :func:`first_colliding_integer`, :func:`rotate_with_tables`: the error
  measure, where consecutive integers collide in a float format, and rotation by given tables.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from .._checks import FLOAT_DTYPES, dtype_choice, finite_frequencies, float_tensor, integer, integer_tensor, same_device
from ..angles import PHASE_BITS, TWO_PI, fixed_point_phases
from ..layouts import pair_indices

_COLLISION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_COLLISION_BLOCK = 2**20
_TOP_BITS = 32  # the kernel keeps the top 32 of the 64 fixed-point bits for float32
_CHUNK_BITS = 31  # reference: positions in 31-bit chunks, so that chunk * 32-bit limb < 2^63
_REFERENCE_CHUNKS = 2  # |m| < 2^62


def _check_inv_freq(inv_freq) -> None:
    """The theta_i are float32 numbers (:func:`rope._checks.finite_frequencies`), at least one."""
    finite_frequencies("inv_freq", inv_freq)
    if inv_freq.numel() == 0:
        raise ValueError("inv_freq must hold at least one frequency")


def _check_base(beta, digits) -> tuple[int, int]:
    """(beta, digits) as ints: beta >= 2, digits >= 1, beta**digits <= 2^62."""
    beta = integer("beta", beta, minimum=2)
    digits = integer("digits", digits, minimum=1)
    if beta**digits > 2**62:
        raise ValueError(f"beta**digits must be at most 2^62, got {beta}**{digits}")
    return beta, digits


def recipe_angles(positions: torch.Tensor, inv_freq: torch.Tensor, *, dtype=torch.float32) -> torch.Tensor:
    """The usual recipe's angles fl(fl(m) * fl(theta_i)), every rounding to ``dtype``.

    Shape ``positions.shape + inv_freq.shape``. float32 is transformers' recipe; bfloat16 and
    float16 are what happens when ``inv_freq`` is cast with the model or the product runs under
    autocast (huggingface/transformers#29496, EleutherAI/gpt-neox#1003).

    Args:
        positions: integer positions m, any shape.
        inv_freq: the frequencies theta_i, float32, at least one.
        dtype: the floating dtype every rounding goes to.
    """
    integer_tensor("positions", positions)
    _check_inv_freq(inv_freq)
    dtype_choice("dtype", dtype, FLOAT_DTYPES)
    return positions.to(dtype)[..., None] * inv_freq.to(dtype)


def table_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, dtype=torch.bfloat16, angle_dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables as stacks store them: angles by :func:`recipe_angles` in ``angle_dtype``,
    cos and sin in float32 (float64 for float64 angles), rounded to ``dtype``.

    Args:
        positions: integer positions m, any shape.
        inv_freq: the frequencies theta_i, float32, at least one.
        dtype: the storage dtype of the tables.
        angle_dtype: the dtype of the recipe's angles.

    Returns:
        ``(cos, sin)``, each ``positions.shape + inv_freq.shape``.
    """
    dtype_choice("dtype", dtype, FLOAT_DTYPES)
    dtype_choice("angle_dtype", angle_dtype, FLOAT_DTYPES)
    angles = recipe_angles(positions, inv_freq, dtype=angle_dtype)
    angles = angles.to(torch.float64 if angle_dtype == torch.float64 else torch.float32)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _reference_limbs(inv_freq: torch.Tensor) -> torch.Tensor:
    """int64 ``[chunks, 2, len(inv_freq)]``: for chunk j the 96-bit turns
    U_j = round(frac(2^(31 j) theta_i / (2 pi)) * 2^96) split into (its top 64 bits read as
    signed, its low 32 bits), by exact rational arithmetic on the float32 theta_i."""
    limbs = []
    for chunk in range(_REFERENCE_CHUNKS):
        rows = []
        for theta in inv_freq.to(torch.float32).tolist():
            turns = round(Fraction(theta) * 2 ** (_CHUNK_BITS * chunk) / TWO_PI * 2**96) % 2**96
            top = turns >> 32
            rows.append((top - 2**64 if top >= 2**63 else top, turns % 2**32))
        limbs.append(rows)
    return torch.tensor(limbs, dtype=torch.int64).permute(0, 2, 1)


def reference_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """m * theta_i modulo 2 pi in [-pi, pi] (theta_i rounded to float32), float64, within
    2^-53 pi + 4 * 2 pi / 2^64 < 4e-16 rad of the exact value for every ``|m|`` < 2^62: the
    reference of this module.

    The same fixed-point idea as :func:`rope.angles.reduced_angles`, with 96-bit turns computed
    exactly, so that it can measure that function's 64-bit error too. ``|m|`` is split into 31-bit
    chunks m_j (``|m|`` = sum_j m_j 2^(31 j)); for each, the top 64 bits of (m_j U_j) mod 2^96 are
    m_j * top + floor(m_j * low / 2^32), with no int64 overflow, and the chunks add up modulo 2^64.
    Each chunk drops less than two units of 2^-64 turns. Negative m gives the negated angle.
    Computed on the CPU, whatever the device of ``positions``.

    Args:
        positions: integer positions m, ``|m|`` < 2^62, any shape.
        inv_freq: the frequencies theta_i, float32, at least one.

    Returns:
        float64 ``positions.shape + inv_freq.shape``, on the CPU.
    """
    integer_tensor("positions", positions)
    _check_inv_freq(inv_freq)
    positions = positions.cpu()
    magnitude = positions.to(torch.int64).abs()[..., None]
    largest = int(magnitude.max()) if positions.numel() else 0
    if largest >= 2 ** (_CHUNK_BITS * _REFERENCE_CHUNKS):
        raise ValueError(f"positions must satisfy |m| < 2^62, got |m| = {largest}")
    turns = torch.zeros(magnitude.shape[:-1] + inv_freq.shape, dtype=torch.int64)
    for chunk, (top, low) in enumerate(_reference_limbs(inv_freq)):
        if chunk and largest < 2 ** (_CHUNK_BITS * chunk):
            break  # this and all further chunks are 0 for every position
        m = (magnitude >> (_CHUNK_BITS * chunk)) % 2**_CHUNK_BITS
        turns += m * top + ((m * low) >> 32)  # wraps modulo 2^64; m * low < 2^63
    angles = turns.to(torch.float64) * (float(TWO_PI) / 2.0**64)
    return torch.where(positions[..., None] < 0, -angles, angles)


def reference_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cos/sin(m theta_i) of :func:`reference_angles`: within about 5e-16 of the exact values
    (the angle's rounding, up to 2^-53 pi, plus that of cos/sin).

    cos and sin are numpy's (one thread): on a two-thread CPU machine, torch's multithreaded
    float64 cos was seen, on rare runs, to return values a few 1e-9 off for part of a tensor.

    Args:
        positions: integer positions m, ``|m|`` < 2^62, any shape.
        inv_freq: the frequencies theta_i, float32, at least one.
    """
    angles = reference_angles(positions, inv_freq).numpy()
    return torch.from_numpy(np.cos(angles)), torch.from_numpy(np.sin(angles))


def fixed_point_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin from the 64-bit fixed-point turns, in torch (the Triton kernel reduces the
    same turns, then takes the quarter turn from the integer and evaluates polynomials instead).

    With T_i the 64-bit fixed-point turns of theta_i (:func:`rope.angles.fixed_point_phases`),
    the wrapped product (m T_i) mod 2^64 read as a signed int64 is the angle in units of
    2 pi / 2^64. Its top 32 bits (an arithmetic shift) become a float32 angle in [-pi, pi):
    angle = fl(fl(t >> 32) * fl(2 pi / 2^32)), and cos/sin are taken in float32.

    Args:
        positions: integer positions m, any shape.
        inv_freq: the frequencies theta_i, float32, at least one.
    """
    integer_tensor("positions", positions)
    _check_inv_freq(inv_freq)
    turns = positions.to(torch.int64)[..., None] * fixed_point_phases(inv_freq)
    unit = torch.tensor(float(TWO_PI) / 2.0 ** (PHASE_BITS - _TOP_BITS), dtype=torch.float32)
    angles = (turns >> (PHASE_BITS - _TOP_BITS)).to(torch.float32) * unit
    return angles.cos(), angles.sin()


def position_digits(positions: torch.Tensor, *, beta: int = 256, digits: int = 4) -> torch.Tensor:
    """Digits of ``|m|`` in base beta, least significant first: d_k = floor(``|m|`` / beta^k) mod beta,
    so that ``|m|`` = sum_k d_k beta^k. Shape ``positions.shape + (digits,)``, int64.

    Args:
        positions: integer positions m, ``|m|`` < beta**digits.
        beta: the base, >= 2.
        digits: the number of digits, >= 1, with beta**digits <= 2^62.
    """
    integer_tensor("positions", positions)
    beta, digits = _check_base(beta, digits)
    magnitude = positions.to(torch.int64).abs()
    if positions.numel() and int(magnitude.max()) >= beta**digits:
        raise ValueError(
            f"positions must satisfy |m| < beta**digits = {beta**digits}, got |m| = {int(magnitude.max())}"
        )
    powers = beta ** torch.arange(digits, dtype=torch.int64)
    return torch.div(magnitude[..., None], powers, rounding_mode="floor") % beta


def digit_tables(inv_freq: torch.Tensor, *, beta: int = 256, digits: int = 4, dtype=torch.float32):
    """cos and sin of d beta^k theta_i for d < beta and k < digits, each ``[digits, beta, len(inv_freq)]``.

    Built once from :func:`reference_angles` in float64 and rounded once to ``dtype``.

    Args:
        inv_freq: the frequencies theta_i, float32, at least one.
        beta: the base, >= 2.
        digits: the number of digits, >= 1, with beta**digits <= 2^62.
        dtype: the floating dtype of the tables.

    Returns:
        ``(cos, sin)``.
    """
    _check_inv_freq(inv_freq)
    beta, digits = _check_base(beta, digits)
    dtype_choice("dtype", dtype, FLOAT_DTYPES)
    entries = torch.arange(beta, dtype=torch.int64)[None, :] * beta ** torch.arange(digits, dtype=torch.int64)[:, None]
    cos, sin = reference_cos_sin(entries, inv_freq)
    return cos.to(dtype), sin.to(dtype)


def digit_table_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, beta: int = 256, digits: int = 4, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin(m theta_i) from per-digit tables, combined by angle addition in ``dtype``.

    With ``|m|`` = sum_k d_k beta^k (:func:`position_digits`), e^{i ``|m|`` theta} = prod_k e^{i d_k beta^k theta}.
    Starting from the table entry of digit 0, each further digit k applies

        (c, s) <- (c c_k - s s_k,  s c_k + c s_k),   c_k = cos(d_k beta^k theta), s_k = sin(...),

    the addition formulas for cos(a + b) and sin(a + b). Negative m flips the sine. Every table
    entry is correctly rounded, so in float32 the error is a few units in the last place,
    whatever m; positions must satisfy ``|m|`` < beta**digits.

    Args:
        positions: integer positions m, ``|m|`` < beta**digits.
        inv_freq: the frequencies theta_i, float32, at least one.
        beta: the base, >= 2.
        digits: the number of digits, >= 1.
        dtype: the floating dtype of the tables and of the products.

    Returns:
        ``(cos, sin)``, each ``positions.shape + inv_freq.shape``.
    """
    digit = position_digits(positions, beta=beta, digits=digits)
    cos_table, sin_table = digit_tables(inv_freq, beta=beta, digits=digits, dtype=dtype)
    cos, sin = cos_table[0, digit[..., 0]], sin_table[0, digit[..., 0]]
    for k in range(1, digits):
        cos_k, sin_k = cos_table[k, digit[..., k]], sin_table[k, digit[..., k]]
        cos, sin = cos * cos_k - sin * sin_k, sin * cos_k + cos * sin_k
    return cos, torch.where(positions[..., None] < 0, -sin, sin)


def cos_sin_error(
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> torch.Tensor:
    """max_i max(``|cos_i - cos(m theta_i)|``, ``|sin_i - sin(m theta_i)|``) per position, float64, against
    :func:`reference_cos_sin`. ``cos`` and ``sin`` have shape ``positions.shape + inv_freq.shape``.

    Args:
        cos: the cos values to measure, ``positions.shape + inv_freq.shape``.
        sin: the sin values to measure, of cos's shape.
        positions: integer positions m.
        inv_freq: the frequencies theta_i, float32.

    Returns:
        float64 ``positions.shape``, on the CPU.
    """
    integer_tensor("positions", positions)
    _check_inv_freq(inv_freq)
    expected = tuple(positions.shape) + tuple(inv_freq.shape)
    for name, t in (("cos", cos), ("sin", sin)):
        float_tensor(name, t)
        if tuple(t.shape) != expected:
            raise ValueError(f"{name} must have shape positions.shape + inv_freq.shape = {expected}, "
                             f"got {tuple(t.shape)}")
    cos_ref, sin_ref = reference_cos_sin(positions, inv_freq)
    cos_error = (cos.to("cpu", torch.float64) - cos_ref).abs()
    error = torch.maximum(cos_error, (sin.to("cpu", torch.float64) - sin_ref).abs())
    return error.amax(dim=-1)


def first_colliding_integer(dtype) -> int:
    """The smallest integer n >= 0 with fl(n) == fl(n + 1) in ``dtype``: from n on, consecutive
    positions stored in ``dtype`` are no longer all distinct.

    Found by converting every integer in turn (blocks of 2^20), not from a formula. With p
    significand bits the answer is 2^p: every integer up to 2^p is exact, 2^p + 1 is a tie
    between 2^p and 2^p + 2 and rounds to the even significand, 2^p.

    Args:
        dtype: ``torch.float16``, ``torch.bfloat16`` or ``torch.float32``.
    """
    dtype_choice("dtype", dtype, _COLLISION_DTYPES)
    start = 0
    while True:
        values = torch.arange(start, start + _COLLISION_BLOCK + 1, dtype=torch.int64).to(dtype)
        equal = torch.nonzero(values[1:] == values[:-1])
        if len(equal):
            return start + int(equal[0])
        start += _COLLISION_BLOCK


def rotate_with_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half") -> torch.Tensor:
    """y_a = x_a c - x_b s, y_b = x_b c + x_a s on each pair (a, b) of ``layout`` (RoFormer eq. 34),
    in float64, with given tables ``cos``, ``sin`` (broadcastable to ``x.shape[:-1] + (d/2,)``).

    Args:
        x: floating ``[..., d]``, d even.
        cos: cos of each pair's angle, last dimension d/2.
        sin: sin of each pair's angle, last dimension d/2.
        layout: ``"half"`` or ``"interleaved"``.
    """
    float_tensor("x", x)
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"x must have an even last dimension, got shape {tuple(x.shape)}")
    half = x.shape[-1] // 2
    for name, t in (("cos", cos), ("sin", sin)):
        float_tensor(name, t)
        same_device("x", x, **{name: t})
        if t.dim() == 0 or t.shape[-1] != half:
            raise ValueError(f"{name} must have last dimension x.shape[-1] / 2 = {half}, got {tuple(t.shape)}")
    a, b = pair_indices(x.shape[-1], layout)
    x = x.to(torch.float64)
    c, s = cos.to(torch.float64), sin.to(torch.float64)
    xa, xb = x[..., a], x[..., b]
    ya, yb = xa * c - xb * s, xb * c + xa * s
    y = torch.empty(ya.shape[:-1] + (2 * half,), dtype=torch.float64, device=x.device)
    y[..., a], y[..., b] = ya, yb
    return y
