"""ReRoPE and Leaky ReRoPE (Su, 2023): RoPE with the relative position bent beyond a window w.

With RoPE the logit of query m and key n is ``(R_m q)^T (R_n k) = q^T R_{n-m} k``: it depends on
r = m - n only. ReRoPE replaces r by a bent position r' (Su, "Transformer upgrade path 12:
ReRoPE", kexue.fm/archives/9708, and github.com/bojone/rerope)::

    ReRoPE        r' = min(r, w)
    Leaky ReRoPE  r' = r                   for r < w
                  r' = w + (r - w) / k     for r >= w,       k = leaky_scale,

so the logit becomes ``q^T R_{-r'} k`` (equivalently ``(R_{r'} q)^T k``). k > 1 compresses the
distances beyond the window (the inference-time use; k -> infinity is ReRoPE); 0 < k < 1
stretches them (training with Leaky ReRoPE and inferring with plain RoPE, Su's "reverse" use);
k = 1 is plain RoPE.

Causal attention only: for a key after its query (r < 0) every function here keeps r' = r, i.e.
the plain RoPE logit. Those entries carry no ReRoPE meaning; the causal mask removes them. (Su's
reference code selects the first pass with ``|r| < w``, which gives r' = w for r <= -w; the
choice is invisible once the mask is applied.)

Two forms of the same logits:

* :func:`rerope_scores`, the *training-time* form: ``q^T R_{-r'} k`` evaluated for each pair
  with its own (possibly fractional) r', in float64;
* :func:`rerope_scores_two_pass`, the *inference-time* form built from two ordinary RoPE logit
  matrices (each a plain ``Q K^T`` of rotated vectors, so any attention kernel computes it),
  combined by the window mask: pass 1 is plain RoPE (r' = r, used where r < w); pass 2 rotates
  every query as if it sat at position w and leaves keys unrotated (r' = w, ReRoPE). For Leaky
  ReRoPE pass 2 uses the interpolated frequencies theta_i / k with queries at m + w (k - 1) and
  keys at n, whose angle difference is ``(m + w(k-1) - n) theta_i / k = (w + (r - w)/k) theta_i``.

Positions are any int64 values, used as given: the window test r < w is exact for every pair
(:func:`below_window`; m - n itself would wrap around at 2^63), and both passes turn by exactly
reduced angles (:func:`bent_frame`), so that the two-pass logits depend on m - n only: shifting
every position by a constant leaves them unchanged to float64 rounding.

Both return unscaled logits ``[batch, heads_q, q_len, k_len]``; apply the 1/sqrt(d), the mask
and the softmax yourself. GQA/MQA: query head h reads key head ``h // (heads_q // heads_k)``.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..angles import cos_sin_of_sum
from ..apply import exact_cos_sin
from ..layouts import check_layout, pair_indices
from ..rotation import rotate_pairs


def check_window(window, leaky_scale) -> tuple[int, float | None]:
    """The ReRoPE window w (an integer >= 1) and Leaky ReRoPE's scale k (a number > 0, or None for
    ReRoPE), checked.

    Args:
        window: the window w.
        leaky_scale: Leaky ReRoPE's k, or ``None`` for ReRoPE.

    Returns:
        ``(window, leaky_scale)``, as an int and a float (or ``None``).
    """
    # an int64 at most, as the positions: below_window compares m - n with it exactly
    window = _checks.integer("window", window, minimum=1, maximum=_checks.INT64_MAX)
    if leaky_scale is not None:
        leaky_scale = _checks.number("leaky_scale", leaky_scale, positive=True)
    return window, leaky_scale


def check_qk(q, k, q_positions, k_positions, inv_freq, *, values: bool = True) -> int:
    """Validate query/key tensors (``[batch, seq, heads, head_dim]``, seq may differ), their 1-D
    integer positions and the frequencies; return the number of query heads per key head.
    ``values=False`` checks metadata only (dtypes, shapes, devices) and reads no tensor value, as
    a fake implementation or a traced graph needs.

    Args:
        q: queries ``[batch, q_len, heads_q, head_dim]``.
        k: keys ``[batch, k_len, heads_k, head_dim]``, heads_q a multiple of heads_k.
        q_positions: the queries' integer positions ``[q_len]``.
        k_positions: the keys' integer positions ``[k_len]``.
        inv_freq: the rotary_dim/2 frequencies theta_i, float32 or float64.
        values: also check the values of the frequencies (finite), not only the metadata.
    """
    _checks.head_tensors(q=q, k=k)
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch and head_dim")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"heads_q = {q.shape[2]} must be a multiple of heads_k = {k.shape[2]} (GQA)")
    _checks.integer_tensor("q_positions", q_positions, dim=1, length=q.shape[1])
    _checks.integer_tensor("k_positions", k_positions, dim=1, length=k.shape[1])
    _checks.finite_frequencies("inv_freq", inv_freq, dtypes=_checks.FREQUENCY_DTYPES, values=values)
    _checks.same_device("q", q, k=k, q_positions=q_positions, k_positions=k_positions, inv_freq=inv_freq)
    if inv_freq.numel() == 0:
        raise ValueError("inv_freq must hold at least one frequency")
    if 2 * inv_freq.numel() > q.shape[3]:
        raise ValueError(f"inv_freq has {inv_freq.numel()} frequencies: rotary_dim {2 * inv_freq.numel()} "
                         f"exceeds head_dim {q.shape[3]}")
    return q.shape[2] // k.shape[2]


def rotate_exactly(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, layout: str,
             conjugate: bool = False) -> torch.Tensor:
    """R_p x for each token (R_p^T x with ``conjugate``), float64, by exactly reduced angles: integer
    ``positions [tokens]`` with ``inv_freq [pairs]`` turn by m theta_i (:func:`rope.apply.exact_cos_sin`);
    ``positions [tokens, terms]`` with ``inv_freq [pairs, terms]`` by sum_j m_j theta_ij
    (:func:`rope.angles.cos_sin_of_sum`), the form of Leaky ReRoPE's bent frame (:func:`bent_frame`).

    Args:
        x: ``[batch, tokens, heads, head_dim]``.
        positions: integer ``[tokens]``, or ``[tokens, terms]``.
        inv_freq: ``[pairs]``, or ``[pairs, terms]`` with positions ``[tokens, terms]``.
        layout: ``"half"`` or ``"interleaved"``.
        conjugate: rotate by R_p^T instead.

    Returns:
        The rotated x, float64.
    """
    if positions.dim() == 2:
        cos, sin = cos_sin_of_sum(positions.to(x.device), inv_freq.to(x.device))
    else:
        cos, sin = exact_cos_sin(positions.to(x.device), inv_freq.to(x.device))
    sin = -sin if conjugate else sin
    rotary_dim = 2 * inv_freq.shape[0]
    return rotate_pairs(x.to(torch.float64), cos[None, :, None, :], sin[None, :, None, :], layout, rotary_dim)


def head_logits(q_rot: torch.Tensor, k_rot: torch.Tensor) -> torch.Tensor:
    """``q_rot . k_rot`` per head pair, ``[batch, heads_q, q_len, k_len]``, key heads shared (GQA).

    Args:
        q_rot: rotated queries ``[batch, q_len, heads_q, head_dim]``.
        k_rot: rotated keys ``[batch, k_len, heads_k, head_dim]``.
    """
    k_rot = k_rot.repeat_interleave(q_rot.shape[2] // k_rot.shape[2], dim=2)
    return torch.einsum("bihd,bjhd->bhij", q_rot, k_rot)


def rotary_scores(q, k, q_positions, k_positions, inv_freq, *, layout: str = "half") -> torch.Tensor:
    """Plain RoPE logits ``(R_m q)^T (R_n k) = q^T R_{n-m} k`` in float64, ``[batch, heads_q, q_len, k_len]``.

    The building block of the two-pass form and of :mod:`rope.attention.kv_cache`. q and k are
    ``[batch, seq, heads, head_dim]`` with their own lengths and 1-D integer positions.

    Args:
        q: queries ``[batch, q_len, heads_q, head_dim]``.
        k: keys ``[batch, k_len, heads_k, head_dim]``, heads_q a multiple of heads_k.
        q_positions: the queries' integer positions ``[q_len]``.
        k_positions: the keys' integer positions ``[k_len]``.
        inv_freq: the rotary_dim/2 frequencies theta_i, float32 or float64.
        layout: ``"half"`` or ``"interleaved"``.
    """
    check_qk(q, k, q_positions, k_positions, inv_freq)
    check_layout(layout)
    q_rot, k_rot = rotate_exactly(q, q_positions, inv_freq, layout), rotate_exactly(k, k_positions, inv_freq, layout)
    return head_logits(q_rot, k_rot)


def rerope_positions(q_positions, k_positions, *, window: int, leaky_scale: float | None = None) -> torch.Tensor:
    """The relative position r' used for each (query, key) pair, float64 ``[q_len, k_len]``.

    With r = q_positions[i] - k_positions[j]: ReRoPE ``r' = min(r, w)``; Leaky ReRoPE
    (``leaky_scale`` = k) ``r' = r`` for r < w and ``w + (r - w) / k`` beyond. Entries with r < 0
    (keys after the query, removed by the causal mask) keep r' = r.

    Args:
        q_positions: the queries' integer positions ``[q_len]``.
        k_positions: the keys' integer positions ``[k_len]``.
        window: the window w, an integer >= 1.
        leaky_scale: Leaky ReRoPE's k > 0, or ``None`` for ReRoPE.
    """
    _checks.integer_tensor("q_positions", q_positions, dim=1)
    _checks.integer_tensor("k_positions", k_positions, dim=1)
    window, leaky_scale = check_window(window, leaky_scale)
    r = _differences(q_positions, k_positions)
    beyond = window + (r - window) / leaky_scale if leaky_scale is not None else torch.full_like(r, float(window))
    return torch.where(below_window(q_positions, k_positions, window), r, beyond)


_LOW_BITS = (1 << 32) - 1


def _differences(m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """m_i - n_j rounded once to float64, ``[i, j]``, for any int64 positions: the difference of the
    high halves (m >> 32) and of the low halves (m & (2^32 - 1)) are exact in int64 and in float64
    (below 2^33), so their sum is the one rounding; int64 m - n wraps around at 2^63, and
    m.double() - n.double() rounds m and n first (off by up to 2^10 at 2^62)."""
    m, n = m.to(torch.int64)[:, None], n.to(torch.int64)[None, :]
    return ((m >> 32) - (n >> 32)).to(torch.float64) * 2.0**32 + ((m & _LOW_BITS) - (n & _LOW_BITS)).to(torch.float64)


def below_window(m: torch.Tensor, n: torch.Tensor, window: int) -> torch.Tensor:
    """``[i, j]`` bool: whether r = m_i - n_j < w (pass 1; else pass 2), exact for every pair of int64
    positions and every window 1 <= w <= 2^63 - 1. The int64 m - n wraps around when the difference
    reaches 2^63 (a query at 2^62 and a key at -2^62 would read as r < 0, inside the window), so
    compare m < n + w instead: n + w exceeds every int64 m exactly where n > 2^63 - 1 - w, and is
    formed only where it does not overflow.

    Args:
        m: the query positions ``[i]``, integer.
        n: the key positions ``[j]``, integer.
        window: the window w.
    """
    m, n = m.to(torch.int64)[:, None], n.to(torch.int64)[None, :]
    limit = _checks.INT64_MAX - window
    return (n > limit) | (m < n.clamp(max=limit) + window)


def rerope_scores(
    q, k, q_positions, k_positions, inv_freq, *, window: int, leaky_scale: float | None = None, layout: str = "half"
) -> torch.Tensor:
    """Training-time (Leaky) ReRoPE logits ``q_i^T R_{-r'_ij} k_j``, float64 ``[batch, heads_q, q_len, k_len]``.

    For pair p of the layout, with (a, b) its two coordinates, the rotation contributes
    ``(q_a k_a + q_b k_b) cos(r' theta_p) + (q_a k_b - q_b k_a) sin(r' theta_p)``; coordinates past
    the rotary width contribute ``q . k`` unrotated. r' is :func:`rerope_positions`, fractional
    for Leaky ReRoPE. Costs d/2 passes over the ``[batch, heads, q_len, k_len]`` logits.

    Args:
        q: queries ``[batch, q_len, heads_q, head_dim]``.
        k: keys ``[batch, k_len, heads_k, head_dim]``, heads_q a multiple of heads_k.
        q_positions: the queries' integer positions ``[q_len]``.
        k_positions: the keys' integer positions ``[k_len]``.
        inv_freq: the rotary_dim/2 frequencies theta_i, float32 or float64.
        window: the window w, an integer >= 1.
        leaky_scale: Leaky ReRoPE's k > 0, or ``None`` for ReRoPE.
        layout: ``"half"`` or ``"interleaved"``.
    """
    check_qk(q, k, q_positions, k_positions, inv_freq)
    check_layout(layout)
    r_prime = rerope_positions(q_positions, k_positions, window=window, leaky_scale=leaky_scale).to(q.device)
    rotary_dim = 2 * inv_freq.numel()
    q64 = q.to(torch.float64)
    k64 = k.to(torch.float64).repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q64[..., rotary_dim:], k64[..., rotary_dim:])
    angles = r_prime[..., None] * inv_freq.to(device=q.device, dtype=torch.float64)  # [q_len, k_len, d/2]
    a, b = pair_indices(rotary_dim, layout)
    for p, (ia, ib) in enumerate(zip(a.tolist(), b.tolist())):
        qa, qb, ka, kb = q64[..., ia], q64[..., ib], k64[..., ia], k64[..., ib]  # [batch, seq, heads]
        aligned = torch.einsum("bih,bjh->bhij", qa, ka) + torch.einsum("bih,bjh->bhij", qb, kb)
        crossed = torch.einsum("bih,bjh->bhij", qa, kb) - torch.einsum("bih,bjh->bhij", qb, ka)
        scores += aligned * torch.cos(angles[..., p]) + crossed * torch.sin(angles[..., p])
    return scores


def bent_frame(positions: torch.Tensor, inv_freq: torch.Tensor, window: int, leaky_scale: float | None,
               query: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, frequencies) of the second pass's rotation of query or key tokens, as :func:`rotate_exactly`
    takes them: ReRoPE queries at w and keys at 0 (int64 ``[tokens]``, frequencies theta_i); Leaky
    ReRoPE (k = leaky_scale) the frequencies theta_i / k, queries at m + w (k - 1) and keys at n,
    whose angle difference is (w + (r - w) / k) theta_i.

    Leaky ReRoPE's query position m + w (k - 1) is no integer, and a float64 product
    (m + w (k - 1)) theta_i / k loses ``|m theta_i / k|`` 2^-53 (0.25 rad at m = 2^60), which a shift
    of every position would change. So the frame is exact in this sense: with phi_i = theta_i / k
    rounded once to float64, the key angle is n phi_i and the query angle (m - w) phi_i + w theta_i
    (the same number as (m + w (k - 1)) phi_i when phi_i = theta_i / k), each a sum of integer
    multiples reduced modulo 2 pi exactly (:func:`rope.angles.cos_sin_of_sum`) for every int64 m, n
    and w: positions ``[tokens, terms]`` (m, w, w) and (n), frequencies ``[pairs, terms]``
    (phi, -phi, theta) and (phi); where some nonzero phi_i is below 2^-100 (or its values cannot be read
    for free, off the CPU), each phi_i as its three float32 pieces (:func:`float32_pieces`, three terms of
    one position; so is a float64 theta_i), the same turns, as no float64 frequency column holds such a
    phi_i. The logit's angle is then (r - w) phi_i + w theta_i, a function of
    r = m - n alone; the one rounding, of phi_i, moves it by at most ``|r - w|`` theta_i 2^-53 / k.
    phi_i must stay below 2^127 (``ValueError`` naming ``leaky_scale`` otherwise); a nonzero phi_i
    below 2^-100 is taken to within 2^-150 (its float32 pieces underflow): at most 2^-86 rad at any int64
    position, far below the resolution of the 126-bit turns themselves (:func:`rope.angles.turns_per_position`).

    Args:
        positions: the tokens' integer positions ``[tokens]``.
        inv_freq: the frequencies theta_i ``[pairs]``.
        window: the window w.
        leaky_scale: Leaky ReRoPE's k, or ``None`` for ReRoPE.
        query: the frame of the queries (else of the keys).
    """
    if leaky_scale is None:
        return torch.full_like(positions, window if query else 0, dtype=torch.int64), inv_freq
    phi = inv_freq.to(torch.float64) / leaky_scale
    _checks.assert_values("leaky_scale", (phi.abs() < 2.0**127).all(),
                          f"a value that keeps inv_freq / leaky_scale below 2^127 (got leaky_scale = {leaky_scale!r})")
    positions = positions.to(torch.int64)[:, None]
    if _checks.reads_are_free(phi.device) and not ((phi != 0) & (phi.abs() < 2.0**-100)).any():
        # a float64 column: the same turns as its three pieces (cos_sin_of_sum splits it so), in fewer terms
        if not query:
            return positions, phi[:, None]
        w = torch.full_like(positions, window)
        return torch.cat((positions, w, w), dim=-1), torch.stack((phi, -phi, inv_freq.to(torch.float64)), dim=-1)
    phi = float32_pieces(phi)  # [pairs, 3]: phi_i below 2^-100 too (a float64 column holds 0 or [2^-100, 2^127))
    if not query:
        return positions.expand(-1, 3), phi
    theta = float32_pieces(inv_freq) if inv_freq.dtype == torch.float64 else inv_freq[:, None]
    w = torch.full_like(positions, window)
    columns = (positions.expand(-1, 3), w.expand(-1, 3), w.expand(-1, theta.shape[1]))
    return torch.cat(columns, dim=-1), torch.cat((phi, -phi, theta), dim=-1)


def float32_pieces(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x [n]`` as three float32 numbers ``[n, 3]`` whose sum is x: exactly where ``|x|`` is 0 or at
    least 2^-100 (24 + 24 + 24 >= 53 bits, the last piece above float32's subnormal range), within 2^-150 below.
    :func:`rope.angles.cos_sin_of_sum` takes them as three terms of one position, whose turns add to those of x
    (its float64 frequencies are split the same way), so that x needs no float64 range.

    Args:
        x: float64 values below 2^127 in magnitude, ``[n]``.
    """
    first = x.to(torch.float32)
    rest = x - first.to(torch.float64)  # exact, as is the next remainder
    second = rest.to(torch.float32)
    return torch.stack((first, second, (rest - second.to(torch.float64)).to(torch.float32)), dim=-1)


def rerope_scores_two_pass(
    q, k, q_positions, k_positions, inv_freq, *, window: int, leaky_scale: float | None = None, layout: str = "half"
) -> torch.Tensor:
    """Inference-time (Leaky) ReRoPE logits from two plain RoPE passes, float64 ``[batch, heads_q, q_len, k_len]``.

    ``where(r < w, pass1, pass2)`` with pass 1 the plain RoPE logits at the true positions and
    pass 2 the logits at relative position w (ReRoPE: queries at w, keys at 0) or, for Leaky
    ReRoPE, under frequencies theta / k with queries at m + w (k - 1) and keys at n (Su's
    ``leaky_rerope_patch.py``). Equal to :func:`rerope_scores` up to float64 rounding of the
    angles.

    Args:
        q: queries ``[batch, q_len, heads_q, head_dim]``.
        k: keys ``[batch, k_len, heads_k, head_dim]``, heads_q a multiple of heads_k.
        q_positions: the queries' integer positions ``[q_len]``.
        k_positions: the keys' integer positions ``[k_len]``.
        inv_freq: the rotary_dim/2 frequencies theta_i, float32 or float64.
        window: the window w, an integer >= 1.
        leaky_scale: Leaky ReRoPE's k > 0, or ``None`` for ReRoPE.
        layout: ``"half"`` or ``"interleaved"``.
    """
    check_qk(q, k, q_positions, k_positions, inv_freq)
    check_layout(layout)
    window, leaky_scale = check_window(window, leaky_scale)
    m, n = q_positions.to(q.device), k_positions.to(q.device)
    pass1 = head_logits(rotate_exactly(q, m, inv_freq, layout), rotate_exactly(k, n, inv_freq, layout))
    q2 = rotate_exactly(q, *bent_frame(m, inv_freq, window, leaky_scale, query=True), layout)
    k2 = rotate_exactly(k, *bent_frame(n, inv_freq, window, leaky_scale, query=False), layout)
    pass2 = head_logits(q2, k2)
    return torch.where(below_window(m, n, window), pass1, pass2)
