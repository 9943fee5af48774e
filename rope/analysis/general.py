"""The general solution of the relative property R_m^T R_n = R_{n-m}, and its reduction to RoPE.

Su Jianlin, "Transformer upgrade path 6: completeness of rotary position embedding" (2022):

* R_n = exp(n B) satisfies R_m^T R_n = R_{n-m} exactly when B^T = -B (B skew-symmetric);
  then exp(n B) is orthogonal with determinant 1.
* R_n = O^n satisfies it for every orthogonal O (O^{-1} = O^T); det O = -1 is allowed.
* Every real skew-symmetric B is orthogonally similar to a block diagonal generator:
  B = P Lambda P^T with P orthogonal and Lambda = blockdiag(J(t_0), J(t_1), ...),
  J(t) = [[0, -t], [t, 0]] (a zero row and column left over when d is odd). Hence
  exp(n B) = P exp(n Lambda) P^T, and exp(n Lambda) is the block diagonal RoPE matrix with
  frequencies t_j in the interleaved layout (pairs (2j, 2j+1)).

All results are float64.
"""

from __future__ import annotations

from numbers import Integral

import torch

from .._checks import integer, number, tensor
from ..reference import rotation_matrix

_INT64_MIN, _INT64_MAX = -(2**63) + 1, 2**63 - 1
SKEW_TOLERANCE = 1e-10
ORTHOGONAL_TOLERANCE = 1e-10


def _square_float64(matrix, name: str) -> torch.Tensor:
    tensor(name, matrix)
    if matrix.dtype.is_complex or matrix.dtype == torch.bool:
        raise TypeError(f"{name} must be a real tensor (float or integer), got {matrix.dtype}")
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty square matrix [d, d], got shape {tuple(matrix.shape)}")
    matrix = matrix.to(torch.float64)
    if not torch.isfinite(matrix).all():
        raise ValueError(f"{name} must have finite entries")
    return matrix


def _exponent(n) -> int | float:
    """n as an int (NumPy integers included; an int64 value, kept exact) or a finite float."""
    if isinstance(n, Integral) and not isinstance(n, bool):
        return integer("n", n, minimum=_INT64_MIN, maximum=_INT64_MAX)
    return number("n", n)


def _check_skew(B) -> torch.Tensor:
    """B as float64, made exactly skew-symmetric, if it is skew-symmetric up to rounding."""
    B = _square_float64(B, "B")
    if B.shape[0] < 2:
        raise ValueError(f"B must be at least 2 x 2 (a 1 x 1 skew-symmetric matrix is 0), got {tuple(B.shape)}")
    asymmetry = (B + B.T).abs().max().item()
    if asymmetry > SKEW_TOLERANCE * max(1.0, B.abs().max().item()):
        raise ValueError(f"B must be skew-symmetric (B^T = -B); max |B + B^T| = {asymmetry:.3g}")
    return (B - B.T) / 2


def skew_block_diagonalize(B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, thetas)`` with P orthogonal and P^T B P = blockdiag(J(t_0), ..., J(t_{d//2-1})) (+ [0]).

    J(t) = [[0, -t], [t, 0]] acts on coordinates (2j, 2j+1); thetas t_0 >= t_1 >= ... >= 0;
    for odd d the last row and column are zero. This is the real Schur form of a skew-symmetric
    matrix. Construction: iB is Hermitian, so ``torch.linalg.eigh`` gives orthonormal eigenvectors;
    the eigenvalue -t < 0 of iB belongs to an eigenvector v = a + ib of B with B v = i t v, i.e.
    B b = t a and B a = -t b, and (sqrt(2) b, sqrt(2) a) are two orthonormal columns of P.
    Eigenvalues within d * 1e-13 * max|t| of zero are treated as zero; the kernel gets any
    orthonormal real basis.

    Args:
        B: a real skew-symmetric matrix ``[d, d]`` (up to rounding), d >= 2.
    """
    B = _check_skew(B)
    d = B.shape[0]
    eigenvalues, vectors = torch.linalg.eigh(1j * B.to(torch.complex128))  # ascending
    tolerance = d * 1e-13 * max(eigenvalues.abs().max().item(), 1e-300)
    pairs = int((eigenvalues < -tolerance).sum().item())
    pairs = min(pairs, int((eigenvalues > tolerance).sum().item()))
    rotating = vectors[:, :pairs]  # eigenvalues -t_j of iB, most negative first: t_j descending
    columns = []
    for j in range(pairs):
        columns += [rotating[:, j].imag, rotating[:, j].real]
    basis = torch.stack(columns, dim=1) * 2**0.5 if pairs else torch.zeros(d, 0, dtype=torch.float64)
    kernel_vectors = vectors[:, pairs : d - pairs]
    if kernel_vectors.shape[1]:
        # The kernel of B is a real subspace; its complex eigenvectors' real and imaginary parts span it.
        spanning = torch.cat([kernel_vectors.real, kernel_vectors.imag], dim=1)
        spanning = spanning - basis @ (basis.T @ spanning)
        left, _, _ = torch.linalg.svd(spanning, full_matrices=False)
        basis = torch.cat([basis, left[:, : d - 2 * pairs]], dim=1)
    # Nearest orthogonal matrix (polar factor): removes the eigensolver's rounding from P^T P.
    u, _, vh = torch.linalg.svd(basis)
    P = u @ vh
    first = torch.arange(0, 2 * pairs, 2)
    thetas = torch.zeros(d // 2, dtype=torch.float64)
    thetas[:pairs] = (P.T @ B @ P)[first + 1, first]
    return P, thetas


def rotation_from_generator(B: torch.Tensor, n: int | float) -> torch.Tensor:
    """R_n = exp(n B) for a skew-symmetric B, float64 ``[d, d]``, orthogonal with det 1.

    Computed as P exp(n Lambda) P^T from :func:`skew_block_diagonalize`, where exp(n Lambda) is
    the block diagonal RoPE matrix of frequencies t_j (interleaved pairs); the angles n t_j are
    formed in float64, so R_n stays orthogonal to rounding for every n.

    Args:
        B: a real skew-symmetric matrix ``[d, d]``, d >= 2.
        n: the position, an int64 integer or a finite real number.
    """
    n = _exponent(n)
    P, thetas = skew_block_diagonalize(B)
    blocks = rotation_matrix(n, thetas, head_dim=P.shape[0], layout="interleaved")
    return P @ blocks @ P.T


def power_rotation(O: torch.Tensor, n: int) -> torch.Tensor:
    """R_n = O^n for an orthogonal O and any integer n, float64 ``[d, d]``.

    O^{-1} = O^T, so R_m^T R_n = O^{-m} O^n = O^{n-m}: the relative property holds for every
    orthogonal O, including det O = -1 (reflections), where det R_n = (-1)^n.
    Negative n use the transpose, never a matrix inverse.

    Args:
        O: a real orthogonal matrix ``[d, d]``.
        n: the position, an int64 integer.
    """
    n = integer("n", n, minimum=_INT64_MIN, maximum=_INT64_MAX)
    O = _square_float64(O, "O")
    error = (O.T @ O - torch.eye(O.shape[0], dtype=torch.float64)).abs().max().item()
    if error > ORTHOGONAL_TOLERANCE:
        raise ValueError(f"O must be orthogonal (O^T O = I); max |O^T O - I| = {error:.3g}")
    return torch.linalg.matrix_power(O if n >= 0 else O.T, abs(n))
