"""rope.analysis.decay against plain float64 loops, complex numbers and explicit rotation matrices."""

import cmath
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import theta_loop
from rope.analysis import decay
from strategies import half_dims, seeds


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The base scans are many small tensor operations; one thread keeps them fast on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


bases = st.floats(min_value=1.5, max_value=1e7)


def random_distances(rng, count=7):
    """Integers and non-integers, positive and negative, small and large."""
    return np.concatenate([rng.integers(-5000, 5000, count), rng.uniform(-300.0, 300.0, count)])


@given(half=half_dims, base=bases, seed=seeds)
def test_partial_sums_match_a_loop(half, base, seed):
    rng = np.random.default_rng(seed)
    distances = random_distances(rng)
    theta = theta_loop(base, 2 * half).tolist()
    sums = decay.partial_sums(torch.tensor(distances), torch.tensor(theta, dtype=torch.float64))
    assert sums.shape == (len(distances), half + 1) and sums.dtype == torch.complex128
    for row, s in zip(sums.tolist(), distances.tolist()):
        running = 0j
        assert row[0] == 0
        for j in range(1, half + 1):
            running += cmath.exp(1j * s * theta[j - 1])
            assert abs(row[j] - running) <= 1e-12 * j


@given(half=half_dims, base=bases, seed=seeds)
def test_relative_upper_bound_and_cosine_sum_match_loops(half, base, seed):
    rng = np.random.default_rng(seed)
    distances = random_distances(rng)
    theta = theta_loop(base, 2 * half).tolist()
    inv_freq = torch.tensor(theta, dtype=torch.float64)
    bound = decay.relative_upper_bound(distances.tolist(), inv_freq)
    cosines = decay.cosine_sum(torch.tensor(distances), inv_freq)
    for s, b, c in zip(distances.tolist(), bound.tolist(), cosines.tolist()):
        partial = [sum(cmath.exp(1j * s * t) for t in theta[:j]) for j in range(1, half + 1)]
        assert math.isclose(b, sum(abs(p) for p in partial) / half, rel_tol=1e-12, abs_tol=1e-12)
        assert math.isclose(c, sum(math.cos(s * t) for t in theta), rel_tol=1e-12, abs_tol=1e-11)
        assert math.isclose(c, partial[-1].real, rel_tol=1e-12, abs_tol=1e-11)


def test_cosine_sum_is_half_the_trace_of_the_rotation():
    gen = torch.Generator().manual_seed(5)
    inv_freq = torch.rand(6, generator=gen, dtype=torch.float64) + 0.01
    for s in torch.randint(-10**6, 10**6, (8,), generator=gen).tolist():
        trace = torch.trace(rope.reference.rotation_matrix(s, inv_freq)).item()
        assert math.isclose(decay.cosine_sum(s, inv_freq).item(), trace / 2, rel_tol=1e-12, abs_tol=1e-12)


@given(half=half_dims, base=bases, seed=seeds)
def test_abel_summation_and_the_bound(half, base, seed):
    """sum_i h_i e^{i s theta_i} = -sum_i S_{i+1} (h_{i+1} - h_i) with h_{d/2} = 0 (RoFormer 3.4.3)."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(half, generator=gen, dtype=torch.complex128)
    s = float(torch.empty((), dtype=torch.float64).uniform_(-1000.0, 1000.0, generator=gen))
    inv_freq = theta_loop(base, 2 * half)
    sums = decay.partial_sums(s, inv_freq)
    direct = sum(h[i].item() * cmath.exp(1j * s * inv_freq[i].item()) for i in range(half))
    h_ext = torch.cat([h, torch.zeros(1, dtype=h.dtype)])  # h_{d/2} = 0
    differences = h_ext[1:] - h_ext[:-1]
    abel = -(sums[1:] * differences).sum().item()
    assert abs(direct - abel) <= 1e-10 * (1 + abs(direct))
    bound = differences.abs().max().item() * half * decay.relative_upper_bound(s, inv_freq).item()
    assert abs(direct) <= bound * (1 + 1e-12)


def test_rotary_score_is_the_complex_sum():
    """(R_m q)^T (R_n k) = Re sum_i q_i conj(k_i) e^{i (m - n) theta_i}, pairs (2i, 2i + 1)."""
    gen = torch.Generator().manual_seed(11)
    d = 16
    inv_freq = rope.inv_freq({"rope_type": "default", "rope_theta": 10000.0}, d)[0].to(torch.float64)
    q, k = torch.randn(2, 1, 1, 1, d, generator=gen, dtype=torch.float64)
    for m, n in torch.randint(0, 5000, (6, 2), generator=gen).tolist():
        q_rot = rope.apply_rotary(q, q, torch.tensor([m]), inv_freq, layout="interleaved")[0]
        k_rot = rope.apply_rotary(k, k, torch.tensor([n]), inv_freq, layout="interleaved")[0]
        h = torch.view_as_complex(q.reshape(-1, 2)) * torch.view_as_complex(k.reshape(-1, 2)).conj()
        complex_sum = (h * torch.exp(1j * (m - n) * inv_freq)).sum()
        assert math.isclose((q_rot * k_rot).sum().item(), complex_sum.real.item(), rel_tol=1e-10, abs_tol=1e-10)


def first_negative_loop(base, dim, limit):
    theta = np.array([base ** (-2 * i / dim) for i in range(dim // 2)])
    values = np.cos(np.outer(np.arange(limit, dtype=np.float64), theta)).sum(axis=1)
    negative = np.flatnonzero(values < 0)
    return int(negative[0]) if negative.size else None


@given(half=st.integers(min_value=1, max_value=64), log_base=st.floats(min_value=0.2, max_value=5.0))
def test_first_negative_distance_matches_a_direct_scan(half, log_base):
    base, dim, limit = 10.0**log_base, 2 * half, 5000
    assert decay.first_negative_distance(base, dim, limit=limit) == first_negative_loop(base, dim, limit)


def test_first_negative_distance_across_blocks():
    # answers far past the first block of 1024 distances, and one that is not found
    for base, dim in ((3.0e4, 128), (2.0e5, 64), (1.0e6, 128)):
        found = decay.first_negative_distance(base, dim, limit=200_000)
        assert found is not None and found > 1024
        assert found == first_negative_loop(base, dim, found + 1)
        assert decay.first_negative_distance(base, dim, limit=found) is None
        assert decay.base_is_admissible(base, found, dim) and not decay.base_is_admissible(base, found + 1, dim)


def admissible_loop(base, length, dim):
    return first_negative_loop(base, dim, length) is None


@pytest.mark.parametrize("dim", [16, 32, 128])
def test_min_base_first_rule(dim):
    lengths = [1, 50, 300, 1000, 3000]
    grid = decay.base_grid(2.0, 1e8, 40).tolist()
    found = decay.min_bases_for_lengths(lengths, dim, points_per_decade=40, lower=2.0, upper=1e8)
    assert found == [decay.min_base_for_length(n, dim, points_per_decade=40, lower=2.0, upper=1e8) for n in lengths]
    for length, base in zip(lengths, found):
        index = grid.index(base)
        assert admissible_loop(base, length, dim)
        assert index == 0 or not admissible_loop(grid[index - 1], length, dim)
    assert found[0] == grid[0]  # length 1 asks only C(0) = d/2 >= 0


def test_min_base_stable_rule_and_non_monotonicity():
    dim, lengths, upper = 32, [200, 800, 2000], 1e6
    grid = decay.base_grid(10.0, upper, 50).tolist()
    first = decay.min_bases_for_lengths(lengths, dim, points_per_decade=50, upper=upper)
    stable = decay.min_bases_for_lengths(lengths, dim, rule="stable", points_per_decade=50, upper=upper)
    for length, low, high in zip(lengths, first, stable):
        index = grid.index(high)
        assert all(admissible_loop(b, length, dim) for b in grid[index:])
        assert not admissible_loop(grid[index - 1], length, dim)
        assert low <= high
    # the two rules differ somewhere: a base above the first admissible one fails
    length, low, high = next((n, a, b) for n, a, b in zip(lengths, first, stable) if a < b)
    failing = next(b for b in grid if low < b < high and not admissible_loop(b, length, dim))
    assert admissible_loop(low, length, dim) and low < failing


def test_base_grid_is_anchored_at_powers_of_ten():
    grid = decay.base_grid(10.0, 1e6, 100)
    assert grid[0].item() == 10.0 and grid[-1].item() == 1e6 and len(grid) == 501
    ratios = grid[1:] / grid[:-1]
    assert torch.allclose(ratios, torch.full_like(ratios, 10 ** 0.01), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: decay.partial_sums("far", torch.ones(2)), TypeError, "distance"),
        (lambda: decay.partial_sums(torch.tensor([1j]), torch.ones(2)), TypeError, "distance"),
        (lambda: decay.partial_sums(torch.tensor([True]), torch.ones(2)), TypeError, "distance"),
        (lambda: decay.cosine_sum(3, [1.0, 0.1]), TypeError, "inv_freq"),
        (lambda: decay.relative_upper_bound(3, torch.ones(2, 2)), ValueError, "inv_freq"),
        (lambda: decay.relative_upper_bound(3, torch.arange(3)), TypeError, "inv_freq"),
        (lambda: decay.relative_upper_bound(3, torch.ones(0)), ValueError, "inv_freq"),
        (lambda: decay.cosine_sum(float("nan"), torch.ones(2)), ValueError, "distance"),
        (lambda: decay.first_negative_distance(1.0, 8, limit=10), ValueError, "base"),
        (lambda: decay.first_negative_distance(float("inf"), 8, limit=10), ValueError, "base"),
        (lambda: decay.first_negative_distance(100.0, 7, limit=10), ValueError, "dim"),
        (lambda: decay.first_negative_distance(100.0, 8, limit=0), ValueError, "limit"),
        (lambda: decay.base_is_admissible(100.0, 2.5, 8), TypeError, "length"),
        (lambda: decay.base_grid(100.0, 10.0, 10), ValueError, "upper"),
        (lambda: decay.base_grid(10.0, 100.0, 0), ValueError, "points_per_decade"),
        (lambda: decay.base_grid(11.0, 12.0, 1), ValueError, "no grid point"),
        (lambda: decay.min_bases_for_lengths(1000, 8), TypeError, "lengths"),
        (lambda: decay.min_bases_for_lengths([1000, -1], 8), ValueError, "length"),
        (lambda: decay.min_bases_for_lengths([1000], 8, rule="last"), ValueError, "rule"),
        (lambda: decay.min_base_for_length(10**6, 128, upper=1e3), ValueError, "upper"),
        (lambda: decay.min_base_for_length(10**4, 128, rule="stable", upper=1e3), ValueError, "upper"),
    ],
)
def test_bad_input(call, error, words):
    with pytest.raises(error, match=words):
        call()
