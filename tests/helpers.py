"""Shared test utilities: tolerances, exact rounding to each dtype, exact and float64 references,
random inputs. (Hypothesis strategies shared by several files are in strategies.py.)"""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

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


def to_fraction(value):
    """An mpmath number (or a float) as the exact Fraction it is."""
    from fractions import Fraction

    import mpmath

    sign, mantissa, exponent, _ = mpmath.mpf(value)._mpf_
    return (-1) ** sign * Fraction(mantissa) * Fraction(2) ** exponent


def rotate_float64(x, cos, sin, *, layout="half", attention_factor=1.0, conjugate=False) -> torch.Tensor:
    """float64 s R x (s R^T x with ``conjugate``) on the CPU: pair i of x, (i, i + d/2) or (2i, 2i + 1)
    with d = 2 pairs, turned by float64 ``cos``, ``sin`` of shape [seq, pairs] or [batch, seq, pairs]
    (x is [batch, seq, heads, head_dim]); coordinates past d unchanged."""
    from rope.layouts import pair_indices

    x = x.to("cpu", torch.float64)
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, :, None] * attention_factor, sin[:, :, None] * attention_factor
    if conjugate:
        sin = -sin
    a, b = pair_indices(2 * cos.shape[-1], layout)
    y = x.clone()
    y[..., a] = x[..., a] * cos - x[..., b] * sin
    y[..., b] = x[..., b] * cos + x[..., a] * sin
    return y


def exact_rotation(x, positions, theta, *, layout="half", attention_factor=1.0, conjugate=False) -> torch.Tensor:
    """float64 s R_m x with the cos and sin of the exact angles m theta_i (:func:`exact_cos_sin`):
    within 2^-50 of the pair's magnitude of the exact rotation. ``positions``: [seq] or [batch, seq]."""
    cos, sin = exact_cos_sin(positions, theta)
    return rotate_float64(x, cos, sin, layout=layout, attention_factor=attention_factor, conjugate=conjugate)


def random_qk(gen, batch, seq, heads_q, heads_k, head_dim, *, k_seq=None, dtype=torch.float64):
    """Normal q [batch, seq, heads_q, head_dim] and k [batch, k_seq or seq, heads_k, head_dim], drawn
    in float64 from ``gen`` (q first) and rounded to ``dtype``: one seed, the same values in every dtype."""
    q = torch.randn(batch, seq, heads_q, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(batch, seq if k_seq is None else k_seq, heads_k, head_dim, generator=gen, dtype=torch.float64)
    return q, k.to(dtype)


def theta_loop(base, dim) -> torch.Tensor:
    """theta_i = base^(-2i/d), i = 0 .. d/2 - 1, one Python float at a time (float64)."""
    return torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def names(message: str, name: str) -> bool:
    """Whether an error message names the argument or config key ``name``: as a word of its own,
    not part of a longer identifier or an attribute (``x.name``)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message) is not None


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an operation returns, inside custom operators too
    (rope's): a mode sees only a custom operator's outputs, so it runs those operators' CPU
    implementations itself, under the mode (``inside`` counts the operations seen there)."""

    largest = 0
    inside = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace not in ("aten", "prim", "prims"):  # a custom operator
            before = self.largest
            with self:
                result = func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **(kwargs or {}))
            self.inside += 1
            self.largest = max(before, self.largest)
        else:
            result = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return result


TESTS = Path(__file__).resolve().parent


def value_checks_assert_on(device) -> bool:
    """Whether rope refuses bad tensor *values* on ``device`` by an asynchronous device assertion
    (CUDA: :func:`rope._checks.assert_values` checks without a host synchronisation) rather than
    an eager ``ValueError`` (every other device). A test of a value check picks its branch here:
    ``pytest.raises(ValueError)`` in-process, or :func:`assert_device_assertion` in a subprocess."""
    return torch.device(device).type == "cuda"


def assert_device_assertion(code: str, timeout: float = 600) -> None:
    """Run ``code`` (Python source; tests/ and the repository are importable, so it may call a
    test module's helpers) in a fresh process, synchronise the GPU after it, and assert that the
    process failed with CUDA's device-side assertion and raised no ``ValueError``: the documented
    refusal of a bad tensor value on CUDA. A fresh process, because a failed device assertion
    leaves its process's CUDA context unusable: every later CUDA call, of every later test, fails."""
    script = f"{code}\nimport torch\ntorch.cuda.synchronize()\n"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], cwd=TESTS, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"no device assertion failed:\n{code}\n{output[-3000:]}"
    assert "device-side assert" in output and "ValueError" not in output, f"{code}\n{output[-3000:]}"
