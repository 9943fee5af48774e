"""What a training context shows each RoPE pair, and how far interpolated scores can stray.

Notation, as in :mod:`rope.frequencies`: pairs i = 0 .. d/2 - 1 (counted from 0) turn by theta_i
per position, theta_i = b^(-2i/d); the relative distance of a query at m and a key at n is
s = m - n. Read pair j of q and k as complex numbers q_j, k_j (half layout: q_j = q[j] + i q[j + d/2];
interleaved: q[2j] + i q[2j + 1]) and put h_j = q_j conj(k_j). Then (Position Interpolation paper,
Chen et al. 2023, eq. 3)

    a(s) = (R_m q)^T (R_n k) = Re sum_j h_j e^{i s theta_j},

a trigonometric series in s, defined for every real s.

**Angles seen in training.** A context of L tokens has distances s = 0 .. L - 1, so pair i is
shown the angles s theta_i mod 2 pi. If (L - 1) theta_i < 2 pi the pair never completes a turn and
the arc ((L - 1) theta_i, 2 pi) is never shown; :func:`largest_unseen_arc` measures the largest
such gap exactly, for any pair. Two neighbouring pairs are told apart by the beat
e^{i s (theta_i - theta_{i+1})}, whose wavelength :func:`neighbour_beat_wavelengths` returns.

**Interpolation** (Theorem 2.1 of Chen et al. 2023). Between integers s_1 = floor(s) and
s_2 = s_1 + 1, with a_lin(s) = (1 - lambda) a(s_1) + lambda a(s_2), lambda = s - s_1,

    ``|a(s) - a_lin(s)|`` <= (s - s_1)(s_2 - s) / 2 * max ``|a''|``,   ``|a''|`` <= sum_j ``|h_j|`` theta_j^2.

:func:`interpolation_bound` is this bound; :func:`geometric_interpolation_bound` replaces
``|h_j|`` by max_j ``|h_j|`` and sums the geometric series, sum_j theta_j^2 = (1 - b^-2) / (1 - b^(-4/d)).
The paper states the constant as d / (4 ln b) instead (:func:`stated_interpolation_bound`), from
an inequality used in the wrong direction; it is smaller than the true sum, and
:func:`worst_interpolation_error` (the exact supremum over ``|h_j|`` <= 1) exceeds it.
"""

from __future__ import annotations

import math

import torch

from .._checks import float_tensor, integer, number, same_device


def _frequencies(inv_freq) -> torch.Tensor:
    float_tensor("inv_freq", inv_freq, dim=1)
    if inv_freq.numel() == 0:
        raise ValueError("inv_freq must hold at least one frequency")
    theta = inv_freq.to(torch.float64)
    if not bool(torch.all(theta > 0)) or not bool(torch.all(theta.isfinite())):
        raise ValueError("inv_freq must hold finite frequencies > 0")
    return theta


def _distances(name: str, value, theta: torch.Tensor | None = None) -> torch.Tensor:
    """``value`` (real numbers, a sequence or a tensor) as finite float64, on ``theta``'s device
    when given (a tensor must be there already)."""
    if isinstance(value, torch.Tensor):
        if theta is not None:
            same_device("inv_freq", theta, **{name: value})
        dtype = value.dtype
    else:
        try:
            dtype = torch.as_tensor(value).dtype
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{name} must be a real number, sequence or tensor, got {value!r}") from error
    if dtype == torch.bool or dtype.is_complex:
        raise TypeError(f"{name} must hold real numbers, got {dtype}")
    # from the original values: Python floats would otherwise pass through float32
    if isinstance(value, torch.Tensor):
        tensor = value.to(torch.float64)
    else:
        tensor = torch.as_tensor(value, dtype=torch.float64, device=None if theta is None else theta.device)
    if not bool(torch.all(tensor.isfinite())):
        raise ValueError(f"{name} must be finite")
    return tensor


def _coefficients(h, theta: torch.Tensor) -> torch.Tensor:
    if not isinstance(h, torch.Tensor) or not h.dtype.is_complex:
        raise TypeError(f"h must be a complex torch.Tensor, got {type(h).__name__} {getattr(h, 'dtype', '')}")
    same_device("inv_freq", theta, h=h)
    if h.dim() == 0 or h.shape[-1] != theta.numel():
        raise ValueError(f"h must have last dimension d/2 = {theta.numel()} (one per frequency), got {tuple(h.shape)}")
    return h.to(torch.complex128)


def _positive_int(name: str, value) -> int:
    return integer(name, value, minimum=1)


def _nonnegative_real(name: str, value) -> float:
    return number(name, value, minimum=0.0)


def _grid_factor(s: torch.Tensor) -> torch.Tensor:
    """(s - s_1)(s_2 - s) with s_1 = floor(s), s_2 = s_1 + 1."""
    frac = s - torch.floor(s)
    return frac * (1 - frac)


def largest_unseen_arc(inv_freq: torch.Tensor, training_length: int) -> torch.Tensor:
    """Per pair, the longest arc of the circle holding none of the angles s theta_i mod 2 pi,
    s = 0 .. L - 1 (L = ``training_length``), in radians, float64.

    For a pair that never completes a turn ((L - 1) theta_i < 2 pi) the angles are
    0, theta_i, .., (L - 1) theta_i and the arc is max(2 pi - (L - 1) theta_i, theta_i) (for L >= 2);
    for a pair that completes one it is at most theta_i.

    Args:
        inv_freq: the frequencies theta_i, finite and > 0, 1-D.
        training_length: L, the training context, >= 1.
    """
    theta = _frequencies(inv_freq)
    length = _positive_int("training_length", training_length)
    s = torch.arange(length, dtype=torch.float64, device=theta.device)
    arcs = []
    for t in theta:  # one pair at a time: memory O(L)
        angles = torch.sort(torch.remainder(s * t, 2 * math.pi)).values
        wrap = angles[:1] + 2 * math.pi - angles[-1:]
        arcs.append(torch.cat([angles.diff(), wrap]).max())
    return torch.stack(arcs)


def neighbour_beat_wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """2 pi / ``|theta_i - theta_{i+1}|`` for i = 0 .. d/2 - 2, float64: the distance over which pairs
    i and i + 1 drift apart by one full turn. Over a shorter window their two terms of a(s) are
    hard to tell apart (a least-squares fit may give them large coefficients that cancel).

    Args:
        inv_freq: the frequencies theta_i, finite and > 0, at least two.
    """
    theta = _frequencies(inv_freq)
    if theta.numel() < 2:
        raise ValueError("inv_freq must hold at least two frequencies to have neighbours")
    return 2 * math.pi / (theta[:-1] - theta[1:]).abs()


def series_score(h: torch.Tensor, distances, inv_freq: torch.Tensor) -> torch.Tensor:
    """a(s) = Re sum_j h_j e^{i s theta_j} (Chen et al. 2023, eq. 3), float64.

    ``h``: complex, shape ``[..., d/2]``; ``distances``: real, any shape (non-integers allowed).
    Returns shape ``h.shape[:-1] + distances.shape``.

    Args:
        h: the complex coefficients h_j ``[..., d/2]``.
        distances: the relative distances s, real numbers (a number, sequence or tensor).
        inv_freq: the frequencies theta_j, finite and > 0, 1-D.
    """
    theta = _frequencies(inv_freq)
    h = _coefficients(h, theta)
    s = _distances("distances", distances, theta)
    phases = torch.exp(1j * (s.reshape(-1, 1) * theta))  # [S, d/2]
    values = (h.reshape(-1, theta.numel()) @ phases.T).real
    return values.reshape(h.shape[:-1] + s.shape)


def fit_series_coefficients(distances, targets, inv_freq: torch.Tensor, *, ridge: float) -> torch.Tensor:
    """The h minimizing sum_k (a(s_k) - y_k)^2 + ridge * sum_j ``|h_j|``^2, complex128 ``[d/2]``.

    The construction of Chen et al. 2023, Fig. 2: a score fitted on distances inside the
    training window. Without the ridge term the problem is numerically singular for long windows
    (the low frequencies are nearly collinear there), so ``ridge`` must be given; it makes the
    answer well defined and reproducible.

    Args:
        distances: the distances s_k, 1-D real numbers.
        targets: the scores y_k to fit, as many as ``distances``.
        inv_freq: the frequencies theta_j, finite and > 0, 1-D.
        ridge: the weight of the penalty, the sum of the squared ``|h_j|``; >= 0.
    """
    theta = _frequencies(inv_freq)
    s = _distances("distances", distances, theta)
    y = _distances("targets", targets, theta)
    if s.dim() != 1 or y.shape != s.shape:
        raise ValueError(
            f"distances and targets must be 1-D of the same length, got {tuple(s.shape)} and {tuple(y.shape)}"
        )
    ridge = _nonnegative_real("ridge", ridge)
    angles = s[:, None] * theta
    design = torch.cat([angles.cos(), -angles.sin()], dim=1)  # Re((u + iv) e^{i phi}) = u cos - v sin
    n = 2 * theta.numel()
    system = torch.cat([design, math.sqrt(ridge) * torch.eye(n, dtype=torch.float64, device=theta.device)])
    rhs = torch.cat([y, torch.zeros(n, dtype=torch.float64, device=theta.device)])
    solution = torch.linalg.lstsq(system, rhs[:, None], driver="gelsd").solution[:, 0]
    half = theta.numel()
    return torch.complex(solution[:half], solution[half:])


def linear_interpolation_error(h: torch.Tensor, distances, inv_freq: torch.Tensor) -> torch.Tensor:
    """a(s) - a_lin(s), a_lin interpolating a linearly between s_1 = floor(s) and s_1 + 1, float64.

    Args:
        h: the complex coefficients h_j ``[..., d/2]``.
        distances: the distances s, real numbers.
        inv_freq: the frequencies theta_j, finite and > 0, 1-D.
    """
    s = _distances("distances", distances, _frequencies(inv_freq))
    s1 = torch.floor(s)
    lam = s - s1
    return series_score(h, s, inv_freq) - (
        (1 - lam) * series_score(h, s1, inv_freq) + lam * series_score(h, s1 + 1, inv_freq)
    )


def _interpolation_gaps(s: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """g_j(s) = e^{i s theta_j} - (1 - lambda) e^{i s_1 theta_j} - lambda e^{i s_2 theta_j}, [..., d/2]."""
    s1 = torch.floor(s)[..., None]
    lam = s[..., None] - s1
    at_s = torch.exp(1j * s[..., None] * theta)
    return at_s - (1 - lam) * torch.exp(1j * s1 * theta) - lam * torch.exp(1j * (s1 + 1) * theta)


def worst_interpolation_error(distances, inv_freq: torch.Tensor) -> torch.Tensor:
    """sup ``|a(s) - a_lin(s)|`` over all h with max_j ``|h_j|`` <= 1, float64.

    a(s) - a_lin(s) = Re sum_j h_j g_j(s) with the fixed numbers g_j(s) of the interpolation, so the
    supremum is sum_j ``|g_j(s)|``, attained by :func:`worst_interpolation_coefficients`. At the
    midpoint of two integers, ``|g_j|`` = 1 - cos(theta_j / 2).

    Args:
        distances: the distances s, real numbers (a number, sequence or tensor).
        inv_freq: the frequencies theta_j, finite and > 0, 1-D.
    """
    theta = _frequencies(inv_freq)
    return _interpolation_gaps(_distances("distances", distances, theta), theta).abs().sum(dim=-1)


def worst_interpolation_coefficients(distance: float, inv_freq: torch.Tensor) -> torch.Tensor:
    """The h (``|h_j|`` = 1) with a(s) - a_lin(s) = :func:`worst_interpolation_error` at s = ``distance``.

    Args:
        distance: the distance s, a real number.
        inv_freq: the frequencies theta_j, finite and > 0, 1-D.

    Returns:
        complex128 ``[d/2]``.
    """
    distance = number("distance", distance)
    theta = _frequencies(inv_freq)
    gaps = _interpolation_gaps(torch.tensor(distance, dtype=torch.float64, device=theta.device), theta)
    unit = torch.ones_like(gaps)
    return torch.where(gaps.abs() > 0, gaps.conj() / gaps.abs().clamp_min(1e-300), unit)


def interpolation_bound(h: torch.Tensor, distances, inv_freq: torch.Tensor) -> torch.Tensor:
    """(s - s_1)(s_2 - s) / 2 * sum_j ``|h_j|`` theta_j^2, float64: a valid bound on ``|a(s) - a_lin(s)|``
    (Chen et al. 2023, appendix A, eqs. 11-12 and 16, before ``|h_j|`` is replaced by its maximum).

    Args:
        h: the complex coefficients h_j ``[..., d/2]``.
        distances: the distances s, real numbers.
        inv_freq: the frequencies theta_j, finite and > 0, 1-D.

    Returns:
        float64 ``h.shape[:-1] + distances.shape``.
    """
    theta = _frequencies(inv_freq)
    h = _coefficients(h, theta)
    curvature = (h.abs() * theta**2).sum(dim=-1)
    s = _distances("distances", distances, theta)
    return curvature.reshape(curvature.shape + (1,) * s.dim()) * _grid_factor(s) / 2


def _check_dim_base(dim, base) -> tuple[int, float]:
    dim = integer("dim", dim, minimum=2, even=True)
    base = number("base", base)
    if not base > 1:
        raise ValueError(f"base must be a finite real number > 1, got {base!r}")
    return dim, base


def geometric_interpolation_bound(max_abs_h: float, distances, dim: int, base: float) -> torch.Tensor:
    """max|h| (s - s_1)(s_2 - s) / 2 * (1 - b^-2) / (1 - b^(-4/d)), float64: Theorem 2.1 of Chen et
    al. 2023 with the geometric sum sum_j theta_j^2 = sum_{j<d/2} b^(-4j/d) evaluated exactly.

    Args:
        max_abs_h: max_j ``|h_j|``, >= 0.
        distances: the distances s, real numbers.
        dim: the head width d, even.
        base: the base b, > 1.
    """
    max_abs_h = _nonnegative_real("max_abs_h", max_abs_h)
    dim, base = _check_dim_base(dim, base)
    squares = (1 - base**-2) / (1 - base ** (-4 / dim))
    return max_abs_h * _grid_factor(_distances("distances", distances)) / 2 * squares


def stated_interpolation_bound(max_abs_h: float, distances, dim: int, base: float) -> torch.Tensor:
    """d max|h| (s - s_1)(s_2 - s) / (8 ln b), float64: Theorem 2.1 of Chen et al. 2023 as printed.

    Not a valid bound: it uses sum_j theta_j^2 <= d / (4 ln b), which is false (the sum is larger);
    see :func:`worst_interpolation_error`.

    Args:
        max_abs_h: max_j ``|h_j|``, >= 0.
        distances: the distances s, real numbers.
        dim: the head width d, even.
        base: the base b, > 1.
    """
    max_abs_h = _nonnegative_real("max_abs_h", max_abs_h)
    dim, base = _check_dim_base(dim, base)
    return dim * max_abs_h * _grid_factor(_distances("distances", distances)) / (8 * math.log(base))
