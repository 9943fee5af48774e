"""Exact rotary tables for transformers' image-grid rotary modules.

Some vision models turn each patch by where it sits in the image, read from the image itself:
their rotary module is called with the pixel values or a feature map, not with position ids.
transformers 5.23 has two such forms, which :func:`reproduce` replaces by rope's modules after
checking them against a copy of the model's:

* **patch centres** (:class:`PatchCentreRotaryEmbedding`: DINOv3's
  ``DINOv3ViTRopePositionEmbedding``, Sapiens2's ``Sapiens2RopePositionEmbedding``,
  EoMT-DINOv3's ``EomtDinov3RotaryEmbedding``; a class of a modeling module that defines
  ``get_patches_center_coordinates``). ``forward(pixel_values)`` for an image of h x w patches
  (``height // patch_height`` rows, ``width // patch_width`` columns) returns ``(cos, sin)``
  ``[h w, 4n]`` in ``pixel_values.dtype``. Patch (r, c), row-major, sits at the centre
  coordinates y = (2r + 1)/h - 1 and x = (2c + 1)/w - 1, normalised to [-1, 1]; entry
  a n + j of each table's first half (a = 0: y, a = 1: x; j < n) is the angle 2 pi y theta_j or
  2 pi x theta_j, and the second half repeats the first (``tile(2)``: Llama's ``rotate_half``
  pairs (i, i + 2n)). theta_j = b^(-j/n) (``1 / base ** arange(0, 1, 4 / head_dim)``,
  head_dim = 4n) is rope's registered ``axial`` type of the module's base b (its ``base``, else
  ``config.rope_parameters["rope_theta"]``). In training the module moves the coordinates as
  transformers does (``augment_patches_center_coordinates``, with the config's
  ``pos_embed_shift``, ``pos_embed_jitter``, ``pos_embed_rescale`` where set): it draws the same
  float32 random numbers from torch's generator (so the same seed gives the same draws) and
  forms (y + s_y) J_y R and (x + s_x) J_x R in float64, J = e^u and R = e^v of the drawn u and v.
  The attention rotates the last h w tokens only (the class and register tokens before them
  pass through): :func:`rope.hf.apply_rotary_pos_emb_patches`.
* **feature grid** (:class:`FeatureGridRotaryEmbedding`: EfficientLoFTR's
  ``EfficientLoFTRRotaryEmbedding``; a class of a modeling module that defines
  ``compute_embeddings``). ``forward(x)`` for a feature map ``[..., H, W]`` returns tables
  ``[1, h, w, 4n]`` in ``x.dtype``, h = (H - k) // s + 1 and w = (W - k) // s + 1 (k, s the
  config's ``q_aggregation_kernel_size`` and ``q_aggregation_stride``): grid cell (r, c) at the
  1-based integer positions i = r + 1, j = c + 1, and entries 4m, 4m + 1 the angle i theta_m,
  4m + 2, 4m + 3 the angle j theta_m (pairs (2i, 2i + 1), read by Cohere's
  ``apply_rotary_pos_emb``), theta_m = b^(-2m/(2n)) rope's ``default`` type of the config's
  ``rope_theta`` for the rotary width 2n (``head_dim * partial_rotary_factor``). Its attention
  turns one head of the whole hidden size, so 4n must be ``hidden_size``.

Accuracy: the patch centres' angle 2 pi c theta_j is formed in float64 as turns
t = ((2r + 1 - h) theta_j) / h (an exact product of an integer and a float32, one rounding),
reduced exactly to t - round(t) in [-1/2, 1/2], then times 2 pi; its cos and sin are within
2^-49 (1 + ``|t|``) of those of the exact angle (``|t|`` <= theta_0 = 1 without augmentation),
where transformers' float32 coordinates and products are off by up to about 2^-20 rad. The
feature grid's angles i theta_m are integer positions times float32 frequencies, reduced
exactly (:func:`rope.apply.exact_cos_sin`, within 2^-52). Either table is then rounded once
(:func:`rope.rotation.round_once`) to its dtype: every entry is within half a unit of its dtype
of the exact value, but for an entry within those bounds of a rounding boundary. The frequencies
stay float32 whatever the module is cast to. Nothing here is differentiable: the tables depend
on the input's shape, not its values (computed under ``torch.no_grad``).

:func:`rope.hf.patch` swaps these modules through :mod:`rope.hf.vision` (:func:`is_grid_rotary`
makes them vision rotary modules there), and :func:`rope.hf.unpatch` puts them back.
"""

from __future__ import annotations

import copy
import inspect
import math
import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .. import _checks
from ..apply import exact_cos_sin
from ..frequencies import inv_freq
from ..rotation import round_once
from .embedding import Float32Frequencies
from .probing import FREQUENCY_ULPS, PROBE_TOLERANCE, first_other_frequency

PROBE_GRID = (5, 7)
"""The grid :func:`reproduce` compares tables on: rows and columns of patches (or of the feature
grid); not square, so that swapped axes show."""

FORMS = {"patch_centres": "forward(pixel_values): patch centres normalised to [-1, 1] (DINOv3, Sapiens2, EoMT-DINOv3)",
         "feature_grid": "forward(x): a feature map's grid at 1-based integer positions (EfficientLoFTR)"}
"""The image-grid forms, by name."""

AUGMENTATIONS = ("pos_embed_shift", "pos_embed_jitter", "pos_embed_rescale")
"""The config keys of the patch centres' training augmentation."""

_FLOAT32 = 2.0**-20


def _pair(name: str, value) -> tuple[int, int]:
    """``(height, width)`` from an int or a pair of ints (transformers' ``patch_size``), each >= 1."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(values) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return tuple(_checks.integer(name, v, minimum=1) for v in values)


def centre_turns(rows: int, columns: int, theta: torch.Tensor) -> torch.Tensor:
    """The patch centres' angles in turns, 2 pi c theta_j / (2 pi) = c theta_j, float64
    ``[rows * columns, 2, n]`` (axis 0: y of row r, axis 1: x of column c, row-major), each
    ``((2r + 1 - rows) theta_j) / rows`` with one rounding (the product is exact).

    Args:
        rows: h, >= 0.
        columns: w, >= 0.
        theta: float32 (or float64) frequencies ``[n]``.
    """
    rows = _checks.integer("rows", rows, minimum=0)
    columns = _checks.integer("columns", columns, minimum=0)
    device, theta = theta.device, theta.to(torch.float64)
    y = (2 * torch.arange(rows, dtype=torch.float64, device=device) + 1 - rows)[:, None] * theta / max(rows, 1)
    x = (2 * torch.arange(columns, dtype=torch.float64, device=device) + 1 - columns)[:, None] * theta / max(columns, 1)
    return torch.stack((y[:, None].expand(-1, columns, -1), x[None].expand(rows, -1, -1)), dim=2).flatten(0, 1)


def turns_cos_sin(turns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of 2 pi t for float64 turns t: t reduced exactly to t - round(t) in [-1/2, 1/2]
    (exact in float64), then times 2 pi; within 2^-49 (1 + ``|t|``) of the exact values for t
    itself exact.

    Args:
        turns: float64 turns, any shape.
    """
    angles = (turns - torch.round(turns)) * (2 * math.pi)
    return torch.cos(angles), torch.sin(angles)


def augmented(coordinates: torch.Tensor, config: Any) -> torch.Tensor:
    """transformers' training augmentation of the patch centres (``augment_patches_center_coordinates``)
    on float64 ``coordinates`` ``[P, 2]``, with the same float32 draws from torch's generator,
    on the coordinates' device, in the same order: with ``config.pos_embed_shift`` s, (y, x) plus
    u ~ U(-s, s) ``[1, 2]``; with ``pos_embed_jitter`` J, times e^u, u ~ U(-ln J, ln J) ``[1, 2]``;
    with ``pos_embed_rescale`` R, times e^u, u ~ U(-ln R, ln R) ``[1]``; each formed in float64.

    Args:
        coordinates: float64 ``[P, 2]``.
        config: the module's config (``None``: no augmentation).
    """
    settings = {key: getattr(config, key, None) for key in AUGMENTATIONS}
    device = coordinates.device
    if settings["pos_embed_shift"] is not None:
        shift = _checks.number("config.pos_embed_shift", settings["pos_embed_shift"], minimum=0)
        drawn = torch.empty((1, 2), device=device, dtype=torch.float32).uniform_(-shift, shift)
        coordinates = coordinates + drawn.to(torch.float64)
    for key, shape in (("pos_embed_jitter", (1, 2)), ("pos_embed_rescale", (1,))):
        if settings[key] is not None:
            size = math.log(_checks.number(f"config.{key}", settings[key], minimum=1))
            drawn = torch.empty(shape, device=device, dtype=torch.float32).uniform_(-size, size)
            coordinates = coordinates * drawn.to(torch.float64).exp()
    return coordinates


class _GridTable(Float32Frequencies):
    """What both grid modules hold: the float32 frequencies ``inv_freq`` (kept through casts) and
    the stock module's config and class name."""

    def __init__(self, theta: torch.Tensor, config: Any, source: str):
        super().__init__()
        _checks.finite_frequencies("theta", theta)
        self.config = config
        self.source = source
        self.register_buffer("inv_freq", theta.detach().clone(), persistent=False)


class PatchCentreRotaryEmbedding(_GridTable):
    """The drop-in for transformers' patch-centre rotary modules (DINOv3's
    ``DINOv3ViTRopePositionEmbedding``, Sapiens2's, EoMT-DINOv3's: module docstring).
    ``forward(pixel_values)`` returns ``(cos, sin)`` ``[h w, 4n]``: cos and sin of 2 pi c theta_j
    at the patch centres c of each axis, in float64, rounded once to ``pixel_values.dtype``; in
    training, at the centres moved as transformers moves them (:func:`augmented`).

    Build it with :func:`reproduce`, which reads a stock module and checks the result.

    Args:
        theta: the float32 frequencies ``[n]`` (:func:`rope.hf.vision.axial_frequencies`).
        patch_size: the patch side, an int or ``(height, width)``.
        config: the stock module's config, read in training for the augmentation settings
            (:data:`AUGMENTATIONS`; ``None``: none).
        source: the stock class's name, for ``repr``.
    """

    def __init__(self, theta: torch.Tensor, patch_size, *, config: Any = None, source: str = ""):
        super().__init__(theta, config, source)
        self.patch_size = _pair("patch_size", patch_size)

    def extra_repr(self) -> str:
        return f"{self.source or 'patch centres'}, pairs={self.inv_freq.numel()}, patch_size={self.patch_size}"

    def pair_cos_sin(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every patch's angle on each axis, float64 ``[h w, 2, n]``: the tables
        before the layout (at the moved centres in training).

        Args:
            pixel_values: ``[batch, channels, height, width]``, floating (only its shape is read).
        """
        _checks.float_tensor("pixel_values", pixel_values)
        if pixel_values.dim() != 4:
            raise ValueError(f"pixel_values must be 4-D [batch, channels, height, width], got shape "
                             f"{tuple(pixel_values.shape)}")
        rows, columns = (size // patch for size, patch in zip(pixel_values.shape[-2:], self.patch_size))
        theta = self.inv_freq.to(pixel_values.device)
        if not self.training:
            return turns_cos_sin(centre_turns(rows, columns, theta))
        y = (2 * torch.arange(rows, dtype=torch.float64, device=theta.device) + 1) / max(rows, 1) - 1
        x = (2 * torch.arange(columns, dtype=torch.float64, device=theta.device) + 1) / max(columns, 1) - 1
        centres = torch.stack(torch.meshgrid(y, x, indexing="ij"), dim=-1).flatten(0, 1)
        return turns_cos_sin(augmented(centres, self.config)[:, :, None] * theta.to(torch.float64))

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.pair_cos_sin(pixel_values)
        return tuple(round_once(t.flatten(1, 2).tile(2), pixel_values.dtype) for t in (cos, sin))


class FeatureGridRotaryEmbedding(_GridTable):
    """The drop-in for EfficientLoFTR's ``EfficientLoFTRRotaryEmbedding`` (module docstring).
    ``forward(x)`` returns ``(cos, sin)`` ``[1, h, w, 4n]`` for the feature map x: cell (r, c)
    at the positions i = r + 1, j = c + 1, entries 4m, 4m + 1 cos or sin of i theta_m and 4m + 2,
    4m + 3 of j theta_m, reduced exactly in float64, rounded once to ``x.dtype``.
    ``forward(x, position_ids)`` gives the tables ``[..., 4n]`` of the integer positions
    ``[..., 2]`` (rows of (i, j)) instead, on x's device and in its dtype (what
    :func:`rope.hf.diagnose` reads; the model never passes them).

    Build it with :func:`reproduce`, which reads a stock module and checks the result.

    Args:
        theta: the float32 frequencies ``[n]``.
        kernel_size: k, the query aggregation's kernel, >= 1.
        stride: s, its stride, >= 1.
        config: the stock module's config, kept for readers of ``module.config`` (not read here).
        source: the stock class's name, for ``repr``.
    """

    def __init__(self, theta: torch.Tensor, kernel_size: int, stride: int, *, config: Any = None, source: str = ""):
        super().__init__(theta, config, source)
        self.kernel_size = _checks.integer("kernel_size", kernel_size, minimum=1)
        self.stride = _checks.integer("stride", stride, minimum=1)

    def extra_repr(self) -> str:
        return (f"{self.source or 'feature grid'}, pairs={self.inv_freq.numel()}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")

    def grid_positions(self, x: torch.Tensor) -> torch.Tensor:
        """The 1-based (i, j) of every cell of x's grid, int64 ``[1, h, w, 2]`` on x's device.

        Args:
            x: a feature map ``[..., H, W]``, floating (only its shape is read).
        """
        if x.dim() < 2:
            raise ValueError(f"x must be a feature map [..., height, width], got shape {tuple(x.shape)}")
        height, width = x.shape[-2:]
        if min(height, width) < self.kernel_size:
            raise ValueError(f"x: its feature map of {height} x {width} is smaller than the aggregation kernel "
                             f"({self.kernel_size}): no grid cell")
        rows, columns = ((size - self.kernel_size) // self.stride + 1 for size in (height, width))
        i = torch.arange(1, rows + 1, device=x.device)
        j = torch.arange(1, columns + 1, device=x.device)
        return torch.stack(torch.meshgrid(i, j, indexing="ij"), dim=-1)[None]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        _checks.float_tensor("x", x)
        if position_ids is None:
            positions = self.grid_positions(x)
        else:
            positions = _checks.integer_tensor("position_ids", position_ids)
            _checks.same_device("x", x, position_ids=positions)
            if positions.dim() == 0 or positions.shape[-1] != 2:
                raise ValueError(f"position_ids must be [..., 2] (rows of (i, j)), got shape {tuple(positions.shape)}")
        cos, sin = exact_cos_sin(positions, self.inv_freq.to(x.device))  # [..., 2, n]
        return tuple(round_once(t.transpose(-1, -2).flatten(-2).repeat_interleave(2, dim=-1), x.dtype)
                     for t in (cos, sin))


GRID_MODULES = (PatchCentreRotaryEmbedding, FeatureGridRotaryEmbedding)
"""rope's image-grid rotary module classes."""

_MARKERS = {"patch_centres": ("pixel_values", "get_patches_center_coordinates"),
            "feature_grid": ("x", "compute_embeddings")}


def form_of(module: nn.Module) -> str | None:
    """The :data:`FORMS` entry of a transformers image-grid rotary module (a module with an
    ``inv_freq`` buffer whose ``forward`` takes the one argument of the form, of a class in a
    modeling module that defines the form's function), of rope's modules too; else ``None``.

    Args:
        module: any module.
    """
    if isinstance(module, PatchCentreRotaryEmbedding):
        return "patch_centres"
    if isinstance(module, FeatureGridRotaryEmbedding):
        return "feature_grid"
    if not isinstance(module._buffers.get("inv_freq"), torch.Tensor):
        return None
    try:
        arguments = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):  # a forward without a signature: not this form
        return None
    modeling = sys.modules.get(type(module).__module__)
    for form, (argument, function) in _MARKERS.items():
        if arguments == [argument] and callable(getattr(modeling, function, None)):
            return form
    return None


def is_grid_rotary(module: nn.Module) -> bool:
    """Whether ``module`` is an image-grid rotary module, transformers' or rope's (:func:`form_of`).

    Args:
        module: any module.
    """
    return form_of(module) is not None


def _refuse(name: str, module: nn.Module, why: str) -> ValueError:
    return ValueError(f"vision: {name} ({type(module).__name__}) is not reproduced: {why}; it stays transformers'")


def _frequencies(name: str, module: nn.Module, rope_type: str, base, pairs_per_width: int) -> torch.Tensor:
    """rope's ``rope_type`` frequencies of ``base`` for ``module``'s n = ``inv_freq.numel()``
    (rotary width ``pairs_per_width`` n), checked against its ``inv_freq``, or the refusal."""
    theirs = module._buffers["inv_freq"]
    if theirs.dim() != 1 or theirs.numel() == 0:
        raise _refuse(name, module, f"its inv_freq has shape {tuple(theirs.shape)}, not [n] with n >= 1")
    if theirs.dtype != torch.float32:
        raise _refuse(name, module, f"its inv_freq is {str(theirs.dtype).removeprefix('torch.')}, not float32 (the "
                                    "model was cast, which rounds transformers' frequencies; patch before casting)")
    n = theirs.numel()
    try:
        theta = inv_freq({"rope_type": rope_type, "rope_theta": base}, pairs_per_width * n)[0][:n]
    except (TypeError, ValueError) as err:
        raise _refuse(name, module, f"rope's {rope_type} type refuses its base {base!r} "
                                    f"({_checks.first_line(err, 120)})") from err
    j = first_other_frequency(theirs, theta)
    if j is not None:
        raise _refuse(name, module, f"its inv_freq[{j}] = {float(theirs[j]):.9g} is not rope's {rope_type} frequency "
                                    f"b^(-{j}/{n}) = {float(theta[j]):.9g} (b = {base}): another width or formula")
    return theta


def _config(name: str, module: nn.Module) -> Any:
    config = getattr(module, "config", None)
    if config is None:
        raise _refuse(name, module, "it has no config to read its patch size, base and augmentation from")
    return config


def _called(name: str, module: nn.Module, *args):
    """A copy of ``module`` (the model's own is never called), in eval mode, called on ``args``; or the refusal."""
    try:
        return copy.deepcopy(module).eval()(*args)
    except Exception as err:  # it does not follow the form it was read as
        raise _refuse(name, module, f"calling a copy of it failed ({type(err).__name__}: "
                                    f"{_checks.first_line(err, 120)})") from err


def _compare(name: str, module: nn.Module, theirs, ours, allowance: float) -> None:
    """Refuse unless ``theirs`` is a ``(cos, sin)`` pair of ``ours``'s shapes and dtypes within
    ``allowance`` + :data:`PROBE_TOLERANCE`."""
    if not (isinstance(theirs, (tuple, list)) and len(theirs) == 2 and all(
            isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype for a, b in zip(theirs, ours))):
        shapes = [tuple(t.shape) for t in ours]
        raise _refuse(name, module, f"it returns no (cos, sin) pair of shapes {shapes} on the probe grid "
                                    f"{PROBE_GRID[0]} x {PROBE_GRID[1]}: another form")
    gap = max(float((a.double().cpu() - b.double().cpu()).abs().max()) for a, b in zip(theirs, ours))
    if gap > allowance + PROBE_TOLERANCE:
        raise _refuse(name, module, f"its tables on the probe grid {PROBE_GRID[0]} x {PROBE_GRID[1]} are off from "
                                    f"rope's by {gap:.3g} beyond float32's error: another layout, axis order or "
                                    "coordinates")


def _base(name: str, module: nn.Module, config: Any):
    base = getattr(module, "base", None)
    if base is None:
        parameters = getattr(config, "rope_parameters", None)
        base = parameters.get("rope_theta") if isinstance(parameters, Mapping) else None
    if base is None:
        raise _refuse(name, module, "neither its base nor its config's rope_parameters['rope_theta'] names a base")
    return base


def _reproduce_centres(name: str, module: nn.Module, device) -> PatchCentreRotaryEmbedding:
    config = _config(name, module)
    theta = _frequencies(name, module, "axial", _base(name, module, config), 4)
    try:
        patch = _pair("config.patch_size", getattr(config, "patch_size", None))
    except (TypeError, ValueError) as err:
        raise _refuse(name, module, _checks.first_line(err, 120)) from err
    new = PatchCentreRotaryEmbedding(theta, patch, config=config, source=type(module).__name__).to(device)
    pixels = torch.zeros(1, 1, PROBE_GRID[0] * patch[0], PROBE_GRID[1] * patch[1], dtype=torch.float64,
                         device=device)
    _compare(name, module, _called(name, module, pixels), new.eval()(pixels),
             _FLOAT32 * 2 * math.pi * float(theta.max()))
    return new.train(module.training)


def _reproduce_feature_grid(name: str, module: nn.Module, device) -> FeatureGridRotaryEmbedding:
    config = _config(name, module)
    parameters = getattr(config, "rope_parameters", None)
    rope_type = parameters.get("rope_type", "default") if isinstance(parameters, Mapping) else None
    if rope_type != "default":
        raise _refuse(name, module, f"its config's rope_type is {rope_type!r}, not 'default' (its forward drops the "
                                    "attention factor of other types: rope reproduces the default frequencies only)")
    theta = _frequencies(name, module, "default", _base(name, module, config), 2)
    try:
        kernel, stride = (_checks.integer(f"config.{key}", getattr(config, key, None), minimum=1)
                          for key in ("q_aggregation_kernel_size", "q_aggregation_stride"))
    except (TypeError, ValueError) as err:
        raise _refuse(name, module, _checks.first_line(err, 120)) from err
    new = FeatureGridRotaryEmbedding(theta, kernel, stride, config=config, source=type(module).__name__).to(device)
    hidden = getattr(config, "hidden_size", None)
    if hidden != 4 * theta.numel():
        raise _refuse(name, module, f"its config's hidden_size {hidden!r} is not 4 n = {4 * theta.numel()} for its "
                                    f"{theta.numel()} frequencies: the tables would not span the head")
    size = [new.kernel_size + (cells - 1) * new.stride for cells in PROBE_GRID]
    x = torch.zeros(1, 1, *size, dtype=torch.float64, device=device)
    _compare(name, module, _called(name, module, x), new(x), _FLOAT32 * max(PROBE_GRID) * float(theta.max()))
    return new.train(module.training)


def reproduce(name: str, module: nn.Module) -> nn.Module:
    """rope's replacement for a transformers image-grid rotary module (:func:`form_of`), checked:
    its ``inv_freq`` must be rope's frequencies to within :data:`FREQUENCY_ULPS` float32 ulps,
    and a copy of it (in eval mode) called on a :data:`PROBE_GRID` image (or feature map) of
    float64 zeros must return rope's tables within :data:`PROBE_TOLERANCE` beyond float32's
    error. On the module's device, in its training mode. Raises ``ValueError`` naming the module
    and what differs where rope does not reproduce it.

    Args:
        name: the module's qualified name in its model, for messages.
        module: a transformers image-grid rotary module.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    form = form_of(module)
    if form is None or isinstance(module, GRID_MODULES):
        raise _refuse(name, module, "it is not a transformers image-grid rotary module (rope.hf.grid.FORMS)")
    device = module._buffers["inv_freq"].device
    if form == "patch_centres":
        return _reproduce_centres(name, module, device)
    return _reproduce_feature_grid(name, module, device)


__all__ = ["AUGMENTATIONS", "FORMS", "FREQUENCY_ULPS", "GRID_MODULES", "PROBE_GRID", "PROBE_TOLERANCE",
           "FeatureGridRotaryEmbedding", "PatchCentreRotaryEmbedding", "augmented", "centre_turns", "form_of",
           "is_grid_rotary", "reproduce", "turns_cos_sin"]
