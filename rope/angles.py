"""Rotation angles m * theta_i reduced modulo 2 pi exactly, by fixed-point arithmetic on turns.

The usual recipe computes m * theta_i as a float32 product and then cos/sin of it. Near
m * theta_i = 2^20 a float32 number has spacing 2^-3, so the angle, and with it cos and sin,
is off by up to 0.06: relative positions stop being relative. What matters is only the angle
modulo 2 pi, i.e. the fractional part of the number of turns m * theta_i / (2 pi).

Write the turns per position of pair i as a 64-bit fixed-point fraction ::

    T_i = round(frac(theta_i / (2 pi)) * 2^64)        (an integer modulo 2^64).

Because m is an integer, frac(m * theta_i / (2 pi)) = frac(m * frac(theta_i / (2 pi))), so ::

    (m * T_i) mod 2^64 = frac(m theta_i / (2 pi)) * 2^64 + m * (rounding error of T_i),

an integer product that wraps around modulo 2^64 by itself in int64 arithmetic. An error of
e units in T_i moves the angle by ``|m|`` e 2^-64 turns: for ``|m|`` < 2^31 and the e <= 8 of
:func:`fixed_point_phases`, less than 3e-9 rad, whatever m. Reading the top bits as a
signed number gives the angle in [-pi, pi), where float cos/sin are accurate to their last bit.
This is RoPE read as a number system: the position's digits pick up exact phase increments.

The Triton kernels compute T_i on the device from float32 theta_i with :data:`INV_TWO_PI_PIECES`
(see :func:`fixed_point_phases`); this module holds the same arithmetic in torch, the exact
big-integer version it is tested against, and the float64 reduced angles the book plots.

The torch path goes further (:func:`cos_sin`): T_i to 126 bits, exact to 2^-125 turns, held in
int64 limbs, so that m T_i is exact for every int64 m and cos and sin come out within 2^-52,
whatever the position: :func:`turns_per_position`, :func:`turns`, :func:`cos_sin_of_turns`.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from . import _checks
from ._checks import integer_tensor

PHASE_BITS = 64
_PIECE_BITS = 26  # 24-bit float32 significand x 26-bit piece = 50 bits: exact in float64
_PIECES = 4  # 1/(2 pi) to 2^-106: enough for every theta below 2^16


def _arctan_inverse(x: int, one: int) -> int:
    """arctan(1/x) * one, by its alternating series in integer arithmetic."""
    total, term, k, sign = 0, one // x, 1, 1
    while term:
        total += sign * (term // k)
        term //= x * x
        k += 2
        sign = -sign
    return total


def _two_pi(bits: int = 256) -> Fraction:
    """2 pi to about ``bits`` bits, from Machin's formula pi = 16 arctan(1/5) - 4 arctan(1/239)."""
    one = 1 << (bits + 16)
    return Fraction(2 * (16 * _arctan_inverse(5, one) - 4 * _arctan_inverse(239, one)), one)


TWO_PI = _two_pi()


def _split(value: Fraction, pieces: int, bits: int) -> list[float]:
    """``value`` as a sum of ``pieces`` float64 numbers of ``bits`` significant bits each."""
    out = []
    for _ in range(pieces):
        exponent = value.numerator.bit_length() - value.denominator.bit_length()
        unit = Fraction(2) ** (exponent - bits + 1)
        piece = (value / unit).__floor__() * unit
        out.append(float(piece))
        value -= piece
    return out


INV_TWO_PI_PIECES: tuple[float, ...] = tuple(_split(1 / TWO_PI, _PIECES, _PIECE_BITS))
"""1/(2 pi) as four float64 numbers of 26 significant bits: theta * piece is exact in float64
for any float32 theta, so frac(theta / (2 pi)) is summed from exact products."""


def exact_phase(theta: float) -> int:
    """T = round(frac(theta / (2 pi)) * 2^64) in [0, 2^64), by exact rational arithmetic.

    Args:
        theta: a frequency theta, a float (the float32 value it stands for, for the kernels' T).
    """
    return round(Fraction(theta) / TWO_PI * 2**PHASE_BITS) % 2**PHASE_BITS


def fixed_point_phases(inv_freq: torch.Tensor) -> torch.Tensor:
    """T_i (as int64 bit patterns) for ``inv_freq`` rounded to float32, in torch float64 arithmetic.

    The same steps as the Triton kernels: theta_i * piece_j is exact, its fractional part f is
    exact, and trunc(f * 2^63) * 2 adds it in 2^-64 units (int64 wraps modulo 2^64). The result
    is within 2 * 4 units of :func:`exact_phase`.

    Args:
        inv_freq: the frequencies theta_i, any floating dtype (rounded to float32 first).

    Returns:
        int64, of inv_freq's shape.
    """
    theta = inv_freq.to(torch.float32).to(torch.float64)
    phase = torch.zeros(theta.shape, dtype=torch.int64, device=theta.device)
    for piece in INV_TWO_PI_PIECES:
        x = theta * piece
        fraction = x - x.trunc()
        phase += (fraction * 2.0**63).to(torch.int64) * 2
    return phase


def reduced_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """m * theta_i reduced to [-pi, pi), float64, shape ``positions.shape + inv_freq.shape``.

    ``inv_freq``: finite float32 theta_i (what :func:`rope.inv_freq` returns); float64 is refused,
    since these 64-bit turns are those of its float32 rounding (:func:`exact_angles` honours
    float64). The product m * T_i wraps modulo 2^64 in int64; its value read as signed, times
    2 pi / 2^64, is the angle.

    Args:
        positions: integer positions m, any shape.
        inv_freq: finite float32 frequencies theta_i.
    """
    integer_tensor("positions", positions)
    _checks.finite_frequencies("inv_freq", inv_freq)
    _checks.same_device("positions", positions, inv_freq=inv_freq)
    turns = positions.to(torch.int64)[..., None] * fixed_point_phases(inv_freq)
    return turns.to(torch.float64) * (float(TWO_PI) / 2.0**PHASE_BITS)


def exact_reduced_angle(position: int, theta: float) -> Fraction:
    """position * theta (theta a float32 value) modulo 2 pi in [-pi, pi), as an exact fraction of
    the 256-bit 2 pi: the reference the fixed-point angles are tested against.

    Args:
        position: the position m, an int.
        theta: the frequency, a float holding a float32 value.
    """
    turns = Fraction(position) * Fraction(theta) / TWO_PI
    turns -= (turns + Fraction(1, 2)).__floor__()
    return turns * TWO_PI


# --- Exact turns for the torch path: 126-bit fixed point in 21-bit limbs -------------------------
#
# theta_i is a float32 number M * 2^e (M < 2^24 an integer) and m an int64, so the number of turns
# m * theta_i / (2 pi) modulo 1 is known exactly once 1/(2 pi) is known to enough bits. Both the
# turns per position T_i = frac(theta_i / (2 pi)) and the product m * T_i are held as 126-bit
# binary fractions in six int64 "limbs" of 21 bits each (least significant first): every limb
# product is below 2^42 and a column of them below 2^44, so int64 arithmetic never overflows and
# nothing needs float64 (the same code runs where float64 does not exist, e.g. Apple's MPS).
# T_i is exact to 2^-125 turns, so for any int64 m the angle is within 2^-59 rad of m theta_i
# modulo 2 pi: below the rounding of a float64 cosine.

LIMB_BITS = 21
TURN_LIMBS = 6  # 126 bits of a turn
_LIMB_MASK = (1 << LIMB_BITS) - 1
_GUARD_LIMBS = 2  # bits of 1/(2 pi) below the window, so M * window's carries into it are right
_WINDOW_LIMBS = TURN_LIMBS + _GUARD_LIMBS
_E_MIN, _E_MAX = -149, 104  # theta = M 2^e: subnormals have e = -149, the largest float32 e = 104
_C_BITS = 400  # 1/(2 pi) as floor(2^400 / (2 pi)): enough for e = 104 with the window's 168 bits


def _inverse_two_pi_windows() -> torch.Tensor:
    """int64 ``[e_max - e_min + 1, 8]``: for each exponent e, the 168 bits of 1/(2 pi) that
    M * 2^e * (1/(2 pi)) needs for its fraction to 2^-126 (two guard limbs below), in limbs.

    frac(M 2^e / (2 pi)) * 2^126 = (M * C >> s) mod 2^126 with C = floor(2^K / (2 pi)) and
    s = K - 126 - e; bits of C above s + 126 only add multiples of 2^126, bits below s - 42
    change the result by less than M 2^-42 < 1 unit... of the guard limbs, which are dropped."""
    c = int(Fraction(2**_C_BITS) / _two_pi(_C_BITS + 64))
    rows = []
    for e in range(_E_MIN, _E_MAX + 1):
        shift = _C_BITS - TURN_LIMBS * LIMB_BITS - e - _GUARD_LIMBS * LIMB_BITS
        window = (c >> shift) & ((1 << (_WINDOW_LIMBS * LIMB_BITS)) - 1)
        rows.append([(window >> (LIMB_BITS * j)) & _LIMB_MASK for j in range(_WINDOW_LIMBS)])
    return torch.tensor(rows, dtype=torch.int64)


_WINDOWS = _inverse_two_pi_windows()
WINDOW_EXPONENTS = (_E_MIN, _E_MAX)
"""The exponents e of theta = M 2^e that the rows of :func:`inverse_two_pi_windows` cover, first and last."""
_COPIES: dict[tuple[int, torch.device], torch.Tensor] = {}


def constant_on(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A module constant on ``device``, copied there once: a copy from pageable host memory per call
    would wait for the device's queue (a host synchronisation per call on CUDA). Copies made while
    tracing (``torch.compile``, fake tensors) are not kept. The constant must live as long as the
    module (it is remembered by identity).

    Args:
        table: the module constant, a CPU tensor that is never freed.
        device: the device to hold the copy.
    """
    if device.type == "cpu":
        return table
    key = (id(table), device)
    if key not in _COPIES:
        copy = table.to(device)
        if type(copy) is not torch.Tensor or torch.compiler.is_compiling():
            return copy
        _COPIES[key] = copy
    return _COPIES[key]


def inverse_two_pi_windows(device: torch.device) -> torch.Tensor:
    """int64 ``[rows, 8]`` on ``device``: row e - e_min holds, in 21-bit limbs (least significant
    first), the 168 bits of 1/(2 pi) that frac(M 2^e / (2 pi)) needs to 2^-126 (two guard limbs
    below); what the kernel's float64 math reads (:mod:`rope.kernels.exact_turns`).

    Args:
        device: the device to hold the table (copied there once).
    """
    return constant_on(_WINDOWS, device)


def _carry(columns: torch.Tensor, limbs: int) -> torch.Tensor:
    """Propagate carries through limb columns (last axis, least significant first); keep
    ``limbs`` limbs, i.e. reduce modulo 2^(21 limbs). Arithmetic shifts make negative columns
    borrow, so the result is the non-negative residue."""
    out, carry = [], 0
    for column in columns.unbind(-1)[:limbs]:
        value = column + carry
        out.append(value & _LIMB_MASK)
        carry = value >> LIMB_BITS
    return torch.stack(out, dim=-1)


def turns_per_position(inv_freq: torch.Tensor) -> torch.Tensor:
    """T_i = frac(theta_i / (2 pi)) as six 21-bit limbs, int64 ``[pairs, 6]`` (least significant
    first), exact to 2^-124 turns (2^-122 for float64), for every finite float32 theta_i, and for
    float64 theta_i that are 0 or of magnitude in [2^-100, 2^127).

    The float32 bits give theta = +-M 2^e exactly (M < 2^24); +-M times the window of 1/(2 pi) for
    exponent e, carried (a negative product borrows, giving the residue of -T) and shifted by the
    two guard limbs, is the fraction. A float64 theta is the exact sum of three float32 pieces
    (24 + 24 + 24 >= 53 bits), whose turns add modulo 1. Integer arithmetic only (and the float64
    split). ``inv_freq`` is checked (:func:`rope._checks.finite_frequencies`, float32 or float64):
    any other dtype, NaN, infinities or float64 magnitudes outside that range are refused, as
    their bits would be read as a wrong angle.

    Args:
        inv_freq: the frequencies theta_i ``[pairs]``, float32 or float64.
    """
    _checks.finite_frequencies("inv_freq", inv_freq, dtypes=_checks.FREQUENCY_DTYPES)
    return turns_of_checked_frequencies(inv_freq)


def turns_of_checked_frequencies(inv_freq: torch.Tensor) -> torch.Tensor:
    """:func:`turns_per_position` of frequencies already checked.

    Args:
        inv_freq: the frequencies theta_i ``[pairs]``, float32 or float64, as
            :func:`turns_per_position` checks them.
    """
    if inv_freq.dtype == torch.float64:
        first = inv_freq.to(torch.float32)
        rest = inv_freq - first.to(torch.float64)  # exact, as is the next remainder
        second = rest.to(torch.float32)
        third = (rest - second.to(torch.float64)).to(torch.float32)
        return _carry(sum(_float32_turns(piece) for piece in (first, second, third)), TURN_LIMBS)
    return _float32_turns(inv_freq)


def _float32_turns(inv_freq: torch.Tensor) -> torch.Tensor:
    bits = inv_freq.contiguous().view(torch.int32).to(torch.int64)
    field = (bits >> 23) & 0xFF
    significand = bits & 0x7FFFFF
    m_int = torch.where(field == 0, significand, significand | 0x800000)
    exponent = torch.where(field == 0, torch.full_like(field, _E_MIN), field - 150)
    window = constant_on(_WINDOWS, inv_freq.device)[(exponent - _E_MIN).clamp(0, _E_MAX - _E_MIN)]  # finite: in range
    signed = torch.where(bits < 0, -m_int, m_int)
    return _carry(signed[..., None] * window, _WINDOW_LIMBS)[..., _GUARD_LIMBS:]


def turns(positions: torch.Tensor, per_position: torch.Tensor) -> torch.Tensor:
    """(m T_i) mod 1 in limbs ``[..., pairs, 6]``, broadcasting ``positions`` (int64 ``[..., 1]``
    or ``[..., pairs]``) against the limbs of T (``[pairs, 6]``).

    m = l_0 + l_1 2^21 + l_2 2^42 with l_0, l_1 in [0, 2^21) and l_2 = m >> 42 signed, so every
    int64 m is covered; column n of the product is sum_k l_k t_(n-k), below 2^44 in magnitude.

    Args:
        positions: integer positions, ``[..., 1]`` or ``[..., pairs]``.
        per_position: the turns per position T_i in limbs, ``[pairs, 6]`` (:func:`turns_per_position`).
    """
    m = positions.to(torch.int64)
    pieces = torch.stack((m & _LIMB_MASK, (m >> LIMB_BITS) & _LIMB_MASK, m >> (2 * LIMB_BITS)), dim=-1)
    shifted = torch.stack([torch.nn.functional.pad(per_position, (k, 0))[..., :TURN_LIMBS] for k in range(3)],
                          dim=-2)  # [pairs, 3, 6]: row k holds t_(n - k)
    return _carry((pieces[..., None] * shifted).sum(dim=-2), TURN_LIMBS)


def add_turns(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(a + b) mod 1 for two turns in limbs (RoPE-Mixed adds the x and y angles).

    Args:
        a: turns in limbs ``[..., 6]``.
        b: turns in limbs, broadcasting against a.
    """
    return _carry(a + b, TURN_LIMBS)


def _quadrant_and_rest(limbs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q = round(4 turns) mod 4, and the two top limbs of turns - q/4 as one signed integer of
    40 bits: the rest is a fraction of a turn in [-1/8, 1/8], whose lower limbs are unchanged."""
    top = limbs[..., -1]
    quadrant = (top + (1 << (LIMB_BITS - 3))) >> (LIMB_BITS - 2)  # 0 .. 4
    head = (top - (quadrant << (LIMB_BITS - 2))) * (1 << LIMB_BITS) + limbs[..., -2]
    return quadrant & 3, head


_SPLIT = 134217729.0  # 2^27 + 1, Veltkamp's splitter for float64
_TWO_PI_HI = float(TWO_PI)
_TWO_PI_LO = float(TWO_PI - Fraction(_TWO_PI_HI))


def two_product(a: torch.Tensor, b: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, e) with p = fl(a b) and p + e = a b exactly, for float64 a and b (Dekker's product, no
    FMA needed; exact while a b stays far from float64's overflow and underflow)."""
    p = a * b
    a_big = a * _SPLIT
    a_hi = a_big - (a_big - a)
    a_lo = a - a_hi
    b_big = b * _SPLIT
    b_hi = b_big - (b_big - b)
    b_lo = b - b_hi
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _rotate_quadrant(quadrant, cos, sin):
    """cos and sin of x + q pi / 2 from those of x: swapped and negated by q mod 4."""
    odd = (quadrant & 1) == 1
    cos_q, sin_q = torch.where(odd, sin, cos), torch.where(odd, cos, sin)
    return (torch.where((quadrant == 1) | (quadrant == 2), -cos_q, cos_q),
            torch.where(quadrant >= 2, -sin_q, sin_q))


_LOW_LIMB_SCALES = torch.tensor([2.0**-105, 2.0**-84, 2.0**-63], dtype=torch.float64)


def cos_sin_of_turns(limbs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cos and sin of 2 pi turns (limbs ``[..., 6]``), each within 2^-52 of the exact value.

    The quadrant comes from the integer; the rest x in [-1/8, 1/8] turns is summed to a float64
    pair (hi, lo) exactly enough (its first 40 bits are exact, the next 63 add with one
    rounding), the angle 2 pi x is formed as a double-float (Dekker's product with 2 pi to 106
    bits), ``|angle|`` <= pi/4, and cos(a + d) = cos a - d sin a, sin(a + d) = sin a + d cos a for the
    low part d (``|d|`` < 2^-53, so d^2 is far below float64's resolution).

    Args:
        limbs: turns in limbs ``[..., 6]`` (:func:`turns`).

    Returns:
        ``(cos, sin)``, float64 ``[...]``.
    """
    quadrant, head = _quadrant_and_rest(limbs)
    head = head.to(torch.float64) * 2.0**-42  # exact: 40 bits
    tail = limbs[..., 1:4].to(torch.float64) @ constant_on(_LOW_LIMB_SCALES, limbs.device)
    x_hi = head + tail
    x_lo = tail - (x_hi - head)  # exact: |head| >= |tail| or head = 0
    angle, error = two_product(x_hi, _TWO_PI_HI)
    low = error + x_hi * _TWO_PI_LO + x_lo * _TWO_PI_HI
    cos, sin = torch.cos(angle), torch.sin(angle)
    return _rotate_quadrant(quadrant, cos - low * sin, sin + low * cos)


def cos_sin_of_turns_float32(limbs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin of 2 pi turns without any float64 arithmetic (for devices that have
    none, e.g. Apple's MPS): the quadrant from the integer, the rest x in [-1/8, 1/8] turns from
    the top 40 bits, then float32 cos/sin of ``|2 pi x|`` <= pi/4: within about 2 float32 roundings,
    the accuracy of the Triton kernel.

    Args:
        limbs: turns in limbs ``[..., 6]`` (:func:`turns`).

    Returns:
        ``(cos, sin)``, float32 ``[...]``.
    """
    quadrant, head = _quadrant_and_rest(limbs)
    high = head >> LIMB_BITS
    x = high.to(torch.float32) * 2.0**-21 + (head - (high << LIMB_BITS)).to(torch.float32) * 2.0**-42
    angle = x * float(TWO_PI)
    return _rotate_quadrant(quadrant, torch.cos(angle), torch.sin(angle))


def cos_sin_of_sum(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cos and sin of the angles sum_j m_j theta_ij reduced modulo 2 pi exactly, ``[..., pairs]``.

    ``positions``: int64 ``[..., terms]`` (term j's position m_j); ``inv_freq``: ``[pairs, terms]``
    (term j's frequencies theta_ij, each column as :func:`turns_per_position` takes it: float32, or
    float64 of magnitude 0 or in [2^-100, 2^127); checked, as in :func:`cos_sin`). Each m_j T_ij is exact in
    126-bit turns and turns add modulo 1 (:func:`add_turns`), so the sum is reduced as exactly as
    one product, whatever the size of each term: for an angle p theta whose position p is no
    integer but an integer combination of frequencies, such as Leaky ReRoPE's bent frame
    (m - w) theta_i / k + w theta_i (:func:`rope.attention.rerope.bent_frame`), where a float64
    p theta would lose ``|p theta|`` 2^-53. Within 2^-52 of the exact values, as :func:`cos_sin`.

    Args:
        positions: int64 ``[..., terms]``, term j's position m_j.
        inv_freq: ``[pairs, terms]``, term j's frequencies theta_ij.

    Returns:
        ``(cos, sin)``, float64 ``[..., pairs]``.
    """
    integer_tensor("positions", positions)
    if not isinstance(inv_freq, torch.Tensor):
        raise TypeError(f"inv_freq must be a float32 or float64 tensor [pairs, terms], got {type(inv_freq).__name__}")
    if inv_freq.dim() != 2 or positions.dim() == 0 or positions.shape[-1] != inv_freq.shape[1]:
        raise ValueError(f"positions [..., terms] and inv_freq [pairs, terms] must name the same terms, got "
                         f"positions {tuple(positions.shape)} and inv_freq {tuple(inv_freq.shape)}")
    _checks.same_device("positions", positions, inv_freq=inv_freq)
    total = None
    for j in range(positions.shape[-1]):
        limbs = turns(positions[..., j, None], turns_per_position(inv_freq[:, j]))  # each column checked
        total = limbs if total is None else add_turns(total, limbs)
    return cos_sin_of_turns(total)


def exact_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """m theta_i reduced exactly to [-pi, pi), as float64 (one rounding of the reduced angle,
    within 2^-51 rad), shape ``positions.shape + inv_freq.shape``: what the float64 reference
    forms of :mod:`rope.reference` turn by. ``inv_freq``: finite float32 or float64 theta_i
    (:func:`turns_per_position`).

    Args:
        positions: integer positions m, any shape.
        inv_freq: finite float32 or float64 frequencies theta_i ``[pairs]``.
    """
    integer_tensor("positions", positions)
    _checks.finite_frequencies("inv_freq", inv_freq, dtypes=_checks.FREQUENCY_DTYPES)
    _checks.same_device("positions", positions, inv_freq=inv_freq)
    limbs = turns(positions[..., None], turns_of_checked_frequencies(inv_freq))
    top = limbs[..., -1] - ((limbs[..., -1] >> (LIMB_BITS - 1)) << LIMB_BITS)  # signed: turns in [-1/2, 1/2)
    head = (top * (1 << LIMB_BITS) + limbs[..., -2]).to(torch.float64) * 2.0**-42
    fraction = head + (limbs[..., -3].to(torch.float64) * 2.0**-63 + limbs[..., -4].to(torch.float64) * 2.0**-84)
    return fraction * float(TWO_PI)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, *, per_pair: bool = False,
            float64: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of m theta_i, with the angle reduced modulo 2 pi exactly.

    ``positions``: integer ``[...]`` (one position per token: the result is ``[..., pairs]``) or,
    with ``per_pair``, ``[..., pairs]`` (each pair's own position: M-RoPE). ``inv_freq``: finite
    float32 or float64 theta_i (:func:`turns_per_position`; checked, as eagerly as
    :func:`rope._checks.assert_values` checks). Returns float64 tensors within 2^-52 of the exact
    values for every int64 position (``float64=False``: float32, without float64 arithmetic,
    within about 2e-7).

    Args:
        positions: integer ``[...]``, one position per token, or with ``per_pair`` ``[..., pairs]``.
        inv_freq: finite float32 or float64 frequencies theta_i ``[pairs]``.
        per_pair: each pair has its own position (M-RoPE).
        float64: compute in float64; False: in float32, for devices without float64.

    Returns:
        ``(cos, sin)``, ``[..., pairs]``.
    """
    integer_tensor("positions", positions)
    _checks.finite_frequencies("inv_freq", inv_freq, dtypes=_checks.FREQUENCY_DTYPES, values=False)  # values: below
    _checks.same_device("positions", positions, inv_freq=inv_freq)
    if _checks.flag("per_pair", per_pair) and (positions.dim() == 0 or positions.shape[-1] != inv_freq.shape[0]):
        raise ValueError(f"positions must be [..., pairs] = [..., {inv_freq.shape[0]}] with per_pair=True "
                         f"(one position per pair), got {tuple(positions.shape)}")
    _checks.flag("float64", float64)
    return cos_sin_of_checked(positions, inv_freq, per_pair=per_pair, float64=float64)


def cos_sin_of_checked(positions: torch.Tensor, inv_freq: torch.Tensor, *, per_pair: bool = False,
                       float64: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cos_sin` of arguments whose types, shapes and devices the caller checked (the values
    of the frequencies are checked here): the torch path's own call, without checking twice.

    Args:
        positions: integer ``[...]``, or with ``per_pair`` ``[..., pairs]``.
        inv_freq: float32 or float64 frequencies theta_i ``[pairs]``.
        per_pair: each pair has its own position (M-RoPE).
        float64: compute in float64; False: in float32.

    Returns:
        ``(cos, sin)``, ``[..., pairs]``.
    """
    _checks.frequency_values("inv_freq", inv_freq)
    if float64 and _products_are_exact(positions, inv_freq):
        angles = (positions if per_pair else positions[..., None]).to(torch.float64) * inv_freq  # float64, exact
        return torch.cos(angles), torch.sin(angles)
    limbs = turns(positions if per_pair else positions[..., None], turns_of_checked_frequencies(inv_freq))
    return cos_sin_of_turns(limbs) if float64 else cos_sin_of_turns_float32(limbs)


EXACT_PRODUCT_POSITIONS = 2**29
"""Below it in magnitude, m theta_i is exact in float64 for every float32 theta_i: 29 + 24 bits."""


def _products_are_exact(positions: torch.Tensor, inv_freq: torch.Tensor) -> bool:
    """Whether :func:`cos_sin` may take the float64 angles m theta_i as they are: float32 theta_i
    and every ``|m|`` < 2^29 make each product exact, and torch's float64 cos and sin reduce any
    argument correctly on the CPU (within an ulp: Payne and Hanek's reduction in SLEEF and glibc;
    tests/test_apply_exactness.py measures it up to 2^1023). Where the bound is read at no cost
    only (:func:`rope._checks.reads_are_free`: the CPU)."""
    if inv_freq.dtype != torch.float32 or positions.numel() == 0 or not _checks.reads_are_free(positions.device):
        return False
    if positions.numel() <= 16:  # decoding: the values themselves, in one read
        values = positions.flatten().tolist()
        low, high = min(values), max(values)
    else:
        low, high = (int(v) for v in torch.aminmax(positions.to(torch.int64)))  # uint32 has no aminmax
    return -EXACT_PRODUCT_POSITIONS < low and high < EXACT_PRODUCT_POSITIONS
