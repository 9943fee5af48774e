"""XPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv:2212.10554): RoPE whose
rotation of q grows, and of k shrinks, by a per-pair exponential in the position.

Definition. For pair i of the d = rotary_dim rotated coordinates (i = 0 .. d/2 - 1)::

    zeta_i = (2i/d + gamma) / (1 + gamma),   gamma = 2/5,
    so zeta_i = (10 i + 2 d) / (7 d),

which lies in [2/7, 1). With B the ``scale_base`` (512 in every source) and c the ``center``, the
query at position m and the key at position n become::

    q'_i = zeta_i^((m - c)/B)  R(m theta_i) q_i,
    k'_i = zeta_i^(-(n - c)/B)  R(n theta_i) k_i,

so that q'_m . k'_n = sum_i zeta_i^((m - n)/B) q_i . R((n - m) theta_i) k_i: the scores depend on
m - n only, decay with the distance for m > n (zeta_i < 1), and do not depend on c.

Sources, all with gamma = 0.4 and B = 512 by default, each centring the positions (their scale
tables ``(arange(0, d, 2) + 0.4 d) / (1.4 d)`` raised to ``(t - c) / scale_base``):

* flash-attention, ``flash_attn/layers/rotary.py``, ``RotaryEmbedding(scale_base=...)``:
  c = L // 2 over the positions 0 .. L-1 of its cached table (L = seqlen + seqlen_offset, or
  ``max_seqlen``); pairs of the half layout by default;
* lucidrains' rotary-embedding-torch, ``RotaryEmbedding(use_xpos=True, xpos_scale_base=512)``,
  ``rotate_queries_and_keys``: c = L // 2 over 0 .. L-1, interleaved pairs. (Its
  ``rotate_queries_with_cached_keys`` centres q at q_len // 2 and k at k_len // 2, so its scores
  carry a further factor zeta_i^((k_len // 2 - q_len // 2)/B); one centre, as here, has none.)
* torchscale (``torchscale/component/xpos_relative_position.py``, the authors' code): c =
  ceil(L/2) = (L + 1) // 2, L = length + offset, interleaved pairs.

``center=0`` (the default) is the formula above without centring; ``center=L // 2`` gives
flash-attention's and lucidrains' numbers, ``center=(L + 1) // 2`` torchscale's. The choice moves
only the range of q' and k' (and the positions this module accepts, below), never the scores.
flash-attention and lucidrains compute zeta_i and the power in float32, so their factors differ
from the exact ones by up to about ``|x|`` 2^-24 relative (tests/test_xpos.py evaluates their
formulas in float64).

Range. zeta_i^(+-x), x = (m - c)/B, lies in float64's normal range [2^-1022, 2^1022] for every pair
exactly when ``|x|`` log2(7/2) <= 1022 (pair 0 has the smallest zeta, 2/7): ``|m - c|`` <=
:data:`MAX_EXPONENT` B, about 565.47 B (289,519 positions at B = 512). Positions beyond are refused
by name: q's factor of pair 0 would underflow and k's overflow. ``scale_base`` is at most 2^43, so
that m - c is an integer below 2^53, exact in float64.

Accuracy. The angles are reduced exactly (:func:`rope.apply.exact_cos_sin`, within 2^-52). The
factor is ``pow(zeta_i, x)`` in float64, with zeta_i = (10 i + 2 d) / (7 d) rounded once
(relative error 2^-53), x = (m - c)/B rounded once (exact where B is a power of two) and pow
within an ulp or two: its relative error is at most (``|x|`` + ``|x ln zeta_i|``) 2^-53 + 2^-51,
below 2^-42.5 over the accepted range (tests/test_xpos.py checks it against mpmath). The factor
is folded into the cos and sin tables (one more rounding) and q and k are rotated once each by
:func:`rope.rotation.rotate_tensors`: float64 products, each output rounded once. Every output is
within half an ulp of its dtype of the exact q'_i (k'_i) plus 2^-41 zeta_i^(+-x) ``|(x_a, x_b)|``:
for float32, float16 and bfloat16 that is below half an ulp's 2^-24 by far. An output beyond its
dtype's range is +-inf, never NaN (the overflow guard of :mod:`rope.rotation` is on for float64
inputs and for factors above 2^512).

Gradients. The backward of q' = zeta^x R q is dq = zeta^x R^T dq': the same tables with the sines
negated, rounded once in the same way (:func:`rope.rotation.rotate_tensors`), in every dtype.
"""

from __future__ import annotations

import math

import torch

from . import _checks
from .apply import check_inputs, exact_cos_sin, has_float64
from .layouts import LAYOUTS
from .rotation import rotate_tensors

MAX_EXPONENT = 1022 / math.log2(3.5)
"""The largest ``|m - c|`` / B accepted: zeta_0^(+-x) = (2/7)^(+-x) stays within [2^-1022, 2^1022]."""

MAX_SCALE_BASE = 2.0**43
"""The largest ``scale_base``: below it every accepted ``|m - c|`` (<= 565.47 B) is below 2^53."""

_SAFE_FACTOR = 2.0**512  # above it, float64 products of float32-range inputs could overflow


def xpos_zeta(pairs: int) -> torch.Tensor:
    """zeta_i = (2i/d + 2/5) / (7/5) = (10 i + 2 d) / (7 d), d = 2 ``pairs``: float64 ``[pairs]``,
    each the exact rational rounded once (numerator and denominator are exact integers).

    Args:
        pairs: the number of rotated pairs, rotary_dim / 2.
    """
    pairs = _checks.integer("pairs", pairs, minimum=1)
    d = 2 * pairs
    return (10 * torch.arange(pairs, dtype=torch.float64) + 2 * d) / (7 * d)


def _options(scale_base, center) -> tuple[float, int, int]:
    """scale_base, center and the largest accepted ``|m - center|``."""
    scale_base = _checks.number("scale_base", scale_base, positive=True, maximum=MAX_SCALE_BASE)
    center = _checks.integer("center", center, minimum=-(2**63), maximum=2**63 - 1)
    return scale_base, center, math.floor(MAX_EXPONENT * scale_base)


def _exponents(positions: torch.Tensor, scale_base: float, center: int, reach: int) -> torch.Tensor:
    """x = (m - c)/B in float64, shape ``positions.shape``, after refusing positions with
    ``|m - c|`` > ``reach`` (eagerly off CUDA, a device assertion on CUDA)."""
    low, high = max(center - reach, -(2**63)), min(center + reach, 2**63 - 1)  # no int64 overflow
    _checks.assert_values("positions", ((positions >= low) & (positions <= high)).all(),
                          f"integers m with |m - center| <= {reach} (= floor({MAX_EXPONENT:.4f} scale_base), "
                          f"center {center}: beyond, (2/7)^(+-(m - center)/scale_base) leaves float64's range)")
    return (positions.to(torch.int64) - center).to(torch.float64) / scale_base


def xpos_scales(positions: torch.Tensor, pairs: int, *, scale_base: float = 512.0,
                center: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors of q and k: zeta_i^((m - c)/B) and zeta_i^(-(m - c)/B), float64, of shape
    ``positions.shape + (pairs,)``, each one ``pow`` (module docstring, "Accuracy").

    Args:
        positions: integer positions m, any shape.
        pairs: the number of rotated pairs, rotary_dim / 2.
        scale_base: B, positive, at most 2^43.
        center: c, an int64 integer; ``|m - c|`` must be at most :data:`MAX_EXPONENT` B.
    """
    positions = _checks.integer_tensor("positions", positions)
    if not has_float64(positions.device):
        raise ValueError(f"XPos computes its factors in float64, which positions' device {positions.device} lacks")
    scale_base, center, reach = _options(scale_base, center)
    x = _exponents(positions, scale_base, center, reach)[..., None]
    zeta = xpos_zeta(pairs).to(positions.device)
    return torch.pow(zeta, x), torch.pow(zeta, -x)


def apply_xpos(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    scale_base: float = 512.0,
    center: int = 0,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by XPos: pair i of q at position m by zeta_i^((m - c)/B) R(m theta_i), of k
    by zeta_i^(-(m - c)/B) R(m theta_i) (module docstring), zeta_i = (10 i + 2 d)/(7 d), d = rotary_dim.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``, float16, bfloat16, float32 or float64.
        k: ``[batch, seq, heads_k, head_dim]``, of q's dtype.
        positions: integer positions, ``[seq]`` or ``[batch, seq]``, with ``|m - center|`` at most
            :data:`MAX_EXPONENT` ``scale_base`` (289,519 at 512).
        inv_freq: the rotary_dim/2 frequencies theta_i, float32 or float64, as in
            :func:`rope.apply_rotary`.
        scale_base: B, positive, at most 2^43; 512 in flash-attention, lucidrains and torchscale.
        center: c, an integer; 0 is the formula without centring, ``L // 2`` reproduces
            flash-attention and lucidrains over positions 0 .. L-1, ``(L + 1) // 2`` torchscale.
            The scores q'_m . k'_n do not depend on it.
        layout: ``"half"`` (flash-attention's default) or ``"interleaved"`` (lucidrains, torchscale).
        rotary_dim: the rotated width d (default ``2 * len(inv_freq)``); the rest passes through.

    Returns:
        ``(q_out, k_out)`` in q's dtype, each value rounded once, within half an ulp plus
        2^-41 zeta_i^(+-x) ``|(x_a, x_b)|`` of the exact value (module docstring); differentiable in
        q and k.

    Raises:
        TypeError, ValueError: for any bad argument, naming it (README, "Errors").
    """
    _checks.choice("layout", layout, LAYOUTS)
    rotary_dim = check_inputs(q, k, positions, inv_freq, rotary_dim)
    rows = positions.reshape(*positions.shape[:-1] or (1,), positions.shape[-1], 1)  # [batch or 1, seq, 1]
    up, down = xpos_scales(rows, rotary_dim // 2, scale_base=scale_base, center=center)
    cos, sin = exact_cos_sin(rows, inv_freq)  # [batch or 1, seq, 1, pairs], float64
    big = up.numel() > 0 and _checks.reads_are_free(q.device) and bool(torch.maximum(up.amax(), down.amax())
                                                                       > _SAFE_FACTOR)
    safe = q.dtype == torch.float64 or not _checks.reads_are_free(q.device) or big  # the overflow guard
    (q_out,) = rotate_tensors((q,), cos * up, sin * up, layout, rotary_dim, safe=safe)
    (k_out,) = rotate_tensors((k,), cos * down, sin * down, layout, rotary_dim, safe=safe)
    return q_out, k_out
