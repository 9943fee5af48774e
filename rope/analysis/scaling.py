"""What frequency-side context extension does to each rotation pair: wavelengths and turns,
NTK-aware and dynamic NTK bases (and the NTK factor of a base change), the base-beta reading of
RoPE, angles a pair never saw in training, the two forms of the YaRN ramp, the kept fraction of a
scaled schedule, and the attention temperature.

Notation, as in :mod:`rope.frequencies`: rotary width d, pairs i = 0 .. d/2 - 1 (counted from 0),
theta_i = b^(-2i/d), pre-training context L, extension factor s, current length l.

* **Wavelength and turns**: pair i completes a turn every lambda_i = 2 pi / theta_i positions and
  turns r_i = L / lambda_i = L theta_i / (2 pi) times over L positions (YaRN's r(d)).
* **NTK-aware base** (bloc97, 2023; YaRN paper, Peng et al. 2023): b' = b s^(d/(d-2)), so that
  theta'_0 = theta_0 = 1 and theta'_{d/2-1} = theta_{d/2-1} / s; then theta'_i / theta_i = s^(-2i/(d-2)).
  Read backwards, a base change b -> b' (RoPE ABF, Xiong et al. 2023) is NTK-aware scaling with
  s = (b'/b)^((d-2)/d).
* **Dynamic NTK**: the same base with a factor that grows with l. transformers (after emozilla,
  2023) uses s(l) = s l / L - (s - 1) for l > L; the YaRN paper's "Dynamic Scaling" uses
  s(l) = max(1, l / L). The two agree only for s = 1.
* **Base beta** (Su, "RoPE is a beta-base encoding", 2023): m theta_i = m / beta^i with
  beta = b^(2/d), so pair i reads position m in units of beta^i, like the i-th digit
  floor(m / beta^i) mod beta of m written in base beta.
* **Angle spans**: over relative distances in [0, l) pair i turns through angles [0, l theta_i). Training
  on length L showed it every angle (mod 2 pi) if L theta_i >= 2 pi, else only [0, L theta_i);
  a length l with frequency theta'_i shows it unseen angles iff L theta_i < 2 pi and
  l theta'_i > L theta_i.
* **YaRN ramp**, paper form (NTK-by-parts): with wavelength lambda_i = 2 pi / theta_i and
  r_i = L / lambda_i (rotations over the original context), gamma(r) = 0 for r < alpha,
  (r - alpha) / (beta - alpha) for alpha <= r <= beta, 1 for r > beta, and
  h(theta_i) = (1 - gamma) theta_i / s + gamma theta_i (alpha = 1, beta = 32 for Llama). Llama 3.1's
  rule is this formula with alpha = low_freq_factor, beta = high_freq_factor and no temperature.
  Code form (the YaRN authors' code and transformers): the pair index where r_i = R is
  i(R) = d ln(L / (2 pi R)) / (2 ln b); gamma is linear in i, 1 up to i(beta_fast) and 0 from
  i(beta_slow) on, with the bounds floored/ceiled when ``truncate`` (the default). Since ln r_i is
  affine in i, the untruncated code ramp is gamma(r) = ln(r / beta_slow) / ln(beta_fast / beta_slow)
  clamped to [0, 1] (while 0 <= i(beta_fast) and i(beta_slow) <= d - 1, the code's clamps): linear
  in ln r where the paper's is linear in r, so the two agree only at the ends. Truncation moves
  the thresholds outward to the turns of whole pair indices.
* **Kept fraction**: gamma_i = (theta'_i / theta_i - 1/s) / (1 - 1/s) inverts the blend h, placing
  any scaled schedule between kept (1) and interpolated (0).
* **Temperature**: softmax(q^T k / (t sqrt(d))) with sqrt(1/t) = 0.1 ln s + 1 (YaRN paper),
  applied by multiplying cos and sin by sqrt(1/t) (:func:`yarn_mscale`, imported from
  :mod:`rope.frequencies` where ``rope.inv_freq`` uses it); DeepSeek's variant splits it into a cos/sin
  factor mscale(s, mscale) / mscale(s, mscale_all_dim) and a softmax-scale factor
  mscale(s, mscale_all_dim)^2, with mscale(s, a) = 0.1 a ln s + 1.
"""

from __future__ import annotations

import math
import sys

import torch

from .. import frequencies
from .._checks import flag, float_tensor, integer, number, same_device
from ..frequencies import yarn_mscale


def _real(name: str, value, *, minimum: float | None = None, above: float | None = None) -> float:
    value = number(name, value, minimum=minimum)
    if above is not None and value <= above:
        raise ValueError(f"{name} must be > {above}, got {value!r}")
    return value


def _length(name: str, value) -> int:
    return integer(name, value, minimum=1, maximum=2**63)


def _dim(value, *, minimum: int = 2) -> int:
    return integer("dim", value, minimum=minimum, even=True)


def _frequencies(name: str, value) -> torch.Tensor:
    float_tensor(name, value, dim=1)
    if value.numel() == 0:
        raise ValueError(f"{name} must hold at least one frequency")
    if not bool(torch.all(value > 0)) or not bool(torch.all(value.isfinite())):
        raise ValueError(f"{name} must hold finite positive frequencies")
    return value.to(torch.float64)


def ntk_aware_base(base: float, factor: float, dim: int) -> float:
    """b' = b s^(d/(d-2)): keeps theta_0 = 1 and divides theta_{d/2-1} by s (needs d >= 4).

    Args:
        base: the base b, > 1.
        factor: the extension factor s, >= 1.
        dim: the rotary width d, even, >= 4.
    """
    base = _real("base", base, above=1.0)
    factor = _real("factor", factor, minimum=1.0)
    dim = _dim(dim, minimum=4)
    if not math.log(base) + dim / (dim - 2) * math.log(factor) < math.log(sys.float_info.max):
        raise ValueError(f"factor {factor} is too large: base * factor^(d/(d-2)) overflows float64")
    return base * factor ** (dim / (dim - 2))


def ntk_factor_for_base(base: float, new_base: float, dim: int) -> float:
    """s = (b'/b)^((d-2)/d), the inverse of :func:`ntk_aware_base`: a base change b -> b' (RoPE ABF,
    Xiong et al. 2023) gives exactly the frequencies of NTK-aware scaling by this s (needs d >= 4).

    Args:
        base: the base b, > 1.
        new_base: the new base b', >= b.
        dim: the rotary width d, even, >= 4.
    """
    base = _real("base", base, above=1.0)
    new_base = _real("new_base", new_base)
    if new_base < base:
        raise ValueError(f"new_base must be >= base (NTK-aware scaling only raises the base), got {new_base} < {base}")
    dim = _dim(dim, minimum=4)
    return (new_base / base) ** ((dim - 2) / dim)


def dynamic_ntk_factor(factor: float, seq_len: int, max_position_embeddings: int) -> float:
    """transformers' dynamic NTK factor s(l) = s l / L - (s - 1) with l = max(seq_len, L),
    computed as 1 + s (l - L) / L (no cancellation: exactly 1 for l <= L, whatever s).

    It is 1 up to l = L and grows with slope s / L: it reaches s at l = L (2 - 1/s), and at
    l = s L it is s^2 - s + 1. The YaRN paper's Dynamic Scaling would use max(1, l / L).

    Args:
        factor: the configured factor s, >= 1.
        seq_len: the current length l.
        max_position_embeddings: L.
    """
    factor = _real("factor", factor, minimum=1.0)
    seq_len = _length("seq_len", seq_len)
    length = _length("max_position_embeddings", max_position_embeddings)
    return 1 + factor * (max(seq_len, length) - length) / length


def base_beta(base: float, dim: int) -> float:
    """beta = b^(2/d), so that theta_i = beta^(-i) and pair i reads m in units of beta^i.

    Args:
        base: the base b, > 1.
        dim: the rotary width d, even.
    """
    return _real("base", base, above=1.0) ** (2 / _dim(dim))


def beta_digits(positions, beta: float, num_digits: int) -> torch.Tensor:
    """floor(m / beta^i) mod beta for i = 0 .. num_digits - 1, float64, shape positions.shape + (num_digits,).

    For an integer beta and 0 <= m < beta^num_digits these are the base-beta digits of m (least
    significant first), and sum_i digit_i beta^i = m.

    Args:
        positions: positions m, finite and >= 0 (a number, sequence or tensor).
        beta: the base beta, > 1.
        num_digits: how many digits, >= 1.
    """
    beta = _real("beta", beta, above=1.0)
    num_digits = _length("num_digits", num_digits)
    if isinstance(positions, torch.Tensor):
        if positions.dtype == torch.bool or positions.dtype.is_complex:
            raise TypeError(f"positions must hold real numbers, got a {positions.dtype} tensor")
        m = positions.to(torch.float64)
    else:
        try:
            m = torch.as_tensor(positions, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"positions must be real numbers, a sequence or a tensor, got {positions!r}") from error
    if not bool(torch.all(m.isfinite() & (m >= 0))):
        raise ValueError("positions must be finite and >= 0")
    powers = beta ** torch.arange(num_digits, dtype=torch.float64)
    return torch.remainder(torch.floor(m[..., None] / powers), beta)


def angle_spans(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """l theta_i: the end of the angle range [0, l theta_i) that pair i covers over positions [0, l), float64.

    Args:
        inv_freq: the frequencies theta_i, finite and > 0, 1-D.
        length: l.
    """
    return _length("length", length) * _frequencies("inv_freq", inv_freq)


def unseen_angle_pairs(
    trained_inv_freq: torch.Tensor,
    trained_length: int,
    inv_freq: torch.Tensor,
    length: int,
    *,
    rtol: float = 1e-9,
) -> torch.Tensor:
    """Boolean mask of the pairs that meet angles (mod 2 pi) never met in training.

    Training on ``trained_length`` = L with theta_i covered [0, L theta_i); a pair that completed a
    full turn (L theta_i >= 2 pi) has seen every angle. Otherwise the pair meets unseen angles at
    ``length`` = l with theta'_i iff l theta'_i > L theta_i (1 + rtol); rtol absorbs rounding when
    the two spans are equal in exact arithmetic (position interpolation).

    Args:
        trained_inv_freq: the training frequencies theta_i.
        trained_length: L, the training length.
        inv_freq: the frequencies theta'_i in use at ``length``, as many as ``trained_inv_freq``.
        length: l, the length in use.
        rtol: the relative tolerance on the comparison of spans, >= 0.
    """
    same_device("trained_inv_freq", float_tensor("trained_inv_freq", trained_inv_freq),
                inv_freq=float_tensor("inv_freq", inv_freq))
    trained = angle_spans(trained_inv_freq, trained_length)
    new = angle_spans(inv_freq, length)
    if trained.shape != new.shape:
        raise ValueError(f"trained_inv_freq and inv_freq must have the same length, got {len(trained)} and {len(new)}")
    rtol = _real("rtol", rtol, minimum=0.0)
    return (trained < 2 * math.pi) & (new > trained * (1 + rtol))


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """lambda_i = 2 pi / theta_i: the positions per full turn of pair i, float64.

    Args:
        inv_freq: the frequencies theta_i, finite and > 0, 1-D.
    """
    return 2 * math.pi / _frequencies("inv_freq", inv_freq)


def rotations_over_context(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """r_i = L / lambda_i = L theta_i / (2 pi): how many turns pair i makes over L positions (YaRN's r(d)).

    Args:
        inv_freq: the frequencies theta_i, finite and > 0, 1-D.
        length: L.
    """
    return angle_spans(inv_freq, length) / (2 * math.pi)


def pair_index_for_rotations(rotations: float, dim: int, base: float, length: int) -> float:
    """i(R) = d ln(L / (2 pi R)) / (2 ln b): the (fractional) pair index that turns R times over L positions.

    Args:
        rotations: R, > 0.
        dim: the rotary width d, even.
        base: the base b, > 1.
        length: L.
    """
    rotations = _real("rotations", rotations, above=0.0)
    dim = _dim(dim)
    base = _real("base", base, above=1.0)
    length = _length("length", length)
    return dim * math.log(length / (2 * math.pi * rotations)) / (2 * math.log(base))


def yarn_ramp_paper(
    inv_freq: torch.Tensor, original_length: int, alpha: float = 1.0, beta: float = 32.0
) -> torch.Tensor:
    """gamma(r_i) of the YaRN paper (NTK-by-parts), the weight on the unscaled theta_i, float64.

    gamma = 0 (interpolate) for r_i < alpha, 1 (keep) for r_i > beta, (r_i - alpha) / (beta - alpha)
    between, with r_i = L theta_i / (2 pi). Linear in r_i, hence exponential in the pair index.

    Args:
        inv_freq: the unscaled frequencies theta_i, finite and > 0, 1-D.
        original_length: L.
        alpha: the turns below which a pair is interpolated, > 0.
        beta: the turns above which a pair is kept, > alpha.
    """
    alpha = _real("alpha", alpha, above=0.0)
    beta = _real("beta", beta)
    if beta <= alpha:
        raise ValueError(f"beta must be > alpha, got alpha={alpha} and beta={beta}")
    r = rotations_over_context(inv_freq, _length("original_length", original_length))
    return ((r - alpha) / (beta - alpha)).clamp(0, 1)


def yarn_correction_range(
    dim: int, base: float, original_length: int, beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True
) -> tuple[float, float]:
    """(low, high) = (i(beta_fast), i(beta_slow)) of :func:`pair_index_for_rotations`, floored/ceiled
    if ``truncate``, clamped to [0, d - 1], as transformers' ``find_correction_range`` (the upper
    clamp is d - 1 although pair indices end at d/2 - 1: it only matters when i(beta_slow) > d/2 - 1).
    The arguments are checked, then :func:`rope.frequencies.yarn_correction_range` computes it.

    Args:
        dim: the rotary width d, even.
        base: the base b, > 1.
        original_length: L.
        beta_fast: the turns of the lower bound, > beta_slow.
        beta_slow: the turns of the upper bound, > 0.
        truncate: floor the lower bound and ceil the upper one.
    """
    return frequencies.yarn_correction_range(*_check_ramp_arguments(dim, base, original_length, beta_fast, beta_slow,
                                                                    truncate))


def yarn_ramp_code(
    dim: int, base: float, original_length: int, beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True
) -> torch.Tensor:
    """gamma_i of the YaRN code (transformers' ``_compute_yarn_parameters``), the weight on the unscaled theta_i.

    gamma_i = 1 - clamp((i - low) / (high - low), 0, 1) with (low, high) from
    :func:`yarn_correction_range` (high = low + 0.001 if they coincide): linear in the pair index.
    The same function :func:`rope.inv_freq` uses for ``yarn`` (:func:`rope.frequencies.yarn_kept_weights`).

    Args:
        dim: the rotary width d, even.
        base: the base b, > 1.
        original_length: L.
        beta_fast: the turns above which a pair is kept, > beta_slow.
        beta_slow: the turns below which a pair is interpolated, > 0.
        truncate: floor and ceil the bounds (:func:`yarn_correction_range`).

    Returns:
        gamma_i for the d/2 pairs, float64.
    """
    return frequencies.yarn_kept_weights(*_check_ramp_arguments(dim, base, original_length, beta_fast, beta_slow,
                                                                truncate))


def _check_ramp_arguments(dim, base, original_length, beta_fast, beta_slow, truncate) -> tuple:
    """The arguments of the YaRN code ramp, checked, as (int, float, int, float, float, bool)."""
    checked = (_dim(dim), _real("base", base, above=1.0), _length("original_length", original_length),
               _real("beta_fast", beta_fast, above=0.0), _real("beta_slow", beta_slow, above=0.0),
               flag("truncate", truncate))
    if checked[3] <= checked[4]:
        raise ValueError(f"beta_fast must be > beta_slow, got beta_fast={checked[3]} and beta_slow={checked[4]}")
    return checked


def blend_frequencies(inv_freq: torch.Tensor, factor: float, gamma: torch.Tensor) -> torch.Tensor:
    """h(theta_i) = gamma_i theta_i + (1 - gamma_i) theta_i / s, float64.

    Args:
        inv_freq: the frequencies theta_i, finite and > 0, 1-D.
        factor: the extension factor s, >= 1.
        gamma: the weight on theta_i of each pair, in [0, 1], of inv_freq's shape.
    """
    theta = _frequencies("inv_freq", inv_freq)
    factor = _real("factor", factor, minimum=1.0)
    float_tensor("gamma", gamma)
    same_device("inv_freq", inv_freq, gamma=gamma)
    if gamma.shape != theta.shape:
        raise ValueError(f"gamma must have the shape of inv_freq {tuple(theta.shape)}, got {tuple(gamma.shape)}")
    gamma = gamma.to(torch.float64)
    if not bool(torch.all((gamma >= 0) & (gamma <= 1))):
        raise ValueError("gamma must lie in [0, 1]")
    return gamma * theta + (1 - gamma) * theta / factor


def kept_fraction(scaled: torch.Tensor, original: torch.Tensor, factor: float) -> torch.Tensor:
    """gamma_i = (theta'_i / theta_i - 1/s) / (1 - 1/s), float64: the weight that
    :func:`blend_frequencies` would need to turn ``original`` into ``scaled``.

    1 for a pair left alone (extrapolated), 0 for a pair interpolated by s (position
    interpolation), in between for a blend. Needs s > 1 (at s = 1 every pair is both kept and
    interpolated). Any other schedule is still placed between the two; dividing a frequency by
    more than s (some LongRoPE factors) gives a value below 0.

    Args:
        scaled: the scaled frequencies theta'_i.
        original: the unscaled frequencies theta_i, of scaled's shape.
        factor: the extension factor s, > 1.
    """
    same_device("scaled", float_tensor("scaled", scaled), original=float_tensor("original", original))
    scaled, original = _frequencies("scaled", scaled), _frequencies("original", original)
    if scaled.shape != original.shape:
        raise ValueError(f"scaled {tuple(scaled.shape)} and original {tuple(original.shape)} must have the same shape")
    factor = _real("factor", factor, above=1.0)
    return (scaled / original - 1 / factor) / (1 - 1 / factor)


def deepseek_yarn_scales(factor: float, mscale: float, mscale_all_dim: float) -> tuple[float, float]:
    """(cos/sin factor, softmax-scale multiplier) of DeepSeek-style YaRN attention, as transformers
    computes them.

    The cos/sin factor is :func:`rope.inv_freq`'s attention factor: mscale(s, mscale) /
    mscale(s, mscale_all_dim) if both keys are non-zero, else plain mscale(s, 1). DeepSeek's
    attention multiplies its softmax scale by mscale(s, mscale_all_dim)^2 (by 1 if that key is 0).
    With both keys non-zero, scores of the rotary dimensions are multiplied by mscale(s, mscale)^2
    and those of the other dimensions by mscale(s, mscale_all_dim)^2. Equal keys make the cos/sin
    factor exactly 1: the whole temperature then sits in the softmax scale, and a runtime that
    applies only the cos/sin factor loses it.

    Args:
        factor: the extension factor s, >= 1.
        mscale: the config key ``mscale`` (0: absent).
        mscale_all_dim: the config key ``mscale_all_dim`` (0: absent).
    """
    factor = _real("factor", factor, minimum=1.0)
    mscale = _real("mscale", mscale)
    mscale_all_dim = _real("mscale_all_dim", mscale_all_dim)
    if mscale and mscale_all_dim:
        numerator = _positive_mscale(factor, mscale, "mscale")
        cos_sin = numerator / _positive_mscale(factor, mscale_all_dim, "mscale_all_dim")
    else:
        cos_sin = yarn_mscale(factor)
    softmax = _positive_mscale(factor, mscale_all_dim, "mscale_all_dim") ** 2 if mscale_all_dim else 1.0
    return cos_sin, softmax


def _positive_mscale(factor: float, value: float, name: str) -> float:
    """mscale(s, value) = 0.1 value ln s + 1, or a ValueError naming ``name`` if it is not > 0."""
    scale = yarn_mscale(factor, value)
    if not scale > 0:
        raise ValueError(f"{name} = {value} makes mscale(s, {name}) = 0.1 * {value} * ln({factor}) + 1 = {scale} <= 0")
    return scale
