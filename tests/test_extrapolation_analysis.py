"""rope.analysis.extrapolation against plain loops, explicit rotation matrices and rope.apply_rotary."""

import cmath
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from rope.analysis import extrapolation as ea
from rope.frequencies import default_theta
from strategies import bases, half_dims, seeds


def random_theta(rng, half):
    """Positive frequencies spread over several decades, in random order."""
    return torch.tensor(10.0 ** rng.uniform(-4.0, 0.3, half), dtype=torch.float64)


def random_h(rng, *shape):
    return torch.tensor(rng.normal(size=shape) + 1j * rng.normal(size=shape), dtype=torch.complex128)


def score_loop(h, s, theta):
    return sum((complex(hj) * cmath.exp(1j * s * float(t))).real for hj, t in zip(h, theta))


@given(half=half_dims, length=st.integers(min_value=1, max_value=300), seed=seeds)
def test_largest_unseen_arc_matches_a_loop(half, length, seed):
    theta = random_theta(np.random.default_rng(seed), half)
    arcs = ea.largest_unseen_arc(theta, length)
    for arc, t in zip(arcs.tolist(), theta.tolist()):
        angles = sorted(math.fmod(s * t, 2 * math.pi) for s in range(length))
        gaps = [b - a for a, b in zip(angles, angles[1:])] + [angles[0] + 2 * math.pi - angles[-1]]
        assert arc == pytest.approx(max(gaps), abs=1e-9)
        if length == 1:
            assert arc == pytest.approx(2 * math.pi)
        elif (length - 1) * t < 2 * math.pi:
            assert arc == pytest.approx(max(2 * math.pi - (length - 1) * t, t), abs=1e-9)
        else:
            assert arc <= t + 1e-9


@given(half=st.integers(min_value=2, max_value=12), seed=seeds)
def test_neighbour_beat_wavelengths_match_a_loop(half, seed):
    theta = random_theta(np.random.default_rng(seed), half)
    beats = ea.neighbour_beat_wavelengths(theta).tolist()
    assert len(beats) == half - 1
    for i, beat in enumerate(beats):
        assert beat == pytest.approx(2 * math.pi / abs(theta[i].item() - theta[i + 1].item()), rel=1e-12)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@given(half=half_dims, seed=seeds)
def test_series_score_is_the_rope_score(layout, half, seed):
    """a(m - n) with h_j = q_j conj(k_j) equals (R_m q)^T (R_n k) from rope.apply_rotary."""
    rng = np.random.default_rng(seed)
    dim = 2 * half
    theta = random_theta(rng, half)
    q = torch.tensor(rng.normal(size=dim), dtype=torch.float64)
    k = torch.tensor(rng.normal(size=dim), dtype=torch.float64)
    a, b = rope.layouts.pair_indices(dim, layout)
    h = torch.complex(q[a], q[b]) * torch.complex(k[a], k[b]).conj()
    positions = torch.tensor(rng.integers(-3000, 3000, size=9))
    qs, ks = q.expand(1, 9, 1, dim), k.expand(1, 9, 1, dim)
    q_rot, k_rot = rope.apply_rotary(qs, ks, positions, theta, layout=layout, backend="torch")
    scores = q_rot[0, :, 0] @ k_rot[0, :, 0].T  # [m, n]
    distances = positions[:, None] - positions[None, :]
    assert torch.allclose(ea.series_score(h, distances, theta), scores, rtol=0, atol=1e-9)


@given(half=half_dims, seed=seeds)
def test_series_score_at_real_distances_matches_rotation_matrices(half, seed):
    """a(s) = q^T R_{-s} k for non-integer s, R from rope.reference, and a Python loop."""
    rng = np.random.default_rng(seed)
    theta = random_theta(rng, half)
    q = torch.tensor(rng.normal(size=2 * half), dtype=torch.float64)
    k = torch.tensor(rng.normal(size=2 * half), dtype=torch.float64)
    h = torch.complex(q[0::2], q[1::2]) * torch.complex(k[0::2], k[1::2]).conj()
    distances = rng.uniform(-500.0, 500.0, size=5)
    values = ea.series_score(h, distances.tolist(), theta)
    for value, s in zip(values.tolist(), distances.tolist()):
        matrix = rope.reference.rotation_matrix(-s, theta, layout="interleaved")
        assert value == pytest.approx((q @ matrix @ k).item(), abs=1e-10)
        assert value == pytest.approx(score_loop(h.tolist(), s, theta.tolist()), abs=1e-10)


@given(half=half_dims, seed=seeds)
def test_series_score_broadcasts_over_coefficient_batches(half, seed):
    rng = np.random.default_rng(seed)
    theta = random_theta(rng, half)
    h = random_h(rng, 3, 2, half)
    s = torch.tensor(rng.uniform(-50, 50, size=(4, 5)))
    values = ea.series_score(h, s, theta)
    assert values.shape == (3, 2, 4, 5)
    assert torch.allclose(values[2, 1], ea.series_score(h[2, 1], s, theta), rtol=0, atol=1e-12)


@given(half=st.integers(min_value=1, max_value=6), seed=seeds)
def test_fit_recovers_coefficients_of_a_well_conditioned_series(half, seed):
    """Targets made by a known h on many distances, frequencies far apart: ridge 0 gives h back."""
    rng = np.random.default_rng(seed)
    theta = torch.linspace(0.2, 3.0, half, dtype=torch.float64) + rng.uniform(0.0, 0.1)
    h = random_h(rng, half)
    distances = torch.arange(400, dtype=torch.float64)
    fitted = ea.fit_series_coefficients(distances, ea.series_score(h, distances, theta), theta, ridge=0.0)
    assert torch.allclose(fitted, h, rtol=0, atol=1e-8)


@given(half=half_dims, ridge=st.floats(min_value=1e-3, max_value=10.0), seed=seeds)
def test_fit_solves_the_ridge_normal_equations(half, ridge, seed):
    """Gradient zero: sum_k (a(s_k) - y_k) d a(s_k) / d h_j + ridge h_j = 0 for real and imaginary parts."""
    rng = np.random.default_rng(seed)
    theta = random_theta(rng, half)
    distances = torch.arange(60, dtype=torch.float64)
    targets = torch.tensor(rng.uniform(-1, 1, 60), dtype=torch.float64)
    h = ea.fit_series_coefficients(distances, targets, theta, ridge=ridge)
    residual = ea.series_score(h, distances, theta) - targets
    phases = torch.exp(1j * distances[:, None] * theta)
    grad_real = residual @ phases.real + ridge * h.real  # d a / d Re h_j = cos(s theta_j)
    grad_imag = -residual @ phases.imag + ridge * h.imag  # d a / d Im h_j = -sin(s theta_j)
    assert grad_real.abs().max() < 1e-8 and grad_imag.abs().max() < 1e-8


@given(half=half_dims, seed=seeds)
def test_linear_interpolation_error_matches_a_loop_and_vanishes_on_integers(half, seed):
    rng = np.random.default_rng(seed)
    theta = random_theta(rng, half)
    h = random_h(rng, half)
    distances = rng.uniform(-100.0, 100.0, size=6)
    errors = ea.linear_interpolation_error(h, distances.tolist(), theta)
    for err, s in zip(errors.tolist(), distances.tolist()):
        s1 = math.floor(s)
        lam = s - s1
        coeffs, freqs = h.tolist(), theta.tolist()
        lin = (1 - lam) * score_loop(coeffs, s1, freqs) + lam * score_loop(coeffs, s1 + 1, freqs)
        assert err == pytest.approx(score_loop(coeffs, s, freqs) - lin, abs=1e-10)
    integers = torch.tensor(rng.integers(-1000, 1000, size=6), dtype=torch.float64)
    assert ea.linear_interpolation_error(h, integers, theta).abs().max() < 1e-10


@given(half=half_dims, seed=seeds)
def test_bounds_hold_and_the_worst_case_is_attained(half, seed):
    rng = np.random.default_rng(seed)
    base = float(rng.uniform(2.0, 1e5))
    theta = default_theta(base, 2 * half)
    h = random_h(rng, half)
    h_max = h.abs().max().item()
    distances = torch.tensor(rng.uniform(-300.0, 300.0, size=8))
    error = ea.linear_interpolation_error(h, distances, theta).abs()
    weighted = ea.interpolation_bound(h, distances, theta)
    geometric = ea.geometric_interpolation_bound(h_max, distances, 2 * half, base)
    worst = ea.worst_interpolation_error(distances, theta)
    assert torch.all(error <= weighted + 1e-12)
    assert torch.all(weighted <= geometric * (1 + 1e-12) + 1e-15)
    assert torch.all(error <= h_max * worst + 1e-12)
    assert torch.all(worst <= geometric / h_max * (1 + 1e-12) + 1e-15)
    s = float(distances[0])
    attained = ea.linear_interpolation_error(ea.worst_interpolation_coefficients(s, theta), s, theta)
    assert attained.item() == pytest.approx(ea.worst_interpolation_error(s, theta).item(), abs=1e-12)


@given(half=half_dims, base=bases, seed=seeds)
def test_geometric_and_stated_bounds_match_their_formulas(half, base, seed):
    rng = np.random.default_rng(seed)
    dim = 2 * half
    h_max = float(rng.uniform(0.1, 10.0))
    s = float(rng.uniform(-50.0, 50.0))
    grid = (s - math.floor(s)) * (math.floor(s) + 1 - s)
    squares = float((default_theta(base, dim) ** 2).sum())
    geometric = ea.geometric_interpolation_bound(h_max, s, dim, base).item()
    assert geometric == pytest.approx(h_max * grid / 2 * squares, rel=1e-9)
    assert ea.stated_interpolation_bound(h_max, s, dim, base).item() == pytest.approx(
        dim * h_max * grid / (8 * math.log(base)), rel=1e-12
    )


def test_worst_case_at_the_midpoint_is_one_minus_cos_half_theta():
    theta = default_theta(1e4, 128)
    expected = float((1 - torch.cos(theta / 2)).sum())
    assert ea.worst_interpolation_error(17.5, theta).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dim", [16, 64, 128, 256])
def test_stated_bound_of_chen_et_al_fails_between_integers(dim):
    """The printed Theorem 2.1 constant is below the exact supremum at every non-integer distance."""
    theta = default_theta(1e4, dim)
    s = torch.linspace(3.0, 4.0, 257, dtype=torch.float64)[1:-1]
    assert torch.all(ea.worst_interpolation_error(s, theta) > ea.stated_interpolation_bound(1.0, s, dim, 1e4))


def test_bad_input_raises_clear_errors():
    theta = default_theta(1e4, 8)
    h = torch.ones(4, dtype=torch.complex128)
    with pytest.raises(TypeError, match="inv_freq"):
        ea.largest_unseen_arc([1.0, 0.1], 10)
    with pytest.raises(ValueError, match="inv_freq"):
        ea.series_score(h, 1.0, -theta)
    with pytest.raises(ValueError, match="training_length"):
        ea.largest_unseen_arc(theta, 0)
    with pytest.raises(TypeError, match="h must be a complex"):
        ea.series_score(h.real, 1.0, theta)
    with pytest.raises(ValueError, match="last dimension"):
        ea.series_score(torch.ones(3, dtype=torch.complex128), 1.0, theta)
    with pytest.raises(TypeError, match="distances"):
        ea.series_score(h, [True, False], theta)
    with pytest.raises(ValueError, match="distances must be finite"):
        ea.linear_interpolation_error(h, [float("nan")], theta)
    with pytest.raises(ValueError, match="ridge"):
        ea.fit_series_coefficients([0.0, 1.0], [1.0, 2.0], theta, ridge=-1.0)
    with pytest.raises(ValueError, match="same length"):
        ea.fit_series_coefficients([0.0, 1.0], [1.0], theta, ridge=0.0)
    with pytest.raises(ValueError, match="neighbours"):
        ea.neighbour_beat_wavelengths(theta[:1])
    with pytest.raises(ValueError, match="dim"):
        ea.geometric_interpolation_bound(1.0, 0.5, 7, 1e4)
    with pytest.raises(ValueError, match="base"):
        ea.stated_interpolation_bound(1.0, 0.5, 8, 1.0)
    with pytest.raises(ValueError, match="max_abs_h"):
        ea.stated_interpolation_bound(-1.0, 0.5, 8, 1e4)
    with pytest.raises(ValueError, match="distance must be finite"):
        ea.worst_interpolation_coefficients(float("inf"), theta)
    with pytest.raises(TypeError, match="distance must be a real number"):
        ea.worst_interpolation_coefficients("0.5", theta)
