"""rope.analysis.general against float64 references (matrix_exp, matrix_power) and the completeness argument."""

import mpmath
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from rope.analysis.general import power_rotation, rotation_from_generator, skew_block_diagonalize
from strategies import seeds

sizes = st.integers(2, 12)


def random_skew(d, gen, scale=1.0):
    a = torch.randn(d, d, generator=gen, dtype=torch.float64) * scale
    return a - a.T


def random_orthogonal(d, gen):
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def block_generator(thetas, d):
    """blockdiag(J(t_0), J(t_1), ...) on pairs (2j, 2j + 1), J(t) = [[0, -t], [t, 0]], zero-padded to d."""
    lam = torch.zeros(d, d, dtype=torch.float64)
    j = torch.arange(len(thetas))
    lam[2 * j + 1, 2 * j] = thetas
    lam[2 * j, 2 * j + 1] = -thetas
    return lam


def mpmath_expm(A):
    """exp(A) to 40 digits (mpmath), rounded to float64: the tight reference."""
    exact = mpmath.expm(mpmath.matrix(A.tolist()))
    return torch.tensor([[float(exact[i, j]) for j in range(A.shape[1])] for i in range(A.shape[0])],
                        dtype=torch.float64)


@given(seeds, st.integers(2, 8), st.sampled_from([-13, -1, 0.5, 1, 7, 60]), st.sampled_from([0.01, 0.1, 1.0, 3.0]))
def test_rotation_from_generator_is_the_matrix_exponential(seed, d, n, scale):
    gen = torch.Generator().manual_seed(seed)
    B = random_skew(d, gen, scale)
    result = rotation_from_generator(B, n)
    tolerance = 1e-14 * d * max(1.0, abs(n) * B.abs().max().item())
    torch.testing.assert_close(result, mpmath_expm(n * B), rtol=0, atol=tolerance)
    # torch.linalg.matrix_exp is looser for small norms in float64 (its degree-8 Taylor branch;
    # pytorch issue 196592 reports a wrong coefficient there), hence 1e-9 (its error peaks near 2.5e-10 at norm 0.05).
    torch.testing.assert_close(result, torch.linalg.matrix_exp(n * B), rtol=0, atol=1e-9 + tolerance)


@given(seeds, sizes, st.integers(-(2**12), 2**12), st.integers(-(2**12), 2**12))
def test_relative_property_and_orthogonality(seed, d, m, n):
    gen = torch.Generator().manual_seed(seed)
    B = random_skew(d, gen)
    r_m, r_n = rotation_from_generator(B, m), rotation_from_generator(B, n)
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(r_m.T @ r_n, rotation_from_generator(B, n - m), rtol=0, atol=1e-9)
    torch.testing.assert_close(r_m.T @ r_m, eye, rtol=0, atol=1e-13 * d)
    assert abs(torch.linalg.det(r_m).item() - 1.0) < 1e-12 * d


@given(seeds, sizes)
def test_skew_block_diagonalize_random(seed, d):
    gen = torch.Generator().manual_seed(seed)
    B = random_skew(d, gen)
    P, thetas = skew_block_diagonalize(B)
    assert thetas.shape == (d // 2,) and thetas.dtype == torch.float64
    assert (thetas >= 0).all() and (thetas[:-1] >= thetas[1:]).all()
    torch.testing.assert_close(P.T @ P, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-13 * d)
    torch.testing.assert_close(P.T @ B @ P, block_generator(thetas, d), rtol=0, atol=1e-13 * d * B.abs().max().item())
    # The frequencies are the moduli of B's eigenvalues +-i t_j (float64 complex reference).
    moduli = torch.linalg.eigvals(B).imag.abs().sort(descending=True).values[0 : 2 * (d // 2) : 2]
    torch.testing.assert_close(thetas, moduli, rtol=0, atol=1e-12 * d * B.abs().max().item())


@given(seeds, st.integers(1, 5), st.integers(0, 3), st.integers(0, 1))
def test_skew_block_diagonalize_repeated_and_zero_frequencies(seed, distinct, zeros, odd):
    """B = Q Lambda Q^T with a repeated frequency and a kernel: thetas come back, sorted."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.rand(distinct, generator=gen, dtype=torch.float64) + 0.5
    planted = torch.cat([t, t[:1], torch.zeros(zeros, dtype=torch.float64)])
    d = 2 * len(planted) + odd
    Q = random_orthogonal(d, gen)
    B = Q @ block_generator(planted, d) @ Q.T
    P, thetas = skew_block_diagonalize(B)
    torch.testing.assert_close(thetas, planted.sort(descending=True).values, rtol=0, atol=1e-12)
    torch.testing.assert_close(P.T @ P, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(P.T @ B @ P, block_generator(thetas, d), rtol=0, atol=1e-12)


@given(seeds, st.integers(1, 6), st.integers(0, 2**16), st.integers(0, 2**16))
def test_block_rope_in_the_rotated_basis_gives_the_same_scores(seed, pairs, m, n):
    """q^T exp((n-m)B) k = (P^T q)^T R_{n-m} (P^T k) with R the library's RoPE (interleaved, thetas)."""
    gen = torch.Generator().manual_seed(seed)
    d = 2 * pairs
    B = random_skew(d, gen)
    q, k = torch.randn(2, d, generator=gen, dtype=torch.float64)
    P, thetas = skew_block_diagonalize(B)
    general = q @ rotation_from_generator(B, n - m) @ k
    q_rot, k_rot = rope.apply_rotary(
        (P.T @ q).reshape(1, 1, 1, d), (P.T @ k).reshape(1, 1, 1, d), torch.tensor([0]), thetas, layout="interleaved"
    )
    q_m, _ = rope.apply_rotary(q_rot, q_rot, torch.tensor([m]), thetas, layout="interleaved")
    _, k_n = rope.apply_rotary(k_rot, k_rot, torch.tensor([n]), thetas, layout="interleaved")
    torch.testing.assert_close((q_m.flatten() @ k_n.flatten()), general, rtol=1e-9, atol=1e-9)


@given(seeds, st.integers(1, 10), st.integers(-40, 40), st.booleans())
def test_power_rotation_is_the_matrix_power(seed, d, n, reflect):
    gen = torch.Generator().manual_seed(seed)
    O = random_orthogonal(d, gen)
    if reflect != (torch.linalg.det(O).item() < 0):
        O[:, 0] = -O[:, 0]
    reference = torch.linalg.matrix_power(O, n)  # negative n: through the inverse
    torch.testing.assert_close(power_rotation(O, n), reference, rtol=0, atol=1e-12 * d * max(1, abs(n)))
    sign = -1.0 if reflect and n % 2 else 1.0
    assert abs(torch.linalg.det(power_rotation(O, n)).item() - sign) < 1e-10


@given(seeds, st.integers(1, 10), st.integers(-50, 50), st.integers(-50, 50))
def test_power_rotation_relative_property(seed, d, m, n):
    gen = torch.Generator().manual_seed(seed)
    O = random_orthogonal(d, gen)
    torch.testing.assert_close(power_rotation(O, m).T @ power_rotation(O, n), power_rotation(O, n - m),
                               rtol=0, atol=1e-11 * d)


@given(seeds, sizes, st.integers(-30, 30))
def test_power_of_exponential_is_exponential_of_multiple(seed, d, n):
    gen = torch.Generator().manual_seed(seed)
    B = random_skew(d, gen)
    torch.testing.assert_close(power_rotation(rotation_from_generator(B, 1), n), rotation_from_generator(B, n),
                               rtol=0, atol=1e-11 * d * max(1, abs(n)))


def test_reflection_gives_a_sign_pattern():
    """O = Q diag(R(phi), -1) Q^T: O^n = Q diag(R(n phi), (-1)^n) Q^T."""
    gen = torch.Generator().manual_seed(11)
    Q = random_orthogonal(3, gen)
    phi = 0.7

    def model(n):
        core = torch.zeros(3, 3, dtype=torch.float64)
        core[:2, :2] = rope.reference.rotation_matrix(n, torch.tensor([phi]))
        core[2, 2] = (-1.0) ** n
        return Q @ core @ Q.T

    for n in (-5, -2, 0, 1, 4, 9):
        torch.testing.assert_close(power_rotation(model(1), n), model(n), rtol=0, atol=1e-13)


def test_bad_input_is_named():
    skew = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match=r"B must be a non-empty square matrix \[d, d\]"):
        rotation_from_generator(torch.zeros(2, 3), 1)
    with pytest.raises(ValueError, match="B must be skew-symmetric"):
        rotation_from_generator(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), 1)
    with pytest.raises(ValueError, match="B must be skew-symmetric"):
        skew_block_diagonalize(torch.eye(3))
    with pytest.raises(ValueError, match="at least 2 x 2"):
        skew_block_diagonalize(torch.zeros(1, 1))
    with pytest.raises(TypeError, match="B must be a torch.Tensor"):
        rotation_from_generator([[0.0, -1.0], [1.0, 0.0]], 1)
    with pytest.raises(TypeError, match="B must be a real tensor"):
        rotation_from_generator(skew.to(torch.complex64), 1)
    with pytest.raises(ValueError, match="B must have finite entries"):
        rotation_from_generator(torch.tensor([[0.0, -float("inf")], [float("inf"), 0.0]]), 1)
    with pytest.raises(TypeError, match="n must be a real number"):
        rotation_from_generator(skew, True)
    with pytest.raises(ValueError, match="n must be finite"):
        rotation_from_generator(skew, float("nan"))
    with pytest.raises(TypeError, match="n must be an int"):
        power_rotation(torch.eye(2), 1.5)
    with pytest.raises(ValueError, match="O must be orthogonal"):
        power_rotation(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), 2)
    with pytest.raises(ValueError, match=r"O must be a non-empty square matrix"):
        power_rotation(torch.ones(3), 2)
