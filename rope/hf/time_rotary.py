"""Exact rotary time embedding for MusicFlamingo's audio features.

MusicFlamingo (``transformers/models/musicflamingo/modeling_musicflamingo.py``, 5.23) turns the
audio encoder's output features themselves, not q and k, by the timestamps of their windows,
before projecting them into the text model:

* its rotary module ``pos_emb`` (``MusicFlamingoRotaryEmbedding``), called as
  ``forward(timestamps, seq_len)`` with timestamps ``[windows, seq_len]`` in seconds (window w,
  frame s at w S tau + s tau, tau = 4 ``audio_frame_step``, S = ``seq_len``), returns ``(cos,
  sin)`` ``[windows, seq_len, 4n]`` of the angles, for the frequencies theta_j (j < n; rope's
  ``default`` type of ``rope_theta`` for the rotary width 2n, float32, as its ``inv_freq``) and
  M = ``max_position_embeddings`` (its config sets it to ``rope_theta``)::

      window half, entries 2j, 2j + 1:  (round(t_w0 / (tau S)) / M) theta_j (-2 pi t_ws)
      time half, entries 2n + 2j, + 1:  (s / M 2 pi) theta_j (-2 pi t_ws)

  with t_ws the timestamp of window w, frame s (t_w0 its window's first). transformers forms
  these in float32 (``position_angles`` is a float32 buffer of its init); the angle is quadratic
  in time, up to 4 pi^2 t s theta_j / M rad, thousands of radians for minutes of audio, where a
  float32 angle is off by 2^-24 of its size;
* ``apply_rotary_time_emb(hidden_states, cos, sin)`` turns the first ``cos.shape[-1]``
  coordinates of the features in pairs (2i, 2i + 1) (its ``rotate_half`` is (-x_2i+1, x_2i)) by
  the tables broadcast as given, in float64 (float32 on Apple's MPS), and casts back.

rope's replacements: :func:`apply_rotary_time_emb`, the same formula in float64 rounded once to
the features' dtype (:func:`rope.rotation.round_once`: transformers' float64 result cast to
float16 or bfloat16 goes through float32 and may land an ulp off); and
:class:`TimeRotaryEmbedding` in place of ``pos_emb`` (:func:`reproduce`, which checks it against
the module first), whose angles are the float64 value of the formula above (each operation in
float64, in transformers' order, on the float64 timestamps and float32 theta_j), reduced modulo
2 pi exactly (:func:`cos_sin_of_angles`: Cody and Waite's three pieces of 2 pi below 2^22 rad,
the angle's turns to 2^-122 beyond; cos and sin within 2^-52), rounded once to float32: every entry is
within half a float32 ulp of the cos or sin of that float64 angle, but for an entry within
2^-52 of a rounding boundary. The float64 angle itself is within a few float64 roundings
(relative 2^-51) of the real formula's: 2^-51 ``|angle|`` rad, below 2^-30 rad for angles below
2^21 rad. Timestamps must be finite and their angles below 2^127 rad.

:func:`rope.hf.patch` covers ``musicflamingo`` with both: its convention
(:data:`rope.hf.families.MUSICFLAMINGO`) replaces ``apply_rotary_time_emb``, and
:mod:`rope.hf.vision` swaps ``pos_emb`` (a time rotary module is a vision rotary module there:
a table module that is not named ``rotary_emb``); :func:`rope.hf.unpatch` restores both. The
text model (Qwen2) follows its own row.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from .. import _checks
from ..angles import TWO_PI, cos_sin_of_turns, turns_of_checked_frequencies
from ..apply import exact_cos_sin, has_float64
from ..frequencies import inv_freq
from ..rotation import round_once
from .embedding import Float32Frequencies
from .probing import FREQUENCY_ULPS, PROBE_TOLERANCE, first_other_frequency

PROBE_WINDOWS, PROBE_FRAMES = 3, 7
"""The timestamps :func:`reproduce` compares tables on: windows of frames, as MusicFlamingo builds them."""

_LARGEST = 2.0**127
_SHORT = 2.0**22  # below it Cody and Waite's reduction (k < 2^20) is exact, and 40 times cheaper than the turns'


def _two_pi_pieces() -> tuple[float, float, float]:
    """2 pi = P1 + P2 + P3 (+ less than 2^-110): P1 and P2 of 30 significant bits each (k P1 and
    k P2 exact in float64 for ``|k|`` < 2^23), P3 the rest rounded to float64 (``|P3|`` < 2^-58);
    from :data:`rope.angles.TWO_PI` (256 bits)."""
    two_pi, pieces = TWO_PI, []
    for _ in range(2):
        rest = two_pi - sum(pieces)
        scale = 2 ** (29 - (rest.numerator.bit_length() - rest.denominator.bit_length()))
        pieces.append(Fraction(int(rest * scale), scale))  # truncated to 30 (or 29) significant bits
    return float(pieces[0]), float(pieces[1]), float(two_pi - pieces[0] - pieces[1])


_P1, _P2, _P3 = _two_pi_pieces()


def apply_rotary_time_emb(hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers-compatible with MusicFlamingo's ``apply_rotary_time_emb``: the first
    r = ``cos.shape[-1]`` coordinates of ``hidden_states`` turned in pairs (2i, 2i + 1), x_2i c_2i -
    x_2i+1 s_2i and x_2i+1 c_2i+1 + x_2i s_2i+1 (``x cos + rotate_half(x) sin``, its ``rotate_half``
    (x_2i, x_2i+1) -> (-x_2i+1, x_2i)), the tables broadcast against ``hidden_states[..., :r]`` as
    given, the other coordinates passed through; computed in float64 (float32 on devices without
    it, as transformers on MPS) and rounded once to ``hidden_states.dtype``. A float32 (or
    narrower) input times a float32 table is exact in float64 and the sum is rounded once there:
    within half an ulp of the exact formula plus 2^-52 of the pair's magnitude. Values are not
    checked (a non-finite entry gives non-finite outputs where the formula reads it).

    Args:
        hidden_states: the audio features ``[..., width]``, floating.
        cos: floating ``[..., r]``, r even and at most ``width``, broadcasting to
            ``hidden_states[..., :r]``.
        sin: the same shape as ``cos``.

    Returns:
        ``hidden_states`` turned, in its dtype and shape.
    """
    _checks.float_tensor("hidden_states", hidden_states)
    _checks.float_tensor("cos", cos)
    _checks.float_tensor("sin", sin)
    _checks.same_device("hidden_states", hidden_states, cos=cos, sin=sin)
    if cos.shape != sin.shape:
        raise ValueError(f"sin {tuple(sin.shape)} must have the shape of cos {tuple(cos.shape)}")
    if hidden_states.dim() == 0 or cos.dim() == 0:
        raise ValueError(f"hidden_states {tuple(hidden_states.shape)} and cos {tuple(cos.shape)} must have a last "
                         "dimension (the features, the rotated width)")
    width, rotated = hidden_states.shape[-1], cos.shape[-1]
    if rotated % 2 or rotated > width:
        raise ValueError(f"cos {tuple(cos.shape)}: its last dimension {rotated} (the rotated width) must be even "
                         f"(pairs (2i, 2i + 1)) and at most the features' {width} (hidden_states "
                         f"{tuple(hidden_states.shape)})")
    target = (*hidden_states.shape[:-1], rotated)
    try:
        broadcast = torch.broadcast_shapes(target, cos.shape)
    except RuntimeError:
        broadcast = None
    if broadcast != target:
        raise ValueError(f"cos {tuple(cos.shape)} must broadcast to hidden_states[..., :{rotated}] {target}")
    wide = torch.float64 if has_float64(hidden_states.device) else torch.float32
    x = hidden_states.to(wide)
    even, odd = x[..., :rotated].unflatten(-1, (-1, 2)).unbind(-1)
    c_even, c_odd = cos.to(wide).unflatten(-1, (-1, 2)).unbind(-1)
    s_even, s_odd = sin.to(wide).unflatten(-1, (-1, 2)).unbind(-1)
    turned = torch.stack((even * c_even - odd * s_even, odd * c_odd + even * s_odd), dim=-1).flatten(-2)
    return round_once(torch.cat((turned, x[..., rotated:]), dim=-1), hidden_states.dtype)


def _cody_waite(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of float64 angles a with ``|a|`` < 2^22: k = round(a / (2 pi)) (``|k|`` < 2^20; an
    off-by-one k only widens the rest), a - k P1 exact (both are multiples of 2^-51 where k != 0
    and differ by less than 4), minus k P2 (exact) as a float64 pair by Knuth's two-sum, minus
    k P3 (``|k P3|`` < 2^-38, its rounding below 2^-91; P3's own below 2^-111 times k): the rest
    r = hi + lo within 2^-89 of a mod 2 pi, ``|r|`` < 4; then cos(hi + lo) = cos hi - lo sin hi
    and sin(hi + lo) = sin hi + lo cos hi (``|lo|`` < 2^-37: lo^2 / 2 is below 2^-74)."""
    k = torch.round(a * (1 / (2 * math.pi)))
    first = a - k * _P1
    second = -(k * _P2)
    hi = first + second
    back = hi - first
    lo = (first - (hi - back)) + (second - back) - k * _P3
    cos, sin = torch.cos(hi), torch.sin(hi)
    return cos - lo * sin, sin + lo * cos


def cos_sin_of_angles(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cos and sin of float64 angles (radians, any shape), each reduced modulo 2 pi
    exactly: below 2^22 in magnitude by Cody and Waite's three pieces of 2 pi, the rest as a
    float64 pair within 2^-90 (:func:`_cody_waite`); from there by the angle's turns,
    frac(a / (2 pi)) to 2^-122 (the angle as three float32 pieces,
    :func:`rope.angles.turns_of_checked_frequencies`, and :func:`rope.angles.cos_sin_of_turns`).
    Either is within 2^-52 (and the float64 cos and sin of the rest) of the exact values.

    Args:
        angles: float64, finite, magnitudes below 2^127.
    """
    _checks.float_tensor("angles", angles, dtypes=(torch.float64,))
    flat = angles.reshape(-1)
    if flat.numel() and not bool((flat.abs() < _LARGEST).all()):  # NaN fails too
        raise ValueError("angles must be finite and below 2^127 in magnitude (where rope's exact reduction stops)")
    short = flat.abs() < _SHORT
    cos, sin = _cody_waite(torch.where(short, flat, 0.0))
    long = (~short).nonzero()[:, 0]
    if long.numel():  # one read of the device, and the turns only where needed
        far_cos, far_sin = cos_sin_of_turns(turns_of_checked_frequencies(flat[long]))  # |a| >= 2^22: in its range
        cos, sin = cos.index_put((long,), far_cos), sin.index_put((long,), far_sin)
    return cos.reshape(angles.shape), sin.reshape(angles.shape)


class TimeRotaryEmbedding(Float32Frequencies):
    """The drop-in for MusicFlamingo's ``MusicFlamingoRotaryEmbedding`` (module docstring).
    ``forward(timestamps, seq_len)`` returns ``(cos, sin)`` float32 ``[windows, seq_len, 4n]``:
    the window half and the time half of the angles of each window's timestamps, each angle
    twice in a row, the float64 angle reduced exactly and rounded once. ``forward(timestamps,
    position_ids)`` with an integer tensor instead gives the tables ``[..., 4n]`` of both axes at
    the integer angles p theta_j (what :func:`rope.hf.diagnose` reads; the model never passes them).
    ``inv_freq`` stays float32 whatever the module is cast to, and so do the tables (the stock
    module's, from its float32 buffers).

    Build it with :func:`reproduce`, which reads a stock module and checks the result.

    Args:
        theta: the float32 frequencies ``[n]``.
        max_positions: M, the module's ``max_position_embeddings`` (a number > 0; the time axis
            has ``int(M)`` rows).
        frame_step: the audio frame step in seconds (the config's ``audio_frame_step``, > 0);
            the encoder's output frames are 4 of them apart.
        config: the stock module's config, kept for readers of ``module.config`` (not read here).
        source: the stock class's name, for ``repr``.
    """

    def __init__(self, theta: torch.Tensor, max_positions: float, frame_step: float, *, config: Any = None,
                 source: str = ""):
        super().__init__()
        _checks.finite_frequencies("theta", theta)
        self.config = config
        self.source = source
        self.register_buffer("inv_freq", theta.detach().clone(), persistent=False)
        self.max_positions = _checks.number("max_positions", max_positions, minimum=1)
        self.frame_step = _checks.number("frame_step", frame_step, positive=True)

    def extra_repr(self) -> str:
        return (f"{self.source or 'time rotary'}, pairs={self.inv_freq.numel()}, max_positions={self.max_positions}, "
                f"frame_step={self.frame_step}")

    def angles(self, timestamps: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The window and time angles, float64 ``[windows, seq_len, n]`` each: the float64 value
        of transformers' formula (module docstring), in its order of operations.

        Args:
            timestamps: ``[windows, seq_len]`` seconds, floating or integer, finite.
            seq_len: S, the frames per window, in [1, ``int(max_positions)``].
        """
        _checks.tensor("timestamps", timestamps)
        if timestamps.dtype.is_complex or timestamps.dtype == torch.bool:
            raise TypeError(f"timestamps must be a real (floating or integer) tensor, got {timestamps.dtype}")
        rows = int(self.max_positions)
        seq_len = _checks.integer("seq_len", seq_len, minimum=1, maximum=rows)
        if timestamps.dim() != 2 or timestamps.shape[1] != seq_len:
            raise ValueError(f"timestamps must be [windows, seq_len] = [windows, {seq_len}], got shape "
                             f"{tuple(timestamps.shape)}")
        times = timestamps.to(torch.float64)
        if times.numel() and not bool(torch.isfinite(times).all()):
            raise ValueError("timestamps must hold finite values (no NaN or inf)")
        theta = self.inv_freq.to(times.device, torch.float64)
        duration = self.frame_step * 4 * seq_len
        window = (torch.round(times[:, 0] / duration) / self.max_positions)[:, None, None] * theta
        frames = torch.arange(seq_len, dtype=torch.float64, device=times.device)
        time = (frames / self.max_positions * (2 * math.pi))[:, None] * theta
        turn = (-times * 2 * math.pi)[..., None]
        return window * turn, time[None] * turn

    @torch.no_grad()
    def forward(self, timestamps: torch.Tensor, seq_len) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(seq_len, torch.Tensor):  # position ids: both axes at p theta_j (diagnose's reading)
            positions = _checks.integer_tensor("position_ids", seq_len)
            cos, sin = exact_cos_sin(positions, self.inv_freq.to(positions.device))
            return tuple(round_once(t.repeat_interleave(2, dim=-1).repeat(*(1,) * (t.dim() - 1), 2), torch.float32)
                         for t in (cos, sin))
        window, time = self.angles(timestamps, seq_len)
        try:
            pairs = [cos_sin_of_angles(a) for a in (window, time)]
        except ValueError as err:
            raise ValueError(f"timestamps: {err}") from err
        return tuple(round_once(torch.cat([p[i].repeat_interleave(2, dim=-1) for p in pairs], dim=-1), torch.float32)
                     for i in (0, 1))


def is_time_rotary(module: nn.Module) -> bool:
    """Whether ``module`` is a rotary time module: rope's, or of a class that computes
    ``position_angles`` (``_compute_position_angles``), holds ``inv_freq`` and ``position_angles``
    buffers, and whose ``forward`` takes ``(timestamps, seq_len)`` (MusicFlamingo's).

    Args:
        module: any module.
    """
    if isinstance(module, TimeRotaryEmbedding):
        return True
    if not callable(getattr(type(module), "_compute_position_angles", None)):
        return False
    if not all(isinstance(module._buffers.get(key), torch.Tensor) for key in ("inv_freq", "position_angles")):
        return False
    try:
        return list(inspect.signature(module.forward).parameters) == ["timestamps", "seq_len"]
    except (TypeError, ValueError):  # a forward without a signature: not this form
        return False


def _refuse(name: str, module: nn.Module, why: str) -> ValueError:
    return ValueError(f"time rotary: {name} ({type(module).__name__}) is not reproduced: {why}; it stays "
                      "transformers'")


def probe_timestamps(windows: int = PROBE_WINDOWS, frames: int = PROBE_FRAMES, step: float = 0.04,
                     device=None) -> torch.Tensor:
    """float32 timestamps ``[windows, frames]`` as MusicFlamingo builds them: window w, frame s at
    (w frames + s) ``step`` seconds.

    Args:
        windows: how many windows, >= 1.
        frames: frames per window, >= 1.
        step: seconds between frames (4 ``audio_frame_step``).
        device: where to make them.
    """
    index = torch.arange(windows, device=device)[:, None] * frames
    return (index * step + torch.arange(frames, device=device, dtype=torch.float32) * step).to(torch.float32)


def reproduce(name: str, module: nn.Module) -> TimeRotaryEmbedding:
    """rope's replacement for MusicFlamingo's rotary time module (:func:`is_time_rotary`),
    checked: its config's rope type must be ``default`` (the forward drops the attention factor
    of other types), its ``inv_freq`` rope's default frequencies of its ``rope_theta`` to within
    :data:`FREQUENCY_ULPS` float32 ulps, and a copy of it called on :func:`probe_timestamps`
    must return rope's tables within :data:`PROBE_TOLERANCE` beyond float32's error. On the
    module's device. Raises ``ValueError`` naming the module and what differs.

    Args:
        name: the module's qualified name in its model, for messages.
        module: a transformers rotary time module.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not is_time_rotary(module) or isinstance(module, TimeRotaryEmbedding):
        raise _refuse(name, module, "it is not a transformers rotary time module (forward(timestamps, seq_len))")
    config = getattr(module, "config", None)
    parameters = getattr(config, "rope_parameters", None)
    if not isinstance(parameters, Mapping):
        raise _refuse(name, module, "it has no config.rope_parameters mapping to read its rope type and base from")
    if parameters.get("rope_type", "default") != "default":
        raise _refuse(name, module, f"its config's rope_type is {parameters.get('rope_type')!r}, not 'default' (its "
                                    "forward drops the attention factor of other types)")
    theirs = module._buffers["inv_freq"]
    if theirs.dim() != 1 or theirs.numel() == 0 or theirs.dtype != torch.float32:
        raise _refuse(name, module, f"its inv_freq is {theirs.dtype} {tuple(theirs.shape)}, not float32 [n] with "
                                    "n >= 1 (a cast model rounds its frequencies; patch before casting)")
    n, base = theirs.numel(), parameters.get("rope_theta")
    try:
        theta = inv_freq({"rope_type": "default", "rope_theta": base}, 2 * n)[0][:n]
    except (TypeError, ValueError) as err:
        raise _refuse(name, module, f"rope's default type refuses its base {base!r} "
                                    f"({_checks.first_line(err, 120)})") from err
    j = first_other_frequency(theirs, theta)
    if j is not None:
        raise _refuse(name, module, f"its inv_freq[{j}] = {float(theirs[j]):.9g} is not rope's default frequency "
                                    f"b^(-{j}/{n}) = {float(theta[j]):.9g} (b = {base}): an odd rotary width "
                                    "(int(head_dim * partial_rotary_factor)) or another formula")
    try:
        new = TimeRotaryEmbedding(theta, getattr(module, "max_seq_len_cached", None),
                                  getattr(config, "audio_frame_step", None), config=config,
                                  source=type(module).__name__)
    except (TypeError, ValueError) as err:
        raise _refuse(name, module, _checks.first_line(err, 160)) from err
    new = new.to(theirs.device)
    frames = min(PROBE_FRAMES, int(new.max_positions))
    stamps = probe_timestamps(PROBE_WINDOWS, frames, 4 * new.frame_step, device=theirs.device)
    try:
        got = copy.deepcopy(module).eval()(stamps, frames)
    except Exception as err:  # it does not follow the form it was read as
        raise _refuse(name, module, f"calling a copy of it failed ({type(err).__name__}: "
                                    f"{_checks.first_line(err, 120)})") from err
    ours = new(stamps, frames)
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(
            isinstance(a, torch.Tensor) and a.shape == b.shape for a, b in zip(got, ours))):
        raise _refuse(name, module, f"it returns no (cos, sin) pair of shape {tuple(ours[0].shape)} on "
                                    f"{PROBE_WINDOWS} windows of {frames} frames: another form")
    largest = max(float(a.abs().max()) for a in new.angles(stamps, frames))
    gap = max(float((a.double().cpu() - b.double().cpu()).abs().max()) for a, b in zip(got, ours))
    if gap > 2.0**-20 * largest + PROBE_TOLERANCE:
        raise _refuse(name, module, f"its tables on {PROBE_WINDOWS} windows of {frames} frames are off from rope's by "
                                    f"{gap:.3g} beyond float32's error: another layout, axis order or formula")
    return new.train(module.training)


__all__ = ["FREQUENCY_ULPS", "PROBE_TOLERANCE", "TimeRotaryEmbedding", "apply_rotary_time_emb", "cos_sin_of_angles",
           "is_time_rotary", "probe_timestamps", "reproduce"]
