"""Where a model's rotary tables are, how :func:`rope.hf.diagnose` reads them, and their exact
reference.

:func:`sources` finds them; :func:`reader` opens one, trying the forms below in turn and taking
the first whose tables at the positions ``first`` to ``first + 7`` match ``a cos(p theta_i)`` and
``a sin(p theta_i)`` of its frequencies theta_i, each column to the pair it is closest to, within
:data:`LAYOUT_TOLERANCE` times a (:class:`Reader`): which pair each column holds (``rotate_half``,
interleaved, partial, M-RoPE's or a vision module's sections) is read there, not assumed, and
every frequency must be held by some column (all columns near one slow pair are no table of
positions). A called module is read again at those positions in reverse order, so that one
that rotates positions 0..n-1 whatever it is given is not taken for another form. Every form
gives the tables as the model makes them, in its dtype, and the model's own frequencies,
computed as its code does in float32 (or float64 where its code does), so that a cast of the
model, which rounds its buffers, does not hide in the reference (but for form 3, whose
frequencies are its weights: the cast weights are then its frequencies).

1. **A rotary module called with positions** (rope's, a module with an ``inv_freq`` buffer, a
   module whose class names rotary or RoPE): ``module(x, position_ids[, layer_type])`` with ``x``
   in the model dtype and the first position-ids shape it takes of ``[1, n]``, M-RoPE's
   ``[3, 1, n]`` and the 2-D vision modules' ``[n, 2]`` and ``[1, n, 2]`` (Qwen2-VL, Pixtral,
   SAM 3, Gemma 4's vision tower, rope's :class:`rope.hf.grid.FeatureGridRotaryEmbedding` in
   EfficientLoFTR: rows of (h, w)): the same position p on every axis, so each
   column is cos or sin of p theta_i for one pair i of one axis, the per-axis reference. The
   frequencies: its ``inv_freq`` as its class computes it from its config (the class rebuilt
   from the config of the module or of its nearest ancestor that has one, where that gives the
   same settings and frequencies that round to the module's own), else its own buffer; rope's
   modules keep float32 frequencies; a at the module's ``attention_scaling``.
2. **A rotary module called with a sequence**: ``module(hidden_states)`` rotates positions 0 to
   L - 1 for a length-L input (wav2vec2-Conformer, wav2vec2-BERT, CLVP), called with
   ``hidden_states`` of the length one past the largest position read, returning ``(cos, sin)``
   stacked in one tensor, or the angles themselves, whose cos and sin the model then takes in
   their dtype (as here). The frequencies as in 1.
3. **A coordinate encoder** (a module named for positions whose one submodule is a bias-free
   ``nn.Linear`` of 2 coordinates): ``module(coordinates)`` with coordinates ``[1, n, 2]``
   in the model dtype, whose angles are that Linear of them (LightGlue's keypoint encoder, 2-D
   Fourier features): its weights are the frequencies, learned (no formula): with p on both
   axes, theta_i is the sum of row i of the weight, exact in float64. rope's atom rotary module
   (:class:`rope.hf.coordinates.AtomRotaryEmbedding`, in a patched EsmFold2) likewise:
   ``module(ref_pos, ref_space_uid, dtype)`` with atoms at (p, p, p) ``[1, n, 3]`` in float32
   and space id p ``[1, n]``, so that each pair turns by p times its frequency: rope's float32
   frequencies, each axis's spatial ones, then the space id's, then 0 for the pairs it leaves
   unturned (transformers' module holds no frequencies to read: unread).
4. **An image grid**: ``module(pixel_values)`` (DINOv3, Sapiens2, EoMT-DINOv3, and rope's
   :class:`rope.hf.grid.PatchCentreRotaryEmbedding` in their place) rotates patch (i, j) of an
   N x N grid by 2 pi c theta at the patch centres c = (2i + 1)/N - 1 of each axis: read on one
   image of the configured N = image_size / patch_size patches a side (fewer with a smaller
   ``limit``), position i being patch (i, i); the reference's angle 2 pi c theta is formed in
   float64 (within 2^-50 of exact: ``|2 pi c theta|`` <= 2 pi ``|theta|``). The frequencies as in 1.
5. **A precomputed table**: a buffer or weight held in a modeling module that mentions rotary,
   of rows ``[sin | cos]`` (row 0 is K zeros then K ones: GPT-J's and CodeGen's
   ``embed_positions``, RoFormer's sinusoidal positions) or complex ``e^(i p theta)`` (any
   complex buffer: ``freqs_cis``, Llama 4 vision's ``freqs_ci``). Row p is position p, or, where
   the rows do not match so, on a square grid of S^2 (+ 1 class token) rows in row-major order,
   row (p - o)(S + 1) is patch (p, p) at position p on both axes, o = 0 or 1 (Llama 4 vision
   counts from 1). The frequencies are the default RoPE formula theta_i = base^(-2i/d) with d
   twice the table's pairs per axis and the base of the config (``rope_parameters`` or
   ``rope_theta``, ``rotary_emb_base``, ``rotary_embedding_base``), else 10000 (GPT-J, CodeGen
   and RoFormer name none): in float32 as torch computes it,
   ``1 / base ** (arange(0, d, 2) / d)``, or in float64, whichever the table's first 1024
   positions are closer to in mean square (GPT-J and CodeGen compute in float32, RoFormer in
   float64 with numpy: a float32 table of float32 angles is within 2^-24 p theta of the first, one
   rounded from float64 within half a unit of the second, and the two differ by up to
   2^-25 p theta); a = 1. Positions end with the table.

A place that none of these reads (a relative-position encoding with an ``inv_freq`` buffer, a
sinusoid added to the input: not rotary tables) gets the reason the first form tried gave, and
how many others failed.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .. import _checks
from ..angles import cos_sin
from . import vision
from .clvp import RotaryAngleTable
from .embedding import ROTARY_MODULES, LayerTypeRotaryEmbedding, RotaryEmbedding
from .self_rotating import StackedRotaryTable

LAYOUT_TOLERANCE = 0.05
"""How far (times the attention factor) a column may be from its pair's exact values at the first
eight positions and still be read as that pair: more than a bfloat16 table of frequencies rounded
to bfloat16 is off there (7 theta 2^-9 + 2^-8 < 0.02), less than neighbouring pairs differ."""

MAP_POSITIONS = 8
"""The positions ``first`` to ``first + 7`` decide a form and which pair each column holds."""

PRECISION_POSITIONS = 1024
"""A precomputed table's first positions that decide between its float32 and float64 frequencies."""

DEFAULT_BASE = 10000.0
"""The RoPE base of a precomputed table whose config names none (GPT-J, CodeGen, RoFormer)."""

_BASE_KEYS = ("rope_theta", "rotary_emb_base", "rotary_embedding_base")


@dataclass(frozen=True)
class Source:
    """A place that makes rotary tables: a module (forms 1-4 of :mod:`rope.hf.tables`) or a
    table tensor of a module (form 5).

    Args:
        name: the qualified name, of the module or of the tensor.
        module: the module (for a table, the module holding it).
        tensor: the table's attribute name on ``module``, or ``None`` for a module.
        config: the config of the module or of its nearest ancestor with one (``None``: none).
    """

    name: str
    module: nn.Module
    tensor: str | None
    config: object


@functools.cache
def _mentions_rotary(module_name: str) -> bool:
    """Whether the source of the Python module ``module_name`` (a class's modeling module) mentions rotary."""
    try:
        return "rotary" in inspect.getsource(sys.modules[module_name]).lower()
    except (KeyError, OSError, TypeError):  # a module without source (built-in, interactive): no evidence
        return False


def _is_table(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` looks like a precomputed rotary table: complex, or real rows whose
    first is K zeros then K ones (``[sin | cos]`` at position 0)."""
    if tensor.is_complex():
        return tensor.dim() >= 2
    if not tensor.is_floating_point() or tensor.dim() < 2 or tensor.shape[-1] % 2 or tensor.shape[0] < MAP_POSITIONS:
        return False
    first = tensor.detach().reshape(tensor.shape[0], -1)[0]
    half = first.shape[0] // 2
    return bool((first[:half] == 0).all() and (first[half:] == 1).all())


def _rotary_class(module: nn.Module) -> bool:
    """Whether the class names a rotary (or RoPE) embedding or encoding (not an attention that uses one)."""
    name = type(module).__name__.lower()
    return ("rotary" in name or "rope" in name) and any(word in name for word in ("embed", "encod", "posit"))


def _has_inv_freq(module: nn.Module) -> bool:
    return any(name.endswith("inv_freq") for name, _ in module.named_buffers(recurse=False))


def _coordinate_linear(module: nn.Module) -> nn.Linear | None:
    """The one bias-free ``nn.Linear`` of 2 coordinates of a module named for positions (form 3),
    or ``None``; rope's :class:`rope.hf.coordinates.CoordinateRotaryEmbedding` holds the model's."""
    if isinstance(module, vision.coordinates.COORDINATE_MODULES):
        return module.projector
    if "posit" not in type(module).__name__.lower():
        return None
    linears = [m for m in module.children() if isinstance(m, nn.Linear)]
    if len(linears) == 1 and linears[0].bias is None and linears[0].in_features == 2:
        return linears[0]
    return None


def sources(model: nn.Module) -> list[Source]:
    """The places in ``model`` that make rotary tables, outermost only (a rotary module's own
    submodules and tensors are its parts): rope's modules, modules with a buffer named
    ``inv_freq`` or ``<layer type>_inv_freq``, modules whose class names a rotary or RoPE
    embedding and that hold no buffer (one that holds a table is read as that table),
    coordinate encoders (form 3), and precomputed tables (form 5) in modeling modules that
    mention rotary. Each comes with the config nearest to it."""
    found: list[Source] = []
    configs: dict[str, object] = {}
    for name, module in model.named_modules():
        parent = name.rpartition(".")[0] if name else None
        own = getattr(module, "config", None)
        configs[name] = own if own is not None else configs.get(parent)
        if any(name.startswith(f"{s.name}.") or not s.name for s in found if s.tensor is None):
            continue
        if (isinstance(module, ROTARY_MODULES) or _has_inv_freq(module) or _coordinate_linear(module) is not None
                or (_rotary_class(module) and not any(True for _ in module.buffers(recurse=False)))):
            found.append(Source(name, module, None, configs[name]))
            continue
        tensors = [*module.named_buffers(recurse=False), *module.named_parameters(recurse=False)]
        tables = [t for t, value in tensors if _is_table(value)]
        if tables and _mentions_rotary(type(module).__module__):
            found += [Source(f"{name}.{t}" if name else t, module, t, configs[name]) for t in tables]
    return found


def _first_error(errors: list[tuple[str, BaseException]]) -> str:
    """The errors of the forms tried, the first one quoted."""
    form, err = errors[0]
    more = f" (and {len(errors) - 1} other forms)" if len(errors) > 1 else ""
    return f"{form}: {type(err).__name__}: {_checks.first_line(err, 160)}{more}"


def _columns(tensor: torch.Tensor, n: int, axis: int) -> torch.Tensor:
    """``tensor`` float64 ``[rows, n, width]`` on the CPU, its position axis ``axis`` (from the end)."""
    if tensor.dim() < 2 or tensor.shape[axis] != n:
        raise ValueError(f"its tables have shape {tuple(tensor.shape)}, with no axis of the {n} positions")
    return tensor.detach().movedim(axis, -2).to("cpu", torch.float64).reshape(-1, n, tensor.shape[-1])


def _position_axis(tensor: torch.Tensor, n: int) -> int:
    """The last axis but the width's of size n (from the end): where a table holds its positions."""
    for axis in range(-2, -tensor.dim() - 1, -1):
        if tensor.shape[axis] == n:
            return axis
    raise ValueError(f"its tables have shape {tuple(tensor.shape)}, with no axis of the {n} positions")


def _select(out, axis: int, positions: torch.Tensor):
    """``out``'s tensors (in tuples too) at ``positions`` on ``axis`` (from the end)."""
    if isinstance(out, (tuple, list)):
        return type(out)(_select(t, axis, positions) for t in out)
    return out.index_select(out.dim() + axis, positions.to(out.device)) if isinstance(out, torch.Tensor) else out


def _outputs(out) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """The ways to read a module's output as ``(cos, sin)``: a pair (inside a 1-tuple too), one
    complex table, cos and sin stacked on a first axis of 2, or the angles."""
    if isinstance(out, (tuple, list)) and len(out) == 1 and isinstance(out[0], (tuple, list)):
        out = out[0]
    if isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out):
        return [("(cos, sin)", *out)]
    if isinstance(out, torch.Tensor) and out.is_complex():
        return [("complex", out.real, out.imag)]
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        stacked = [("cos and sin stacked", out[0], out[1])] if out.dim() > 1 and out.shape[0] == 2 else []
        return [*stacked, ("angles", out.cos(), out.sin())]
    raise ValueError(f"it returns {type(out).__name__}, not (cos, sin), a complex table or angles")


class Reader:
    """One source's tables at given positions, and their exact reference.

    Attributes:
        form: how the tables are read (:mod:`rope.hf.tables`).
        reference: where the reference's frequencies come from.
        first: the first position it can read.
        last: the last position it can read (``None``: any).
        note: what limits the reading (``""``: nothing).
        pairs: which pair each table column holds (int64 ``[width]``), once opened.
    """

    form = ""
    reference = ""
    first = 0
    last: int | None = None
    note = ""
    pairs: torch.Tensor

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` at ``positions`` (int64 ``[n]``) as the model makes them, float64 ``[rows, n, width]``."""
        raise NotImplementedError

    def frequencies(self, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The reference theta_i (float32 or float64, CPU) and attention factor a at ``positions``."""
        raise NotImplementedError

    def prepare(self, positions: list[int]) -> None:
        """Get ready to read all of ``positions`` (a sequence module reads them in one call)."""

    def exact(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``a cos(p theta_i)``, ``a sin(p theta_i)`` float64 ``[n, pairs]`` with the angle reduced
        exactly (:func:`rope.angles.cos_sin`, within 2^-52), and a."""
        theta, attention = self.frequencies(positions)
        cos, sin = cos_sin(positions, theta)
        return cos * attention, sin * attention, attention

    def open(self) -> Reader:
        """Read which pair each column holds at the first :data:`MAP_POSITIONS` positions;
        raise ``ValueError`` where a column matches none. Returns itself."""
        if self.last is not None and self.last - self.first + 1 < MAP_POSITIONS:
            raise ValueError(f"it holds {self.last - self.first + 1} positions, fewer than {MAP_POSITIONS}")
        positions = torch.arange(self.first, self.first + MAP_POSITIONS)
        got_cos, got_sin = self.tables(positions)
        cos, sin, attention = self.exact(positions)
        cost = ((got_cos[:, 1:, :, None] - cos[1:, None, :]).abs() + (got_sin[:, 1:, :, None] - sin[1:, None, :]).abs())
        best, pairs = cost.amax(dim=(0, 1)).min(dim=1)  # [width, pairs] -> the closest pair per column
        worst = float(best.max())
        if worst > LAYOUT_TOLERANCE * max(abs(attention), 1e-30):
            raise ValueError(f"its tables at positions {self.first}-{self.first + MAP_POSITIONS - 1} match none of "
                             f"its frequencies (a column is off by {worst:.3g}): another layout or convention")
        exact = torch.stack((cos[1:], sin[1:]))  # [2, positions, pairs]
        held = (exact[:, :, pairs, None] == exact[:, :, None, :]).all(dim=(0, 1)).any(dim=0)  # [pairs]
        if not held.all():  # e.g. all columns near one low frequency: a table of no positions
            raise ValueError(f"its tables at positions {self.first}-{self.first + MAP_POSITIONS - 1} hold only "
                             f"{int(held.sum())} of its {len(held)} frequencies")
        self.pairs = pairs
        return self


def _settings(module: nn.Module) -> dict:
    """A module's plain settings: its public attributes that are numbers, strings or None, but
    ``training``."""
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k != "training"
            and (v is None or isinstance(v, (bool, int, float, str)))}


def same(a: Source, b: Source) -> bool:
    """Whether two sources make the same tables: the same class, and the same RoPE configuration
    and layout (rope's modules) or config object and settings (transformers'), and the same
    buffers and parameters; for tables, the same tensor."""
    if type(a.module) is not type(b.module) or (a.tensor is None) != (b.tensor is None):
        return False
    if a.tensor is not None:
        return _equal({"": getattr(a.module, a.tensor)}, {"": getattr(b.module, b.tensor)})
    if isinstance(a.module, ROTARY_MODULES):
        ours, theirs = (dict((name, (m.rope_config, m.tables, m.head_dim)) for name, m in module.named_modules()
                             if isinstance(m, RotaryEmbedding)) for module in (a.module, b.module))
        if ours != theirs:
            return False
    elif getattr(a.module, "config", None) is not getattr(b.module, "config", None) or (
            _settings(a.module) != _settings(b.module)):
        return False
    return all(_equal(dict(getattr(a.module, kind)()), dict(getattr(b.module, kind)()))
               for kind in ("named_buffers", "named_parameters"))


def _equal(ours: dict, theirs: dict) -> bool:
    """Whether two name -> tensor maps hold the same names and tensors (dtype, shape, values)."""
    return ours.keys() == theirs.keys() and all(
        ours[k].dtype == theirs[k].dtype and ours[k].shape == theirs[k].shape
        and torch.equal(ours[k].detach().cpu(), theirs[k].detach().cpu()) for k in ours)


def layer_types(source: Source) -> list[str | None]:
    """The layer types a source makes tables for: rope's per-type modules' types, a transformers
    module's ``layer_types`` that have a ``<layer type>_inv_freq``, else ``[None]``."""
    module = source.module
    if source.tensor is not None:
        return [None]
    if isinstance(module, LayerTypeRotaryEmbedding):
        return list(module.layer_types)
    types = getattr(module, "layer_types", None)
    if isinstance(types, (list, tuple, set, dict)):
        found = [t for t in types if isinstance(t, str) and isinstance(getattr(module, f"{t}_inv_freq", None),
                                                                        torch.Tensor)]
        if found:
            return sorted(found)
    return [None]


class _Frequencies:
    """A rotary module's reference frequencies (forms 1, 2 and 4): rope's own, its ``inv_freq``
    as its class computes it from its config, or its own buffer; or (form 3) its Linear's weights."""

    def __init__(self, module: nn.Module, config, layer_type: str | None):
        self.layer_type = layer_type
        self.rope = isinstance(module, ROTARY_MODULES)
        self.atoms = isinstance(module, vision.coordinates.AtomRotaryEmbedding)
        self.linear = None if self.rope or _has_inv_freq(module) else _coordinate_linear(module)
        if self.rope or self.atoms:
            self.module, self.source = module, "rope's float32 frequencies"
        elif self.linear is not None:
            self.module, self.source = module, "its Linear's weights (learned), summed over the axes"
        elif not isinstance(getattr(module, self._name, None), torch.Tensor):
            raise ValueError(f"it has no {self._name} buffer, nor a Linear of coordinates: no frequencies to read")
        else:
            self.module, self.source = self._rebuilt(module, config)
            if isinstance(module, (*vision.VISION_MODULES, StackedRotaryTable,
                                   RotaryAngleTable)):  # rope's: float32 frequencies
                self.source = "rope's float32 frequencies"

    @property
    def _name(self) -> str:
        return "inv_freq" if self.layer_type is None else f"{self.layer_type}_inv_freq"

    def _rebuilt(self, module: nn.Module, config):
        """Its class rebuilt from ``config`` where that module is the same (the same settings, and
        frequencies that round to the module's own), else a copy of the module itself."""
        own = getattr(module, self._name).detach().to("cpu")
        if config is not None:
            try:
                with torch.device("cpu"):
                    fresh = type(module)(config)
                theta = getattr(fresh, self._name)
                if (_settings(fresh) == _settings(module) and theta.dtype in (torch.float32, torch.float64)
                        and theta.shape == own.shape and torch.equal(theta.to(own.dtype), own)):
                    return fresh, "its class rebuilt from its config"
            except Exception:  # another constructor: its own buffers are the reference
                pass
        stored = str(own.dtype).removeprefix("torch.")
        return copy.deepcopy(module).to("cpu"), f"its own {self._name} (stored in {stored})"

    def update(self, call) -> None:
        """Let the reference see the call's positions (transformers' dynamic types update their
        ``inv_freq`` in forward): ``call(module)`` calls it as the model's module was called."""
        if not self.rope and not self.atoms and self.linear is None:
            call(self.module)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        if self.rope:
            embedding = self.module if self.layer_type is None else self.module.layer_types[self.layer_type]
            theta, attention = RotaryEmbedding.frequencies(embedding, positions.to(embedding.inv_freq.device))
            return theta.detach().to("cpu"), float(attention)
        if self.linear is not None:
            return self.linear.weight.detach().to("cpu", torch.float64).sum(dim=1), 1.0
        if self.atoms:  # its pairs' order: x, y, z (the spatial frequencies each), the space id, unturned
            spatial, uid = (t.detach().to("cpu") for t in (self.module.spatial_inv_freq, self.module.uid_inv_freq))
            return torch.cat((spatial.repeat(3), uid, spatial.new_zeros(self.module.num_inactive_channels))), 1.0
        theta = getattr(self.module, self._name).detach().to("cpu")
        attention = None if self.layer_type is None else getattr(self.module, f"{self.layer_type}_attention_scaling",
                                                                 None)
        attention = getattr(self.module, "attention_scaling", 1.0) if attention is None else attention
        return (theta if theta.dtype == torch.float64 else theta.float()), float(attention)


@dataclass(frozen=True)
class _Call:
    """One way to call a rotary module (forms 1-3): ``arguments(positions, dtype)`` gives the
    arguments before the layer type; ``sequence``: it rotates positions 0..L-1 for a length L."""

    form: str
    arguments: Callable[[torch.Tensor, torch.dtype], tuple]
    sequence: bool = False
    takes_layer_type: bool = True


def _pairs_of(positions: torch.Tensor) -> torch.Tensor:
    return torch.stack((positions, positions), dim=-1)


_CALLS = (
    _Call("called with position ids [1, n]", lambda p, dtype: (torch.zeros(1, dtype=dtype, device=p.device), p[None])),
    _Call("called with M-RoPE position ids [3, 1, n]",
          lambda p, dtype: (torch.zeros(1, dtype=dtype, device=p.device), p[None].expand(3, 1, -1))),
    _Call("called with 2-D position ids [n, 2]",
          lambda p, dtype: (torch.zeros(1, dtype=dtype, device=p.device), _pairs_of(p)), takes_layer_type=False),
    _Call("called with 2-D position ids [1, n, 2]",
          lambda p, dtype: (torch.zeros(1, dtype=dtype, device=p.device), _pairs_of(p)[None]), takes_layer_type=False),
    _Call("called with coordinates [1, n, 2]", lambda p, dtype: (_pairs_of(p)[None].to(dtype),),
          takes_layer_type=False),
    _Call("called with a sequence (hidden states [1, L, 1])",
          lambda p, dtype: (torch.zeros((), dtype=dtype, device=p.device).expand(1, int(p.max()) + 1, 1),),
          sequence=True, takes_layer_type=False),
    _Call("called with atom coordinates [1, n, 3] and space ids [1, n]",
          lambda p, dtype: (p[None, :, None].expand(1, -1, 3).to(torch.float32), p[None], dtype),
          takes_layer_type=False),
)


class CallReader(Reader):
    """Forms 1-3: a copy of the module (transformers' dynamic module keeps state) called in the
    first of :data:`_CALLS` whose output reads as tables of its frequencies."""

    def __init__(self, source: Source, layer_type: str | None, dtype: torch.dtype):
        self.layer_type, self.dtype = layer_type, dtype
        self.module = copy.deepcopy(source.module)
        self.device = next((t.device for t in source.module.buffers()), None) or next(
            (t.device for t in source.module.parameters()), torch.device("cpu"))
        self.theta = _Frequencies(source.module, source.config, layer_type)
        self.reference = self.theta.source
        self.call: _Call | None = None
        self.output = 0
        self.axis = -2
        self.cached: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None = None

    def _output(self, call: _Call, positions: torch.Tensor):
        ids = positions.to(self.device)
        arguments = call.arguments(ids, self.dtype)
        if self.layer_type is not None:
            arguments = (*arguments, self.layer_type)
        return self.module(*arguments)

    def _read(self, out, positions: torch.Tensor):
        if self.call.sequence:  # the rows of positions 0..L-1 asked for, before any arithmetic on them
            out = _select(out, self.axis, positions)
        _, cos, sin = _outputs(out)[self.output]
        return tuple(_columns(t, len(positions), self.axis) for t in (cos, sin))

    def prepare(self, positions: list[int]) -> None:
        if self.call.sequence:  # one call for all: each computes every position below its length
            everything = torch.tensor(sorted(set(positions)), dtype=torch.int64)
            try:
                self.cached = everything, self._read(self._output(self.call, everything), everything)
            except Exception:  # too long for it: read in calls of each octave, whose failure is reported
                self.cached = None

    def tables(self, positions):
        if self.cached is not None:
            everything, (cos, sin) = self.cached
            index = torch.searchsorted(everything, positions)
            if bool((index < len(everything)).all()) and torch.equal(everything[index.clamp(max=len(everything) - 1)],
                                                                       positions):
                return cos[:, index], sin[:, index]
        return self._read(self._output(self.call, positions), positions)

    def frequencies(self, positions):
        if self.call is not None and not self.call.sequence:
            self.theta.update(lambda module: module(*self.call.arguments(positions, torch.float32),
                                                    *(() if self.layer_type is None else (self.layer_type,))))
        return self.theta(positions)

    def open(self) -> CallReader:
        errors = []
        positions = torch.arange(MAP_POSITIONS)
        for call in _CALLS:
            if self.layer_type is not None and not call.takes_layer_type:
                continue
            try:
                out = self._output(call, positions)
                ways = _outputs(out)
            except Exception as err:  # this call does not fit the module: the next one
                errors.append((call.form, err))
                continue
            for index, (way, cos, _) in enumerate(ways):
                try:
                    n = MAP_POSITIONS
                    self.axis = _position_axis(cos, n)
                    self.call, self.output = call, index
                    super().open()
                    self._check_order()
                    self.form = call.form + ("" if way == "(cos, sin)" else f", returning {way}")
                    return self
                except Exception as err:  # not this reading: the next one
                    self.call = None
                    errors.append((f"{call.form}, read as {way}", err))
        raise ValueError(_first_error(errors))


    def _check_order(self) -> None:
        """Raise unless the tables follow the positions asked for: read again at the first
        positions in reverse order (a module that rotates positions 0..n-1 whatever it is given,
        e.g. a sequence module called with coordinates, fails here)."""
        positions = torch.arange(MAP_POSITIONS).flip(0)
        got_cos, got_sin = self.tables(positions)
        cos, sin, attention = self.exact(positions)
        worst = max(float((got - exact[:, self.pairs]).abs().max()) for got, exact in ((got_cos, cos), (got_sin, sin)))
        if worst > LAYOUT_TOLERANCE * max(abs(attention), 1e-30):
            raise ValueError(f"its tables do not follow the positions asked for (off by {worst:.3g} for positions "
                             "in reverse order)")


class GridReader(Reader):
    """Form 4: ``module(pixel_values)`` on one image of N x N patches; position i is patch (i, i)."""

    def __init__(self, source: Source, dtype: torch.dtype, limit: int):
        module, config = source.module, source.config
        if next(iter(inspect.signature(module.forward).parameters), None) != "pixel_values":
            raise ValueError("its forward takes no pixel_values")
        patch = getattr(config, "patch_size", None)
        patch = tuple(patch) if isinstance(patch, (tuple, list)) else (patch, patch)
        size = getattr(config, "image_size", None)
        size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        if not all(isinstance(v, int) and v > 0 for v in (*patch, *size)):
            raise ValueError("its config gives no image_size and patch_size")
        self.side = min(size[0] // patch[0], size[1] // patch[1])
        if limit + 1 < self.side:
            self.side = limit + 1
        else:
            self.note = f"one image of {self.side}x{self.side} patches (its configured size)"
        self.last = self.side - 1
        self.module, self.dtype, self.patch = copy.deepcopy(module), dtype, patch
        self.channels = getattr(config, "num_channels", 3)
        self.device = next((t.device for t in module.buffers()), torch.device("cpu"))
        self.theta = _Frequencies(module, config, None)
        self.reference, self.form = self.theta.source, f"called with an image of {self.side}x{self.side} patches"
        self.cached: tuple[torch.Tensor, torch.Tensor] | None = None

    def tables(self, positions):
        if self.cached is None:
            pixels = torch.zeros(1, self.channels, self.side * self.patch[0], self.side * self.patch[1],
                                 dtype=self.dtype, device=self.device)
            (_, cos, sin), *_ = _outputs(self.module(pixels))
            self.cached = tuple(_columns(t, self.side**2, -2) for t in (cos, sin))
        rows = positions * (self.side + 1)
        return self.cached[0][:, rows], self.cached[1][:, rows]

    def frequencies(self, positions):
        return self.theta(positions)

    def exact(self, positions):
        theta, attention = self.frequencies(positions)
        centre = (2 * positions.to(torch.float64) + 1) / self.side - 1
        angles = 2 * math.pi * centre[:, None] * theta.to(torch.float64)
        return torch.cos(angles) * attention, torch.sin(angles) * attention, attention


def _base(config) -> tuple[float, str]:
    """The RoPE base a config names, and where (form 5)."""
    for key in _BASE_KEYS:
        parameters = getattr(config, "rope_parameters", None)
        if key == "rope_theta" and isinstance(parameters, dict) and isinstance(parameters.get(key), (int, float)):
            return float(parameters[key]), "rope_parameters"
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), key
    return DEFAULT_BASE, "its config names none"


def default_frequencies(base: float, d: int, dtype: torch.dtype) -> torch.Tensor:
    """theta_i = base^(-2i/d), i < d/2: in float32 as torch computes it,
    ``1 / base ** (arange(0, d, 2) / d)``, or in float64."""
    exponents = torch.arange(0, d, 2, dtype=torch.int64).to(dtype) / d
    return 1.0 / (base ** exponents)


class TableReader(Reader):
    """Form 5: a precomputed table's rows, at the positions of one of its row layouts."""

    def __init__(self, source: Source):
        value = getattr(source.module, source.tensor).detach()
        table = value.reshape(value.shape[0], -1)
        if table.is_complex():
            self.cos, self.sin, self.form = table.real, table.imag, "a precomputed complex table"
        else:
            half = table.shape[1] // 2
            self.sin, self.cos, self.form = table[:, :half], table[:, half:], "a precomputed [sin | cos] table"
        self.rows = table.shape[0]
        self.base, where = _base(source.config)
        self.where = f"base {self.base:g} ({where})"
        self.grid: tuple[int, int] | None = None  # (side, offset)
        self.theta = torch.zeros(0)

    def _layout(self, grid: tuple[int, int] | None) -> None:
        self.grid = grid
        axes = 1 if grid is None else 2
        d = 2 * self.cos.shape[1] // axes
        self.theta = default_frequencies(self.base, d, torch.float32)
        if grid is None:
            self.first, self.last = 0, self.rows - 1
            self.note = f"a table of {self.rows:,} positions"
        else:
            side, offset = grid
            self.first, self.last = offset, side - 1 + offset
            self.note = f"a grid of {side}x{side} patches, read on its diagonal"
            self.form += f" on a {side}x{side} grid"
        self.d = d

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        if self.grid is None:
            return positions
        side, offset = self.grid
        return (positions - offset) * (side + 1)

    def tables(self, positions):
        rows = self.rows_of(positions).to(self.cos.device)
        return tuple(t[rows].to("cpu", torch.float64)[None] for t in (self.cos, self.sin))

    def frequencies(self, positions):
        return self.theta, 1.0

    def open(self) -> TableReader:
        side = math.isqrt(self.rows)
        layouts = [None] + ([(side, 0), (side, 1)] if self.rows in (side * side, side * side + 1) else [])
        form, errors = self.form, []
        for layout in layouts:
            self.form = form
            try:
                self._layout(layout)
                super().open()
                break
            except Exception as err:  # not this layout: the next one
                errors.append(("rows as positions" if layout is None else f"a {side}x{side} grid", err))
        else:
            raise ValueError(_first_error(errors))
        # float32 or float64 frequencies: whichever the first positions are closer to in mean square
        positions = torch.arange(self.first, min(self.last, self.first + PRECISION_POSITIONS - 1) + 1)
        got_cos, got_sin = self.tables(positions)
        squares = []
        for dtype in (torch.float32, torch.float64):
            self.theta = default_frequencies(self.base, self.d, dtype)
            cos, sin, _ = self.exact(positions)
            squares.append(float(((got_cos - cos[:, self.pairs]) ** 2 + (got_sin - sin[:, self.pairs]) ** 2).mean()))
        dtype = torch.float32 if squares[0] <= squares[1] else torch.float64
        self.theta = default_frequencies(self.base, self.d, dtype)
        self.reference = (f"base^(-2i/d), {self.where}, d = {self.d}, in {str(dtype).removeprefix('torch.')} "
                          "(the closer)")
        return self


def reader(source: Source, layer_type: str | None, dtype: torch.dtype, limit: int) -> Reader:
    """The opened :class:`Reader` of ``source`` for ``layer_type`` in ``dtype``: a precomputed
    table's (form 5), an image grid's (form 4, a module whose forward takes ``pixel_values``,
    to ``limit``), or a called module's (forms 1-3). Raises ``ValueError`` with the reason where
    none reads it."""
    if source.tensor is not None:
        return TableReader(source).open()
    forward = inspect.signature(source.module.forward).parameters
    if next(iter(forward), None) == "pixel_values":
        return GridReader(source, dtype, limit).open()
    return CallReader(source, layer_type, dtype).open()


__all__ = ["DEFAULT_BASE", "LAYOUT_TOLERANCE", "MAP_POSITIONS", "PRECISION_POSITIONS", "CallReader", "GridReader",
           "Reader", "Source", "TableReader", "default_frequencies", "layer_types", "reader", "same", "sources"]
