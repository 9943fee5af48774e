"""Shared test utilities: float64 references live in rope.reference; this holds tolerances."""

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
    """Every entry of `out` is within half a unit in the last place (plus float64 noise) of the
    float64 reference: one rounding to out's dtype."""
    err = (out.to(torch.float64) - reference).abs()
    bound = 0.5 * ulp(reference, out.dtype) * (1 + 1e-6) + 1e-12 * reference.abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{out.dtype}: error reaches {worst:.3f} x half an ulp"
