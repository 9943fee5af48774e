"""Rotation angles m * theta_i reduced modulo 2 pi exactly, by fixed-point arithmetic on turns.

The usual recipe computes m * theta_i as a float32 product and then cos/sin of it. Near
m * theta_i = 2^20 a float32 number has spacing 2^-3, so the angle, and with it cos and sin,
is off by up to 0.06: relative positions stop being relative. What matters is only the angle
modulo 2 pi, i.e. the fractional part of the number of turns m * theta_i / (2 pi).

Write the turns per position of pair i as a 64-bit fixed-point fraction

    T_i = round(frac(theta_i / (2 pi)) * 2^64)        (an integer modulo 2^64).

Because m is an integer, frac(m * theta_i / (2 pi)) = frac(m * frac(theta_i / (2 pi))), so

    (m * T_i) mod 2^64 = frac(m theta_i / (2 pi)) * 2^64 + m * (rounding error of T_i),

an integer product that wraps around modulo 2^64 by itself in int64 arithmetic. An error of
e units in T_i moves the angle by |m| e 2^-64 turns: for |m| < 2^31 and the e <= 8 of
:func:`fixed_point_phases`, less than 3e-9 rad, whatever m. Reading the top bits as a
signed number gives the angle in [-pi, pi), where float cos/sin are accurate to their last bit.
This is RoPE read as a number system: the position's digits pick up exact phase increments.

The Triton kernels compute T_i on the device from float32 theta_i with :data:`INV_TWO_PI_PIECES`
(see :func:`fixed_point_phases`); this module holds the same arithmetic in torch, the exact
big-integer version it is tested against, and the float64 reduced angles the book plots.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from .checks import integer_tensor

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
    """T = round(frac(theta / (2 pi)) * 2^64) in [0, 2^64), by exact rational arithmetic."""
    return round(Fraction(theta) / TWO_PI * 2**PHASE_BITS) % 2**PHASE_BITS


def fixed_point_phases(inv_freq: torch.Tensor) -> torch.Tensor:
    """T_i (as int64 bit patterns) for ``inv_freq`` rounded to float32, in torch float64 arithmetic.

    The same steps as the Triton kernels: theta_i * piece_j is exact, its fractional part f is
    exact, and trunc(f * 2^63) * 2 adds it in 2^-64 units (int64 wraps modulo 2^64). The result
    is within 2 * 4 units of :func:`exact_phase`.
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

    theta_i is taken as its float32 value (what :func:`rope.inv_freq` returns). The product
    m * T_i wraps modulo 2^64 in int64; its value read as signed, times 2 pi / 2^64, is the angle.
    """
    integer_tensor("positions", positions)
    turns = positions.to(torch.int64)[..., None] * fixed_point_phases(inv_freq)
    return turns.to(torch.float64) * (float(TWO_PI) / 2.0**PHASE_BITS)


def exact_reduced_angle(position: int, theta: float) -> Fraction:
    """position * theta (theta a float32 value) modulo 2 pi in [-pi, pi), as an exact fraction of
    the 256-bit 2 pi: the reference the fixed-point angles are tested against."""
    turns = Fraction(position) * Fraction(theta) / TWO_PI
    turns -= (turns + Fraction(1, 2)).__floor__()
    return turns * TWO_PI
