"""The block-diagonal and Kronecker helpers of rope.analysis.book (group A: chapters 2, 4, 8, 10)."""

import sympy as sp
import torch

import rope
from rope.analysis import book

k = sp.Symbol("k", integer=True, positive=True)
i, j = sp.symbols("i j", integer=True, nonnegative=True)


def test_unit_matrices_multiply_by_kronecker_delta():
    E_i, E_j = book.unit_matrix(i, k), book.unit_matrix(j, k)
    assert book.entries_vanish(E_i * E_j - sp.KroneckerDelta(i, j) * E_i, k, [i, j])
    assert not book.entries_vanish(E_i * E_j - E_i, k, [i, j])
    e_j = book.unit_vector(j, k)
    assert book.entries_vanish(E_i * e_j - sp.KroneckerDelta(i, j) * book.unit_vector(i, k), k, [i, j])
    assert not book.entries_vanish(E_i * e_j - book.unit_vector(i, k), k, [i, j])


def test_in_range_drops_only_range_conditions():
    expr = sp.Piecewise((sp.KroneckerDelta(i, j), i <= k - 1), (0, True))
    assert book.in_range(expr, k, [i]) == sp.KroneckerDelta(i, j)
    other = sp.Piecewise((1, i <= 3), (0, True))
    assert book.in_range(other, k, [i]) == other


def test_shuffle_swaps_kronecker_factors_for_a_symbolic_size():
    x, y = sp.MatrixSymbol("x", k, 1), sp.MatrixSymbol("y", 2, 1)
    A, B = sp.MatrixSymbol("A", 2, 2), sp.MatrixSymbol("B", k, k)
    P = sp.MatrixSymbol("P", 2 * k, 2 * k)
    left = book.swap(P * book.mixed_product(sp.KroneckerProduct(B, A) * sp.KroneckerProduct(x, y)), P)
    right = book.mixed_product(sp.KroneckerProduct(A, B) * book.swap(P * sp.KroneckerProduct(x, y), P))
    assert left == right == sp.KroneckerProduct(A * y, B * x)
    wrong = book.swap(P * book.mixed_product(sp.KroneckerProduct(A, B) * sp.KroneckerProduct(x, y)), P)
    assert wrong != right


def test_shuffle_and_block_rotation_match_the_package():
    m = sp.Symbol("m")
    for d in range(2, 18, 2):
        P = book.shuffle(d)
        x = sp.Matrix(sp.symbols(f"x0:{d}"))
        assert list(P * x) == [x[p] for p in rope.layouts.interleaved_to_half(d).tolist()]
        assert P.T * P == sp.eye(d)
        theta = sp.symbols(f"t0:{d // 2}")
        half, interleaved = book.block_rotation(m, theta, "half"), book.block_rotation(m, theta)
        assert half == P * interleaved * P.T
        freqs, _ = rope.inv_freq({"rope_theta": 10000.0}, d)
        for layout, matrix in (("half", half), ("interleaved", interleaved)):
            numeric = sp.lambdify([m, theta], matrix)(5, [float(f) for f in freqs])
            expected = rope.reference.rotation_matrix(5, freqs, layout=layout)
            assert torch.allclose(torch.tensor(numeric, dtype=torch.float64), expected, atol=1e-12)


def test_sums_agree_is_fubini_and_nothing_else():
    N, d = sp.symbols("N d", integer=True, positive=True)
    n, t, c = sp.symbols("n t c", integer=True)
    a, b, v = sp.IndexedBase("a"), sp.IndexedBase("b"), sp.IndexedBase("v")
    pairwise = sp.Sum(sp.Sum(a[t] * b[n, t], (t, 0, d - 1)) * v[n, c], (n, 0, N - 1))
    regrouped = sp.Sum(a[t] * sp.Sum(b[n, t] * v[n, c], (n, 0, N - 1)), (t, 0, d - 1))
    assert book.sums_agree(pairwise, regrouped)
    assert not book.sums_agree(pairwise, sp.Sum(a[t] * sp.Sum(b[n, t] * v[t, c], (n, 0, N - 1)), (t, 0, d - 1)))
    assert not book.sums_agree(pairwise, sp.Sum(a[t] * sp.Sum(b[n, t] * v[n, c], (n, 0, N - 2)), (t, 0, d - 1)))


def test_vanishes():
    alpha, beta = sp.symbols("alpha beta", real=True)
    assert book.vanishes(book.rotation(alpha).T * book.rotation(beta) - book.rotation(beta - alpha))
    assert not book.vanishes(book.rotation(alpha).T * book.rotation(beta) - book.rotation(alpha - beta))
