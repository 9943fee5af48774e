"""Long-term decay of RoPE scores, and how large the base must be for a context length.

Notation: a head of width d has d/2 frequencies theta_i = b^(-2i/d), i = 0 .. d/2 - 1 (i counted
from 0, as in :mod:`rope.frequencies`); ``distance`` is the relative position s = m - n.

**Decay bound** (RoFormer, Su et al. 2021, sec. 3.4.3). With h_i = q_i conj(k_i) for the complex
pairs of q and k, the score is Re sum_i h_i e^{i s theta_i}. The partial sums

    S_0 = 0,   S_j(s) = sum_{i=0}^{j-1} e^{i s theta_i}   (j = 1 .. d/2)

turn it, by summation by parts with the convention h_{d/2} = 0, into -sum_i S_{i+1} (h_{i+1} - h_i),
so ``|score|`` <= (max_i ``|h_{i+1} - h_i|``) sum_{j=1}^{d/2} ``|S_j(s)|``. RoFormer's Figure 2 plots the
*relative upper bound* (1/(d/2)) sum_{j=1}^{d/2} ``|S_j(s)|``; the Position Interpolation paper
(Chen et al. 2023) calls sum_j ``|S_j(s)|`` = B(s) and plots B(s)/d, half of RoFormer's quantity.

**Base condition** (Men et al. 2024, "Base of RoPE Bounds Context Length"). For a random vector
q with i.i.d. zero-mean coordinates of variance sigma^2, E[q^T R_s q] = sigma^2 tr R_s
= 2 sigma^2 C(s) with the *cosine sum*

    C(s) = sum_{i=0}^{d/2-1} cos(s theta_i)  (= Re S_{d/2}(s)).

A base b is *admissible for length L* if C(s) >= 0 for every integer s with 0 <= s < L. The set
of admissible bases is not an interval: a larger base can fail where a smaller one passes, so
"the smallest base" is defined on an explicit grid (see :func:`min_bases_for_lengths`).
"""

from __future__ import annotations

import bisect
import math

import torch

from .._checks import choice, float_tensor, integer, number, same_device
from ..frequencies import default_theta

# The scan evaluates C(s) in blocks of _BLOCK consecutive distances, starting with one block and
# doubling the number of blocks per step up to _MAX_BLOCKS (about a million distances per step).
_BLOCK = 1024
_MAX_BLOCKS = 1024


def _as_distances(distance, theta: torch.Tensor) -> torch.Tensor:
    """``distance`` (a real number, sequence or tensor) as float64 on the device of ``theta``;
    a tensor must already be there. NaN and infinite distances are refused."""
    if isinstance(distance, torch.Tensor):
        same_device("inv_freq", theta, distance=distance)
        if distance.dtype == torch.bool or distance.dtype.is_complex:
            raise TypeError(f"distance must hold real numbers, got a {distance.dtype} tensor")
        s = distance.to(torch.float64)
    else:
        try:
            probe = torch.as_tensor(distance)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"distance must be a real number, sequence or tensor, got {distance!r}") from error
        if probe.dtype == torch.bool or probe.dtype.is_complex:
            raise TypeError(f"distance must hold real numbers, got {distance!r}")
        # from the original values: Python floats would otherwise pass through float32
        s = torch.as_tensor(distance, dtype=torch.float64, device=theta.device)
    if not bool(torch.isfinite(s).all()):
        raise ValueError("distance must be finite")
    return s


def _as_frequencies(inv_freq) -> torch.Tensor:
    """``inv_freq`` as float64: a non-empty 1-D float tensor of finite values (any float dtype:
    these are analyses, often of float64 frequencies)."""
    float_tensor("inv_freq", inv_freq, dim=1)
    if inv_freq.numel() == 0:
        raise ValueError("inv_freq must hold at least one frequency")
    theta = inv_freq.to(torch.float64)
    if not bool(torch.isfinite(theta).all()):
        raise ValueError("inv_freq must hold finite frequencies")
    return theta


def _base(name: str, value) -> float:
    base = number(name, value)
    if not base > 1:
        raise ValueError(f"{name} must be a finite real number > 1, got {value!r}")
    return base


def partial_sums(distance, inv_freq: torch.Tensor) -> torch.Tensor:
    """S_j(s) = sum_{i=0}^{j-1} e^{i s theta_i} for j = 0 .. d/2 (RoFormer sec. 3.4.3), complex128.

    Returns shape ``distance.shape + (d/2 + 1,)``; entry ``[..., j]`` is S_j, so ``[..., 0]`` is
    S_0 = 0. ``distance`` may be any real numbers (PI evaluates non-integer s).

    Args:
        distance: the relative positions s, real numbers (a number, sequence or tensor).
        inv_freq: the frequencies theta_i, a non-empty 1-D float tensor of finite values.
    """
    theta = _as_frequencies(inv_freq)
    s = _as_distances(distance, theta)
    terms = torch.exp(1j * (s[..., None] * theta))
    zero = torch.zeros(*s.shape, 1, dtype=terms.dtype, device=terms.device)
    return torch.cat([zero, torch.cumsum(terms, dim=-1)], dim=-1)


def relative_upper_bound(distance, inv_freq: torch.Tensor) -> torch.Tensor:
    """(1/(d/2)) sum_{j=1}^{d/2} ``|S_j(s)|``, the curve of RoFormer's Figure 2, float64.

    Multiplied by (d/2) * max_i ``|h_{i+1} - h_i|`` (with h_{d/2} = 0) it bounds ``|sum_i h_i e^{i s theta_i}|``;
    B(s)/d of the Position Interpolation paper is half of it.

    Args:
        distance: the relative positions s, real numbers (a number, sequence or tensor).
        inv_freq: the frequencies theta_i, a non-empty 1-D float tensor of finite values.

    Returns:
        float64, of the shape of ``distance``.
    """
    return partial_sums(distance, inv_freq)[..., 1:].abs().mean(dim=-1)


def cosine_sum(distance, inv_freq: torch.Tensor) -> torch.Tensor:
    """C(s) = sum_i cos(s theta_i) = tr(R_s) / 2, the expected score E[q^T R_s q] / (2 sigma^2), float64.

    Args:
        distance: the relative positions s, real numbers (a number, sequence or tensor).
        inv_freq: the frequencies theta_i, a non-empty 1-D float tensor of finite values.

    Returns:
        float64, of the shape of ``distance``.
    """
    theta = _as_frequencies(inv_freq)
    s = _as_distances(distance, theta)
    return torch.cos(s[..., None] * theta).sum(dim=-1)


def first_negative_distance(base: float, dim: int, *, limit: int) -> int | None:
    """The smallest integer s in [0, limit) with C(s) < 0 for theta_i = base^(-2i/d), or None.

    Scans s = 0, 1, 2, ... in blocks and stops at the first negative value, so the cost grows with
    the answer, not with ``limit``. Within a block starting at a, the angle-addition formula
    cos((a + j) theta) = cos(a theta) cos(j theta) - sin(a theta) sin(j theta) turns the sums over i
    for many blocks into one matrix product; each C(s) is accurate to about d/2 * s * 1e-16.
    The scan is many small tensor operations: on a busy machine, ``torch.set_num_threads(1)``
    can make it many times faster.

    Args:
        base: the base b, > 1.
        dim: the head width d, an even int >= 2.
        limit: the end of the scan, exclusive, >= 1.
    """
    base = _base("base", base)
    dim = integer("dim", dim, minimum=2, even=True)
    limit = integer("limit", limit, minimum=1)
    theta = default_theta(base, dim)
    offsets = torch.arange(_BLOCK, dtype=torch.float64)[:, None] * theta
    within_block = torch.cat([offsets.cos(), -offsets.sin()], dim=1)  # [_BLOCK, d]
    start, blocks = 0, 1
    while start < limit:
        anchors = (start + _BLOCK * torch.arange(blocks, dtype=torch.float64))[:, None] * theta
        at_anchor = torch.cat([anchors.cos(), anchors.sin()], dim=1)  # [blocks, d]
        values = (at_anchor @ within_block.T).reshape(-1)[: limit - start]  # C(start), C(start + 1), ...
        negative = torch.nonzero(values < 0)
        if negative.numel():
            return start + int(negative[0, 0])
        start += blocks * _BLOCK
        blocks = min(2 * blocks, _MAX_BLOCKS)
    return None


def base_is_admissible(base: float, length: int, dim: int) -> bool:
    """True if C(s) = sum_i cos(s base^(-2i/d)) >= 0 for every integer 0 <= s < length (Men et al. 2024).

    Args:
        base: the base b, > 1.
        length: the context length L, >= 1.
        dim: the head width d, an even int >= 2.
    """
    length = integer("length", length, minimum=1)
    return first_negative_distance(base, dim, limit=length) is None


def base_grid(lower: float, upper: float, points_per_decade: int) -> torch.Tensor:
    """The log grid 10^(k / points_per_decade), integer k, of the bases in [lower, upper], float64.

    Args:
        lower: the smallest base, > 1.
        upper: the largest base, >= lower.
        points_per_decade: the grid points per factor of 10, >= 1.
    """
    lower, upper = _base("lower", lower), _base("upper", upper)
    points_per_decade = integer("points_per_decade", points_per_decade, minimum=1)
    if upper < lower:
        raise ValueError(f"upper must be >= lower, got lower={lower!r}, upper={upper!r}")
    first = math.ceil(math.log10(lower) * points_per_decade - 1e-9)
    last = math.floor(math.log10(upper) * points_per_decade + 1e-9)
    if last < first:
        raise ValueError(f"no grid point 10^(k/{points_per_decade}) lies in [lower, upper] = [{lower!r}, {upper!r}]")
    return 10.0 ** (torch.arange(first, last + 1, dtype=torch.float64) / points_per_decade)


RULES = ("first", "stable")


def min_bases_for_lengths(
    lengths,
    dim: int,
    *,
    rule: str = "first",
    points_per_decade: int = 100,
    lower: float = 10.0,
    upper: float = 1e12,
) -> list[float]:
    """For each length L, the smallest admissible base on the grid ``base_grid(lower, upper, points_per_decade)``.

    Admissibility is not monotone in b, so "smallest" needs a rule:

    * ``rule="first"``: the first grid point b, in increasing order, with C(s) >= 0 for all
      integers 0 <= s < L. Every smaller grid point fails; some larger ones may fail too.
      Found by one walk up the grid: at each point the first negative distance s*
      (:func:`first_negative_distance`, which stops early) settles every waiting L <= s*.
    * ``rule="stable"``: the smallest grid point b such that *every* grid point from b up to
      ``upper`` is admissible (so the answer depends on ``upper``). Found by one walk down the
      grid from ``upper``: the first failing point settles L, with the grid point above it.

    Between grid points a base may pass or fail unseen: the grid is the definition. If the answer
    is ``lower`` itself, it only says that ``lower`` passes. Raises ValueError if no grid point up
    to ``upper`` is admissible for some L ("first"), or if the top grid point fails ("stable").

    Args:
        lengths: the context lengths L, a sequence of positive ints.
        dim: the head width d, an even int >= 2.
        rule: ``"first"`` or ``"stable"``, as above.
        points_per_decade: the grid points per factor of 10 (:func:`base_grid`).
        lower: the grid's smallest base.
        upper: the grid's largest base.

    Returns:
        One base per length, in the order of ``lengths``.
    """
    choice("rule", rule, RULES)
    lengths = _lengths(lengths)
    dim = integer("dim", dim, minimum=2, even=True)
    grid = base_grid(lower, upper, points_per_decade).tolist()
    waiting = sorted(set(lengths))
    if rule == "first":
        answers = _first_admissible(grid, dim, waiting, upper)
    else:
        answers = _stable_admissible(grid, dim, waiting, upper)
    return [answers[length] for length in lengths]


def _lengths(lengths) -> list[int]:
    """``lengths`` as a list of positive ints; TypeError for a string or a non-iterable."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(f"lengths must be a sequence of positive ints, got {lengths!r}")
    return [integer(f"lengths[{i}]", length, minimum=1) for i, length in enumerate(lengths)]


def _admissible_count(base: float, dim: int, waiting: list[int]) -> int:
    """How many of the increasing lengths ``waiting`` the base is admissible for: those L <= s*,
    s* its first negative distance below ``waiting[-1]`` (all of them if there is none), a prefix."""
    first_negative = first_negative_distance(base, dim, limit=waiting[-1])
    return len(waiting) if first_negative is None else bisect.bisect_right(waiting, first_negative)


def _first_admissible(grid: list[float], dim: int, waiting: list[int], upper: float) -> dict[int, float]:
    """Rule "first" of :func:`min_bases_for_lengths` for the increasing lengths ``waiting``: one walk
    up ``grid``, each grid point settling the lengths still waiting that it is admissible for."""
    answers = {}
    for base in grid:
        if not waiting:
            break
        passed = _admissible_count(base, dim, waiting)
        answers.update((length, base) for length in waiting[:passed])
        waiting = waiting[passed:]
    if waiting:
        raise ValueError(
            f"no base on the grid up to upper={upper!r} is admissible for length {waiting[0]}; raise upper"
        )
    return answers


def _stable_admissible(grid: list[float], dim: int, waiting: list[int], upper: float) -> dict[int, float]:
    """Rule "stable" of :func:`min_bases_for_lengths` for the increasing lengths ``waiting``: one walk
    down ``grid``; the first grid point that fails a length settles it with the grid point above."""
    answers, above = {}, None
    for base in reversed(grid):
        if not waiting:
            break
        passed = _admissible_count(base, dim, waiting)
        if passed < len(waiting) and above is None:
            raise ValueError(f"upper={upper!r} is not admissible for length {waiting[-1]}; raise upper")
        answers.update((length, above) for length in waiting[passed:])
        waiting = waiting[:passed]
        above = base
    answers.update((length, grid[0]) for length in waiting)
    return answers


def min_base_for_length(length: int, dim: int, **grid_options) -> float:
    """The smallest admissible base for one length; see :func:`min_bases_for_lengths` for the
    keyword arguments (``rule``, ``points_per_decade``, ``lower``, ``upper``).

    Args:
        length: the context length L, >= 1.
        dim: the head width d, an even int >= 2.
        **grid_options: ``rule``, ``points_per_decade``, ``lower``, ``upper`` of :func:`min_bases_for_lengths`.
    """
    length = integer("length", length, minimum=1)
    return min_bases_for_lengths([length], dim, **grid_options)[0]
