"""rope.analysis.precision against exact references: rational angles, one-rounding products, explicit bounds."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import ulp
from rope.analysis import precision
from rope.angles import exact_reduced_angle
from rope.frequencies import inv_freq as frequencies

U32 = 2.0**-24  # unit roundoff of float32
INT31 = 2**31 - 1
REFERENCE_ERROR = 6e-16  # of precision.reference_cos_sin


def llama_inv_freq(head_dim=128, base=10000.0):
    return frequencies({"rope_type": "default", "rope_theta": base}, head_dim)[0]


def random_positions(count, *, high=INT31, seed=0, signed=True):
    gen = torch.Generator().manual_seed(seed)
    low = -high if signed else 0
    return torch.randint(low, high + 1, (count,), generator=gen, dtype=torch.int64)


def random_inv_freq(count, seed):
    """float32 frequencies spread over [1e-6, 2], the range real configs use."""
    gen = torch.Generator().manual_seed(seed)
    exponents = torch.empty(count, dtype=torch.float64).uniform_(math.log(1e-6), math.log(2.0), generator=gen)
    return torch.exp(exponents).float()


def largest_digit_count(beta):
    """The most base-beta digits the digit functions accept: beta**digits <= 2^62."""
    digits = 1
    while beta ** (digits + 1) <= 2**62:
        digits += 1
    return digits


def angle_gap(a, b):
    """|a - b| modulo 2 pi, in [0, pi]."""
    return abs(math.remainder(a - b, 2 * math.pi))


# --- the reference -------------------------------------------------------------------------------------

@given(
    position=st.integers(-(2**62) + 1, 2**62 - 1),
    theta=st.floats(1e-7, 1e3).map(lambda t: float(torch.tensor(t, dtype=torch.float32))),
)
def test_reference_angles_match_exact_rationals(position, theta):
    angle = precision.reference_angles(torch.tensor([position]), torch.tensor([theta], dtype=torch.float32))
    exact = float(exact_reduced_angle(position, theta))
    assert angle_gap(angle.item(), exact) <= 1e-15
    assert -math.pi <= angle.item() <= math.pi


def test_reference_cos_sin_on_a_sample_up_to_2_31():
    theta = llama_inv_freq()
    positions = torch.cat([random_positions(64, seed=1), torch.tensor([0, 1, -1, INT31, -INT31])])
    cos, sin = precision.reference_cos_sin(positions, theta)
    for row, m in enumerate(positions.tolist()):
        for i in (0, 1, 7, 40, 63):
            exact = float(exact_reduced_angle(m, theta[i].item()))
            # the angle's float64 rounding (up to 2^-53 pi) plus the rounding of cos/sin
            assert abs(cos[row, i].item() - math.cos(exact)) <= REFERENCE_ERROR
            assert abs(sin[row, i].item() - math.sin(exact)) <= REFERENCE_ERROR


# --- the usual recipe ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_recipe_angles_round_the_exact_product_of_rounded_factors_once(dtype):
    theta = random_inv_freq(32, seed=2)
    positions = random_positions(256, high=2048 if dtype == torch.float16 else INT31, seed=3)
    angles = precision.recipe_angles(positions, theta, dtype=dtype)
    assert angles.dtype == dtype
    # both factors have at most 24 significant bits: their product is exact in float64
    exact_product = positions.to(dtype).double()[:, None] * theta.to(dtype).double()
    assert torch.equal(angles, exact_product.to(dtype))


def test_recipe_angles_float64_is_correctly_rounded():
    theta = random_inv_freq(8, seed=4)
    positions = random_positions(64, high=2**52, seed=5)
    angles = precision.recipe_angles(positions, theta, dtype=torch.float64)
    for row, m in enumerate(positions.tolist()):
        for i, t in enumerate(theta.tolist()):
            assert angles[row, i].item() == float(Fraction(m) * Fraction(t))  # float(Fraction) rounds once


def test_float32_recipe_error_is_half_an_ulp_of_the_angle_and_exceeds_1e_2_at_2_20():
    theta = llama_inv_freq()
    positions = torch.cat([2**19 + random_positions(512, high=2**19, seed=6, signed=False), torch.tensor([2**20 - 1])])
    cos, sin = precision.table_cos_sin(positions, theta, dtype=torch.float32)
    angles = precision.recipe_angles(positions, theta)
    cos_ref, sin_ref = precision.reference_cos_sin(positions, theta)
    # |cos a - cos b| <= |a - b| <= half an ulp of the float32 product, plus float32 cos rounding
    bound = 0.5 * ulp(angles.double(), torch.float32) + 2 * U32
    assert torch.all((cos.double() - cos_ref).abs() <= bound)
    assert torch.all((sin.double() - sin_ref).abs() <= bound)
    # ... and the failure is real: above 1e-2 near 2^20, so m theta_0 = m is off by up to 2^-5
    assert precision.cos_sin_error(cos, sin, positions, theta).max() > 1e-2


def test_bfloat16_tables_round_accurate_values_at_small_positions():
    theta = llama_inv_freq()
    positions = torch.arange(256)
    cos, sin = precision.table_cos_sin(positions, theta, dtype=torch.bfloat16)
    assert cos.dtype == sin.dtype == torch.bfloat16
    cos_ref, sin_ref = precision.reference_cos_sin(positions, theta)
    for value, ref in ((cos, cos_ref), (sin, sin_ref)):
        error = (value.double() - ref).abs()
        assert torch.all(error <= 0.5 * ulp(ref, torch.bfloat16) + 1e-5)
        assert error.max() > 1e-3  # storing the table in bfloat16 costs up to 2^-9


def test_bfloat16_angles_are_wrong_before_positions_collide():
    theta = llama_inv_freq()
    positions = torch.arange(precision.first_colliding_integer(torch.bfloat16))  # all exact in bfloat16
    cos, sin = precision.table_cos_sin(positions, theta, dtype=torch.float32, angle_dtype=torch.bfloat16)
    assert precision.cos_sin_error(cos, sin, positions, theta).max() > 0.1


# --- the exact methods ---------------------------------------------------------------------------------

def test_fixed_point_cos_sin_stays_at_the_float32_floor_up_to_2_31():
    theta = llama_inv_freq()
    positions = torch.cat([random_positions(4096, seed=7), torch.tensor([0, 1, -1, INT31, -INT31, 2**30])])
    cos, sin = precision.fixed_point_cos_sin(positions, theta)
    assert cos.dtype == sin.dtype == torch.float32
    # the float32 angle in [-pi, pi) carries three roundings (u pi each) and 2^-32 turns of truncation
    bound = 3 * math.pi * U32 + 2 * math.pi * 2.0**-32 + 2 * U32
    assert precision.cos_sin_error(cos, sin, positions, theta).max() <= bound


@pytest.mark.parametrize("head_dim, base", [(128, 10000.0), (64, 500000.0)])
def test_digit_tables_in_float32_stay_below_1e_6_everywhere(head_dim, base):
    theta = llama_inv_freq(head_dim, base)
    edges = [0, 1, -1, 255, 256, 65535, 65536, 2**24 - 1, 2**24, INT31, -INT31]
    positions = torch.cat([random_positions(4096, seed=8), torch.tensor(edges)])
    cos, sin = precision.digit_table_cos_sin(positions, theta)
    assert cos.dtype == sin.dtype == torch.float32
    assert precision.cos_sin_error(cos, sin, positions, theta).max() < 1e-6


@given(beta=st.integers(2, 1024), digits=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_digit_tables_obey_the_rounding_bound_for_any_base(beta, digits, seed):
    digits = min(digits, largest_digit_count(beta))
    theta = random_inv_freq(8, seed)
    positions = random_positions(64, high=beta**digits - 1, seed=seed)
    for dtype, u in ((torch.float32, U32), (torch.float64, 2.0**-53)):
        cos, sin = precision.digit_table_cos_sin(positions, theta, beta=beta, digits=digits, dtype=dtype)
        assert cos.dtype == dtype
        # D entries rounded from the reference (|error| <= u / sqrt 2 each, plus the reference's
        # own error) and D - 1 complex products (relative error <= sqrt(5) u each, Brent,
        # Percival and Zimmermann 2007); the result is compared with the reference again
        bound = (digits / math.sqrt(2) + (digits - 1) * math.sqrt(5)) * u * 1.01 + (digits + 1) * REFERENCE_ERROR
        assert precision.cos_sin_error(cos, sin, positions, theta).max() <= bound


@given(beta=st.integers(2, 2**20), digits=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_position_digits_rebuild_the_position(beta, digits, seed):
    digits = min(digits, largest_digit_count(beta))
    positions = random_positions(32, high=beta**digits - 1, seed=seed)
    d = precision.position_digits(positions, beta=beta, digits=digits)
    assert torch.all((d >= 0) & (d < beta))
    rebuilt = [sum(int(x) * beta**k for k, x in enumerate(row)) for row in d.tolist()]
    assert rebuilt == positions.abs().tolist()


# --- collisions, errors, scores --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_first_colliding_integer(dtype):
    n = precision.first_colliding_integer(dtype)
    significand_bits = 1 - round(math.log2(torch.finfo(dtype).eps))
    assert n == 2**significand_bits
    pair = torch.tensor([n - 1, n, n + 1]).to(dtype)
    assert pair[0] != pair[1] and pair[1] == pair[2]


def test_cos_sin_error_is_the_largest_deviation_per_position():
    theta = llama_inv_freq(16)
    positions = random_positions(8, seed=9)
    cos, sin = precision.reference_cos_sin(positions, theta)
    gen = torch.Generator().manual_seed(10)
    bump = torch.rand(cos.shape, generator=gen, dtype=torch.float64) * 1e-3
    error = precision.cos_sin_error(cos + bump, sin - 2 * bump, positions, theta)
    assert error.shape == positions.shape
    assert torch.allclose(error, (2 * bump).amax(dim=-1), rtol=0, atol=1e-15)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotate_with_tables_matches_the_complex_reference(layout):
    from rope.reference import rotate_by_complex

    theta = llama_inv_freq(32)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 5, 3, 32, generator=gen, dtype=torch.float64)
    positions = torch.randint(0, 4096, (5,), generator=gen)
    cos, sin = precision.reference_cos_sin(positions, theta)
    y = precision.rotate_with_tables(x, cos[:, None, :], sin[:, None, :], layout=layout)
    assert torch.allclose(y, rotate_by_complex(x, positions, theta, layout=layout), rtol=0, atol=1e-12)


def score_at(q, k, m, n, method, theta):
    cos_m, sin_m = method(torch.tensor([m]), theta)
    cos_n, sin_n = method(torch.tensor([n]), theta)
    return (precision.rotate_with_tables(q, cos_m, sin_m) * precision.rotate_with_tables(k, cos_n, sin_n)).sum().item()


def test_scores_depend_on_the_offset_only_with_exact_tables_and_not_with_the_recipe():
    theta = llama_inv_freq()
    gen = torch.Generator().manual_seed(12)
    q, k = torch.randn(2, 128, generator=gen, dtype=torch.float64)
    q, k = q / q.norm(), k / k.norm()
    shifts = [0, 2**22 + 17, 2**30 + 5]

    def recipe(positions, theta_):
        return precision.table_cos_sin(positions, theta_, dtype=torch.float32)

    exact = [score_at(q, k, 3 + t, 10 + t, precision.reference_cos_sin, theta) for t in shifts]
    digits = [score_at(q, k, 3 + t, 10 + t, precision.digit_table_cos_sin, theta) for t in shifts]
    usual = [score_at(q, k, 3 + t, 10 + t, recipe, theta) for t in shifts]
    assert max(exact) - min(exact) < 1e-14
    assert max(abs(a - b) for a, b in zip(digits, exact)) < 2e-6
    assert abs(usual[0] - exact[0]) < 1e-5 and abs(usual[2] - exact[2]) > 1e-2


# --- bad input -------------------------------------------------------------------------------------------

THETA = torch.tensor([1.0, 0.01])


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: precision.recipe_angles(torch.tensor([1.0]), THETA), TypeError, "positions"),
        (lambda: precision.recipe_angles([1, 2], THETA), TypeError, "positions"),
        (lambda: precision.recipe_angles(torch.tensor([1]), torch.tensor([1, 2])), TypeError, "inv_freq"),
        (lambda: precision.recipe_angles(torch.tensor([1]), THETA[None]), ValueError, "inv_freq"),
        (lambda: precision.recipe_angles(torch.tensor([1]), THETA, dtype=torch.int32), ValueError, "dtype"),
        (lambda: precision.table_cos_sin(torch.tensor([1]), THETA, dtype="bf16"), TypeError, "dtype"),
        (lambda: precision.table_cos_sin(torch.tensor([1]), THETA, angle_dtype=torch.int32), ValueError, "angle_dtype"),
        (lambda: precision.recipe_angles(torch.tensor([1]), THETA.double()), TypeError, "inv_freq"),
        (lambda: precision.reference_angles(torch.tensor([2**62]), THETA), ValueError, "2\\^62"),
        (lambda: precision.fixed_point_cos_sin(torch.tensor([True]), THETA), TypeError, "positions"),
        (lambda: precision.digit_table_cos_sin(torch.tensor([1]), THETA, beta=1), ValueError, "beta"),
        (lambda: precision.digit_table_cos_sin(torch.tensor([1]), THETA, beta=2.0), TypeError, "beta"),
        (lambda: precision.digit_table_cos_sin(torch.tensor([1]), THETA, digits=0), ValueError, "digits"),
        (lambda: precision.digit_table_cos_sin(torch.tensor([1]), THETA, beta=2**32, digits=2), ValueError, "beta"),
        (lambda: precision.digit_table_cos_sin(torch.tensor([256]), THETA, beta=16, digits=2), ValueError,
         "beta\\*\\*digits"),
        (lambda: precision.digit_table_cos_sin(torch.tensor([1]), THETA, dtype=torch.int64), ValueError, "dtype"),
        (lambda: precision.cos_sin_error(torch.ones(3, 2), torch.ones(3, 2), torch.tensor([1, 2]), THETA), ValueError,
         "cos"),
        (lambda: precision.cos_sin_error(torch.ones(2, 2), None, torch.tensor([1, 2]), THETA), TypeError, "sin"),
        (lambda: precision.first_colliding_integer(torch.float64), ValueError, "dtype"),
        (lambda: precision.rotate_with_tables(torch.ones(3), torch.ones(1), torch.ones(1)), ValueError, "even"),
        (lambda: precision.rotate_with_tables(torch.ones(4, dtype=torch.int64), torch.ones(2), torch.ones(2)),
         TypeError, "x"),
        (lambda: precision.rotate_with_tables(torch.ones(4), torch.ones(3), torch.ones(2)), ValueError, "cos"),
        (lambda: precision.rotate_with_tables(torch.ones(4), torch.ones(2), torch.ones(2), layout="gptj"), ValueError,
         "layout"),
    ],
)
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()
