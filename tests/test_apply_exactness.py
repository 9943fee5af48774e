"""The torch path's promise, checked against mpmath: every output (and every input gradient) is
within half an ulp of its dtype from the exact rotation, plus at most 2^-50 of the pair's
magnitude, at every int64 position; finite inputs never give NaN.

The reference is written here from the formula: the angle m * theta_i with theta_i the float32
value of the frequency, its cosine and sine in mpmath at 200 bits, the products exact.
"""

import math
from fractions import Fraction

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
import rope.apply
from helpers import FLOAT_DTYPES, round_exact, ulp
from rope import reference as ref
from rope.axial import apply_rotary_2d
from rope.mrope import apply_mrope, section_axes

mpmath.mp.prec = 200
SLACK = 2.0**-50  # of the pair's magnitude, beyond half an ulp


def _pairs(rotary_dim: int, layout: str) -> list[tuple[int, int]]:
    half = rotary_dim // 2
    if layout == "half":
        return [(i, i + half) for i in range(half)]
    return [(2 * i, 2 * i + 1) for i in range(half)]


def exact_rotation(x: torch.Tensor, angles_of, layout: str, rotary_dim: int, factor: float, conjugate: bool):
    """The exact s R x as mpmath numbers and the pair magnitude s |(x_a, x_b)| of every entry:
    ``angles_of(b, s, i)`` is the exact angle (an mpmath number) of pair i of token (b, s)."""
    values = x.to(torch.float64).tolist()
    exact = [[[[mpmath.mpf(v) for v in head] for head in token] for token in row] for row in values]
    magnitude = [[[[0.0] * x.shape[3] for _ in token] for token in row] for row in values]
    s = mpmath.mpf(factor)
    for b, row in enumerate(values):
        for t, token in enumerate(row):
            for i, (ia, ib) in enumerate(_pairs(rotary_dim, layout)):
                angle = angles_of(b, t, i)
                c, sn = mpmath.cos(angle), mpmath.sin(angle) * (-1 if conjugate else 1)
                for h, head in enumerate(token):
                    xa, xb = mpmath.mpf(head[ia]), mpmath.mpf(head[ib])
                    exact[b][t][h][ia] = s * (xa * c - xb * sn)
                    exact[b][t][h][ib] = s * (xb * c + xa * sn)
                    magnitude[b][t][h][ia] = magnitude[b][t][h][ib] = float(s * mpmath.hypot(xa, xb))
    return exact, magnitude


def assert_within_promise(out: torch.Tensor, exact, magnitude) -> None:
    """|out - exact| <= ulp(exact)/2 + 2^-50 magnitude, entry by entry; overflow is inf, never NaN."""
    got = out.to(torch.float64).flatten().tolist()
    flat_exact = [v for row in exact for token in row for head in token for v in head]
    flat_mag = [v for row in magnitude for token in row for head in token for v in head]
    for value, reference, size in zip(got, flat_exact, flat_mag):
        assert not math.isnan(value), "a finite input gave NaN"
        nearest = round_exact(Fraction(mpmath.nstr(reference, 70)) if mpmath.isfinite(reference) else 0, out.dtype)
        if math.isinf(nearest):
            assert value == nearest, f"{value} where the exact value {reference} overflows to {nearest}"
            continue
        half_ulp = 0.5 * float(ulp(torch.tensor([float(reference)]), out.dtype))
        error = abs(mpmath.mpf(value) - reference)
        assert error <= half_ulp + SLACK * size + 2.0**-1074, (
            f"{out.dtype}: {value} vs exact {mpmath.nstr(reference, 20)}: error {mpmath.nstr(error, 5)} > "
            f"{half_ulp} + 2^-50 x {size}")


positions_st = st.lists(st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]),
                                  st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=3)
theta_st = st.lists(st.one_of(st.floats(0, 1, width=32), st.floats(-2.0**20, 2.0**20, width=32)), min_size=1,
                    max_size=3)
theta64_st = st.lists(st.one_of(st.just(0.0), st.floats(2.0**-100, 1), st.floats(-2.0**30, -(2.0**-100))),
                      min_size=1, max_size=3)


@given(dtype=st.sampled_from(FLOAT_DTYPES), layout=st.sampled_from(["half", "interleaved"]), positions=positions_st,
       thetas=st.one_of(theta_st.map(lambda t: (t, torch.float32)), theta64_st.map(lambda t: (t, torch.float64))),
       factor=st.floats(0.25, 4), conjugate=st.booleans(), tail=st.integers(0, 2), seed=st.integers(0, 2**32 - 1))
def test_torch_path_is_correctly_rounded_at_any_position(dtype, layout, positions, thetas, factor, conjugate, tail,
                                                         seed):
    """float32 frequencies, and float64 ones honoured exactly (not rounded to float32)."""
    gen = torch.Generator().manual_seed(seed)
    thetas, theta_dtype = thetas
    theta = torch.tensor(thetas, dtype=theta_dtype)
    rotary_dim = 2 * len(thetas)
    seq = len(positions)
    q = (torch.randn(1, seq, 2, rotary_dim + tail, generator=gen, dtype=torch.float64) * 3).to(dtype)
    k = (torch.randn(1, seq, 1, rotary_dim + tail, generator=gen, dtype=torch.float64) * 3).to(dtype)
    pos = torch.tensor(positions)
    q_out, k_out = rope.apply_rotary(q, k, pos, theta, layout=layout, attention_factor=factor, conjugate=conjugate,
                                     backend="torch")

    def angle(b, t, i):
        return mpmath.mpf(positions[t]) * mpmath.mpf(float(theta[i]))

    for x, out in ((q, q_out), (k, k_out)):
        assert_within_promise(out, *exact_rotation(x, angle, layout, rotary_dim, factor, conjugate))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_gradient_is_the_transposed_rotation_rounded_once(dtype):
    """Every dtype (the bf16/fp16 gradients of issue 12's first example came back as zeros)."""
    gen = torch.Generator().manual_seed(1)
    theta, _ = rope.inv_freq({}, 8)
    positions = [3, 2**24 + 1, 2**31 - 1]
    q = torch.randn(1, 3, 2, 10, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(1, 3, 1, 10, generator=gen).to(dtype).requires_grad_()
    grad_q = torch.randn(1, 3, 2, 10, generator=gen).to(dtype)
    grad_k = torch.randn(1, 3, 1, 10, generator=gen).to(dtype)
    q_out, k_out = rope.apply_rotary(q, k, torch.tensor(positions), theta, attention_factor=1.5, backend="torch")
    torch.autograd.backward((q_out, k_out), (grad_q, grad_k))

    def angle(b, t, i):
        return mpmath.mpf(positions[t]) * mpmath.mpf(float(theta[i]))

    for grad, x_grad in ((grad_q, q.grad), (grad_k, k.grad)):  # d/dx of <g, s R x> is s R^T g
        assert_within_promise(x_grad, *exact_rotation(grad, angle, "half", 8, 1.5, True))


def test_gradcheck_and_second_derivative_in_float64():
    gen = torch.Generator().manual_seed(2)
    theta, _ = rope.inv_freq({}, 6)
    q = torch.randn(2, 3, 2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 1, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([[0, 5, 2**30], [7, -3, 11]])

    def fn(a, b):
        return rope.apply_rotary(a, b, positions, theta, layout="interleaved", backend="torch")

    assert torch.autograd.gradcheck(fn, (q, k))
    assert torch.autograd.gradgradcheck(fn, (q, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_overflow_gives_inf_never_nan(dtype):
    """x = the largest finite value in both coordinates with attention factor 2: y_a is finite and
    exact, y_b overflows (inf), and no NaN appears (issue 12, item 4)."""
    big = torch.finfo(dtype).max
    x = torch.tensor([[[[big, big], [big, -big], [-big, big]]]], dtype=dtype)
    theta = torch.tensor([0.5], dtype=torch.float32)
    for factor, conjugate in ((2.0, False), (1.0, True), (1e300, False)):
        out, _ = rope.apply_rotary(x, x, torch.tensor([1]), theta, attention_factor=factor, conjugate=conjugate,
                                   backend="torch")

        def angle(b, t, i):
            return mpmath.mpf(0.5)

        assert_within_promise(out, *exact_rotation(x, angle, "half", 2, factor, conjugate))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float32_route_without_float64(monkeypatch, dtype):
    """Where float64 does not exist (Apple's MPS) the torch path turns by the same exactly reduced
    angles in integer arithmetic and computes in float32: within a few float32 roundings of the
    exact value at every position, forced here on the CPU."""
    monkeypatch.setattr(rope.apply, "has_float64", lambda device: False)
    gen = torch.Generator().manual_seed(3)
    theta, _ = rope.inv_freq({"rope_theta": 5e5}, 16)
    positions = [0, 1000, 2**24 + 3, 2**31 - 1]
    x = torch.randn(1, 4, 2, 16, generator=gen).to(dtype)
    out, _ = rope.apply_rotary(x, x, torch.tensor(positions), theta, attention_factor=1.25, backend="torch")
    exact, magnitude = exact_rotation(
        x, lambda b, t, i: mpmath.mpf(positions[t]) * mpmath.mpf(float(theta[i])), "half", 16, 1.25, False)
    for value, reference, size in zip(out.double().flatten().tolist(),
                                      [v for r in exact for t in r for h in t for v in h],
                                      [v for r in magnitude for t in r for h in t for v in h]):
        half_ulp = 0.5 * float(ulp(torch.tensor([float(reference)]), dtype))
        assert abs(mpmath.mpf(value) - reference) <= half_ulp + 8 * 2.0**-24 * size


def test_mrope_and_2d_are_exact_too():
    """M-RoPE turns pair i by the position of its axis, RoPE-Mixed by x theta_x + y theta_y: both
    exactly reduced (the sum of the two angles is reduced as one)."""
    gen = torch.Generator().manual_seed(4)
    theta, _ = rope.inv_freq({}, 12)
    axes = section_axes([2, 2, 2], 6)
    rows = [[5, 2**31 - 1, 2**29 + 7], [9, -2**31, 13], [2**30, 3, 2**31 - 5]]  # t, h, w of 3 tokens
    x = torch.randn(1, 3, 2, 12, generator=gen).to(torch.bfloat16)
    out, _ = apply_mrope(x, x, torch.tensor(rows), theta, axes, backend="torch")
    exact = exact_rotation(x, lambda b, t, i: mpmath.mpf(rows[int(axes[i])][t]) * mpmath.mpf(float(theta[i])),
                           "half", 12, 1.0, False)
    assert_within_promise(out, *exact)

    theta_x = torch.tensor([0.75, 1e-3, 3.0], dtype=torch.float32)
    theta_y = torch.tensor([-0.5, 2e-4, 0.1], dtype=torch.float32)
    xy = [[2**31 - 1, 2**30 + 1], [-7, 2**31 - 3], [123456789, -987654321]]
    y = torch.randn(1, 3, 1, 6, generator=gen, dtype=torch.float64)
    out, _ = apply_rotary_2d(y, y, torch.tensor(xy), theta_x, theta_y, mixed=True)

    def mixed_angle(b, t, i):
        x, y = (mpmath.mpf(v) for v in xy[t])
        return x * mpmath.mpf(float(theta_x[i])) + y * mpmath.mpf(float(theta_y[i]))

    assert_within_promise(out, *exact_rotation(y, mixed_angle, "half", 6, 1.0, False))


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=8),
       st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4))
def test_turns_in_limbs_are_exact(thetas, positions):
    """T_i (126-bit turns per position) within 2 units of round(frac(theta_i / 2 pi) 2^126), and
    (m T_i) mod 1 within 2 |m| + 1 units of the exact frac(m theta_i / 2 pi), for every float32
    theta_i (negative, subnormal, huge) and int64 m; 2 pi to 400 bits."""
    unit = 2**126
    theta = torch.tensor(thetas, dtype=torch.float32)

    def as_int(limbs):
        return sum(int(v) << (21 * j) for j, v in enumerate(limbs))

    def exact(value):
        with mpmath.workprec(400):
            fraction = mpmath.frac(value / (2 * mpmath.pi))
            return int(mpmath.nint(fraction * unit)) % unit

    def distance(a, b):
        d = (a - b) % unit
        return min(d, unit - d)

    per_position = rope.angles.turns_per_position(theta)
    for i, t in enumerate(theta.tolist()):
        assert distance(as_int(per_position[i].tolist()), exact(mpmath.mpf(t))) <= 2
    limbs = rope.angles.turns(torch.tensor(positions)[:, None], per_position)
    for p, m in enumerate(positions):
        for i, t in enumerate(theta.tolist()):
            assert distance(as_int(limbs[p, i].tolist()), exact(mpmath.mpf(m) * mpmath.mpf(t))) <= 2 * abs(m) + 1


# ----- the float64 reference forms (rope.reference) -----------------------------------------------


def _formula_rotation(x: torch.Tensor, angles, layout: str) -> torch.Tensor:
    """R x in float64 from the formula, pair by pair: (x_a cos - x_b sin, x_b cos + x_a sin), with
    ``angles[b][s][i]`` mpmath numbers (cos and sin at 200 bits, rounded once)."""
    y = x.to(torch.float64).clone()
    rotary_dim = 2 * len(angles[0][0])
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            for i, (ia, ib) in enumerate(_pairs(rotary_dim, layout)):
                c, sn = mpmath.cos(angles[b][s][i]), mpmath.sin(angles[b][s][i])
                for h in range(x.shape[2]):
                    xa, xb = mpmath.mpf(float(x[b, s, h, ia])), mpmath.mpf(float(x[b, s, h, ib]))
                    y[b, s, h, ia], y[b, s, h, ib] = float(xa * c - xb * sn), float(xb * c + xa * sn)
    return y


@given(seed=st.integers(0, 2**31 - 1), layout=st.sampled_from(["half", "interleaved"]),
       dtype=st.sampled_from([torch.float64, torch.float32]))
def test_reference_forms_agree_on_real_positions(seed, layout, dtype):
    """Fractional positions (float64 or float32 tensors) are honoured by all three reference forms:
    the angle is the float64 product of the position and theta_i, each at its exact value."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 2, 8, generator=gen, dtype=torch.float64)
    theta = torch.rand(3, generator=gen)  # float32; rotary_dim 6 of head_dim 8: a tail passes through
    grid = ((torch.rand(2, 3, generator=gen, dtype=torch.float64) - 0.5) * 200).to(dtype)
    assert (grid != grid.round()).all()
    angles = [[[mpmath.mpf(float(grid[b, s])) * mpmath.mpf(float(t)) for t in theta] for s in range(3)]
              for b in range(2)]
    expected = _formula_rotation(x, angles, layout)
    forms = [ref.rotate_by_matrix, ref.rotate_by_complex, ref.rotate_elementwise]
    for form in forms:
        # the float64 product m theta_i is one rounding (|m theta_i| < 100: within 2^-46 rad)
        torch.testing.assert_close(form(x, grid, theta, layout=layout), expected, rtol=0, atol=1e-13)
    matrix = ref.rotate_by_matrix(x, grid, theta, layout=layout)
    for form in forms[1:]:
        torch.testing.assert_close(form(x, grid, theta, layout=layout), matrix, rtol=0, atol=1e-14)


@given(seed=st.integers(0, 2**31 - 1), layout=st.sampled_from(["half", "interleaved"]))
def test_reference_takes_python_frequencies_as_float64(seed, layout):
    """A list of Python floats is float64, never rounded to float32: theta = 0.1 stays 0.1."""
    gen = torch.Generator().manual_seed(seed)
    thetas = torch.rand(3, generator=gen, dtype=torch.float64).tolist()
    m = int(torch.randint(10**5, 10**6, (1,), generator=gen))
    assert any(t != float(torch.tensor(t, dtype=torch.float32)) for t in thetas)
    matrix = ref.rotation_matrix(m, thetas, layout=layout)
    assert torch.equal(matrix, ref.rotation_matrix(m, torch.tensor(thetas, dtype=torch.float64), layout=layout))
    a_b = _pairs(6, layout)
    for i, (ia, ib) in enumerate(a_b):
        angle = mpmath.mpf(m) * mpmath.mpf(thetas[i])  # |m theta| < 10^6: the float64 product within 2^-33
        assert abs(float(matrix[ia, ia]) - float(mpmath.cos(angle))) < 1e-9
        assert abs(float(matrix[ib, ia]) - float(mpmath.sin(angle))) < 1e-9
    x = torch.randn(1, 2, 1, 6, generator=gen, dtype=torch.float64)
    positions = torch.tensor([m, m + 1])
    by_list = [f(x, positions, thetas, layout=layout) for f in (ref.rotate_by_matrix,
                                                                 ref.rotate_by_complex,
                                                                 ref.rotate_elementwise)]
    as_tensor = torch.tensor(thetas, dtype=torch.float64)
    assert torch.equal(by_list[0], ref.rotate_by_matrix(x, positions, as_tensor, layout=layout))
    for y in by_list[1:]:
        torch.testing.assert_close(y, by_list[0], rtol=0, atol=1e-12)
