"""Rotation frequencies theta_i for every RoPE scaling type, as ``(inv_freq, attention_factor)``.

RoPE rotates pair i of a d-dimensional head by the angle m * theta_i at position m, with
theta_i = b^(-2i/d), i = 0 .. d/2 - 1 (RoFormer, Su et al. 2021, eq. 15). Each context-extension
method changes the theta_i (and sometimes scales cos/sin by an attention factor). One registry,
:data:`FREQUENCY_FUNCTIONS`, maps a ``rope_type`` to a pure function of a :class:`RopeConfig`,
the rotary width d and the current sequence length. The formulas follow transformers'
``modeling_rope_utils.py`` (v5) so that the numbers agree with it; the arithmetic is done in
float64 and rounded once to float32.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Callable, Mapping

import torch

from .config import RopeConfig, parse_config

Frequencies = tuple[torch.Tensor, float]


def _exponents(dim: int) -> torch.Tensor:
    """2i/d for i = 0 .. d/2 - 1, float64."""
    return torch.arange(0, dim, 2, dtype=torch.float64) / dim


def default_theta(base: float, dim: int) -> torch.Tensor:
    """theta_i = base^(-2i/d), float64."""
    return base ** -_exponents(dim)


def _default(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """theta_i = b^(-2i/d) (RoFormer eq. 15)."""
    return default_theta(cfg.rope_theta, dim), 1.0


def _linear(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Position interpolation (Chen et al. 2023): positions divided by s, i.e. theta_i / s."""
    return default_theta(cfg.rope_theta, dim) / cfg.require("factor"), 1.0


def _ntk(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """NTK-aware scaling (bloc97, 2023): base b' = b * s^(d/(d-2)).

    The exponent makes the lowest frequency theta_{d/2-1} = b'^(-(d-2)/d) = theta_{d/2-1}/s
    (interpolated by s) while theta_0 = 1 is unchanged (extrapolated).
    """
    s = cfg.require("factor")
    return default_theta(cfg.rope_theta * s ** (dim / (dim - 2)), dim), 1.0


def _dynamic(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Dynamic NTK (emozilla, 2023): the NTK base change with the factor grown with the length,
    b' = b * (s * l / L - (s - 1))^(d/(d-2)), l = max(seq_len, L), L = max_position_embeddings.
    At l <= L nothing changes; transformers uses max_position_embeddings here, not the original length.
    """
    s = cfg.require("factor")
    length = cfg.require("max_position_embeddings")
    current = length if seq_len is None else max(seq_len, length)
    base = cfg.rope_theta * (s * current / length - (s - 1)) ** (dim / (dim - 2))
    return default_theta(base, dim), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature (Peng et al. 2023, eq. 22 with mscale = 1): the factor on cos
    and sin, sqrt(1/t) = 0.1 * mscale * ln(s) + 1 for s > 1, else 1 (transformers' ``get_mscale``,
    DeepSeek's ``yarn_get_mscale``)."""
    for name, value in (("scale", scale), ("mscale", mscale)):
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise TypeError(f"{name} must be a finite real number, got {value!r}")
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(
    dim: int, base: float, original_length: int, beta_fast: float, beta_slow: float, truncate: bool
) -> tuple[float, float]:
    """(low, high) = (i(beta_fast), i(beta_slow)) with i(r) = d ln(L / (2 pi r)) / (2 ln b), the
    (fractional) pair index that turns r times over L positions; floored/ceiled if ``truncate``
    and clamped to [0, d - 1] as transformers' ``find_correction_range`` does (the upper clamp is
    d - 1 although pair indices end at d/2 - 1). Arguments as validated by :mod:`rope.config`;
    :func:`rope.scaling_analysis.yarn_correction_range` checks them for direct use."""

    def pair_index(rotations: float) -> float:
        return dim * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_kept_weights(
    dim: int, base: float, original_length: int, beta_fast: float, beta_slow: float, truncate: bool
) -> torch.Tensor:
    """gamma_i = 1 - clamp((i - low) / (high - low), 0, 1), float64, the weight YaRN's code puts on
    the unscaled theta_i (1 - gamma_i on theta_i / s): linear in the pair index i between the
    bounds of :func:`yarn_correction_range` (high = low + 0.001 if they coincide, transformers'
    guard against a zero-width ramp)."""
    low, high = yarn_correction_range(dim, base, original_length, beta_fast, beta_slow, truncate)
    if low == high:
        high += 0.001
    index = torch.arange(dim // 2, dtype=torch.float64)
    return 1 - ((index - low) / (high - low)).clamp(0, 1)


def _yarn(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """YaRN (Peng et al. 2023): NTK-by-parts frequencies plus an attention temperature.

    Pair i rotates r_i = L * theta_i / (2 pi) times over the original context L. Its index as a
    function of r is i(r) = d * ln(L / (2 pi r)) / (2 ln b); pairs below i(beta_fast) keep theta_i,
    pairs above i(beta_slow) are interpolated to theta_i / s, and a linear ramp in the pair index
    blends between (transformers' form; ``truncate`` floors/ceils the two bounds).
    """
    s = cfg.extension_factor()
    length = cfg.original_length()
    base = cfg.rope_theta
    if cfg.attention_factor is not None:
        attention = cfg.attention_factor
    elif cfg.mscale and cfg.mscale_all_dim:  # truthiness, as transformers: 0 counts as absent
        attention = yarn_mscale(s, cfg.mscale) / yarn_mscale(s, cfg.mscale_all_dim)
    else:
        attention = yarn_mscale(s)
    kept = yarn_kept_weights(dim, base, length, cfg.beta_fast or 32.0, cfg.beta_slow or 1.0, cfg.truncate)
    theta = default_theta(base, dim)
    return kept * theta + (1 - kept) * theta / s, float(attention)


def _longrope(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """LongRoPE (Ding et al. 2024): theta_i / lambda_i with searched per-pair factors lambda_i,
    ``long_factor`` beyond the original length L and ``short_factor`` within it; attention factor
    sqrt(1 + ln s / ln L) unless given."""
    length = cfg.original_length()
    s = cfg.extension_factor()
    factors = cfg.require("long_factor" if seq_len is not None and seq_len > length else "short_factor")
    if len(factors) != dim // 2:
        raise ValueError(
            f"longrope short_factor/long_factor must have rotary_dim/2 = {dim // 2} entries, got {len(factors)}"
        )
    if cfg.attention_factor is not None:
        attention = cfg.attention_factor
    else:
        attention = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(length))
    return default_theta(cfg.rope_theta, dim) / torch.tensor(factors, dtype=torch.float64), float(attention)


def _llama3(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Llama 3.1 scaling: with wavelength w_i = 2 pi / theta_i and original length L,
    pairs with w_i > L / low_freq_factor are interpolated (theta_i / s), pairs with
    w_i < L / high_freq_factor are kept, and between them
    theta_i' = (1 - a) theta_i / s + a theta_i with a = (L / w_i - low) / (high - low)."""
    s = cfg.require("factor")
    low, high = cfg.require("low_freq_factor"), cfg.require("high_freq_factor")
    if not high > low > 0:
        raise ValueError(f"llama3 needs high_freq_factor > low_freq_factor > 0, got {high} and {low}")
    length = cfg.original_length()
    theta = default_theta(cfg.rope_theta, dim)
    wavelength = 2 * math.pi / theta
    smooth = ((length / wavelength - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * theta / s + smooth * theta, 1.0


def _proportional(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Proportional RoPE (Gemma 4, LFM3): over the whole head (dim = head_dim), the first
    r = int(partial_rotary_factor * dim // 2) pairs keep the frequencies of a full head,
    theta_i = b^(-2i/dim), and the other pairs get 0 (they do not rotate); all divided by
    ``factor`` (default 1). Unlike partial rotary, the exponent counts the whole head, so the
    rotated pairs are exactly the fastest ones of ordinary RoPE on that head."""
    rotated = int(cfg.partial_rotary_factor * dim // 2)
    theta = default_theta(cfg.rope_theta, dim)
    theta[rotated:] = 0.0
    return theta / (cfg.factor or 1.0), 1.0


FREQUENCY_FUNCTIONS: dict[str, Callable[[RopeConfig, int, int | None], Frequencies]] = {
    "default": _default,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
    "proportional": _proportional,
}


def inv_freq(
    config: Mapping[str, Any] | RopeConfig, head_dim: int, *, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """The rotation frequencies of a RoPE configuration.

    Args:
        config: a Hugging Face style ``rope_parameters`` mapping (see :mod:`rope.config`) or a
            :class:`RopeConfig`.
        head_dim: the attention head dimension; the rotary width is
            ``int(head_dim * partial_rotary_factor)``.
        seq_len: the current sequence length, read by ``dynamic`` and ``longrope``.

    Returns:
        ``(inv_freq, attention_factor)``: a float32 tensor of rotary_dim/2 frequencies theta_i and
        the factor by which cos and sin are multiplied.
    """
    cfg = parse_config(config)
    dim = cfg.rotary_dim(head_dim)
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0):
        raise ValueError(f"seq_len must be a positive int or None, got {seq_len!r}")
    theta, attention = FREQUENCY_FUNCTIONS[cfg.rope_type](cfg, dim, seq_len)
    return theta.to(torch.float32), attention
