"""rope.axial (2D RoPE) against explicit float64 block matrices, and the 2D relative property."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import FLOAT_DTYPES, assert_correctly_rounded, names
from rope.axial import apply_rotary_2d, axial_inv_freq, mixed_inv_freq, pair_cos_sin
from rope.layouts import interleaved_to_half
from rope.reference import rotation_matrix
from strategies import layouts


@st.composite
def problems(draw, dtype=None, high=None, mixed=None):
    """Random q, k (GQA allowed), 2D positions ([seq, 2] or [batch, seq, 2]) and axial or mixed frequencies."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, seq = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    heads_q, heads_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    mixed = draw(st.booleans()) if mixed is None else mixed
    if mixed:
        pairs = draw(st.integers(1, 8))
        theta_x = torch.randn(pairs, generator=gen)
        theta_y = torch.randn(pairs, generator=gen)
    else:
        pairs_x, pairs_y = draw(st.integers(1, 5)), draw(st.integers(1, 5))
        theta_x = rope.inv_freq({"rope_theta": draw(st.floats(10.0, 1e4))}, 2 * pairs_x)[0]
        theta_y = rope.inv_freq({"rope_theta": draw(st.floats(10.0, 1e4))}, 2 * pairs_y)[0]
        pairs = pairs_x + pairs_y
    head_dim = 2 * pairs + 2 * draw(st.integers(0, 2))
    dtype = dtype or draw(st.sampled_from(FLOAT_DTYPES))
    q = torch.randn(batch, seq, heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, seq, heads_k, head_dim, generator=gen).to(dtype)
    high = high or draw(st.sampled_from([16, 2**12, 2**20]))
    shape = (seq, 2) if draw(st.booleans()) else (batch, seq, 2)
    positions = torch.randint(-high, high, shape, generator=gen)
    return q, k, positions, theta_x, theta_y, mixed


def full_frequencies(theta_x, theta_y, mixed):
    """Per-pair (x, y) frequencies: axial puts zeros where an axis does not act."""
    if mixed:
        return theta_x.to(torch.float64), theta_y.to(torch.float64)
    zeros_x, zeros_y = torch.zeros(len(theta_y), dtype=torch.float64), torch.zeros(len(theta_x), dtype=torch.float64)
    return torch.cat([theta_x.double(), zeros_x]), torch.cat([zeros_y, theta_y.double()])


def block_matrix(x, y, theta_x, theta_y, mixed, head_dim, layout):
    """The explicit float64 R_(x, y): pair i rotated by x theta_x,i + y theta_y,i (identity past the width)."""
    fx, fy = full_frequencies(theta_x, theta_y, mixed)
    return rotation_matrix(1.0, x * fx + y * fy, head_dim=head_dim, layout=layout)


def rotate_by_block_matrix(t, positions, theta_x, theta_y, mixed, layout):
    grid = positions.expand(t.shape[0], *positions.shape) if positions.dim() == 2 else positions
    mats = torch.stack([block_matrix(int(x), int(y), theta_x, theta_y, mixed, t.shape[-1], layout)
                        for x, y in grid.reshape(-1, 2)])
    return torch.einsum("bsij,bshj->bshi", mats.reshape(*grid.shape[:2], *mats.shape[-2:]), t.double())


@given(problems(), layouts)
def test_matches_block_matrix_with_one_rounding(problem, layout):
    q, k, positions, theta_x, theta_y, mixed = problem
    q_out, k_out = apply_rotary_2d(q, k, positions, theta_x, theta_y, layout=layout, mixed=mixed)
    for t, out in ((q, q_out), (k, k_out)):
        assert out.dtype == t.dtype and out.shape == t.shape
        assert_correctly_rounded(out, rotate_by_block_matrix(t, positions, theta_x, theta_y, mixed, layout))
        rotated = 2 * len(full_frequencies(theta_x, theta_y, mixed)[0])
        assert torch.equal(out[..., rotated:], t[..., rotated:])


@given(st.integers(-(2**12), 2**12), st.integers(-(2**12), 2**12), st.integers(1, 4), st.integers(1, 4),
       st.integers(0, 2**31 - 1))
def test_axial_is_the_product_of_commuting_rotations(x, y, pairs_x, pairs_y, seed):
    """Axial, interleaved: blockdiag(R_x, R_y); and in general R_(x,y) = exp(x B_x) exp(y B_y)."""
    theta_x = rope.inv_freq({}, 2 * pairs_x)[0]
    theta_y = torch.rand(pairs_y, generator=torch.Generator().manual_seed(seed))
    d = 2 * (pairs_x + pairs_y)
    explicit = torch.block_diag(rotation_matrix(x, theta_x, layout="interleaved"),
                                rotation_matrix(y, theta_y, layout="interleaved"))
    ours = block_matrix(x, y, theta_x, theta_y, False, d, "interleaved")
    torch.testing.assert_close(ours, explicit, rtol=0, atol=1e-12)
    fx, fy = full_frequencies(theta_x, theta_y, False)
    for layout in ("half", "interleaved"):
        product = rotation_matrix(x, fx, layout=layout) @ rotation_matrix(y, fy, layout=layout)
        torch.testing.assert_close(block_matrix(x, y, theta_x, theta_y, False, d, layout), product, rtol=0, atol=1e-9)
    # The half layout is the interleaved one with coordinates permuted (pair i keeps its axis).
    p = interleaved_to_half(d)
    half = block_matrix(x, y, theta_x, theta_y, False, d, "half")
    torch.testing.assert_close(half, explicit[p][:, p], rtol=0, atol=1e-12)


@given(problems(dtype=torch.float64, high=2**12), layouts, st.integers(-(2**12), 2**12), st.integers(-(2**12), 2**12))
def test_scores_depend_on_the_offset_only(problem, layout, shift_x, shift_y):
    """(R_{p_m} q)^T (R_{p_n} k) is unchanged when every position moves by the same (dx, dy)."""
    q, k, positions, theta_x, theta_y, mixed = problem
    k = k[:, :, :1].expand_as(q).contiguous()
    shifted = positions + torch.tensor([shift_x, shift_y])

    def scores(pos):
        q_rot, k_rot = apply_rotary_2d(q, k, pos, theta_x, theta_y, layout=layout, mixed=mixed)
        return torch.einsum("bshd,bthd->bhst", q_rot, k_rot)

    torch.testing.assert_close(scores(shifted), scores(positions), rtol=1e-9, atol=1e-9)


@given(problems(dtype=torch.float64), layouts)
def test_conjugate_is_the_transpose_and_inverts(problem, layout):
    q, k, positions, theta_x, theta_y, mixed = problem
    q_rot, k_rot = apply_rotary_2d(q, k, positions, theta_x, theta_y, layout=layout, mixed=mixed)
    q_back, k_back = apply_rotary_2d(q_rot, k_rot, positions, theta_x, theta_y, layout=layout, mixed=mixed,
                                     conjugate=True)
    torch.testing.assert_close(q_back, q, rtol=0, atol=1e-12)
    torch.testing.assert_close(k_back, k, rtol=0, atol=1e-12)
    q_conj, _ = apply_rotary_2d(q, k, positions, theta_x, theta_y, layout=layout, mixed=mixed, conjugate=True)
    grid = positions.expand(q.shape[0], *positions.shape) if positions.dim() == 2 else positions
    mats = torch.stack([block_matrix(int(x), int(y), theta_x, theta_y, mixed, q.shape[-1], layout)
                        for x, y in grid.reshape(-1, 2)])
    expected = torch.einsum("bsji,bshj->bshi", mats.reshape(*grid.shape[:2], *mats.shape[-2:]), q)
    torch.testing.assert_close(q_conj, expected, rtol=0, atol=1e-12)


@given(problems(dtype=torch.float32, mixed=False), layouts)
def test_axial_equals_mixed_with_zero_cross_frequencies_and_1d_on_the_diagonal(problem, layout):
    q, k, positions, theta_x, theta_y, _ = problem
    axial = apply_rotary_2d(q, k, positions, theta_x, theta_y, layout=layout)
    fx, fy = (f.float() for f in full_frequencies(theta_x, theta_y, False))
    as_mixed = apply_rotary_2d(q, k, positions, fx, fy, layout=layout, mixed=True)
    assert torch.equal(axial[0], as_mixed[0]) and torch.equal(axial[1], as_mixed[1])
    # x = y = m: axial RoPE is 1D RoPE with the frequencies side by side.
    diagonal = positions[..., :1].expand_as(positions)
    one_d = rope.apply_rotary(q, k, diagonal[..., 0], torch.cat([theta_x, theta_y]), layout=layout)
    two_d = apply_rotary_2d(q, k, diagonal, theta_x, theta_y, layout=layout)
    assert torch.equal(one_d[0], two_d[0]) and torch.equal(one_d[1], two_d[1])


@given(st.sampled_from([4, 8, 64, 128]), st.floats(2.0, 1e5))
def test_axial_inv_freq_is_1d_rope_of_half_the_width(head_dim, base):
    theta_x, theta_y = axial_inv_freq(head_dim, base=base)
    expected = torch.tensor([base ** (-4 * j / head_dim) for j in range(head_dim // 4)], dtype=torch.float64)
    assert theta_x.dtype == torch.float32 and torch.equal(theta_x, theta_y)
    assert_correctly_rounded(theta_x, expected)


@given(st.sampled_from([4, 8, 64]), st.floats(-10.0, 10.0), st.floats(2.0, 100.0))
def test_mixed_inv_freq_directions(head_dim, angle, base):
    fx, fy = mixed_inv_freq(head_dim, base=base, angle=angle)
    quarter = head_dim // 4
    magnitude = torch.tensor([base ** (-4 * j / head_dim) for j in range(quarter)], dtype=torch.float64)
    expected_x = torch.cat([magnitude * math.cos(angle), magnitude * math.cos(angle + math.pi / 2)])
    expected_y = torch.cat([magnitude * math.sin(angle), magnitude * math.sin(angle + math.pi / 2)])
    torch.testing.assert_close(fx.double(), expected_x, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fy.double(), expected_y, rtol=1e-6, atol=1e-7)
    # Pair j and pair head_dim/4 + j rotate along perpendicular directions of the (x, y) plane.
    dot = fx[:quarter].double() * fx[quarter:].double() + fy[:quarter].double() * fy[quarter:].double()
    assert dot.abs().max() < 1e-6


def test_mixed_with_zero_angle_is_axial():
    ax, ay = axial_inv_freq(16, base=10.0)
    fx, fy = mixed_inv_freq(16, base=10.0, angle=0.0)
    assert torch.equal(fx, torch.cat([ax, torch.zeros(4)])) and torch.equal(fy, torch.cat([torch.zeros(4), ay]))


def _inputs():
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8)
    fx, fy = axial_inv_freq(8)
    return q, k, torch.randint(0, 5, (4, 2)), fx, fy


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda q, k, p, fx, fy: (q, k, p.float(), fx, fy), TypeError, "positions_xy must be an integer"),
        (lambda q, k, p, fx, fy: (q, k, p.tolist(), fx, fy), TypeError, "positions_xy must be a torch.Tensor"),
        (lambda q, k, p, fx, fy: (q, k, p[:, 0], fx, fy), ValueError, r"positions_xy must have shape \[seq, 2\]"),
        (lambda q, k, p, fx, fy: (q, k, p[:3], fx, fy), ValueError, r"positions_xy must have shape"),
        (lambda q, k, p, fx, fy: (q, k.double(), p, fx, fy), TypeError, "same dtype"),
        (lambda q, k, p, fx, fy: (q[0], k, p, fx, fy), ValueError, r"q must have shape \[batch, seq, heads"),
        (lambda q, k, p, fx, fy: (q, k, p, fx[None], fy), ValueError, "inv_freq_x must be 1-D"),
        (lambda q, k, p, fx, fy: (q, k, p, fx, fy.long()), TypeError, "inv_freq_y must be float32"),
        (lambda q, k, p, fx, fy: (q, k, p, fx, [1.0]), TypeError, "inv_freq_y must be a torch.Tensor"),
        (lambda q, k, p, fx, fy: (q, k, p, torch.cat([fx, fx]), fy), ValueError, "rotary_dim 12 exceeds head_dim 8"),
        (lambda q, k, p, fx, fy: (q, k, p, fx, fy[:0]), ValueError, "at least one frequency per axis"),
    ],
)
def test_bad_input_is_named(change, error, match):
    with pytest.raises(error, match=match):
        apply_rotary_2d(*change(*_inputs()))


def test_bad_options_are_named():
    q, k, p, fx, fy = _inputs()
    with pytest.raises(ValueError, match="layout must be"):
        apply_rotary_2d(q, k, p, fx, fy, layout="neox")
    with pytest.raises(ValueError, match="mixed=True needs inv_freq_x and inv_freq_y of equal length"):
        apply_rotary_2d(q, k, p, torch.cat([fx, fy]), fy, mixed=True)
    with pytest.raises(ValueError, match="head_dim must be a positive multiple of 4"):
        axial_inv_freq(6)
    with pytest.raises(ValueError, match="angle must be finite"):
        mixed_inv_freq(8, angle=float("nan"))


@given(st.sampled_from([4, 8, 64]), st.floats(-10.0, 10.0), st.floats(2.0, 100.0))
def test_numpy_numbers_give_what_python_numbers_give(head_dim, angle, base):
    """README "Errors": NumPy integers are ints and NumPy floats real numbers."""
    angle32, base32 = float(np.float32(angle)), float(np.float32(base))
    assert all(torch.equal(a, b) for a, b in zip(axial_inv_freq(np.int64(head_dim), base=np.float32(base32)),
                                                  axial_inv_freq(head_dim, base=base32)))
    assert all(torch.equal(a, b) for a, b in zip(mixed_inv_freq(np.int32(head_dim), base=np.float64(base),
                                                                angle=np.float32(angle32)),
                                                  mixed_inv_freq(head_dim, base=base, angle=angle32)))


@pytest.mark.parametrize(
    "call, error, argument",
    [
        (lambda: axial_inv_freq(8.0), TypeError, "head_dim"),
        (lambda: axial_inv_freq("8"), TypeError, "head_dim"),
        (lambda: axial_inv_freq(True), TypeError, "head_dim"),
        (lambda: axial_inv_freq(0), ValueError, "head_dim"),
        (lambda: axial_inv_freq(6), ValueError, "head_dim"),
        (lambda: axial_inv_freq(8, base="100"), TypeError, "base"),
        (lambda: axial_inv_freq(8, base=1.0), ValueError, "base"),
        (lambda: axial_inv_freq(8, base=math.inf), ValueError, "base"),
        (lambda: mixed_inv_freq(8, angle="0.5"), TypeError, "angle"),
        (lambda: mixed_inv_freq(8, angle=None), TypeError, "angle"),
        (lambda: mixed_inv_freq(8, angle=math.inf), ValueError, "angle"),
        (lambda: mixed_inv_freq(8.0), TypeError, "head_dim"),
        (lambda: pair_cos_sin(torch.zeros(3, 2), *axial_inv_freq(8)), TypeError, "positions_xy"),
        (lambda: pair_cos_sin(torch.zeros(3, 3, dtype=torch.int64), *axial_inv_freq(8)), ValueError, "positions_xy"),
        (lambda: pair_cos_sin(torch.zeros(3, 2, dtype=torch.int64), torch.tensor([math.nan, 1.0]),
                              axial_inv_freq(8)[1]), ValueError, "inv_freq_x"),
        (lambda: pair_cos_sin(torch.zeros(3, 2, dtype=torch.int64), *axial_inv_freq(8), mixed=1), TypeError, "mixed"),
    ],
)
def test_bad_frequency_arguments_are_named(call, error, argument):
    """Wrong types raise TypeError and wrong values ValueError, naming the argument."""
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    assert type(caught.value) is error, repr(caught.value)
    assert names(str(caught.value), argument), str(caught.value)
