"""The fused kernel's accuracy promises (module docstring of rope/kernels/triton_rotary.py) against mpmath.

Every output is RN(v), the output dtype's rounding to nearest even of a number v within Delta of
the exact value y, with |pair| = s |(x_a, x_b)|:

    float32 math (float32 inputs, or ``float64_math=False``): Delta = c 2^-24 |pair| + 2^-148 max(1, s),
        c = 5 for float32 outputs and 6 for float16 and bfloat16 outputs;
    float-float math (float16 and bfloat16 inputs, by default):
        Delta = 2^-43 |pair| + 2^-145 max(1, s);
    float64 math (float64 inputs, or ``float64_math=True``): Delta = 2^-51 |pair| + 2^-1070 s.

Rounding is monotone, so that is RN(y - Delta) <= out <= RN(y + Delta), checked entry by entry
with y written here from the formula: the angle m theta_i for the float32 value theta_i, its cos
and sin in mpmath at 200 bits, the products exact. It implies |out - y| <= ulp(y)/2 + 2 Delta, so
float-float and float64 math's outputs are correctly rounded unless y lies within Delta of a
rounding tie (float64 math: within half an ulp plus 2^-50 |pair|), and +-inf only where |y| is
beyond the range (or within Delta of its edge); a finite input never gives NaN.

Without a GPU the kernel runs in Triton's interpreter, which performs the same float operations
(every multiply-add is an explicit fma and nothing else is contracted); shapes stay small.
"""

import math
from fractions import Fraction

import mpmath
import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

import rope
from helpers import exact_cos_sin, round_exact, to_fraction, ulp
from rope.angles import inverse_two_pi_windows
from rope.kernels import exact_turns, float_float, triton_rotary
from rope.mrope import apply_mrope, section_axes

mpmath.mp.prec = 200
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
U = Fraction(1, 2**24)
EDGE_POSITIONS = [0, 1, -1, 2**31 - 1, -(2**31 - 1), 10**6, 2**30 + 1]


def float32_math_delta(dtype: torch.dtype, scale: float):
    """Delta of float32 math as a function of |pair| (a Fraction)."""
    c = 5 if dtype == torch.float32 else 6
    underflow = Fraction(1, 2**148) * max(1, Fraction(scale))
    return lambda pair: c * U * pair + underflow


def float_float_math_delta(scale: float):
    """Delta of float-float math as a function of |pair| (a Fraction)."""
    return lambda pair: pair / 2**43 + max(1, Fraction(scale)) / 2**145


def float64_math_delta(scale: float):
    """Delta of float64 math as a function of |pair| (a Fraction)."""
    return lambda pair: pair / 2**51 + Fraction(scale) / 2**1070


def default_delta(dtype: torch.dtype, scale: float):
    """Delta of the math ``launch`` takes by default: float32 math for float32, float64 math for
    float64, float-float math for float16 and bfloat16."""
    if dtype == torch.float32:
        return float32_math_delta(dtype, scale)
    return float64_math_delta(scale) if dtype == torch.float64 else float_float_math_delta(scale)


def pair_indices(rotary_dim: int, layout: str) -> list[tuple[int, int]]:
    half = rotary_dim // 2
    return [(i, i + half) for i in range(half)] if layout == "half" else [(2 * i, 2 * i + 1) for i in range(half)]


def token_angles(positions: torch.Tensor, theta: torch.Tensor, batch: int):
    """angle(b, t, i) = m theta_i exactly (mpmath), m the position of token t of batch row b."""
    rows = positions.cpu().expand(batch, -1).tolist() if positions.dim() == 1 else positions.cpu().tolist()
    thetas = [mpmath.mpf(float(t)) for t in theta.cpu()]
    return lambda b, t, i: mpmath.mpf(rows[b][t]) * thetas[i]


def exact_rotation(x, angle_of, *, layout, rotary_dim, scale, conjugate):
    """[(y, |pair|)] for every entry of x in flat order: y = s R x exactly (mpmath numbers),
    |pair| = s |(x_a, x_b)| as a Fraction; past ``rotary_dim`` (y, None): copied."""
    values = x.cpu().to(torch.float64).tolist()
    s = mpmath.mpf(scale)
    out = []
    for b, row in enumerate(values):
        for t, token in enumerate(row):
            cos_sin = []
            for i in range(rotary_dim // 2):
                angle = angle_of(b, t, i)
                cos_sin.append((mpmath.cos(angle), mpmath.sin(angle) * (-1 if conjugate else 1)))
            for head in token:
                entries = [(mpmath.mpf(v), None) for v in head]
                for (ia, ib), (c, sn) in zip(pair_indices(rotary_dim, layout), cos_sin):
                    xa, xb = mpmath.mpf(head[ia]), mpmath.mpf(head[ib])
                    pair = to_fraction(s) * to_fraction(mpmath.sqrt(xa**2 + xb**2)) * (1 + Fraction(1, 2**190))
                    entries[ia] = (s * (xa * c - xb * sn), pair)
                    entries[ib] = (s * (xb * c + xa * sn), pair)
                out.extend(entries)
    return out


def assert_rounded_from_within(out: torch.Tensor, exact, delta_of, *, slack=None) -> None:
    """Every entry is the rounding of a number within Delta = delta_of(|pair|) of the exact value:
    RN(y - Delta) <= out <= RN(y + Delta); copied entries are equal. ``slack``: also
    |out - y| <= ulp(y)/2 + slack |pair| for finite outputs (the form of float64's promise)."""
    got = out.cpu().to(torch.float64).flatten().tolist()
    assert len(got) == len(exact)
    for value, (y, pair) in zip(got, exact):
        assert not math.isnan(value), "a finite input gave NaN"
        y = to_fraction(y)
        if pair is None:
            assert value == y, f"a copied coordinate changed: {value} != {float(y)}"
            continue
        delta = delta_of(pair)
        low, high = round_exact(y - delta, out.dtype), round_exact(y + delta, out.dtype)
        assert low <= value <= high, (f"{out.dtype}: {value!r} is not the rounding of a number within "
                                      f"{float(delta):.3g} of the exact {float(y)!r} (allowed [{low}, {high}])")
        if slack is not None and math.isfinite(value):
            half_ulp = Fraction(float(ulp(torch.tensor([float(y)]), out.dtype))) / 2
            assert abs(Fraction(value) - y) <= half_ulp + slack * pair, f"{value!r} vs exact {float(y)!r}"


def rotate(x, positions, theta, *, layout="half", scale=1.0, conjugate=False, float64_math=None):
    """x rotated by the kernel (``launch`` with q = k = x, out of place)."""
    out, out_k = torch.empty_like(x), torch.empty_like(x)
    triton_rotary.launch(x, x, out, out_k, positions, theta, interleaved=layout == "interleaved",
                         rotary_dim=2 * theta.numel(), scale=scale, conjugate=conjugate, float64_math=float64_math)
    assert torch.equal(out, out_k)
    return out


def check(x, positions, theta, delta_of, *, layout="half", scale=1.0, conjugate=False, float64_math=None,
          slack=None):
    """Rotate x with the kernel and hold every output to :func:`assert_rounded_from_within`."""
    out = rotate(x.to(DEVICE), positions.to(DEVICE), theta.to(DEVICE), layout=layout, scale=scale,
                 conjugate=conjugate, float64_math=float64_math)
    exact = exact_rotation(x, token_angles(positions, theta, x.shape[0]), layout=layout,
                           rotary_dim=2 * theta.numel(), scale=scale, conjugate=conjugate)
    assert_rounded_from_within(out, exact, delta_of, slack=slack)


def heads(gen, shape, dtype, spread=0):
    """Normal numbers times 2^u, u uniform in [-spread, spread], rounded to ``dtype``."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    return (x * torch.exp2(spread * (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1))).to(dtype)


def positions_with_edges(gen, batch, seq):
    """[batch, seq] positions: the edges of |m| < 2^31 first, then random ones."""
    edges = torch.tensor(EDGE_POSITIONS[:batch * seq])
    rest = torch.randint(-(2**31) + 1, 2**31, (batch * seq - edges.numel(),), generator=gen)
    return torch.cat([edges, rest]).reshape(batch, seq)


THETA, _ = rope.inv_freq({"rope_theta": 1e4}, 8)


# ----- float32 math: float32 (and float16, bfloat16 on request) -----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale, conjugate, layout", [(0.8125, True, "interleaved"), (1.37, False, "half")])
def test_float32_math_is_within_its_bound(dtype, scale, conjugate, layout):
    """Random heads (float32: magnitudes over 2^+-8) at the edges of the positions and random
    ones, attention factors below and above 1 (folded into cos/sin, or applied after)."""
    gen = torch.Generator().manual_seed(int(scale * 1000) + torch.finfo(dtype).bits)
    x = heads(gen, (2, 5, 2, 10), dtype, spread=8 if dtype == torch.float32 else 2)
    check(x, positions_with_edges(gen, 2, 5), THETA, float32_math_delta(dtype, scale), layout=layout, scale=scale,
          conjugate=conjugate, float64_math=False)


@pytest.mark.parametrize("dtype, float64_math", [(torch.bfloat16, None), (torch.bfloat16, False),
                                                 (torch.float32, None)])
@pytest.mark.parametrize("scale", [2.0**-64, 2.0**64])
def test_extreme_attention_factors(dtype, float64_math, scale):
    """Factors from 2^-64 to 2^64 with inputs scaled the other way, so that outputs are O(1)."""
    gen = torch.Generator().manual_seed(5)
    x = (heads(gen, (1, 4, 2, 8), torch.float64) / scale).to(dtype)
    delta = float32_math_delta(dtype, scale) if float64_math is False else default_delta(dtype, scale)
    check(x, positions_with_edges(gen, 1, 4), THETA, delta, scale=scale, float64_math=float64_math)


def test_attention_factor_outside_the_kernels_range_is_refused():
    x = torch.zeros(1, 1, 1, 8, device=DEVICE)
    positions = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    for scale in (2.0**65, 2.0**-65, 0.0, math.inf):
        with pytest.raises(ValueError, match="scale"):
            rotate(x, positions, THETA.to(DEVICE), scale=scale)
    with pytest.raises(TypeError, match="scale"):
        rotate(x, positions, THETA.to(DEVICE), scale=True)


# ----- overflow, underflow ------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy, on the expected overflows to inf
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("scale, conjugate", [(2.0, False), (1.0, True)])
def test_huge_inputs_overflow_to_inf_and_never_give_nan(dtype, scale, conjugate):
    """The largest finite value in both coordinates (issue 12: with attention factor 2, float32
    math gave y_a = inf - inf = NaN, whose exact value is finite), mixed signs, and random
    magnitudes in [max/2, max]: every output is the rounding of the exact value, +-inf only beyond
    the range."""
    gen = torch.Generator().manual_seed(7)
    big = torch.finfo(dtype).max
    signs = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    magnitude = torch.cat([torch.ones(4, 2, dtype=torch.float64),
                           0.5 + 0.5 * torch.rand(4, 2, generator=gen, dtype=torch.float64)])
    pairs = (signs.repeat(2, 1) * magnitude * big).to(dtype)  # [8, 2]: one pair per head
    x = pairs.reshape(1, 1, 8, 2).expand(1, 3, 8, 2).contiguous()
    theta = torch.tensor([0.7853981633974483], dtype=torch.float32)  # about pi/4: cos and sin both large
    positions = torch.tensor([1, 3, -5])
    check(x, positions, theta, default_delta(dtype, scale), scale=scale, conjugate=conjugate)
    if dtype in (torch.float16, torch.bfloat16):
        check(x, positions, theta, float32_math_delta(dtype, scale), scale=scale, conjugate=conjugate,
              float64_math=False)
        check(x, positions, theta, float64_math_delta(scale), scale=scale, conjugate=conjugate, float64_math=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_subnormal_and_zero_inputs(dtype):
    """Multiples of the smallest subnormal and zeros, both signs: the products underflow."""
    gen = torch.Generator().manual_seed(8)
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # the smallest subnormal
    multiples = torch.randint(-40, 41, (2, 4, 2, 8), generator=gen).to(torch.float64)
    x = (multiples * tiny).to(dtype)
    positions = positions_with_edges(gen, 2, 4)
    for scale in (0.75, 1.5):
        check(x, positions, THETA, default_delta(dtype, scale), scale=scale)


# ----- float64 math: float64 (and float16, bfloat16, float32 on request) ---------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("scale, conjugate, layout", [(1.0, False, "half"), (0.3, True, "interleaved")])
def test_float64_math_is_as_exact_as_the_torch_path(dtype, scale, conjugate, layout):
    """Half an ulp plus 2^-50 |pair| at every position (the 64-bit turns of float32 math, off by
    up to 8 units, missed this by about 5e3 ulp near m = 10^6), for frequencies from
    rope.inv_freq and beyond 2^16 (subnormal, the largest float32), where the 126-bit turns are
    still exact: float16 and bfloat16 (``float64_math=True``) correctly rounded, as the torch path."""
    gen = torch.Generator().manual_seed(9 + torch.finfo(dtype).bits)
    theta = torch.cat([THETA, torch.tensor([0.0, 1.0, 3.0e5, 1.0e-30, 1.0e-45, -3.4e38])])
    x = heads(gen, (2, 5, 2, 2 * theta.numel() + 2), dtype, spread=20 if dtype == torch.float64 else 2)
    check(x, positions_with_edges(gen, 2, 5), theta, float64_math_delta(scale), layout=layout, scale=scale,
          conjugate=conjugate, float64_math=True, slack=Fraction(1, 2**50))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_default_math_decode_and_mrope_turn_each_pair_by_its_position(dtype):
    """One token per sequence (the batch read as the token axis) and M-RoPE (pair i turned by row
    axes[i] of the [3, ...] positions), in the default math: float-float (bfloat16), float64."""
    gen = torch.Generator().manual_seed(10)
    x = heads(gen, (5, 1, 2, 10), dtype)
    positions = torch.randint(-(2**31) + 1, 2**31, (5, 1), generator=gen)
    check(x, positions, THETA, default_delta(dtype, 1.0))

    axes = section_axes([2, 1, 1], 4)
    rows = torch.randint(-(2**31) + 1, 2**31, (3, 2, 3), generator=gen)
    x = heads(gen, (2, 3, 2, 8), dtype)
    out, _ = apply_mrope(x.to(DEVICE), x.to(DEVICE), rows.to(DEVICE), THETA.to(DEVICE), axes.to(DEVICE),
                         attention_factor=1.5, backend="triton")
    thetas = [mpmath.mpf(float(t)) for t in THETA]
    exact = exact_rotation(x, lambda b, t, i: mpmath.mpf(int(rows[int(axes[i]), b, t])) * thetas[i], layout="half",
                           rotary_dim=8, scale=1.5, conjugate=False)
    assert_rounded_from_within(out, exact, default_delta(dtype, 1.5))


def hard_cases(dtype):
    """Inputs x and a factor s for position 0 (cos = 1, sin = 0 exactly, so y = s x), where
    float32 math's rounding of s decides the result. float16/bfloat16 (p significand bits):
    s = 1 - 2^-(p+1) - 2^-40 and x = +-2^e, so that y lies 2^-40 |y| below a tie (the correct
    rounding goes down, while float32 math, with RN(s) = 1 - 2^-(p+1), lands on the tie and
    rounds to even, up), and x = +-2^e (1 + j 2^(1-p)) beside them. float32: random x and
    s = 1 - 2^-9 + 0.49 2^-24, which float32 rounds by almost half an ulp."""
    index = torch.arange(64)
    if dtype == torch.float32:
        return heads(torch.Generator().manual_seed(11), (1, 1, 4, 16), dtype), 1 - 2.0**-9 + 0.49 * 2.0**-24
    bits = {torch.float16: 11, torch.bfloat16: 8}[dtype]
    j = torch.where(index % 2 == 0, 0, index // 2).to(torch.float64)
    x = torch.exp2((index % 9 - 4).to(torch.float64)) * (1 + j * 2.0 ** (1 - bits)) * (1 - 2 * (index % 4 // 2))
    return x.reshape(1, 1, 4, 16).to(dtype), 1 - 2.0 ** -(bits + 1) - 2.0**-40


@pytest.mark.parametrize("dtype, float64_math", [(torch.float16, True), (torch.bfloat16, True),
                                                 (torch.float32, True), (torch.float16, None),
                                                 (torch.bfloat16, None)])
def test_float64_and_float_float_math_round_every_dtype_once(dtype, float64_math):
    """float64 math (``float64_math=True``): outputs within half an ulp plus 2^-50 |pair|, i.e.
    correctly rounded unless y is within 2^-51 |pair| of a tie; float-float math (the default for
    float16 and bfloat16): within its Delta = 2^-43 |pair|. On random heads, and on inputs placed
    2^-40 |y| beside ties (outside both Deltas), where every output must be the correct rounding
    and float32 math (within its own bound) rounds some of them the other way."""
    gen = torch.Generator().manual_seed(12)
    x = heads(gen, (2, 4, 2, 10), dtype)
    if float64_math:
        check(x, positions_with_edges(gen, 2, 4), THETA, float64_math_delta(1.3), scale=1.3,
              float64_math=float64_math, slack=Fraction(1, 2**50))
    else:
        check(x, positions_with_edges(gen, 2, 4), THETA, float_float_math_delta(1.3), scale=1.3)

    x, scale = hard_cases(dtype)
    theta = torch.full((x.shape[-1] // 2,), 0.25, dtype=torch.float32)
    positions = torch.zeros(1, dtype=torch.int64)
    exact = [round_exact(Fraction(scale) * Fraction(v), dtype) for v in x.double().flatten().tolist()]
    ours = rotate(x.to(DEVICE), positions.to(DEVICE), theta.to(DEVICE), scale=scale, float64_math=float64_math)
    assert ours.cpu().double().flatten().tolist() == exact
    fast = rotate(x.to(DEVICE), positions.to(DEVICE), theta.to(DEVICE), scale=scale, float64_math=False)
    assert fast.cpu().double().flatten().tolist() != exact
    check(x, positions, theta, float32_math_delta(dtype, scale), scale=scale, float64_math=False)


def test_float64_math_flag_is_checked():
    """float64 q and k cannot take float32 math; the flag is a real bool."""
    x = torch.zeros(1, 1, 1, 8, dtype=torch.float64, device=DEVICE)
    positions = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="float64_math"):
        rotate(x, positions, THETA.to(DEVICE), float64_math=False)
    with pytest.raises(TypeError, match="float64_math"):
        rotate(x.float(), positions, THETA.to(DEVICE), float64_math="yes")


# ----- float-float math: float16 and bfloat16 by default -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale, conjugate, layout", [(1.0, False, "half"), (0.3, True, "interleaved"),
                                                      (1.37, False, "interleaved")])
def test_float_float_math_is_within_its_bound(dtype, scale, conjugate, layout):
    """The default math of float16 and bfloat16: every output the rounding of a number within
    2^-43 |pair| + 2^-145 max(1, s) of the exact one, at positions of every int64 size (the
    126-bit turns reduce every one exactly, as in float64 math) and frequencies beyond 2^16, with
    attention factors folded into cos and sin (0.3) and applied after (1, 1.37: bfloat16 keeps
    half of float32's range as headroom)."""
    gen = torch.Generator().manual_seed(20 + torch.finfo(dtype).bits + int(10 * scale))
    theta = torch.cat([THETA, torch.tensor([0.0, 1.0, 3.0e5, 1.0e-30, 1.0e-45, -3.4e38])])
    x = heads(gen, (2, 5, 2, 2 * theta.numel() + 2), dtype, spread=2)
    positions = positions_with_edges(gen, 2, 5)
    positions[1, :3] = torch.tensor([2**63 - 1, -(2**63), 2**40 + 3])
    check(x, positions, theta, float_float_math_delta(scale), layout=layout, scale=scale, conjugate=conjugate)


def beside_a_tie(gen, dtype, distance):
    """(x, position, theta, scale): one pair (x_a, 0) at a random position m whose exact output
    y_a = s x_a cos(m theta) lies ``distance`` |pair| from a rounding tie of ``dtype`` (above it
    for distance > 0), up to float64's rounding of s (2^-53 |y_a|)."""
    p = {torch.float16: 11, torch.bfloat16: 8}[dtype]
    theta = torch.tensor([float(THETA[1])], dtype=torch.float32)
    while True:
        position = int(torch.randint(2**20, 2**40, (1,), generator=gen))
        cos = mpmath.cos(mpmath.mpf(position) * mpmath.mpf(float(theta)))
        if abs(cos) > 0.1:
            break
    x_a = 1.5 * (1 + int(torch.randint(0, 2**(p - 2), (1,), generator=gen)) * 2.0 ** (2 - p))  # a dtype value
    target = mpmath.mpf(0.55 + 0.4 * float(torch.rand(1, generator=gen))) * x_a * cos
    unit = mpmath.mpf(2) ** (mpmath.floor(mpmath.log(abs(target), 2)) - p + 1)
    tie = (mpmath.floor(target / unit) + mpmath.mpf(1) / 2) * unit
    scale = float((tie + distance * abs(target / cos)) / (x_a * cos))
    x = torch.tensor([[[[x_a, 0.0]]]], dtype=dtype)
    return x, torch.tensor([position]), theta, scale


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float_float_math_rounds_correctly_beyond_delta_of_a_tie(dtype):
    """Outputs placed 3 2^-43 |pair| beside rounding ties (beyond Delta) are the correct rounding;
    outputs placed 2^-52 |pair| beside ties (within Delta, closer than the float-float arithmetic
    resolves) are the rounding of a number within Delta, and some of them are rounded the other
    way: the exception the bound states is real, and bounded."""
    gen = torch.Generator().manual_seed(30 + torch.finfo(dtype).bits)
    other_way = 0
    for distance in [3 * 2.0**-43, -3 * 2.0**-43] * 4 + [2.0**-52, -(2.0**-52)] * 8:
        x, positions, theta, scale = beside_a_tie(gen, dtype, distance)
        out = rotate(x.to(DEVICE), positions.to(DEVICE), theta.to(DEVICE), scale=scale)
        exact = exact_rotation(x, token_angles(positions, theta, 1), layout="half", rotary_dim=2, scale=scale,
                               conjugate=False)
        assert_rounded_from_within(out, exact, float_float_math_delta(scale))
        correct = round_exact(to_fraction(exact[0][0]), dtype)
        if abs(distance) > 2.0**-43:
            assert out.flatten()[0].item() == correct, f"{distance}: {out.flatten()[0].item()} != {correct}"
        else:
            other_way += out.flatten()[0].item() != correct
    assert other_way > 0


@triton.jit
def _scaled_cos_sin_probe(POS, FREQ, WINDOWS, TABLE, OUT, sigma_hi, sigma_lo, N: tl.constexpr, P: tl.constexpr,
                          FMA_BY_PARTS: tl.constexpr):
    i = tl.arange(0, N)
    j = tl.arange(0, P)
    c_hi, c_lo, s_hi, s_lo = float_float.scaled_cos_sin(tl.load(POS + i)[:, None], tl.load(FREQ + j)[None, :],
                                                        WINDOWS, TABLE, sigma_hi, sigma_lo, FMA_BY_PARTS)
    out = OUT + (i[:, None] * P + j[None, :]) * 4
    tl.store(out, c_hi)
    tl.store(out + 1, c_lo)
    tl.store(out + 2, s_hi)
    tl.store(out + 3, s_lo)


def test_cos_sin_table_is_cos_and_sin_to_2_to_the_minus_49():
    """Row j of the float-float table: cos and sin of 2 pi j 2^-11 as float32 pairs (hi the
    rounding of the value, lo of the rest), within 2^-49 of mpmath's, row 0 exactly (1, 0)."""
    rows = float_float.cos_sin_rows()
    assert len(rows) == float_float.TABLE_ROWS == 257 and rows[0] == (1.0, 0.0, 0.0, 0.0)
    for j, (cos_hi, cos_lo, sin_hi, sin_lo) in enumerate(rows):
        angle = 2 * mpmath.pi * j / 2**11
        for hi, lo, value in ((cos_hi, cos_lo, mpmath.cos(angle)), (sin_hi, sin_lo, mpmath.sin(angle))):
            assert abs(to_fraction(value) - Fraction(hi) - Fraction(lo)) <= Fraction(1, 2**49)
            assert abs(Fraction(lo)) <= Fraction(1, 2**25) and float(torch.tensor(lo, dtype=torch.float32)) == lo
    assert torch.equal(float_float.cos_sin_table(torch.device(DEVICE)).cpu(), torch.tensor(rows))


def test_float_float_cos_sin_within_the_proven_bound():
    """sigma cos(m theta) and sigma sin(m theta) as float32 pairs (the per-pair part of float-float
    math) within 2^-45 sigma of mpmath's, chapter 18's bound (2^-45.1), and normalized (``|lo|`` <=
    2^-24 ``|hi|``): positions at the int64 edges and random ones of every size, theta from the smallest
    subnormal to the largest float32, attention factors 1, one that float32 does not hold, and
    2^-64 times one."""
    gen = torch.Generator().manual_seed(18)
    sizes = torch.randint(1, 63, (44,), generator=gen)
    positions = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63)] + [0] * 11
                             + [int(torch.randint(-(2**int(b)), 2**int(b), (1,), generator=gen)) for b in sizes])
    positions[5:16] = torch.arange(-5, 6) * 2**50 + 7  # near multiples of large powers of two
    exponents = torch.randint(-40, 30, (10,), generator=gen).to(torch.float64)
    theta = torch.cat([torch.tensor([1e-45, 3.4e38, -2.0, 0.0, 1.0, 0.25]),
                       (torch.rand(10, generator=gen, dtype=torch.float64) + 1) * torch.exp2(exponents)]).float()
    windows, table = inverse_two_pi_windows(torch.device(DEVICE)), float_float.cos_sin_table(torch.device(DEVICE))
    angles = [mpmath.mpf(m) * mpmath.mpf(float(t)) for m in positions.tolist() for t in theta.tolist()]
    for sigma in (1.0, 0.7368421052631579, 2.0**-64 * 1.2345678901234567):
        sigma_hi = float(torch.tensor(sigma, dtype=torch.float32))
        sigma_lo = float(torch.tensor(sigma - sigma_hi, dtype=torch.float32))
        out = torch.empty(64, 16, 4, device=DEVICE)
        _scaled_cos_sin_probe[(1,)](positions.to(DEVICE), theta.to(DEVICE), windows, table, out, sigma_hi, sigma_lo,
                                    N=64, P=16, FMA_BY_PARTS=triton_rotary.needs_fma_by_parts())
        pairs = out.cpu().reshape(-1, 4).tolist()
        for angle, (c_hi, c_lo, s_hi, s_lo) in zip(angles, pairs):
            for hi, lo, value in ((c_hi, c_lo, mpmath.cos(angle)), (s_hi, s_lo, mpmath.sin(angle))):
                error = abs(to_fraction(value) * Fraction(sigma) - Fraction(hi) - Fraction(lo))
                assert error <= Fraction(sigma) / 2**45, f"off by 2^{math.log2(error / Fraction(sigma)):.2f} sigma"
                assert abs(Fraction(lo)) <= abs(Fraction(hi)) / 2**24


@triton.jit
def _difference_probe(XA, XB, C, Z, R, ODD, N: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    i = tl.arange(0, N)
    xa, xb = tl.load(XA + i), tl.load(XB + i)
    c_hi, c_lo, s_hi, s_lo = tl.load(C + 4 * i), tl.load(C + 4 * i + 1), tl.load(C + 4 * i + 2), tl.load(C + 4 * i + 3)
    z, r = float_float.difference_of_products(xa, xb, c_hi, c_lo, s_hi, s_lo, FMA_BY_PARTS)
    tl.store(Z + i, z)
    tl.store(R + i, r)
    tl.store(ODD + i, float_float.round_to_odd(z, r))


def float32_round_to_odd(value: Fraction) -> Fraction:
    """``value`` rounded to odd in float32: itself if a float32 number, else the one of its two
    float32 neighbours whose last significand bit is 1 (exact, in rational arithmetic)."""
    if value == 0:
        return value
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    exponent -= Fraction(2) ** exponent > magnitude
    unit = Fraction(2) ** (max(exponent, -126) - 23)
    whole = magnitude.numerator * unit.denominator // (magnitude.denominator * unit.numerator)
    rounded = whole * unit if whole * unit == magnitude else (whole | 1) * unit
    return rounded if value > 0 else -rounded


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_difference_of_products_is_within_its_roundings_and_rounds_to_odd(dtype):
    """The per-element part of float-float math: z + r within 7.0000005 2^-48 (``|x_a c_hi|`` +
    ``|x_b s_hi|``) plus 6 2^-150 of x_a (c_hi + c_lo) - x_b (s_hi + s_lo) (chapter 18), z the float32
    rounding of z + r, and round_to_odd(z, r) its rounding to odd; on random pairs and inputs of
    every magnitude, pairs whose two products cancel to a few bits (S exact, the Fast2Sum's second
    case), and products that underflow."""
    gen = torch.Generator().manual_seed(40 + torch.finfo(dtype).bits)
    n = 512
    x = heads(gen, (2, n), torch.float64, spread=30 if dtype == torch.bfloat16 else 8).to(dtype).to(torch.float32)
    x[:, -16:] *= 2.0**-100 if dtype == torch.bfloat16 else 2.0**-14  # products near and below float32's range
    cos_sin = torch.rand(2, n, generator=gen, dtype=torch.float64) * 2 - 1
    cos_sin[:, :4] = torch.tensor([[1.0, 0.0, -1.0, 0.5], [0.0, 1.0, 0.0, -0.5]], dtype=torch.float64)
    hi = cos_sin.float()
    pairs = torch.stack([hi[0], (cos_sin[0] - hi[0].double()).float(), hi[1], (cos_sin[1] - hi[1].double()).float()],
                        dim=-1)
    cancel = slice(16, 128)  # x_b s_hi = x_a c_hi up to the last bits of s_hi
    pairs[cancel, 2] = (x[0, cancel].double() * pairs[cancel, 0].double() / x[1, cancel].double()).float()
    pairs[cancel, 3] = (pairs[cancel, 2].double() * 2.0**-24 * (2 * torch.rand(112, generator=gen,
                                                                              dtype=torch.float64) - 1)).float()
    z, r, odd = (torch.empty(n, device=DEVICE) for _ in range(3))
    _difference_probe[(1,)](x[0].to(DEVICE), x[1].to(DEVICE), pairs.to(DEVICE), z, r, odd, N=n,
                            FMA_BY_PARTS=triton_rotary.needs_fma_by_parts())
    rows = zip(x[0].tolist(), x[1].tolist(), pairs.tolist(), z.cpu().tolist(), r.cpu().tolist(), odd.cpu().tolist())
    for xa, xb, (c_hi, c_lo, s_hi, s_lo), zi, ri, oi in rows:
        exact = Fraction(xa) * (Fraction(c_hi) + Fraction(c_lo)) - Fraction(xb) * (Fraction(s_hi) + Fraction(s_lo))
        weight = abs(Fraction(xa) * Fraction(c_hi)) + abs(Fraction(xb) * Fraction(s_hi))
        value = Fraction(zi) + Fraction(ri)
        assert abs(value - exact) <= Fraction(70000005, 10**7) / 2**48 * weight + Fraction(6, 2**150)
        assert round_exact(value, torch.float32) == zi
        assert Fraction(oi) == float32_round_to_odd(value)


# ----- gradients ------------------------------------------------------------------------------------------------------


def float64_rotation(x, cos, sin, scale, conjugate):
    """s R x (s R^T x when ``conjugate``) in float64 from float64 cos/sin ``[batch, seq, pairs]``, half layout."""
    half = cos.shape[-1]
    xa, xb = x[..., :half], x[..., half:2 * half]
    c, sn = cos[:, :, None] * scale, sin[:, :, None] * (-scale if conjugate else scale)
    return torch.cat([xa * c - xb * sn, xb * c + xa * sn, x[..., 2 * half:]], dim=-1)


@pytest.mark.parametrize("dtype, scale, conjugate", [(torch.float16, 1.3, True), (torch.bfloat16, 0.9, False),
                                                     (torch.float32, 1.0, True)])
def test_gradients_are_within_the_bound_in_every_dtype(dtype, scale, conjugate):
    """The backward is the kernel with the conjugate rotation: each input gradient is within the
    forward's bound (with the incoming gradient as the pair) of float64 autograd through the same
    rotation written here with exactly reduced angles, whose own error is below 2^-50 |pair|."""
    gen = torch.Generator().manual_seed(13)
    positions = positions_with_edges(gen, 2, 4)
    q = heads(gen, (2, 4, 2, 10), dtype).to(DEVICE).requires_grad_()
    k = heads(gen, (2, 4, 1, 10), dtype).to(DEVICE).requires_grad_()
    grads = (heads(gen, (2, 4, 2, 10), dtype).to(DEVICE), heads(gen, (2, 4, 1, 10), dtype).to(DEVICE))
    outs = rope.apply_rotary(q, k, positions.to(DEVICE), THETA.to(DEVICE), attention_factor=scale,
                             conjugate=conjugate, backend="triton")
    got = torch.autograd.grad(outs, (q, k), grads)
    cos, sin = exact_cos_sin(positions, THETA)
    delta = default_delta(dtype, scale)
    for x, grad, x_grad in zip((q, k), grads, got):
        x64 = x.detach().cpu().double().requires_grad_()
        (reference,) = torch.autograd.grad(float64_rotation(x64, cos, sin, scale, conjugate), x64, grad.cpu().double())
        g = grad.cpu().double()
        pair = scale * torch.hypot(g[..., :4], g[..., 4:8]).repeat(1, 1, 1, 2)
        rotated = zip(x_grad.cpu().double()[..., :8].flatten().tolist(), reference[..., :8].flatten().tolist(),
                      pair.flatten().tolist())
        for value, ref, size in rotated:
            allowed = delta(Fraction(size)) + Fraction(size) / 2**50  # plus the float64 reference's error
            low, high = round_exact(Fraction(ref) - allowed, dtype), round_exact(Fraction(ref) + allowed, dtype)
            assert low <= value <= high, f"{dtype}: gradient {value!r}, float64 {ref!r}"
        assert torch.equal(x_grad.cpu()[..., 8:], grad.cpu()[..., 8:])


# ----- the pieces: cos/sin of the turns, the roundings --------------------------------------------------------------


@triton.jit
def _exact_cos_sin_probe(POS, FREQ, WINDOWS, COS, SIN, N: tl.constexpr, P: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    i = tl.arange(0, N)
    j = tl.arange(0, P)
    cos, sin = exact_turns.exact_cos_sin(tl.load(POS + i)[:, None], tl.load(FREQ + j)[None, :], WINDOWS, FMA_BY_PARTS)
    tl.store(COS + i[:, None] * P + j[None, :], cos)
    tl.store(SIN + i[:, None] * P + j[None, :], sin)


@triton.jit
def _near_zero_probe(X, COS, SIN, N: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    i = tl.arange(0, N)
    cos, sin = exact_turns.cos_sin_near_zero(tl.load(X + i), FMA_BY_PARTS)
    tl.store(COS + i, cos)
    tl.store(SIN + i, sin)


def assert_within(got: torch.Tensor, exact: list, bound: Fraction, what: str) -> None:
    worst = max(abs(Fraction(g) - to_fraction(e)) for g, e in zip(got.cpu().flatten().tolist(), exact))
    assert worst <= bound, f"{what} off by {float(worst / bound):.3f} x the bound"


def test_exact_cos_sin_in_the_kernel_is_within_2_to_the_minus_52():
    """float64 math's cos(m theta) and sin(m theta) (126-bit turns in the kernel) against mpmath
    at the exact angle: positions at the int64 and int32 edges and random ones of every size,
    float32 theta from the smallest subnormal to the largest value, both signs."""
    gen = torch.Generator().manual_seed(17)
    edges = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
    sizes = torch.randint(1, 63, (57,), generator=gen)
    rest = [int(torch.randint(-(2**int(b)), 2**int(b), (1,), generator=gen)) for b in sizes]
    positions = torch.tensor(edges + rest, dtype=torch.int64)
    exponents = torch.randint(-149, 128, (26,), generator=gen).to(torch.float64)
    random = (torch.rand(26, generator=gen, dtype=torch.float64) + 1) * torch.exp2(exponents)
    theta = torch.cat([torch.tensor([1e-45, -1e-45, 3.4028234663852886e38, -2.0, 0.0, 1.0]), random]).float()
    theta = theta * torch.where(torch.arange(32) % 3 == 0, -1.0, 1.0)
    cos, sin = (torch.empty(64, 32, dtype=torch.float64, device=DEVICE) for _ in range(2))
    _exact_cos_sin_probe[(1,)](positions.to(DEVICE), theta.to(DEVICE), inverse_two_pi_windows(torch.device(DEVICE)),
                               cos, sin, N=64, P=32, FMA_BY_PARTS=triton_rotary.needs_fma_by_parts())
    angles = [mpmath.mpf(m) * mpmath.mpf(float(t)) for m in positions.tolist() for t in theta.tolist()]
    assert_within(cos, [mpmath.cos(a) for a in angles], Fraction(1, 2**52), "cos")
    assert_within(sin, [mpmath.sin(a) for a in angles], Fraction(1, 2**52), "sin")


def test_kernel_cos_sin_polynomials_near_zero():
    """The Taylor polynomials of float64 math on [-pi/4, pi/4] and a little beyond (the rest of
    a turn after the quadrant), densest near the ends where the truncated terms are largest."""
    edge = math.pi / 4 + 2.0**-40
    x = torch.cat([torch.linspace(-edge, edge, 1000, dtype=torch.float64),
                   torch.tensor([edge, -edge, 2.0**-1074, 0.0, 1e-8, math.pi / 4] * 4, dtype=torch.float64)])
    cos, sin = torch.empty_like(x), torch.empty_like(x)
    _near_zero_probe[(1,)](x.to(DEVICE), cos, sin, N=1024, FMA_BY_PARTS=triton_rotary.needs_fma_by_parts())
    assert_within(cos, [mpmath.cos(v) for v in x.tolist()], Fraction(1, 2**52), "cos")
    assert_within(sin, [mpmath.sin(v) for v in x.tolist()], Fraction(1, 2**52), "sin")


@triton.jit
def _rounding_probe(X, OUT, DTYPE_IS_BF16: tl.constexpr, DTYPE_IS_FP16: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    y = tl.load(X + i)
    if DTYPE_IS_BF16:
        tl.store(OUT + i, triton_rotary.round_to_dtype(y, tl.bfloat16, True))
    elif DTYPE_IS_FP16:
        tl.store(OUT + i, triton_rotary.round_to_dtype(y, tl.float16, True))
    else:
        tl.store(OUT + i, triton_rotary.round_to_dtype(y, tl.float32, True))


def test_bfloat16_rounding_by_bits_is_round_to_nearest_even():
    """float32 -> bfloat16 in the kernel under the interpreter (which itself truncates): ties both
    ways, the largest values (overflow to inf), subnormals, infinities, NaN and random patterns,
    against torch's conversion (to nearest even)."""
    gen = torch.Generator().manual_seed(15)
    special = [0x00008000, 0x00018000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
               0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x80000001, 0x00000000, 0x80000000, 0x007FFFFF]
    patterns = special + torch.randint(0, 2**32, (1024 - len(special),), generator=gen).tolist()
    y = torch.tensor([p - 2**32 if p >= 2**31 else p for p in patterns], dtype=torch.int32).view(torch.float32)
    out = torch.empty(1024, dtype=torch.bfloat16, device=DEVICE)
    _rounding_probe[(1,)](y.to(DEVICE), out, DTYPE_IS_BF16=True, DTYPE_IS_FP16=False, N=1024)
    expected = y.to(torch.bfloat16)
    got = out.cpu()
    same = (got.view(torch.int16) == expected.view(torch.int16)) | (got.isnan() & expected.isnan())
    assert same.all(), f"{y[~same][:4].tolist()} gave {got[~same][:4].tolist()}, not {expected[~same][:4].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rounding_from_float64_is_once(dtype):
    """float64 -> dtype in the kernel (float64 math): round to odd on float32, then to nearest
    even, is one rounding: values one float64 ulp beside ties, below float32's normal range
    (bfloat16 reaches there), beyond the range, infinities, NaN, random values."""
    gen = torch.Generator().manual_seed(16)
    bits = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24}[dtype]
    exponents = {torch.float16: (-24, 15), torch.bfloat16: (-133, 127), torch.float32: (-149, 127)}[dtype]
    e = torch.randint(*exponents, (128,), generator=gen).to(torch.float64)
    ties = torch.exp2(e) * (1 + (2 * torch.randint(0, 2 ** (bits - 1), (128,), generator=gen) + 1) * 2.0**-bits)
    nudged = torch.cat([ties, torch.nextafter(ties, ties * 2), torch.nextafter(ties, ties * 0)])
    special = torch.tensor([math.inf, -math.inf, math.nan, float(torch.finfo(dtype).max)], dtype=torch.float64)
    values = torch.cat([nudged, -nudged, special, torch.randn(1024 - 772, generator=gen, dtype=torch.float64) * 1e3])
    out = torch.empty(1024, dtype=dtype, device=DEVICE)
    _rounding_probe[(1,)](values.to(DEVICE), out, DTYPE_IS_BF16=dtype == torch.bfloat16,
                          DTYPE_IS_FP16=dtype == torch.float16, N=1024)
    for value, got in zip(values.tolist(), out.cpu().double().tolist()):
        if math.isnan(value):
            assert math.isnan(got)
        else:
            assert got == round_exact(value if math.isinf(value) else Fraction(value), dtype), value
