"""Shared test utilities: tolerances and exact rounding to each dtype."""

import math

import torch

# Significand bits (implicit bit included) and the spacing of subnormals, per dtype.
_PRECISION = {
    torch.float16: (11, 2.0**-24),
    torch.bfloat16: (8, 2.0**-133),
    torch.float32: (24, 2.0**-149),
    torch.float64: (53, 2.0**-1074),
}


def ulp(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` numbers at |reference| (float64 in, float64 out)."""
    bits, tiny = _PRECISION[dtype]
    _, exponent = torch.frexp(reference.to(torch.float64).abs())
    return torch.clamp(torch.ldexp(torch.ones_like(reference, dtype=torch.float64), exponent - bits), min=tiny)


def assert_correctly_rounded(out: torch.Tensor, reference: torch.Tensor) -> None:
    """Every entry of `out` is within half a unit in the last place of the float64 reference, plus
    2^-50 of the pair's magnitude (the promise of rope's rotations; the pair's magnitude is at most
    sqrt(2) times the largest coordinate of the head vector, the last axis), plus float64 noise."""
    err = (out.to(torch.float64) - reference).abs()
    pair_bound = 1.5 * reference.abs().amax(dim=-1, keepdim=True) if reference.dim() else reference.abs()
    bound = 0.5 * ulp(reference, out.dtype) * (1 + 1e-6) + 2.0**-50 * pair_bound + 1e-300
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{out.dtype}: error reaches {worst:.3f} x (half an ulp + 2^-50 of the pair)"


# (significand bits incl. the implicit one, smallest normal exponent, largest finite value)
_FORMATS = {
    torch.float16: (11, -14, 65504.0),
    torch.bfloat16: (8, -126, float(torch.finfo(torch.bfloat16).max)),
    torch.float32: (24, -126, float(torch.finfo(torch.float32).max)),
    torch.float64: (53, -1022, float(torch.finfo(torch.float64).max)),
}


def round_exact(value, dtype: torch.dtype) -> float:
    """The exact rational ``value`` (a Fraction, int or float) rounded once to ``dtype``, to nearest
    with ties to even, as a Python float (+-inf beyond the range, as IEEE rounding gives)."""
    from fractions import Fraction

    bits, emin, largest = _FORMATS[dtype]
    if isinstance(value, float) and not math.isfinite(value):
        return value
    value = Fraction(value)
    if value == 0:
        return 0.0
    sign, magnitude = (-1 if value < 0 else 1), abs(value)
    exponent = max(magnitude.numerator.bit_length() - magnitude.denominator.bit_length(), emin)
    while Fraction(2) ** exponent > magnitude and exponent > emin:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    unit = Fraction(2) ** (exponent - bits + 1)  # spacing of dtype numbers at |value|
    scaled = magnitude / unit
    whole = scaled.numerator // scaled.denominator
    rest = scaled - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    rounded = whole * unit
    top = Fraction(largest).numerator.bit_length() - 1  # largest = (2 - 2^(1 - bits)) 2^top
    overflow_threshold = Fraction(largest) + Fraction(2) ** (top - bits)  # largest + half its spacing
    if magnitude >= overflow_threshold:
        return sign * float("inf")
    return sign * float(rounded)


def exact_cos_sin(positions: torch.Tensor, theta: torch.Tensor):
    """float64 cos and sin, ``positions.shape + (pairs,)``, of the exact angles m theta_i
    (theta_i the float32 values): mpmath at 200 bits, rounded once to float64."""
    import mpmath

    with mpmath.workprec(200):
        thetas = [mpmath.mpf(float(t)) for t in theta.cpu()]
        angles = [mpmath.mpf(m) * t for m in positions.cpu().flatten().tolist() for t in thetas]
        cos = [float(mpmath.cos(a)) for a in angles]
        sin = [float(mpmath.sin(a)) for a in angles]
    shape = (*positions.shape, len(thetas))
    return (torch.tensor(cos, dtype=torch.float64).reshape(shape),
            torch.tensor(sin, dtype=torch.float64).reshape(shape))
