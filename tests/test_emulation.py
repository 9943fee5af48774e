"""rope.kernels.emulation: the fma by parts is correctly rounded (against exact rationals), loop
bounds reach the interpreter as Python ints, and the switches are off where nothing needs them;
rope.kernels refuses a Triton older than it supports, and ``import rope`` needs no Triton.

The kernels run in Triton's interpreter with ``FMA_BY_PARTS`` set by hand, so that the emulation
is checked under every Triton version, whatever its own ``tl.fma`` does. Inputs: random operands
over wide exponent ranges, sums that cancel the product's leading bits, and constructed near ties:
x y + z lies exactly on, or one unit of the product's last bit beside, the midpoint of two
neighbours of the result's precision, where rounding the product first goes wrong.
"""

import os
import random
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

from helpers import round_exact
from rope.kernels import MIN_TRITON, check_triton_version, emulation, triton_rotary

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PRECISION = {torch.float32: 24, torch.float64: 53}


@triton.jit
def _fma_kernel(X, Y, Z, OUT, N: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(OUT + i, emulation.fma(tl.load(X + i), tl.load(Y + i), tl.load(Z + i), FMA_BY_PARTS))


@triton.jit
def _fma_constants_kernel(X, OUT, N: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    """fma with Python numbers as operands (as the kernels' Taylor coefficients are)."""
    i = tl.arange(0, N)
    tl.store(OUT + i, emulation.fma(tl.load(X + i), 0.1, -0.30000000000000004, FMA_BY_PARTS))


@triton.jit
def _loop_kernel(OUT, start, stop, STEP: tl.constexpr, PYTHON_LOOPS: tl.constexpr):
    total = 0
    for i in range(emulation.loop_bound(start, PYTHON_LOOPS), emulation.loop_bound(stop, PYTHON_LOOPS), STEP):
        total += i
    tl.store(OUT, total)


def fma_by_parts(x: list[float], y: list[float], z: list[float], dtype: torch.dtype) -> list[float]:
    """The kernel's fma(x, y, z) with FMA_BY_PARTS, element by element (padded to a power of two)."""
    n = triton.next_power_of_2(len(x))
    tensors = [torch.tensor(v + [0.0] * (n - len(v)), dtype=dtype, device=DEVICE) for v in (x, y, z)]
    out = torch.empty(n, dtype=dtype, device=DEVICE)
    _fma_kernel[(1,)](*tensors, out, N=n, FMA_BY_PARTS=True)
    return out[: len(x)].tolist()


def exact_fma(x: float, y: float, z: float, dtype: torch.dtype) -> float:
    return round_exact(Fraction(x) * Fraction(y) + Fraction(z), dtype)


def representable(value: float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=dtype).item()


def random_operands(rng: random.Random, dtype: torch.dtype, count: int, spread: int):
    """Random x, y (significands from a normal draw, exponents in [-spread, spread]) and z: half of
    them random, half -x y times 1 + a small relative offset (the leading bits cancel)."""
    xs, ys, zs = [], [], []
    for _ in range(count):
        x = representable(rng.gauss(0, 1) * 2.0 ** rng.randint(-spread, spread), dtype)
        y = representable(rng.gauss(0, 1) * 2.0 ** rng.randint(-spread, spread), dtype)
        if rng.random() < 0.5:
            z = rng.gauss(0, 1) * 2.0 ** rng.randint(-spread, spread)
        else:
            z = -x * y * (1 + rng.gauss(0, 1) * 2.0 ** -rng.randint(5, 60))
        xs.append(x)
        ys.append(y)
        zs.append(representable(z, dtype))
    return xs, ys, zs


def near_ties(rng: random.Random, dtype: torch.dtype, count: int, scales: tuple[int, int]):
    """x, y integers of p bits (times powers of two) and z such that x y + z has p + 8 significant
    bits whose lowest 8 are 0x7F, 0x80 or 0x81: one unit of the product's last bit below a
    midpoint, on it, or above it. P = x y; z = -(floor(P / 2^s) - 1) 2^s with s = p + 7 keeps
    P mod 2^s + 2^s, in [2^s, 2^(s + 1)); y's low byte is chosen so that P's is the target."""
    p = PRECISION[dtype]
    s = p + 7
    xs, ys, zs = [], [], []
    for _ in range(count):
        x = rng.randrange(2 ** (p - 1), 2**p) | 1
        target = rng.choice((0x7F, 0x80, 0x81))
        y = (rng.randrange(2 ** (p - 1), 2**p) & ~0xFF) | (target * pow(x, -1, 256)) % 256
        product = x * y
        z = -((product >> s) - 1) << s
        assert (product + z) % 256 == target and 2**s <= product + z < 2 ** (s + 1)
        a, b = rng.randint(*scales), rng.randint(*scales)
        sign = rng.choice((1, -1))
        xs.append(sign * x * 2.0**a)
        ys.append(y * 2.0**b)
        zs.append(sign * float(z) * 2.0 ** (a + b))
    return xs, ys, zs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fma_by_parts_is_correctly_rounded(dtype):
    rng = random.Random(20260)
    spread = 30 if dtype == torch.float32 else 200
    scales = (-40, 40) if dtype == torch.float32 else (-300, 300)
    xs, ys, zs = random_operands(rng, dtype, 1500, spread)
    for extra in (near_ties(rng, dtype, 1500, scales), near_ties(rng, dtype, 200, (-5, 5))):
        xs, ys, zs = xs + extra[0], ys + extra[1], zs + extra[2]
    out = fma_by_parts(xs, ys, zs, dtype)
    wrong = [(x, y, z, o) for x, y, z, o in zip(xs, ys, zs, out) if o != exact_fma(x, y, z, dtype)]
    assert not wrong, f"{len(wrong)} of {len(xs)} not correctly rounded, e.g. {wrong[:3]}"
    # the near ties are where two roundings differ: the inputs reach the cases that matter
    twice = [representable(representable(x * y, dtype) + z, dtype) for x, y, z in zip(xs, ys, zs)]
    assert sum(t != exact_fma(x, y, z, dtype) for x, y, z, t in zip(xs, ys, zs, twice)) > 100


def test_fma_by_parts_float32_rounds_subnormal_results_once():
    """float32 results below 2^-126 (near ties scaled down): float64 holds the whole range."""
    rng = random.Random(7)
    xs, ys, zs = near_ties(rng, torch.float32, 400, (-88, -80))
    out = fma_by_parts(xs, ys, zs, torch.float32)
    assert max(abs(o) for o in out) < 2.0**-126
    assert out == [exact_fma(x, y, z, torch.float32) for x, y, z in zip(xs, ys, zs)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fma_by_parts_special_values(dtype):
    """Infinities, NaN and signed zeros as IEEE 754's fma gives them; huge float64 factors (beyond
    the splitter's reach, up to the largest number) are split at a smaller scale."""
    inf, nan = float("inf"), float("nan")
    big = 2.0**1000 if dtype == torch.float64 else 2.0**100
    largest = torch.finfo(dtype).max  # its top 26 bits round up to 2^1024 when split
    cases = [  # x, y, z, expected
        (inf, 2.0, 1.0, inf), (-inf, 2.0, 1.0, -inf), (2.0, 3.0, -inf, -inf), (inf, 0.0, 1.0, nan),
        (inf, 1.0, -inf, nan), (nan, 1.0, 1.0, nan), (1.0, 1.0, nan, nan),
        (-0.0, 1.0, -0.0, -0.0), (0.0, 1.0, -0.0, 0.0), (2.0, 3.0, -6.0, 0.0), (-2.0, 3.0, 6.0, 0.0),
        (big * (1 + 2**-20), 0.5 + 2**-23, -big / 2, None), (big, 0.75, -big, -big / 4),
        (largest, 0.5 + 2**-20, -largest / 4, None), (-largest, largest * 2.0**-1000, 1.0, None),
    ]
    xs, ys, zs, expected = (list(column) for column in zip(*cases))
    out = fma_by_parts(xs, ys, zs, dtype)
    for x, y, z, e, o in zip(xs, ys, zs, expected, out):
        e = exact_fma(x, y, z, dtype) if e is None else e
        assert (o != o and e != e) or (o == e and str(o)[0] == str(e)[0]), (x, y, z, o, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fma_by_parts_takes_python_numbers_as_tl_fma_does(dtype):
    """Number operands take the tensor's dtype: 0.1 and -0.30000000000000004 rounded to float32 for
    float32 x, exact for float64 x."""
    x = torch.tensor([3.0, 1.0, -2.5, 7.0], dtype=dtype, device=DEVICE)
    out = torch.empty_like(x)
    _fma_constants_kernel[(1,)](x, out, N=4, FMA_BY_PARTS=True)
    y, z = representable(0.1, dtype), representable(-0.30000000000000004, dtype)
    assert out.tolist() == [exact_fma(v, y, z, dtype) for v in x.tolist()]


@pytest.mark.parametrize("python_loops", [True, False] if DEVICE == "cuda" else [True])
def test_loop_bound_runs_runtime_bounds(python_loops):
    out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _loop_kernel[(1,)](out, 3, 40, STEP=4, PYTHON_LOOPS=python_loops)
    assert out.item() == sum(range(3, 40, 4))


def test_switches_follow_the_interpreter(monkeypatch):
    """Off when compiled for a GPU; in the interpreter FMA_BY_PARTS follows the probe, which is True
    exactly where the interpreter's own fma misses the rounding error of a square."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not triton_rotary.needs_fma_by_parts() and not triton_rotary.interpreting()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if DEVICE == "cpu":
        a = torch.tensor([1 + 2**-12], dtype=torch.float32)
        out = torch.empty_like(a)
        _fma_kernel[(1,)](a, a, -(a * a), out, N=1, FMA_BY_PARTS=False)
        assert triton_rotary.needs_fma_by_parts() == (out.item() != 2**-24)


@pytest.mark.parametrize("version", ["3.6.0", "3.9.0", "3.10.1+git1a2b3c", "4.0.0"])
def test_supported_triton_versions_pass(version):
    check_triton_version(version)


@pytest.mark.parametrize("version", ["3.5.1", "2.3.0", "3.0.0+fb", "unknown"])
def test_older_triton_is_refused_by_name(version):
    with pytest.raises(ImportError, match=rf"Triton {MIN_TRITON[0]}\.{MIN_TRITON[1]} or newer, found Triton "
                                          rf"{re.escape(version)}"):
        check_triton_version(version)


def run_python(code: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_importing_the_kernels_under_an_old_triton_fails_with_the_versions():
    """The check runs at import: Triton reporting 3.5.2 stops ``import rope.kernels`` with the message."""
    result = run_python("import triton\ntriton.__version__ = '3.5.2'\nimport rope.kernels")
    assert result.returncode != 0
    assert "ImportError: rope.kernels needs Triton 3.6 or newer, found Triton 3.5.2" in result.stderr


def test_import_rope_works_without_triton():
    """``import rope`` (and the torch path) does not import Triton; only the kernels need it."""
    result = run_python("import sys\nsys.modules['triton'] = None\nimport rope, torch\n"
                        "x = torch.randn(1, 4, 2, 8, dtype=torch.float64)\n"
                        "theta, _ = rope.inv_freq({'rope_theta': 1e4}, 8)\n"
                        "rope.apply_rotary(x, x, torch.arange(4), theta, backend='torch')\n"
                        "try:\n    import rope.kernels\nexcept ImportError:\n    print('no kernels')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no kernels"
