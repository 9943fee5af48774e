"""Position encodings that came before RoPE, and ALiBi, as small exact functions.

The book's chapter on earlier encodings derives their properties; the chapters on length
extrapolation compare RoPE with them. Conventions, stated once:

* positions are counted from 0; a *relative position* is ``key - query``, the sign used
  by Shaw et al. (2018) and by T5, so a key after its query has a positive relative position;
* when a function takes ``q_len`` and ``k_len``, the queries are the *last* ``q_len`` tokens of
  the ``k_len`` keys (query i sits at position ``i + k_len - q_len``, as in decoding with a cache);
  with ``q_len == k_len`` query i sits at position i;
* values are computed in float64 (or exactly, in integers) and rounded once to the requested dtype.
"""

from __future__ import annotations

import math

import torch

from .._checks import (
    FLOAT_DTYPES,
    dtype_choice,
    flag,
    float_tensor,
    integer,
    integer_tensor,
    number,
    same_device,
    tensor,
)


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """omega_i = base^(-2i/d) for i = 0 .. d/2 - 1, float64, shape ``[dim/2]``.

    The angular frequency of pair i of the sinusoidal encoding (Vaswani et al. 2017, section 3.5);
    its wavelength 2 pi / omega_i grows geometrically from 2 pi to just under 2 pi * base. The same
    numbers are RoPE's default theta_i (RoFormer eq. 15 writes them with i = 1 .. d/2 as
    base^(-2(i-1)/d)).

    Args:
        dim: the encoding's width d, an even int >= 2.
        base: the base, > 1.
    """
    dim = integer("dim", dim, minimum=2, even=True)
    base = number("base", base)
    if base <= 1:
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    return base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def sinusoidal(
    positions: torch.Tensor, dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The sinusoidal absolute encoding p_pos of Vaswani et al. (2017), shape ``positions.shape + (dim,)``.

    Interleaved, as in the paper's formula (not the concatenated [sin..., cos...] of tensor2tensor
    and fairseq, whose frequencies are also spaced differently)::

        PE(pos, 2i)     = sin(pos * omega_i)
        PE(pos, 2i + 1) = cos(pos * omega_i),    omega_i = base^(-2i/d),  i = 0 .. d/2 - 1.

    ``positions`` may be integer or float (fractional positions arise under interpolation).
    The angles, sines and cosines are float64; the result is rounded once to ``dtype``.

    Args:
        positions: integer or float positions, finite, any shape.
        dim: the encoding's width d, an even int >= 2.
        base: the base of omega_i, > 1.
        dtype: the floating dtype of the result.
    """
    tensor("positions", positions)
    if positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer or float tensor, got {positions.dtype}")
    dtype_choice("dtype", dtype, FLOAT_DTYPES)
    omega = sinusoidal_frequencies(dim, base).to(positions.device)
    angles = positions.to(torch.float64)[..., None] * omega
    if not torch.isfinite(angles).all():
        raise ValueError("positions must be finite")
    encoding = torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1)  # [..., dim/2, 2]
    return encoding.flatten(-2).to(dtype)


def _relative_distances(q_len: int, k_len: int) -> torch.Tensor:
    """key position - query position, ``[q_len, k_len]``, queries right-aligned to the keys."""
    q_len = integer("q_len", q_len, minimum=1)
    k_len = integer("k_len", k_len, minimum=1)
    if q_len > k_len:
        raise ValueError(f"q_len must be <= k_len (queries are the last q_len keys), got {q_len} > {k_len}")
    query_positions = torch.arange(k_len - q_len, k_len)
    return torch.arange(k_len)[None, :] - query_positions[:, None]


def shaw_relative_indices(q_len: int, k_len: int, max_relative_position: int) -> torch.Tensor:
    """Shaw et al. (2018) relative indices: ``clip(j - i, -k, k) + k``, int64 ``[q_len, k_len]``.

    Query i and key j use the learned vectors a_ij^K = w^K_{clip(j-i, k)} and a_ij^V = w^V_{clip(j-i, k)}
    (Shaw et al. 2018, section 3) with ``k = max_relative_position``; the 2k + 1 vectors are stored as rows
    0 .. 2k of a table, so the returned matrix indexes it directly (row k is offset 0).

    Args:
        q_len: the number of queries, the last q_len of the keys.
        k_len: the number of keys.
        max_relative_position: k, the largest distance with its own vector (>= 1).
    """
    k = integer("max_relative_position", max_relative_position, minimum=1)
    return _relative_distances(q_len, k_len).clamp(-k, k) + k


def deberta_relative_indices(q_len: int, k_len: int, span: int) -> torch.Tensor:
    """DeBERTa's (He et al. 2021, section 3.1) relative distance delta(i, j), int64 ``[q_len, k_len]``::

        delta(i, j) = 0            if i - j <= -k
                      2k - 1       if i - j >= k
                      i - j + k    otherwise,          k = span.

    Note the sign: delta grows with *query minus key*, the opposite of Shaw's and T5's ``j - i``.
    The content-to-position term reads row delta(i, j) of the position table; the
    position-to-content term reads row delta(j, i), which for q_len == k_len is the transpose.

    Args:
        q_len: the number of queries, the last q_len of the keys.
        k_len: the number of keys.
        span: k, the largest distance told apart (>= 1).
    """
    k = integer("span", span, minimum=1)
    return (-_relative_distances(q_len, k_len) + k).clamp(0, 2 * k - 1)


def _t5_log_thresholds(max_exact: int, log_buckets: int, max_distance: int) -> list[int]:
    """Smallest distance n of each log bucket j = 1 .. log_buckets - 1, exactly.

    n falls in bucket max_exact + j or later iff log(n / e) / log(D / e) * c >= j, i.e. (integers
    only) n^c * e^j >= D^j * e^c, with e = max_exact, c = log_buckets, D = max_distance.
    """
    e, c, big_d = max_exact, log_buckets, max_distance

    def reached(n: int, j: int) -> bool:
        return n**c * e**j >= big_d**j * e**c

    thresholds = []
    for j in range(1, c):
        n = max(e, math.floor(e * (big_d / e) ** (j / c)))  # float estimate, corrected below
        while n > e and reached(n - 1, j):
            n -= 1
        while not reached(n, j):
            n += 1
        thresholds.append(n)
    return thresholds


def t5_relative_bucket(
    relative_position: torch.Tensor, *, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket of each relative position ``key - query`` (Raffel et al. 2020, section 2.1).

    Bidirectional: half the buckets for keys at or before the query, half (offset by
    num_buckets // 2) for keys after it. Causal: keys after the query share bucket 0 with distance 0
    (attention masks them anyway). Within each half of B buckets, with distance n >= 0 and
    e = B // 2::

        bucket = n                                                   if n < e
        bucket = min(B - 1, e + floor(log(n / e) / log(D / e) * (B - e)))  otherwise

    with D = max_distance, so small distances get a bucket each and larger ones share logarithmically wider buckets; the
    last bucket collects every distance from a point below max_distance on (91 for T5's settings).
    The floor is evaluated exactly (by integer comparison), so a distance at which the log
    expression is exactly an integer lands in the upper bucket. transformers and Mesh TensorFlow
    evaluate the expression in float32, which can land a distance one bucket below or above
    where the expression is an integer or within float32 rounding of one. Examples, found by
    comparing this function with transformers' ``T5Attention._relative_position_bucket`` over
    every num_buckets <= 160 and max_distance <= 1200 (and checked by the tests):

    * ``relative_position=-18, bidirectional=False, num_buckets=17, max_distance=27``: exact 14,
      transformers 13 (the expression is 6 exactly; float32 gives 5.9999995);
    * ``relative_position=-206, bidirectional=False, num_buckets=15, max_distance=636``: exact 12,
      transformers 13 (the expression is 5.99999948; float32 gives 6);
    * ``relative_position=18, bidirectional=True, num_buckets=34, max_distance=27``: exact 31,
      transformers 30 (the first example, in the half of keys after the query).

    An exact tie can also come out right in float32:
    ``relative_position=-60, bidirectional=False, num_buckets=72, max_distance=100``: exact 54,
    transformers 54 ((60/36)^2 = 100/36). The formula in float64 errs too, elsewhere:
    ``relative_position=8, bidirectional=True, num_buckets=18, max_distance=128``: exact 14,
    float64 13 (transformers' float32 gives 14 there). For T5's settings (32 buckets,
    max_distance 128, either direction) the exact rule and transformers agree at every distance.

    Args:
        relative_position: integer ``key - query`` positions, any shape.
        bidirectional: buckets for keys on both sides of the query (encoder), else causal.
        num_buckets: B, the number of buckets (>= 4 bidirectional, >= 2 causal).
        max_distance: D, the distance the logarithmic buckets span (the last one collects the rest).

    Returns:
        An int64 tensor of the shape of ``relative_position``, values in [0, num_buckets).
    """
    integer_tensor("relative_position", relative_position)
    flag("bidirectional", bidirectional)
    num_buckets = integer("num_buckets", num_buckets, minimum=4 if bidirectional else 2)
    half = num_buckets // 2 if bidirectional else num_buckets
    max_exact = half // 2
    max_distance = integer("max_distance", max_distance, minimum=max_exact + 1, maximum=2**62)

    relative_position = relative_position.to(torch.int64)
    if bidirectional:
        offset = (relative_position > 0).to(torch.int64) * half
        distance = relative_position.abs()
    else:
        offset = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)
    thresholds = _t5_log_thresholds(max_exact, half - max_exact, max_distance)
    log_bucket = max_exact + torch.bucketize(
        distance, torch.tensor(thresholds, dtype=torch.int64, device=distance.device), right=True
    )
    return offset + torch.where(distance < max_exact, distance, log_bucket)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2022, section 3), float64 ``[num_heads]``.

    For n a power of two, head h = 1 .. n gets slope 2^(-8h/n): a geometric sequence from 2^(-8/n)
    down to 2^(-8). Otherwise, with n the largest power of two not above num_heads, the first n heads
    get those slopes and the remaining num_heads - n heads get the odd-numbered slopes
    2^(-8h/(2n)), h = 1, 3, 5, .., of the 2n recipe, which lie between the first ones (the order
    of the paper's reference code, which appends them).

    Args:
        num_heads: the number of attention heads, >= 1.
    """
    num_heads = integer("num_heads", num_heads, minimum=1)
    n = 2 ** (num_heads.bit_length() - 1)
    exponents = list(range(1, n + 1)) + [h / 2 for h in range(1, 2 * (num_heads - n), 2)]
    return torch.tensor([2.0 ** (-8.0 * h / n) for h in exponents], dtype=torch.float64)


def alibi_bias(q_positions: torch.Tensor, k_positions: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """ALiBi's additive attention bias, ``[heads, q, k]`` in the dtype of ``slopes``::

        bias[h, i, j] = -slopes[h] * |k_positions[j] - q_positions[i]|

    In causal attention (keys at or before the query) this is the paper's -m * (i - j); keys after
    the query, which a causal mask removes, get the mirror image. Computed in float64 and rounded once.

    Args:
        q_positions: the queries' integer positions ``[q]``.
        k_positions: the keys' integer positions ``[k]``.
        slopes: the head slopes ``[heads]``, floating (:func:`alibi_slopes`).
    """
    integer_tensor("q_positions", q_positions, dim=1)
    integer_tensor("k_positions", k_positions, dim=1)
    float_tensor("slopes", slopes, dim=1)
    same_device("slopes", slopes, q_positions=q_positions, k_positions=k_positions)
    distance = (k_positions.to(torch.float64)[None, :] - q_positions.to(torch.float64)[:, None]).abs()
    return (-slopes.to(torch.float64)[:, None, None] * distance).to(slopes.dtype)
