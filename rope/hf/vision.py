"""Exact rotary tables for the vision towers of transformers models.

transformers' vision towers turn image patches by their 2D position (h, w): the ``axial`` rope
type. 33 of its modeling modules (5.23) define a vision rotary module of one form, Qwen2-VL's
``Qwen2VLVisionRotaryEmbedding``: ``inv_freq`` from ``compute_axial_rope_parameters(config)``,
``forward(x, position_ids)`` with position ids ``[..., axes]`` (one column per axis: h, w, for
MiniMax-M3-VL also t), the float32 angles ``position_ids[..., None].float() * inv_freq``, their
cos and sin times ``attention_scaling``, and ``recomposition_frequencies``, the family's own
arrangement of the axes' tables in the last dimension. :class:`VisionRotaryEmbedding` replaces
any of them (:func:`reproduce`, which checks the replacement first):

* the frequencies are rope's registered ``axial`` type (:mod:`rope.axial`) of the module's
  ``config.rope_parameters["rope_theta"]`` b: theta_j = b^(-j/n), j = 0 .. n - 1, for the n
  frequencies of the module's ``inv_freq`` (a head of width d = 4n: the families derive d from
  ``head_dim``, ``embed_dim``, SAM 2's memory attention, MiniMax-M3-VL's third of the head, but
  all come to this). They must equal the module's ``inv_freq`` to within :data:`FREQUENCY_ULPS`
  ulps of float32 (transformers' float32 power and division), in the module's order: ascending
  j, or Pixtral's even j then odd j (:data:`ORDERS`); any other module is refused, naming the
  first frequency that differs;
* the angle of position p on each axis is p theta_j reduced modulo 2 pi exactly
  (:func:`rope.apply.exact_cos_sin`, :mod:`rope.angles`): cos and sin in float64 within 2^-52,
  whatever the position, where transformers' float32 product is off by up to 2^-24 ``|p theta_j|``
  (a whole 2^-8 rad at p theta_j = 2^16). Positions given as floats (SAM 3's global layers scale
  an integer grid by window / grid) are taken exactly as the numbers they are: p = M 2^-s with M
  an integer, and the angle M (theta_j 2^-s), exact too (:func:`exact_positions`);
* cos and sin times the attention factor, in float64, are laid out by the module's own
  ``recomposition_frequencies`` (called on rope's float64 tables: :func:`reproduce` checks
  that it only moves and repeats entries, so the layout is the model's), then rounded once to
  the dtype the module returns: float32, or ``x.dtype`` for the families whose forward casts to
  it (Gemma 4, MiniMax-M3-VL, MuSE, Pixtral). float32 is the contract of the others, which
  ``apply_rotary_pos_emb_vision`` reads with ``cos.float()``: a float64 table would be rounded
  there, once and correctly, to the same float32 numbers, but callers that do not cast the
  tables (SAM's ``apply_rotary_pos_emb_2d``: ``q.float() * cos``) would compute in float64.
  Every entry is within half a float32 ulp (of its dtype) of the exact value.

Llama 4's ``Llama4VisionRotaryEmbedding`` (rope type ``mllama4``) is another form: one complex
table ``freqs_ci`` computed at init, returned by ``forward(hidden_states)``.
:class:`VisionComplexRotaryEmbedding` computes it exactly (patch n of the square grid at 1-based
column and row, the class token at angle 0: :func:`rope.axial.llama4_vision_positions`).

:func:`rope.hf.patch` swaps every vision rotary module that :func:`reproduce` accepts
(:func:`vision_replacements`; those it refuses stay transformers' and are named, with the reason,
in a warning and in the :class:`rope.hf.Patch` record) and :func:`rope.hf.unpatch` puts the
originals back (:func:`swap`, :func:`restore`). The image-grid rotary modules, called with the
pixel values or a feature map (DINOv3, Sapiens2, EoMT-DINOv3, EfficientLoFTR), are vision rotary
modules here too: :mod:`rope.hf.grid` reproduces them; so are LightGlue's coordinate encoders,
which :mod:`rope.hf.coordinates` reproduces, and MusicFlamingo's rotary time module, which
:mod:`rope.hf.time_rotary` reproduces. :func:`rope.hf.install` and the text side of
patch leave vision rotary modules to this module, even where a family names one ``rotary_emb``
(:func:`is_vision_rotary`).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import _checks
from ..apply import exact_cos_sin
from ..axial import llama4_vision_positions, pair_cos_sin
from ..frequencies import inv_freq
from ..rotation import round_once
from . import coordinates, grid, time_rotary
from .embedding import Float32Frequencies
from .probing import FREQUENCY_ULPS, PROBE_FLOAT32, PROBE_TOLERANCE, first_other_frequency, output_gap

ORDERS = {"ascending": "theta_0, theta_1, ..., theta_(n-1)",
          "even_odd": "theta_0, theta_2, ..., then theta_1, theta_3, ... (Pixtral)"}
"""The orders in which a vision module may hold its n frequencies in ``inv_freq``."""

_PROBE_POSITIONS = 16
_FAR = ((1000, 3), (5, 4099))  # rows past the grid: a swapped axis shows at once
_MAX_SCALED = 2.0**62  # |M| below it, so that M = p 2^s is an int64


def _order(theta: torch.Tensor, order: str) -> torch.Tensor:
    return theta if order == "ascending" else torch.cat([theta[0::2], theta[1::2]])


def axial_frequencies(rope_theta: float, pairs: int, order: str = "ascending") -> torch.Tensor:
    """The n = ``pairs`` frequencies of one axis, theta_j = b^(-j/n), float32, from rope's
    registered ``axial`` type for a head of width 4n (:mod:`rope.axial`), in ``order``
    (:data:`ORDERS`).

    Args:
        rope_theta: the base b, > 1.
        pairs: n, the frequencies per axis, >= 1.
        order: ``"ascending"`` or ``"even_odd"``.
    """
    pairs = _checks.integer("pairs", pairs, minimum=1)
    _checks.choice("order", order, ORDERS)
    theta, _ = inv_freq({"rope_type": "axial", "rope_theta": rope_theta}, 4 * pairs)
    return _order(theta[:pairs], order)


def exact_positions(position_ids: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions, frequencies)`` whose products are ``position_ids * theta`` exactly, with
    integer positions, as :func:`rope.apply.exact_cos_sin` takes them: integer position ids and
    float32 ``theta`` as they are; float position ids p = M 2^-s (s the fewest fraction bits that
    make every M an integer) as M and theta 2^-s in float64 (both exact). Float positions cost a
    few reads of the device (s, and the checks of the values); integer ones none.

    Args:
        position_ids: integer or floating positions, any shape.
        theta: float32 frequencies ``[n]``.
    """
    _checks.tensor("position_ids", position_ids)
    if position_ids.dtype.is_complex or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must be an integer or floating tensor, got {position_ids.dtype}")
    if not position_ids.dtype.is_floating_point:
        return _checks.integer_tensor("position_ids", position_ids), theta
    values = position_ids.to(torch.float64)
    if values.numel() == 0:
        return values.to(torch.int64), theta
    if not bool(torch.isfinite(values).all()):
        raise ValueError("position_ids must hold finite values (no NaN or inf)")
    mantissa, exponent = torch.frexp(values)  # values = mantissa 2^exponent, 0.5 <= |mantissa| < 1
    digits = (mantissa * 2.0**53).to(torch.int64)  # exact: the 53-bit significand
    _, lowest = torch.frexp((digits & -digits).to(torch.float64))  # 2^(trailing zero bits), its exponent + 1
    bits = torch.where(values == 0, 0, 53 - exponent - (lowest - 1)).clamp_min(0)
    shift = int(bits.max())
    scaled = torch.ldexp(values, torch.tensor(shift, dtype=torch.int32, device=values.device))
    if float(scaled.abs().max()) >= _MAX_SCALED:
        raise ValueError(f"position_ids: as integers times 2^-{shift} (the fraction bits they carry) they exceed "
                         "2^62, beyond int64's exact positions")
    if shift == 0:
        return scaled.to(torch.int64), theta
    frequencies = torch.ldexp(theta.to(torch.float64), torch.tensor(-shift, dtype=torch.int32, device=theta.device))
    small = frequencies[frequencies != 0].abs()
    if small.numel() and float(small.min()) < 2.0**-100:
        raise ValueError(f"position_ids carry {shift} fraction bits: theta 2^-{shift} falls below 2^-100, where rope's "
                         "exact angles stop")
    return scaled.to(torch.int64), frequencies


class VisionRotaryEmbedding(Float32Frequencies):
    """The drop-in for transformers' axial vision rotary modules (``Qwen2VLVisionRotaryEmbedding``
    and the 32 others of its form: module docstring). ``forward(x, position_ids)`` takes
    ``position_ids`` ``[..., axes]`` (integer, or float: :func:`exact_positions`) on x's device
    and returns ``(cos, sin)``: for axis a and frequency j the entries a cos(p_a theta_j) and
    a sin(p_a theta_j) (a = ``attention_scaling``), angles reduced exactly, in float64, laid out
    by ``layout`` (the stock class's ``recomposition_frequencies``), rounded once to ``dtype``
    (``None``: ``x.dtype``). ``inv_freq`` stays float32 whatever the module is cast to.

    Build it with :func:`reproduce`, which reads a stock module and checks the result.

    Args:
        theta: the float32 frequencies ``[n]``, in the stock module's order (:func:`axial_frequencies`).
        layout: the stock class's ``recomposition_frequencies`` (a function of ``(module, freq)``
            that only moves and repeats entries of freq ``[..., axes, n]``).
        attention_scaling: the attention factor a, > 0.
        dtype: the dtype of the tables (``None``: x's).
        position_dims: how many dimensions precede the axes in the position ids the family passes:
            1 (``[N, axes]``) or 2 (Gemma 4's ``[batch, N, axes]``).
        source: the stock class's name, for ``repr``.
        config: the stock module's config, kept for readers of ``module.config`` (not read here).
    """

    def __init__(self, theta: torch.Tensor, layout: Callable, *, attention_scaling: float = 1.0,
                 dtype: torch.dtype | None = torch.float32, position_dims: int = 1, source: str = "",
                 config: Any = None):
        super().__init__()
        _checks.finite_frequencies("theta", theta)
        if not callable(layout):
            raise TypeError(f"layout must be callable (recomposition_frequencies), got {type(layout).__name__}")
        self.attention_scaling = _checks.number("attention_scaling", attention_scaling, positive=True)
        self.tables_dtype = None if dtype is None else _checks.dtype_choice("dtype", dtype, _checks.FLOAT_DTYPES)
        self.position_dims = _checks.integer("position_dims", position_dims, minimum=1, maximum=2)
        self.layout = layout
        self.source = source
        self.config = config
        self.register_buffer("inv_freq", theta.detach().clone(), persistent=False)

    def extra_repr(self) -> str:
        dtype = "x.dtype" if self.tables_dtype is None else str(self.tables_dtype).removeprefix("torch.")
        return f"{self.source or 'axial'}, pairs={self.inv_freq.numel()}, tables={dtype}"

    def pair_cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a cos and a sin of every axis's angle p_a theta_j, reduced exactly, float64
        ``position_ids.shape + (n,)``: the tables before the layout.

        Args:
            position_ids: integer or float positions ``[..., axes]``.
        """
        positions, theta = exact_positions(position_ids, self.inv_freq.to(position_ids.device))
        cos, sin = exact_cos_sin(positions, theta)
        return cos * self.attention_scaling, sin * self.attention_scaling

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _checks.float_tensor("x", x)
        _checks.tensor("position_ids", position_ids)
        _checks.same_device("x", x, position_ids=position_ids)
        dtype = x.dtype if self.tables_dtype is None else self.tables_dtype
        cos, sin = self.pair_cos_sin(position_ids)
        return round_once(self.layout(self, cos), dtype), round_once(self.layout(self, sin), dtype)


class VisionComplexRotaryEmbedding(nn.Module):
    """The drop-in for Llama 4's ``Llama4VisionRotaryEmbedding`` (rope type ``mllama4``):
    ``forward(hidden_states)`` returns ``freqs_ci``, complex64 ``[s^2 + 1, 1, 2n]`` for a square
    grid of side s and n = head_dim / 4: row r holds exp(i x theta_j) for j < n and
    exp(i y theta_j) after, (x, y) the 1-based column and row of patch r and (0, 0) for the class
    token last (:func:`rope.axial.llama4_vision_positions`), theta_j = b^(-4j/head_dim)
    (rope's ``mllama4`` type); the angles reduced exactly, cos and sin each rounded once from
    float64. The table keeps complex64 whatever the module is cast to.

    Args:
        num_patches: s^2, a square number.
        head_dim: the vision heads' width, a multiple of 4.
        rope_theta: the base b, > 1.
    """

    def __init__(self, num_patches: int, head_dim: int, rope_theta: float):
        super().__init__()
        positions = llama4_vision_positions(num_patches)
        theta, _ = inv_freq({"rope_type": "mllama4", "rope_theta": rope_theta}, head_dim)
        pairs = theta.numel() // 2
        cos, sin = pair_cos_sin(positions, theta[:pairs], theta[pairs:])
        self.register_buffer("freqs_ci", torch.complex(cos.float(), sin.float())[:, None, :], persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """Casts move ``freqs_ci`` but keep it complex64 (``.to(torch.bfloat16)`` would drop its
        imaginary part): the table is moved to the device ``fn`` moves an empty tensor to, and
        never passed to ``fn``."""
        table = self._buffers.pop("freqs_ci")
        device = fn(torch.empty(0, device=table.device)).device
        super()._apply(fn, recurse)
        self._buffers["freqs_ci"] = table.to(device)
        return self

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        _checks.tensor("hidden_states", hidden_states)
        return self.freqs_ci.to(hidden_states.device)


VISION_MODULES = (VisionRotaryEmbedding, VisionComplexRotaryEmbedding, *grid.GRID_MODULES,
                  *coordinates.COORDINATE_MODULES, time_rotary.TimeRotaryEmbedding)
"""rope's vision rotary module classes."""


def _is_axial(module: nn.Module) -> bool:
    return callable(getattr(type(module), "compute_axial_rope_parameters", None))


def _is_llama4(module: nn.Module) -> bool:
    return callable(getattr(type(module), "_compute_freqs_ci", None)) and "freqs_ci" in module._buffers


def is_vision_rotary(module: nn.Module) -> bool:
    """Whether ``module`` is a vision rotary module, transformers' (a class with
    ``compute_axial_rope_parameters``, Llama 4's ``_compute_freqs_ci``, an image-grid module:
    :func:`rope.hf.grid.is_grid_rotary`, a coordinate encoder:
    :func:`rope.hf.coordinates.is_coordinate_rotary`, or MusicFlamingo's rotary time module:
    :func:`rope.hf.time_rotary.is_time_rotary`) or rope's.

    Args:
        module: any module.
    """
    return (isinstance(module, VISION_MODULES) or _is_axial(module) or _is_llama4(module) or grid.is_grid_rotary(module)
            or coordinates.is_coordinate_rotary(module) or time_rotary.is_time_rotary(module))


def _refuse(name: str, module: nn.Module, why: str) -> ValueError:
    return ValueError(f"vision: {name} ({type(module).__name__}) is not reproduced: {why}; it stays transformers'")


def _rope_parameters(name: str, module: nn.Module) -> Mapping:
    config = getattr(module, "config", None)
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, Mapping):
        raise _refuse(name, module, "it has no config.rope_parameters mapping to read its rope type and base from")
    return params


def _frequencies(name: str, module: nn.Module) -> torch.Tensor:
    """rope's axial frequencies for ``module``, in the order of its ``inv_freq``, or the refusal
    naming what differs."""
    params = _rope_parameters(name, module)
    if params.get("rope_type") != "axial":
        raise _refuse(name, module, f"its config's rope_type is {params.get('rope_type')!r}, not 'axial'")
    theirs = module._buffers.get("inv_freq")
    if not isinstance(theirs, torch.Tensor) or theirs.dim() != 1 or theirs.numel() == 0:
        raise _refuse(name, module, "it has no 1-D inv_freq buffer")
    if theirs.dtype != torch.float32:
        cast = " (the model was cast, which rounds transformers' frequencies; patch before casting)" \
            if theirs.dtype in (torch.float16, torch.bfloat16) else ""
        raise _refuse(name, module, f"its inv_freq is {str(theirs.dtype).removeprefix('torch.')}, not float32{cast}")
    try:
        ours = {order: axial_frequencies(params.get("rope_theta"), theirs.numel(), order) for order in ORDERS}
    except (TypeError, ValueError) as err:
        raise _refuse(name, module, f"rope's axial type refuses its rope_theta ({_checks.first_line(err, 120)})") \
            from err
    for theta in ours.values():
        if first_other_frequency(theirs, theta) is None:
            return theta
    theta, j = ours["ascending"], first_other_frequency(theirs, ours["ascending"])
    raise _refuse(name, module, f"its inv_freq[{j}] = {float(theirs[j]):.9g} is not rope's axial frequency "
                                f"b^(-{j}/{theta.numel()}) = {float(theta[j]):.9g} (b = {params.get('rope_theta')}), "
                                "nor in Pixtral's even-then-odd order: another width or formula")


def _position_dims(name: str, module: nn.Module, layout: Callable, pairs: int) -> int:
    """How many dimensions precede the axes in the family's position ids (1 or 2), read from its
    layout applied to coded entries: the layout must be a gather, each output column one
    (axis, j) entry of every position's own row, both axes and every j used (Pixtral turns h by
    the first half of its frequencies and w by the second)."""
    rows = pairs + 3  # differs from the sizes of the other dimensions
    codes = torch.arange(rows * 2 * pairs, dtype=torch.float64).reshape(rows, 2, pairs)
    for dims in (1, 2):
        try:
            out = layout(module, codes if dims == 1 else codes[None])
        except Exception:  # this position form does not fit the layout: try the next
            continue
        if not (isinstance(out, torch.Tensor) and out.dim() >= 2 and out.shape[-2] == rows
                and out[..., 0, 0].numel() == 1 and out.dtype == torch.float64):  # [1, ..., N, width]: SAM adds a 1
            continue
        out = out.reshape(rows, -1)
        row, entry = torch.div(out, 2 * pairs, rounding_mode="floor"), out.remainder(2 * pairs)
        used = set(entry[0].long().tolist())
        if (torch.equal(out, out.round()) and torch.equal(row, torch.arange(rows, dtype=torch.float64)[:, None]
                                                          .expand_as(row))
                and bool((entry == entry[:1]).all()) and {e % pairs for e in used} == set(range(pairs))
                and {e // pairs for e in used} == {0, 1}):
            return dims
    raise _refuse(name, module, f"its {layout.__name__} is not a rearrangement of the h and w tables ([N, 2, n] or "
                                "[1, N, 2, n]) into [1, ..., N, width]: rope cannot lay out exact tables with it")


def probe_positions(position_dims: int, axes: int = 2, device=None) -> torch.Tensor:
    """The positions :func:`reproduce` compares tables at: each axis a fixed shuffle of 0 .. 15,
    then rows (1000, 3) and (5, 4099) (a third axis, if any, repeats the first); ``[18, axes]``,
    or ``[1, 18, axes]`` for ``position_dims`` 2.

    Args:
        position_dims: 1 or 2 (:class:`VisionRotaryEmbedding`).
        axes: the number of axes, >= 2.
        device: where the positions go.
    """
    gen = torch.Generator().manual_seed(0)
    grid = torch.stack([torch.randperm(_PROBE_POSITIONS, generator=gen) for _ in range(2)], dim=-1)
    positions = torch.cat([grid, torch.tensor(_FAR)])
    positions = torch.cat([positions, positions[:, :1].expand(-1, axes - 2)], dim=-1)
    return (positions if position_dims == 1 else positions[None]).to(device)


def _called(name: str, module: nn.Module, *args):
    """``module(*args)`` on a deep copy (the model's own module is never called), or the refusal."""
    try:
        return copy.deepcopy(module)(*args)
    except Exception as err:  # it does not follow the form it was read as
        raise _refuse(name, module, f"calling a copy of it failed ({type(err).__name__}: "
                                    f"{_checks.first_line(err, 120)})") from err


def _reproduce_axial(name: str, module: nn.Module, device) -> VisionRotaryEmbedding:
    theta = _frequencies(name, module)
    layout = getattr(type(module), "recomposition_frequencies", None)
    if not callable(layout):
        raise _refuse(name, module, "its class has no recomposition_frequencies method to lay out tables with")
    position_dims = _position_dims(name, module, layout, theta.numel())
    scaling = getattr(module, "attention_scaling", None)
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not scaling > 0:
        raise _refuse(name, module, f"its attention_scaling is {scaling!r}, not a number > 0")
    positions = probe_positions(position_dims, device=device)
    x = torch.zeros(1, dtype=torch.float64, device=device)
    theirs = _called(name, module, x, positions)
    returned = theirs[0].dtype if isinstance(theirs, (tuple, list)) and theirs and isinstance(
        theirs[0], torch.Tensor) else None
    new = VisionRotaryEmbedding(theta, layout, attention_scaling=float(scaling), position_dims=position_dims,
                                dtype=None if returned == torch.float64 else torch.float32,
                                source=type(module).__name__, config=module.config).to(device)
    allowance = new.layout(new, positions[..., None].abs().double() * theta.double().to(device)
                           * (PROBE_FLOAT32 * float(scaling)))
    gap = output_gap(theirs, new(x, positions), allowance, same_dtype=True)
    if gap is None or gap > PROBE_TOLERANCE:
        got = "other shapes or dtypes" if gap is None else f"tables off by {gap:.3g} beyond float32's error"
        raise _refuse(name, module, f"{got} at probe positions: its forward is not the axial form "
                                    "(position_ids[..., None] * inv_freq, cos and sin, recomposition_frequencies)")
    return new


def _reproduce_llama4(name: str, module: nn.Module, device) -> VisionComplexRotaryEmbedding:
    params = _rope_parameters(name, module)
    config = module.config
    try:
        new = VisionComplexRotaryEmbedding((config.image_size // config.patch_size) ** 2,
                                           config.hidden_size // config.num_attention_heads, params.get("rope_theta"))
    except (AttributeError, TypeError, ValueError) as err:
        raise _refuse(name, module, f"its config does not give rope's mllama4 table ({type(err).__name__}: "
                                    f"{_checks.first_line(err, 120)})") from err
    theirs = module._buffers["freqs_ci"]
    if theirs.dtype != torch.complex64 or theirs.shape != new.freqs_ci.shape:
        raise _refuse(name, module, f"its freqs_ci is {str(theirs.dtype).removeprefix('torch.')} "
                                    f"{list(theirs.shape)}, not complex64 {list(new.freqs_ci.shape)} (a cast drops "
                                    "its imaginary part: patch before casting)")
    positions = llama4_vision_positions(new.freqs_ci.shape[0] - 1).amax(dim=-1).double()
    allowance = positions[:, None, None] * PROBE_FLOAT32 + PROBE_TOLERANCE  # angles of at most (s + 1) theta_0
    gap = (theirs.detach().cpu() - new.freqs_ci).abs().double() - allowance
    if float(gap.max()) > 0:
        raise _refuse(name, module, f"its freqs_ci differs from rope's mllama4 table by {float(gap.max()):.3g} beyond "
                                    "float32's error: another layout or frequencies")
    return new.to(device)


def reproduce(name: str, module: nn.Module) -> nn.Module:
    """rope's replacement for a transformers vision rotary module (:func:`is_vision_rotary`),
    checked: :class:`VisionRotaryEmbedding` for the axial modules, whose frequencies must equal
    rope's (:func:`axial_frequencies`), whose layout must be a rearrangement, and whose (cos, sin)
    at :func:`probe_positions` (called on a copy with a float64 x) must equal rope's within
    :data:`PROBE_TOLERANCE` beyond float32's error (2^-20 ``|p| theta_j`` per entry);
    :class:`VisionComplexRotaryEmbedding` for
    Llama 4's, whose ``freqs_ci`` must equal rope's likewise; :func:`rope.hf.grid.reproduce` for
    the image-grid modules; :func:`rope.hf.coordinates.reproduce` for the coordinate encoders;
    :func:`rope.hf.time_rotary.reproduce` for the rotary time module. On the module's device.

    Raises ``ValueError`` naming the module and what differs where rope does not reproduce it.

    Args:
        name: the module's qualified name in its model, for messages.
        module: a transformers vision rotary module.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if grid.is_grid_rotary(module):
        return grid.reproduce(name, module)
    if coordinates.is_coordinate_rotary(module):
        return coordinates.reproduce(name, module)
    if time_rotary.is_time_rotary(module):
        return time_rotary.reproduce(name, module)
    device = next((buffer.device for buffer in module.buffers()), None)
    if _is_llama4(module):
        return _reproduce_llama4(name, module, device)
    if not _is_axial(module):
        raise _refuse(name, module, "it is not a vision rotary module of the axial or mllama4 form")
    return _reproduce_axial(name, module, device)


@dataclass(frozen=True, eq=False)
class VisionReplacement:
    """One vision rotary module swapped: ``name`` (qualified, in the model) from ``old``
    (transformers') to ``new`` (rope's, :func:`reproduce`).

    Args:
        name: the module's qualified name.
        old: transformers' module.
        new: rope's module.
    """

    name: str
    old: nn.Module
    new: nn.Module


def vision_rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every transformers vision rotary module of ``model`` (:func:`is_vision_rotary`, rope's
    left out) with its qualified name, once per name where a module is held under several.

    Args:
        model: a ``torch.nn.Module``.
    """
    return [(name, module) for name, module in model.named_modules(remove_duplicate=False)
            if name and is_vision_rotary(module) and not isinstance(module, VISION_MODULES)]


def owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every module that holds a vision rotary module of ``model``
    (:func:`vision_rotary_modules`), each once.

    Args:
        model: a ``torch.nn.Module``.
    """
    held = {name.rpartition(".")[0] for name, _ in vision_rotary_modules(model)}
    return [(name, model.get_submodule(name)) for name in sorted(held)]


def vision_replacements(model: nn.Module) -> tuple[tuple[VisionReplacement, ...], tuple[tuple[str, str], ...]]:
    """The vision rotary modules of ``model`` that rope reproduces, each with its checked
    replacement (one per module, however many names hold it), and ``(name, reason)`` for the
    others, each also named in a ``UserWarning``. The model is not changed.

    Args:
        model: a ``torch.nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    done, left, made = [], [], {}
    for name, module in vision_rotary_modules(model):
        if id(module) not in made:
            try:
                made[id(module)] = reproduce(name, module)
            except ValueError as err:
                made[id(module)] = str(err)
        new = made[id(module)]
        if isinstance(new, str):
            left.append((name, new))
            warnings.warn(new, UserWarning, stacklevel=3)
        else:
            done.append(VisionReplacement(name, module, new))
    return tuple(done), tuple(left)


def _held(model: nn.Module, name: str) -> nn.Module | None:
    """The module at ``name`` in ``model``, or ``None`` where it is gone."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _put(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent), attribute, module)


def swap(model: nn.Module, replacements: tuple[VisionReplacement, ...]) -> None:
    """Put each replacement's new module in place of its old one; all or none (a failure undoes
    the swaps before it and raises).

    Args:
        model: the model the replacements were made for.
        replacements: from :func:`vision_replacements`.
    """
    done = []
    try:
        for r in replacements:
            _put(model, r.name, r.new)
            done.append(r)
    except BaseException:
        for r in done:
            _put(model, r.name, r.old)
        raise


def moved(model: nn.Module, replacements: tuple[VisionReplacement, ...]) -> list[str]:
    """The names whose module is no longer the one :func:`swap` put in.

    Args:
        model: the model.
        replacements: what :func:`swap` put in.
    """
    return [r.name for r in replacements if _held(model, r.name) is not r.new]


def restore(model: nn.Module, replacements: tuple[VisionReplacement, ...]) -> None:
    """Put each old module back, moved to the device its replacement is on now.

    Args:
        model: the model.
        replacements: what :func:`swap` put in.
    """
    for r in replacements:
        device = next((buffer.device for buffer in r.new.buffers()), None)
        _put(model, r.name, r.old if device is None else r.old.to(device))


def position_ids(module: nn.Module, positions: torch.Tensor) -> torch.Tensor:
    """Position ids for an axial vision module (transformers' or rope's) with every axis at
    ``positions`` (int64 ``[n]``): ``[n, 2]``, or ``[1, n, 2]`` for a family that passes a batch
    dimension (:class:`VisionRotaryEmbedding`'s ``position_dims``). Raises ``ValueError`` for a
    module whose layout is not a rearrangement.

    Args:
        module: an axial vision rotary module.
        positions: int64 ``[n]``.
    """
    if isinstance(module, VisionRotaryEmbedding):
        dims = module.position_dims
    else:
        dims = _position_dims(type(module).__name__, module, type(module).recomposition_frequencies,
                              module.inv_freq.numel())
    ids = positions[:, None].expand(-1, 2)
    return ids if dims == 1 else ids[None]


__all__ = ["FREQUENCY_ULPS", "ORDERS", "PROBE_TOLERANCE", "VISION_MODULES", "VisionComplexRotaryEmbedding",
           "VisionReplacement", "VisionRotaryEmbedding", "axial_frequencies", "exact_positions", "is_vision_rotary",
           "moved", "owners", "position_ids", "probe_positions", "reproduce", "restore", "swap", "vision_replacements",
           "vision_rotary_modules"]
