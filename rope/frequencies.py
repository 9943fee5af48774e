"""Rotation frequencies theta_i for every RoPE scaling type, as ``(inv_freq, attention_factor)``.

RoPE rotates pair i of a d-dimensional head by the angle m * theta_i at position m, with
theta_i = b^(-2i/d), i = 0 .. d/2 - 1 (RoFormer, Su et al. 2021, eq. 15). Each context-extension
method changes the theta_i (and sometimes scales cos/sin by an attention factor). Each
``rope_type`` is registered (:mod:`rope.registry`) with a pure function of a :class:`RopeConfig`,
the rotary width d and the current sequence length, and with the config keys it reads; this
module registers the built-in types. The formulas follow transformers'
``modeling_rope_utils.py`` (v5) so that the numbers agree with it; the arithmetic is done in
float64 and rounded once to float32.

**Degenerate numbers are refused**, with a ``ValueError`` naming the config keys (and
``head_dim`` or ``seq_len``) that produce them, instead of a ZeroDivisionError, a math domain
error, an OverflowError or a silently wrong tensor:

* every frequency of a rotated pair must round to a finite float32 number > 0: a base or a
  factor so large that theta_i underflows to 0 in float32 is refused (the pair would stop
  rotating); the only zeros are those proportional RoPE means (its unrotated pairs);
* yarn's beta_fast and beta_slow must give a finite correction range: a beta so far from its
  default that L / (2 pi beta) overflows or underflows float64 is refused;
* the NTK base b s^(d/(d-2)) of ``ntk_aware`` and ``dynamic`` needs d >= 4 (d = 2 divides by 0)
  and must not overflow float64;
* the attention factor must be finite and > 0: yarn's mscale(s, m) = 0.1 m ln s + 1 must be > 0
  for ``mscale`` and ``mscale_all_dim`` (a zero denominator is refused), and longrope's
  sqrt(1 + ln s / ln L) needs L >= 2 when s > 1 (ln 1 = 0 divides);
* ``seq_len`` is an int in [1, 2^63] (any length of int64 positions).
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from . import _checks
from .config import MAX_LENGTH, YARN_BETA_FAST, YARN_BETA_SLOW, RopeConfig, RopeConfigWarning, parse_config
from .registry import Frequencies, register_rope_type, rope_type, rope_types

__all__ = ["TELECHAT3_SLOPE", "YARN_SLOPE", "default_theta", "inv_freq", "register_rope_type", "rope_types",
           "yarn_correction_range", "yarn_kept_weights", "yarn_mscale"]

_LOG_FLOAT64_MAX = math.log(sys.float_info.max)


def _exponents(dim: int) -> torch.Tensor:
    """2i/d for i = 0 .. d/2 - 1, float64."""
    return torch.arange(0, dim, 2, dtype=torch.float64) / dim


def default_theta(base: float, dim: int) -> torch.Tensor:
    """theta_i = base^(-2i/d), i = 0 .. d/2 - 1, float64. ``base`` is a finite number > 0 and
    ``dim`` an even int >= 2 (``TypeError`` / ``ValueError`` naming the argument otherwise).

    Args:
        base: the base b, a finite number > 0.
        dim: the rotary width d, an even int >= 2.

    Returns:
        The d/2 frequencies theta_i, float64.
    """
    base = _checks.number("base", base, positive=True)
    dim = _checks.integer("dim", dim, minimum=2, even=True)
    return base ** -_exponents(dim)


def _named(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key!r} = {value}" for key, value in values.items())


def _float32(theta: torch.Tensor, rope_type: str, **sources: Any) -> torch.Tensor:
    """``theta`` (float64) rounded once to float32, or a ValueError naming ``sources`` (the keys
    and arguments it was computed from) where an entry is not a finite float32 number > 0."""
    rounded = theta.to(torch.float32)
    bad = ~(torch.isfinite(rounded) & (rounded > 0))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"rope_type {rope_type!r}: theta_{i} = {theta[i].item():.6g} is {rounded[i].item()} in float32, not a "
            f"finite frequency > 0 (float32 numbers lie between 2^-149 and 2^128); it comes from {_named(sources)}"
        )
    return rounded


def _attention(value: float, rope_type: str, **sources: Any) -> float:
    """The attention factor, or a ValueError naming ``sources`` if it is not finite and > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"rope_type {rope_type!r}: the attention factor {value} is not finite and > 0; "
                         f"it comes from {_named(sources)}")
    return float(value)


def _default(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """theta_i = b^(-2i/d) (RoFormer eq. 15)."""
    theta = default_theta(cfg.rope_theta, dim)
    return _float32(theta, cfg.rope_type, rope_theta=cfg.rope_theta), 1.0


def _linear(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Position interpolation (Chen et al. 2023): positions divided by s, i.e. theta_i / s."""
    theta = default_theta(cfg.rope_theta, dim) / cfg.factor
    return _float32(theta, cfg.rope_type, rope_theta=cfg.rope_theta, factor=cfg.factor), 1.0


def _ntk_base(cfg: RopeConfig, dim: int, growth: float, **sources: Any) -> float:
    """b' = b * growth^(d/(d-2)), the NTK-aware base; d >= 4 and b' finite, or a ValueError."""
    if dim < 4:
        raise ValueError(f"rope_type {cfg.rope_type!r} needs a rotary dimension d >= 4 (its base b s^(d/(d-2)) "
                         f"divides by d - 2), got d = {dim}: raise head_dim or partial_rotary_factor")
    exponent = dim / (dim - 2)
    if not math.log(cfg.rope_theta) + exponent * math.log(growth) < _LOG_FLOAT64_MAX:
        raise ValueError(f"rope_type {cfg.rope_type!r}: the base b s^(d/(d-2)) = {cfg.rope_theta} * "
                         f"{growth}^{exponent:.6g} overflows float64; it comes from {_named(sources)}")
    return cfg.rope_theta * growth**exponent


def _ntk_aware(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """NTK-aware scaling (bloc97, 2023): base b' = b * s^(d/(d-2)).

    The exponent makes the lowest frequency theta_{d/2-1} = b'^(-(d-2)/d) = theta_{d/2-1}/s
    (interpolated by s) while theta_0 = 1 is unchanged (extrapolated). rope's name; no other
    library calls this rope_type ``ntk_aware`` (transformers has it only inside ``dynamic``).
    """
    sources = {"rope_theta": cfg.rope_theta, "factor": cfg.factor}
    theta = default_theta(_ntk_base(cfg, dim, cfg.factor, **sources), dim)
    return _float32(theta, cfg.rope_type, **sources), 1.0


def _ntk(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """vLLM's ``ntk`` (``NTKScalingRotaryEmbedding`` in
    ``vllm/model_executor/layers/rotary_embedding/ntk_scaling_rope.py``,
    https://github.com/vllm-project/vllm, after Su Jianlin's https://kexue.fm/archives/9706; the
    only public library with a rope_type of this name): pair i = 0 .. d/2 - 1 gets
    theta_i = b^(-2i/d) / lambda_i.

    Without ``mixed_b``, vLLM takes the base b s and divides every frequency by s^(2/d):
    theta_i = (b s)^(-2i/d) / s^(2/d) = b^(-2i/d) / s^((i+1)/(d/2)), so lambda_i = s^((i+1)/(d/2)):
    the last pair is interpolated by exactly s and the first by s^(2/d) (not kept, as
    ``ntk_aware`` keeps it). With ``mixed_b`` = kappa the base stays b and
    lambda_i = exp(a (i + 1)^kappa), a = ln s / (d/2)^kappa: again lambda_{d/2-1} = s, and the
    first pairs barely move for kappa > 1. Both are lambda_i = exp(ln s ((i + 1)/(d/2))^kappa),
    the first with kappa = 1, which is how it is computed here (in float64; d = 2 is legal).
    """
    kappa = cfg.extra.get("mixed_b", 1.0)
    index = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
    theta = default_theta(cfg.rope_theta, dim) / torch.exp(math.log(cfg.factor) * (index / (dim // 2)) ** kappa)
    sources = {"rope_theta": cfg.rope_theta, "factor": cfg.factor, **cfg.extra}
    return _float32(theta, cfg.rope_type, **sources), 1.0


def _dynamic(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Dynamic NTK (emozilla, 2023): the NTK base change with the factor grown with the length,
    b' = b * (s * l / L - (s - 1))^(d/(d-2)), l = max(seq_len, L), L = max_position_embeddings.
    At l <= L nothing changes; transformers uses max_position_embeddings here, not the original length.
    The growth is computed as 1 + s (l - L) / L, the same number without transformers' cancellation
    (s l / L and s - 1 are both near s: at s = 2^70 their float64 difference is 0, not 1).

    With ``alpha`` (HunYuan's "DynamicNTKAlpha": transformers' ``compute_ntk_alpha_rope_parameters``
    in ``models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py``, vLLM's
    ``DynamicNTKAlphaRotaryEmbedding``): a fixed base b' = b * alpha^(d/(d-2)) at every length;
    ``factor`` and ``max_position_embeddings`` are then not read (``alpha`` wins in both libraries).
    """
    if cfg.given("alpha"):
        return _ntk_alpha(cfg, dim)
    s, length = cfg.factor, cfg.max_position_embeddings
    current = length if seq_len is None else max(seq_len, length)
    sources = {"rope_theta": cfg.rope_theta, "factor": s, "max_position_embeddings": length, "seq_len": seq_len}
    base = _ntk_base(cfg, dim, 1 + s * (current - length) / length, **sources)
    return _float32(default_theta(base, dim), cfg.rope_type, **sources), 1.0


def _ntk_alpha(cfg: RopeConfig, dim: int) -> Frequencies:
    """theta_i = b'^(-2i/d) with b' = b * alpha^(d/(d-2)), whatever the length; a ``factor`` beside
    ``alpha`` is not read (HunYuan's configs carry ``factor: 1.0``), with a :class:`RopeConfigWarning`
    where it would have changed the numbers (a factor other than 1)."""
    if cfg.factor is not None and cfg.factor != 1:
        warnings.warn(f"config key 'factor' is ignored ({cfg.factor}): rope_type 'dynamic' with 'alpha' uses the "
                      "fixed base rope_theta * alpha^(d/(d-2)), as transformers' HunYuan and vLLM do",
                      RopeConfigWarning, stacklevel=4)
    sources = {"rope_theta": cfg.rope_theta, "alpha": cfg.extra["alpha"]}
    base = _ntk_base(cfg, dim, cfg.extra["alpha"], **sources)
    return _float32(default_theta(base, dim), cfg.rope_type, **sources), 1.0


YARN_SLOPE = 0.1
"""The slope of YaRN's attention factor 0.1 m ln s + 1 (Peng et al. 2023, eq. 22)."""
TELECHAT3_SLOPE = 0.07
"""The slope of TeleChat3's variant, 0.07 ln s + 1 (vLLM's ``TeleChat3RoPEScaledRotaryEmbedding``)."""


def yarn_mscale(scale: float, mscale: float = 1.0, *, slope: float = YARN_SLOPE) -> float:
    """YaRN's attention temperature (Peng et al. 2023, eq. 22 with mscale = 1): the factor on cos
    and sin, sqrt(1/t) = 0.1 * mscale * ln(s) + 1 for s > 1, else 1 (transformers' ``get_mscale``,
    DeepSeek's ``yarn_get_mscale``); with ``slope`` c, c * mscale * ln(s) + 1 (TeleChat3's c =
    0.07, :data:`TELECHAT3_SLOPE`). ``scale`` must be > 0.

    Args:
        scale: the extension factor s, > 0.
        mscale: the multiplier m of 0.1 ln(s) (DeepSeek-V3's ``mscale`` and ``mscale_all_dim``).
        slope: the slope c of c m ln(s) + 1, 0.1 in YaRN (:data:`YARN_SLOPE`).
    """
    scale = _checks.number("scale", scale, positive=True)
    mscale = _checks.number("mscale", mscale)
    slope = _checks.number("slope", slope)
    return 1.0 if scale <= 1 else slope * mscale * math.log(scale) + 1.0


def yarn_correction_range(
    dim: int, base: float, original_length: int, beta_fast: float, beta_slow: float, truncate: bool
) -> tuple[float, float]:
    """(low, high) = (i(beta_fast), i(beta_slow)) with i(r) = d ln(L / (2 pi r)) / (2 ln b), the
    (fractional) pair index that turns r times over L positions; floored/ceiled if ``truncate``
    and clamped to [0, d - 1] as transformers' ``find_correction_range`` does (the upper clamp is
    d - 1 although pair indices end at d/2 - 1). Arguments as validated by :mod:`rope.config`;
    :func:`rope.analysis.scaling.yarn_correction_range` checks them for direct use. Betas so extreme
    that a bound is not a finite number (L / (2 pi r) overflows or underflows float64) raise a
    ``ValueError`` naming the config keys.

    Args:
        dim: the rotary width d.
        base: the base b (``rope_theta``).
        original_length: L, the pre-training context (``original_max_position_embeddings``).
        beta_fast: r of the lower bound: pairs turning more often over L keep theta_i.
        beta_slow: r of the upper bound: pairs turning fewer times over L are interpolated.
        truncate: floor the lower bound and ceil the upper one.

    Returns:
        ``(low, high)``, fractional pair indices (whole ones with ``truncate``).
    """

    def pair_index(rotations: float, key: str) -> float:
        ratio = original_length / (rotations * 2 * math.pi)
        index = dim * math.log(ratio) / (2 * math.log(base)) if math.isfinite(ratio) and ratio > 0 else math.nan
        if not math.isfinite(index):
            raise ValueError(
                f"YaRN's correction range is not finite: i({key}) = d ln(L / (2 pi {key})) / (2 ln b) with "
                f"{key} = {rotations}, L = original_max_position_embeddings = {original_length}, d = {dim}, "
                f"b = {base}: L / (2 pi {key}) = {ratio} is not a finite number > 0 in float64; give a {key} "
                f"nearer the default ({YARN_BETA_FAST if key == 'beta_fast' else YARN_BETA_SLOW})"
            )
        return index

    low, high = pair_index(beta_fast, "beta_fast"), pair_index(beta_slow, "beta_slow")
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_kept_weights(
    dim: int, base: float, original_length: int, beta_fast: float, beta_slow: float, truncate: bool
) -> torch.Tensor:
    """gamma_i = 1 - clamp((i - low) / (high - low), 0, 1), float64, the weight YaRN's code puts on
    the unscaled theta_i (1 - gamma_i on theta_i / s): linear in the pair index i between the
    bounds of :func:`yarn_correction_range` (high = low + 0.001 if they coincide, transformers'
    guard against a zero-width ramp).

    Args:
        dim: the rotary width d.
        base: the base b (``rope_theta``).
        original_length: L, the pre-training context.
        beta_fast: as in :func:`yarn_correction_range`.
        beta_slow: as in :func:`yarn_correction_range`.
        truncate: as in :func:`yarn_correction_range`.

    Returns:
        gamma_i for the d/2 pairs, float64.
    """
    low, high = yarn_correction_range(dim, base, original_length, beta_fast, beta_slow, truncate)
    if low == high:
        high += 0.001
    index = torch.arange(dim // 2, dtype=torch.float64)
    return 1 - ((index - low) / (high - low)).clamp(0, 1)


def _mscale(scale: float, mscale: float, key: str) -> float:
    """mscale(s, m) = 0.1 m ln s + 1 for the config key ``key``, or a ValueError if it is not > 0."""
    value = yarn_mscale(scale, mscale)
    if not value > 0:
        raise ValueError(f"config key {key!r} = {mscale} makes YaRN's mscale 0.1 * {mscale} * ln({scale}) + 1 = "
                         f"{value} <= 0; it must be > -10 / ln(factor) = {-10 / math.log(scale)}")
    return value


def _yarn_attention(cfg: RopeConfig, s: float) -> float:
    """attention_factor if given; else mscale(s, mscale) / mscale(s, mscale_all_dim) if both are
    non-zero (0 counts as absent, as in transformers and DeepSeek's code); else mscale(s, 1).
    ``apply_yarn_scaling: False`` (vLLM's YaRN key, Mistral's ``yarn.apply_scale``) means 1: vLLM's
    ``YaRNScalingRotaryEmbedding`` multiplies cos and sin by ``attn_factor`` alone (1, since rope
    refuses ``attn_factor``) instead of ``yarn_get_mscale(factor) * attn_factor``, whatever
    ``mscale`` and ``mscale_all_dim`` say (Mistral's configs carry ``mscale_all_dim: 1`` beside it)."""
    if cfg.extra.get("apply_yarn_scaling") is False:
        if cfg.attention_factor is not None:
            raise ValueError("config keys 'apply_yarn_scaling' (False: vLLM's attention factor 1) and "
                             f"'attention_factor' ({cfg.attention_factor}) disagree: give one of them")
        return 1.0
    if cfg.attention_factor is not None:
        return cfg.attention_factor
    if cfg.mscale and cfg.mscale_all_dim:
        ratio = _mscale(s, cfg.mscale, "mscale") / _mscale(s, cfg.mscale_all_dim, "mscale_all_dim")
        return _attention(ratio, cfg.rope_type, factor=s, mscale=cfg.mscale, mscale_all_dim=cfg.mscale_all_dim)
    return yarn_mscale(s)


def _yarn(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """YaRN (Peng et al. 2023): NTK-by-parts frequencies plus an attention temperature.

    Pair i rotates r_i = L * theta_i / (2 pi) times over the original context L. Its index as a
    function of r is i(r) = d * ln(L / (2 pi r)) / (2 ln b); pairs below i(beta_fast) keep theta_i,
    pairs above i(beta_slow) are interpolated to theta_i / s, and a linear ramp in the pair index
    blends between (transformers' form; ``truncate`` floors/ceils the two bounds).
    """
    s = cfg.extension_factor()
    blended = _yarn_blend(cfg, dim, s, cfg.original_length(), cfg.truncate)
    return _float32(blended, cfg.rope_type, rope_theta=cfg.rope_theta, factor=s), _yarn_attention(cfg, s)


def _yarn_blend(cfg: RopeConfig, dim: int, s: float, length: int, truncate: bool,
                extrapolation: float = 1.0) -> torch.Tensor:
    """YaRN's frequencies, float64: k_i theta_i + (1 - k_i) theta_i / s with k_i = e gamma_i,
    gamma_i of :func:`yarn_kept_weights` (``beta_fast`` and ``beta_slow`` of ``cfg``, else 32 and
    1) and e = ``extrapolation`` (vLLM's ``extrapolation_factor``; 1 in transformers)."""
    fast = YARN_BETA_FAST if cfg.beta_fast is None else cfg.beta_fast
    slow = YARN_BETA_SLOW if cfg.beta_slow is None else cfg.beta_slow
    kept = extrapolation * yarn_kept_weights(dim, cfg.rope_theta, length, fast, slow, truncate)
    theta = default_theta(cfg.rope_theta, dim)
    return kept * theta + (1 - kept) * theta / s


def _deepseek_yarn(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """vLLM's ``deepseek_yarn`` and ``deepseek_llama_scaling``, one branch of its ``get_rope``
    (``DeepseekScalingRotaryEmbedding`` in
    ``vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py``,
    https://github.com/vllm-project/vllm): YaRN's frequencies with the bounds always truncated, and
    the attention factor mscale(s, mscale) / mscale(s, mscale_all_dim) with mscale(s, m) =
    0.1 m ln s + 1, ``mscale`` 1 and ``mscale_all_dim`` 0 when not given. Unlike ``yarn``, a 0 is a
    0 here, not "absent" (DeepSeek-V4 gives both as 0: factor 1). DeepSeek's softmax scale
    mscale(s, mscale_all_dim)^2 lives in the model's attention, not here; the two names differ
    only there: vLLM's DeepSeek models rename a config to ``deepseek_llama_scaling`` where
    ``apply_yarn_scaling`` is False (Mistral Large 3's) and then leave that softmax scale out."""
    s = cfg.factor
    blended = _yarn_blend(cfg, dim, s, cfg.original_max_position_embeddings, True)
    mscale = 1.0 if cfg.mscale is None else cfg.mscale
    mscale_all_dim = 0.0 if cfg.mscale_all_dim is None else cfg.mscale_all_dim
    ratio = _mscale(s, mscale, "mscale") / _mscale(s, mscale_all_dim, "mscale_all_dim")
    attention = _attention(ratio, cfg.rope_type, factor=s, mscale=mscale, mscale_all_dim=mscale_all_dim)
    return _float32(blended, cfg.rope_type, rope_theta=cfg.rope_theta, factor=s), attention


def _telechat3_yarn(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """vLLM's ``telechat3-yarn`` (``TeleChat3RoPEScaledRotaryEmbedding`` in
    ``vllm/model_executor/layers/rotary_embedding/telechat3_scaling_rope.py``,
    https://github.com/vllm-project/vllm, a subclass of its ``YaRNScalingRotaryEmbedding``): vLLM's
    YaRN frequencies, k_i theta_i + (1 - k_i) theta_i / s with k_i = e gamma_i (e =
    ``extrapolation_factor``, default 1; gamma_i the ramp of ``beta_fast`` and ``beta_slow`` over
    L = ``original_max_position_embeddings``, bounds floored and ceiled unless ``truncate`` is
    False), and the attention factor (0.07 ln s + 1) * ``attn_factor`` for s > 1 (``attn_factor``
    alone for s = 1, default 1): YaRN's with the slope 0.07 in place of 0.1. The two vLLM keys are
    read as vLLM reads them (elsewhere rope refuses them, :data:`rope.config.FOREIGN_KEYS`);
    transformers has no such type."""
    s = cfg.factor
    extrapolation = cfg.extra.get("extrapolation_factor", 1.0)
    attn_factor = cfg.extra.get("attn_factor", 1.0)
    blended = _yarn_blend(cfg, dim, s, cfg.original_max_position_embeddings, cfg.truncate, extrapolation)
    attention = yarn_mscale(s, slope=TELECHAT3_SLOPE) * attn_factor
    theta = _float32(blended, cfg.rope_type, rope_theta=cfg.rope_theta, factor=s, extrapolation_factor=extrapolation)
    return theta, _attention(attention, cfg.rope_type, factor=s, attn_factor=attn_factor)


def _longrope(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """LongRoPE (Ding et al. 2024): theta_i / lambda_i with searched per-pair factors lambda_i,
    ``long_factor`` beyond the original length L and ``short_factor`` within it; attention factor
    sqrt(1 + ln s / ln L) unless given: ``attention_factor`` for both tables (transformers), or
    ``short_mscale`` and ``long_mscale``, one per table (vLLM's ``Phi3LongRoPEScaledRotaryEmbedding``,
    PhiMoE's config; a table without its own keeps the computed factor, as there)."""
    length = cfg.original_length()
    s = cfg.extension_factor()
    for key in ("short_factor", "long_factor"):
        if len(getattr(cfg, key)) != dim // 2:
            raise ValueError(f"config key {key!r} must have rotary_dim/2 = {dim // 2} entries (rotary_dim = "
                             f"int(head_dim * partial_rotary_factor) = {dim}), got {len(getattr(cfg, key))}")
    key = "long_factor" if seq_len is not None and seq_len > length else "short_factor"
    mscale_key = key.replace("factor", "mscale")
    given = [k for k in ("short_mscale", "long_mscale") if cfg.given(k)]
    if given and cfg.attention_factor is not None:
        named = " and ".join(map(repr, given))
        raise ValueError(f"config keys 'attention_factor' ({cfg.attention_factor}) and {named} disagree"
                         ": give one factor for both tables (attention_factor) or one per table")
    if cfg.given(mscale_key):
        attention = cfg.extra[mscale_key]
    elif cfg.attention_factor is not None:
        attention = cfg.attention_factor
    elif s <= 1:
        attention = 1.0
    elif length < 2:
        raise ValueError("rope_type 'longrope' computes its attention factor sqrt(1 + ln s / ln L), which needs "
                         "L = original_max_position_embeddings >= 2 (ln 1 = 0), got 1: give attention_factor")
    else:
        attention = math.sqrt(1 + math.log(s) / math.log(length))
    factors = getattr(cfg, key)
    theta = default_theta(cfg.rope_theta, dim) / torch.tensor(factors, dtype=torch.float64)
    extremes = f"[{min(factors)} .. {max(factors)}]"
    return _float32(theta, cfg.rope_type, rope_theta=cfg.rope_theta, **{key: extremes}), attention


def _llama3(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Llama 3.1 scaling: with wavelength w_i = 2 pi / theta_i and original length L,
    pairs with w_i > L / low_freq_factor are interpolated (theta_i / s), pairs with
    w_i < L / high_freq_factor are kept, and between them
    theta_i' = (1 - a) theta_i / s + a theta_i with a = (L / w_i - low) / (high - low)."""
    s, low, high = cfg.factor, cfg.low_freq_factor, cfg.high_freq_factor
    length = float(cfg.original_length())
    theta = default_theta(cfg.rope_theta, dim)
    wavelength = 2 * math.pi / theta
    smooth = ((length / wavelength - low) / (high - low)).clamp(0, 1)
    scaled = (1 - smooth) * theta / s + smooth * theta
    return _float32(scaled, cfg.rope_type, rope_theta=cfg.rope_theta, factor=s), 1.0


def _proportional(cfg: RopeConfig, dim: int, seq_len: int | None) -> Frequencies:
    """Proportional RoPE (Gemma 4, LFM3): over the whole head (dim = head_dim), the first
    r = int(partial_rotary_factor * dim // 2) pairs keep the frequencies of a full head,
    theta_i = b^(-2i/dim), and the other pairs get 0 (they do not rotate); all divided by
    ``factor`` (default 1). Unlike partial rotary, the exponent counts the whole head, so the
    rotated pairs are exactly the fastest ones of ordinary RoPE on that head."""
    rotated = int(cfg.partial_rotary_factor * dim // 2)
    factor = cfg.factor or 1.0
    theta = default_theta(cfg.rope_theta, dim)[:rotated] / factor
    kept = _float32(theta, cfg.rope_type, rope_theta=cfg.rope_theta, factor=factor)
    return torch.cat([kept, torch.zeros(dim // 2 - rotated, dtype=torch.float32)]), 1.0


def _positive(name: str, value) -> float:
    return _checks.number(name, value, positive=True)


def _non_negative(name: str, value) -> float:
    return _checks.number(name, value, minimum=0.0)


def _at_least_one(name: str, value) -> float:
    return _checks.number(name, value, minimum=1.0)


_ORIGINAL_FROM_MAX = {"original_max_position_embeddings": ("max_position_embeddings",)}
_FACTOR_FROM_LENGTHS = {"factor": ("max_position_embeddings", "original_max_position_embeddings")}
_YARN_KEYS = ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")

# The built-in types, with transformers' key sets (``ntk_aware`` is rope's fixed NTK-aware type).
register_rope_type("default", _default)
register_rope_type("linear", _linear, required_keys=("factor",))
register_rope_type("ntk_aware", _ntk_aware, required_keys=("factor",))
# Keys of vLLM and HunYuan that these types read as those libraries mean them (``ntk`` is vLLM's)
register_rope_type("ntk", _ntk, required_keys=("factor",), optional_keys=("mixed_b",),
                   key_checks={"mixed_b": _positive})
register_rope_type("dynamic", _dynamic, required_keys=("factor", "max_position_embeddings"),
                   optional_keys=("alpha",), key_checks={"alpha": _at_least_one},
                   stand_ins={"factor": ("alpha",), "max_position_embeddings": ("alpha",)})
register_rope_type("yarn", _yarn, required_keys=("factor", "original_max_position_embeddings"),
                   optional_keys=(*_YARN_KEYS, "apply_yarn_scaling"), key_checks={"apply_yarn_scaling": _checks.flag},
                   stand_ins={**_FACTOR_FROM_LENGTHS, **_ORIGINAL_FROM_MAX})
register_rope_type("longrope", _longrope,
                   required_keys=("factor", "short_factor", "long_factor", "original_max_position_embeddings"),
                   optional_keys=("attention_factor", "short_mscale", "long_mscale"),
                   key_checks={"short_mscale": _positive, "long_mscale": _positive},
                   stand_ins={**_FACTOR_FROM_LENGTHS, **_ORIGINAL_FROM_MAX})
# llama3 and proportional need rope_theta, as in transformers (the others default to 10000): a legacy
# rope_scaling block of Llama 3.1 does not carry its base 500000
register_rope_type("llama3", _llama3,
                   required_keys=("rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                                  "original_max_position_embeddings"),
                   stand_ins=_ORIGINAL_FROM_MAX)
register_rope_type("proportional", _proportional, required_keys=("rope_theta",), optional_keys=("factor",),
                   zero_frequencies=True)
# vLLM's name for DeepSeek's YaRN (DeepSeek-V2/V3 and V4 configs, as vLLM's model code renames them);
# deepseek_llama_scaling is the same branch of vLLM's get_rope (DeepseekScalingRotaryEmbedding)
_DEEPSEEK_KEYS = {"required_keys": ("factor", "original_max_position_embeddings"),
                  "optional_keys": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")}
register_rope_type("deepseek_yarn", _deepseek_yarn, **_DEEPSEEK_KEYS)
register_rope_type("deepseek_llama_scaling", _deepseek_yarn, **_DEEPSEEK_KEYS)
# vLLM's TeleChat3 YaRN, with vLLM's YaRN keys extrapolation_factor and attn_factor
register_rope_type("telechat3-yarn", _telechat3_yarn, required_keys=("factor", "original_max_position_embeddings"),
                   optional_keys=("beta_fast", "beta_slow", "truncate", "extrapolation_factor", "attn_factor"),
                   key_checks={"extrapolation_factor": _non_negative, "attn_factor": _positive})
# vLLM's openPangu-VL M-RoPE: default frequencies, pairs dealt to t/h/w by rope.mrope.openpangu_axes
register_rope_type("openpangu", _default)


def inv_freq(
    config: Mapping[str, Any] | RopeConfig, head_dim: int, *, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """The rotation frequencies of a RoPE configuration.

    Args:
        config: a Hugging Face style ``rope_parameters`` mapping (see :mod:`rope.config` for the
            keys and how unknown ones are treated) or a :class:`RopeConfig`.
        head_dim: the attention head dimension; the rotary width is
            ``int(head_dim * partial_rotary_factor)``.
        seq_len: the current sequence length, read by ``dynamic`` and ``longrope``; an int in
            [1, 2^63].

    Returns:
        ``(inv_freq, attention_factor)``: a float32 tensor of rotary_dim/2 frequencies theta_i,
        finite and > 0 (0 only for proportional RoPE's unrotated pairs, or those of a type
        registered with ``zero_frequencies=True``), and the finite positive factor by which cos
        and sin are multiplied. What a registered type's function returns is checked against
        this (``TypeError`` / ``ValueError`` naming the ``rope_type``).
    """
    cfg = parse_config(config)
    dim = cfg.rotary_dim(head_dim)
    seq_len = _checks.optional_integer("seq_len", seq_len, minimum=1, maximum=MAX_LENGTH)
    entry = rope_type(cfg.rope_type)
    result = entry.frequencies(cfg, dim, seq_len)
    expected = "a pair (inv_freq, attention_factor) of a float32 tensor and a number"
    if not isinstance(result, tuple) or len(result) != 2:
        got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
        raise TypeError(f"rope_type {cfg.rope_type!r} must return {expected}, got {got}")
    theta, attention = result
    if not isinstance(theta, torch.Tensor) or theta.dtype != torch.float32 or isinstance(attention, bool) \
            or not isinstance(attention, (int, float)):
        raise TypeError(f"rope_type {cfg.rope_type!r} must return {expected}, got "
                        f"({type(theta).__name__} {getattr(theta, 'dtype', '')}, {type(attention).__name__})")
    if theta.is_meta:
        raise ValueError(f"rope_type {cfg.rope_type!r} returned a meta tensor, which has no values; expected "
                         f"{dim // 2} float32 frequencies")
    try:
        _checks.finite_frequencies("inv_freq", theta)
    except ValueError as error:
        raise ValueError(f"rope_type {cfg.rope_type!r}: {error}") from None
    if theta.shape != (dim // 2,):
        raise ValueError(f"rope_type {cfg.rope_type!r} gave {tuple(theta.shape)} frequencies; expected "
                         f"{dim // 2} (rotary_dim / 2)")
    if entry.zero_frequencies:
        if bool((theta < 0).any()):
            raise ValueError(f"rope_type {cfg.rope_type!r} gave frequencies < 0; expected {dim // 2} frequencies "
                             ">= 0 (0 for a pair that does not rotate)")
    elif not bool((theta > 0).all()):
        raise ValueError(f"rope_type {cfg.rope_type!r} gave frequencies <= 0; expected {dim // 2} frequencies > 0 "
                         "(a type whose pairs may stand still is registered with zero_frequencies=True, as "
                         "'proportional' is)")
    return theta, _attention(attention, cfg.rope_type, attention_factor=cfg.attention_factor)
