"""How precise a model's rotary tables are: :func:`diagnose` reads them as the model makes them and
measures them against exact angles.

For each rotary module of a model (a submodule with an ``inv_freq`` buffer, transformers' rotary
modules, or rope's own :class:`~rope.hf.RotaryEmbedding`), and for each layer type where it has
several (Gemma 3's sliding and full attention), :func:`diagnose` calls a copy of the module as
the model does, ``module(x, position_ids[, layer_type])`` with ``x`` in the model's dtype, at
every position below :data:`DENSE` and :data:`PER_OCTAVE` positions per octave above, up to
``limit`` (default the larger of 2^20 and four times ``max_position_embeddings``). Each call
holds the positions of one octave (and none across ``max_position_embeddings``), so that the
length-dependent rope types (``dynamic``, ``longrope``) read the length max(position_ids) + 1
of that call, as in a forward of that length. A vision tower's axial rotary module
(:mod:`rope.hf.vision`, transformers' or rope's) is called with position ids ``[n, 2]`` (or its
family's ``[1, n, 2]``) holding each position on both axes, h = w = m.

The reference is exact: ``a cos(m theta_i)`` and ``a sin(m theta_i)`` with the angle m theta_i
reduced modulo 2 pi exactly (:func:`rope.angles.cos_sin`, within 2^-52), where theta_i are the
model's own frequencies for that call, as its code computes them in float32 (the module's class
rebuilt from its config, so a cast of the model to bfloat16, which rounds the module's own
``inv_freq``, does not hide in the reference; rope's modules keep float32 frequencies), and a is
the module's attention factor (``attention_scaling``). Which pair i each table column holds
(``rotate_half``, interleaved, partial, M-RoPE with one position on every axis) is read from
the tables at positions 1 to 7, the column taking the pair its values are closest to.

The error of an entry v of exact value e is ``|v - e|`` in units of the model dtype's spacing at
``max(|e|, a/2)``: the last place of e, but never finer than at half the table's magnitude (an
entry near a zero of cos or sin is judged on the absolute scale of the rotation, which is what
attention sees). A table rounded once from exact values is within 0.5 units everywhere, so the
first position where an error exceeds ``threshold`` = 0.5 units is the first position at which the
table is no longer the exact one rounded to the dtype. Stock transformers computes the angle as a
float32 product, off by up to 2^-24 ``|m theta|``: a float32 model exceeds 0.5 units within the
first few positions, a bfloat16 one once that error starts to move roundings (a few hundred
positions) and by whole units from ``m theta`` near 2^16. Frequencies rounded to bfloat16
(2^-9 relative) are off by whole units of bfloat16 from the first positions.

A model whose attention keeps its table in a buffer, one row per position (GPT-J, CodeGen:
:data:`rope.hf.POSITION_TABLES`), has that table read instead, converted to the model dtype as
their attention converts it, at the positions it holds (to its last row, unless ``limit`` is
lower); its reference frequencies are rope's float32 ones of its config (GPT-J's code computes
the same values in float32), and its columns must be the sin and then the cos of each pair.

The error at positions between the samples above :data:`DENSE` is not read: the first position
found is the first sampled one, with the sample before it named. The reference itself is within
2^-52 relative, so float64 tables are measured to about one unit only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .. import _checks
from ..angles import cos_sin
from . import vision
from .embedding import ROTARY_MODULES, LayerTypeRotaryEmbedding, RotaryEmbedding
from .install import rotary_slots, table_embedding

DENSE = 1024
"""Every position below it is read."""

PER_OCTAVE = 64
"""Positions read per octave [2^k, 2^(k+1)) above :data:`DENSE`, evenly spaced."""

SHORTEST_LIMIT = 2**20
"""The default limit is the larger of this and four times ``max_position_embeddings``."""

LAYOUT_TOLERANCE = 0.05
"""How far (times the attention factor) a column may be from its pair's exact values at positions
1-7 and still be read as that pair: more than a bfloat16 table of frequencies rounded to bfloat16
is off there (7 theta 2^-9 + 2^-8 < 0.02), less than neighbouring pairs differ."""

_MAP_POSITIONS = 8


@dataclass(frozen=True)
class RotaryPrecision:
    """The precision of one rotary module's tables for one layer type (errors in units of the
    model dtype, :mod:`rope.hf.precision`); the numbers are ``None`` where ``note`` says why the
    tables were not read.

    Args:
        module: the module's qualified name in the model.
        layer_type: the layer type it was called with (``None``: it takes none).
        copies: the names of further modules with the same class, config and buffers (same tables).
        reference: where the exact reference's frequencies came from.
        length: the configured ``max_position_embeddings`` (``None``: none found).
        limit: the largest position read.
        worst_within: the largest error at positions below ``length`` (all read, without a length).
        worst_beyond: the largest error at positions from ``length`` on.
        worst_position: the position of the largest error.
        first_position: the first position read whose error exceeds the threshold (``None``: none).
        previous_position: the position read just before ``first_position`` (all read before it were within).
        note: why the tables were not read (or not to the limit), or ``""``.
    """

    module: str
    layer_type: str | None
    copies: tuple[str, ...]
    reference: str
    length: int | None
    limit: int | None
    worst_within: float | None
    worst_beyond: float | None
    worst_position: int | None
    first_position: int | None
    previous_position: int | None
    note: str = ""


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found: one :class:`RotaryPrecision` per rotary module and layer type
    (iterate, index or ``len`` it as that tuple), the dtype the tables were read in and the
    threshold; ``str()`` or :meth:`table` gives a Markdown table.

    Args:
        rows: one per rotary module and layer type.
        dtype: the model dtype the modules were called with (the unit of the errors).
        threshold: the error, in units, whose first excess each row reports.
    """

    rows: tuple[RotaryPrecision, ...]
    dtype: torch.dtype
    threshold: float

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]

    def table(self) -> str:
        """The rows as a Markdown table, under a line that gives the unit."""
        dtype = str(self.dtype).removeprefix("torch.")
        lines = [f"Rotary tables in {dtype}: error against exact angles in units of {dtype}'s spacing at the exact "
                 f"value (at least at half the attention factor); a table rounded once from exact values stays within "
                 f"0.5. Every position below {DENSE} read, then {PER_OCTAVE} per octave.", "",
                 f"| module | layer type | length | worst error below length | worst error beyond | at position "
                 f"| first position > {self.threshold:g} | reference |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in self.rows:
            name = f"`{row.module}`" + (f" (+{len(row.copies)} same)" if row.copies else "")
            if row.worst_within is None:
                lines.append(f"| {name} | {row.layer_type or '-'} | {_count(row.length)} | not read: {row.note} "
                             f"| | | | {row.reference} |")
                continue
            first = "none" if row.first_position is None else _count(row.first_position)
            if row.first_position is not None and row.previous_position not in (None, row.first_position - 1):
                first += f" (sample before: {_count(row.previous_position)})"
            beyond = "-" if row.worst_beyond is None else f"{row.worst_beyond:.3g} (to {_count(row.limit)})"
            note = f" ({row.note})" if row.note else ""
            lines.append(f"| {name} | {row.layer_type or '-'} | {_count(row.length)} | {row.worst_within:.3g} "
                         f"| {beyond}{note} | {_count(row.worst_position)} | {first} | {row.reference} |")
        return "\n".join(lines)

    __str__ = table


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The rotary modules of ``model`` with their qualified names: rope's modules and every
    module with a buffer named ``inv_freq`` or ``<layer type>_inv_freq``, outermost only (a rotary
    module's own submodules are its parts)."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") or not outer for outer, _ in found):
            continue
        if isinstance(module, ROTARY_MODULES) or any(
                buffer.endswith("inv_freq") for buffer, _ in module.named_buffers(recurse=False)):
            found.append((name, module))
    return found


def position_tables(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The position tables of ``model`` (:data:`rope.hf.POSITION_TABLES`: GPT-J's and CodeGen's
    ``embed_positions`` buffers) with their qualified names."""
    return [(f"{owner}.{attribute}" if owner else attribute, value) for owner, attribute, value in rotary_slots(model)
            if isinstance(value, torch.Tensor)]


def sample_positions(limit: int, length: int | None = None) -> list[int]:
    """The positions :func:`diagnose` reads up to ``limit``: every one below :data:`DENSE`,
    :data:`PER_OCTAVE` evenly spaced in each octave above, and ``length - 1``, ``length``,
    ``length + 1`` and ``limit``, sorted."""
    positions = set(range(min(DENSE, limit + 1)))
    low = DENSE
    while low <= limit:
        positions |= {low + (low * k) // PER_OCTAVE for k in range(PER_OCTAVE)}
        low *= 2
    if length is not None:
        positions |= {length - 1, length, length + 1}
    positions.add(limit)
    return sorted(p for p in positions if 0 <= p <= limit)


def _groups(positions: list[int], length: int | None) -> list[list[int]]:
    """``positions`` split at powers of two and at ``length``: one call each."""
    groups: dict[tuple[int, bool], list[int]] = {}
    for p in positions:
        groups.setdefault((p.bit_length(), length is not None and p >= length), []).append(p)
    return [groups[key] for key in sorted(groups, key=lambda key: groups[key][0])]


def _model_dtype(model: nn.Module) -> torch.dtype:
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.get_default_dtype()


def _config(module: nn.Module | None, model: nn.Module):
    config = getattr(module, "config", None)
    if config is not None:
        return config
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    return text() if callable(text) else config


def _length(config) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _layer_types(module: nn.Module) -> list[str | None]:
    if isinstance(module, LayerTypeRotaryEmbedding):
        return list(module.layer_types)
    types = getattr(module, "layer_types", None)
    if isinstance(types, (list, tuple, set, dict)):
        found = [t for t in types if isinstance(t, str) and isinstance(getattr(module, f"{t}_inv_freq", None),
                                                                        torch.Tensor)]
        if found:
            return sorted(found)
    return [None]


def _tables(out, rows_and_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` float64 ``[rows, n, width]`` on the CPU from a module's output."""
    if isinstance(out, torch.Tensor) and out.is_complex():
        cos, sin = out.real, out.imag
    elif isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out):
        cos, sin = out
    else:
        raise ValueError("it returns neither (cos, sin) nor one complex table")
    if cos.shape != sin.shape or cos.dim() < 2 or cos.shape[-2] != rows_and_positions:
        raise ValueError(f"its tables have shape {tuple(cos.shape)}, not [..., positions, width]")
    return tuple(t.detach().to("cpu", torch.float64).reshape(-1, *t.shape[-2:]) for t in (cos, sin))


class _Reader:
    """Calls one rotary module (a copy: transformers' dynamic module keeps state) and its
    reference for one layer type, positions in increasing calls."""

    def __init__(self, module: nn.Module, layer_type: str | None, dtype: torch.dtype):
        self.module, self.layer_type, self.dtype = copy.deepcopy(module), layer_type, dtype
        self.device = next((b.device for b in module.buffers()), torch.device("cpu"))
        self.rope = isinstance(module, ROTARY_MODULES)
        self.vision = vision.is_vision_rotary(module)
        self.reference, self.reference_source = self._reference(module)
        self.mrope: bool | None = None

    def _reference(self, module):
        """The module its reference frequencies are read from: its class rebuilt from its config
        where that module is the same (the same settings, and frequencies that round to the
        module's own), else a copy of the module itself."""
        if self.rope:
            return None, "rope's float32 frequencies"
        if isinstance(module, vision.VisionRotaryEmbedding):  # its inv_freq is rope's float32 frequencies
            return copy.deepcopy(module).to("cpu"), "rope's float32 frequencies"
        config = getattr(module, "config", None)
        if config is not None:
            try:
                with torch.device("cpu"):
                    fresh = type(module)(config)
                if _settings(fresh) == _settings(module) and self._rounds_to(self._theta_of(fresh), module):
                    return fresh, "its class rebuilt from its config"
            except Exception:  # another constructor: its own buffers are the reference
                pass
        stored = str(self._theta_of(module).dtype).removeprefix("torch.")
        return copy.deepcopy(module).to("cpu"), f"its own inv_freq (stored in {stored})"

    def _rounds_to(self, theta: torch.Tensor, module: nn.Module) -> bool:
        """Whether float32 or float64 ``theta`` rounded to the dtype of ``module``'s frequencies is them."""
        own = self._theta_of(module).detach().to("cpu")
        return theta.dtype in (torch.float32, torch.float64) and theta.shape == own.shape and torch.equal(
            theta.to(own.dtype), own)

    def _theta_of(self, module) -> torch.Tensor:
        name = "inv_freq" if self.layer_type is None else f"{self.layer_type}_inv_freq"
        return getattr(module, name)

    def _call(self, module, x, ids):
        return module(x, ids) if self.layer_type is None else module(x, ids, self.layer_type)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's ``(cos, sin)`` at ``positions`` (int64 ``[n]``), float64 ``[rows, n, width]``.
        The first call finds the position ids it takes: ``[1, n]``, or M-RoPE's ``[3, 1, n]``
        (the same position on every axis)."""
        ids = positions.to(self.device)[None]
        x = torch.zeros(1, dtype=self.dtype, device=self.device)
        if self.vision:  # h = w = m, in the family's form
            ids = vision.position_ids(self.module, positions.to(self.device))
            return _tables(self._call(self.module, x, ids), len(positions))
        if self.mrope is None:
            try:
                out = _tables(self._call(self.module, x, ids), len(positions))
            except Exception as err:  # perhaps M-RoPE's three rows; if not, its own error
                try:
                    out = _tables(self._call(self.module, x, ids.expand(3, 1, -1)), len(positions))
                except Exception:
                    raise err from None
                self.mrope = True
                return out
            self.mrope = False
            return out
        return _tables(self._call(self.module, x, ids.expand(3, 1, -1) if self.mrope else ids), len(positions))

    def frequencies(self, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The reference theta (float32 or float64, CPU) and attention factor at ``positions``."""
        if self.rope:
            embedding = self.module if self.layer_type is None else self.module.layer_types[self.layer_type]
            theta, attention = RotaryEmbedding.frequencies(embedding, positions.to(self.device))
            return theta.detach().to("cpu"), float(attention)
        ids = positions[None].expand(3, 1, -1) if self.mrope else positions[None]
        ids = vision.position_ids(self.reference, positions) if self.vision else ids
        self._call(self.reference, torch.zeros(1), ids)  # transformers' dynamic types update inv_freq here
        theta = self._theta_of(self.reference).detach().to("cpu")
        attention = None if self.layer_type is None else getattr(self.reference, f"{self.layer_type}_attention_scaling",
                                                                 None)
        attention = getattr(self.reference, "attention_scaling", 1.0) if attention is None else attention
        return (theta if theta.dtype == torch.float64 else theta.float()), float(attention)


class _TableReader:
    """Reads one position table (rows by position, sin then cos halves) and rope's float32
    frequencies of the model's config, which its rows hold: the interface of :class:`_Reader`."""

    reference_source = "rope's float32 frequencies of its config"

    def __init__(self, table: torch.Tensor, config, dtype: torch.dtype):
        self.table, self.dtype = table.detach(), dtype
        self.embedding = table_embedding(config, table.shape[-1])

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``positions`` (int64 ``[n]``) in the model dtype: ``(cos, sin)``, float64 ``[1, n, pairs]``."""
        rows = self.table.shape[0]
        if int(positions.max()) >= rows:
            raise IndexError(f"its table holds {rows} rows (positions 0-{rows - 1})")
        values = self.table[positions.to(self.table.device)].to(self.dtype).to("cpu", torch.float64)
        sin, cos = values.chunk(2, dim=-1)
        return cos[None], sin[None]

    def frequencies(self, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        return self.embedding.inv_freq, float(self.embedding.attention_scaling)


def _exact(positions: torch.Tensor, theta: torch.Tensor, attention: float) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin(positions, theta)
    return cos * attention, sin * attention


def _layout(reader: _Reader) -> torch.Tensor:
    """Which pair each table column holds (int64 ``[width]``), from positions 1 to 7."""
    positions = torch.arange(_MAP_POSITIONS)
    got_cos, got_sin = reader.tables(positions)
    theta, attention = reader.frequencies(positions)
    cos, sin = _exact(positions, theta, attention)
    cost = ((got_cos[:, 1:, :, None] - cos[1:, None, :]).abs() + (got_sin[:, 1:, :, None] - sin[1:, None, :]).abs())
    cost = cost.amax(dim=(0, 1))  # [width, pairs]
    best, pairs = cost.min(dim=1)
    worst = float(best.max())
    if worst > LAYOUT_TOLERANCE * max(abs(attention), 1e-30):
        raise ValueError(f"its tables at positions 1-7 match none of its frequencies (a column is off by {worst:.3g}): "
                         "another layout or convention")
    return pairs


def _units(exact: torch.Tensor, attention: float, eps: float) -> torch.Tensor:
    """The dtype's spacing at max(``|exact|``, a/2): eps 2^(floor(log2 x))."""
    magnitude = exact.abs().clamp_min(abs(attention) / 2)
    _, exponent = torch.frexp(magnitude)
    return torch.ldexp(torch.full_like(magnitude, eps), exponent - 1)


def _errors(reader: _Reader, positions: torch.Tensor, pairs: torch.Tensor, eps: float) -> torch.Tensor:
    """The largest error of each position's entries, in units (float64 ``[n]``)."""
    got_cos, got_sin = reader.tables(positions)
    theta, attention = reader.frequencies(positions)
    cos, sin = (t[:, pairs] for t in _exact(positions, theta, attention))
    if got_cos.shape[-1] != len(pairs):
        raise ValueError(f"its tables changed width ({got_cos.shape[-1]} columns, {len(pairs)} at positions 0-7)")
    errors = [((got - exact).abs() / _units(exact, attention, eps)).amax(dim=(0, 2))
              for got, exact in ((got_cos, cos), (got_sin, sin))]
    return torch.maximum(*errors)


def _read(name: str, copies: tuple[str, ...], reader: Callable, layer_type, dtype, length, limit,
          threshold, note: str = "") -> RotaryPrecision:
    """The row of one module (or table) and layer type, read by ``reader()`` (a :class:`_Reader`
    or :class:`_TableReader`); ``note`` says why it was read short of the limit asked."""
    eps = torch.finfo(dtype).eps
    try:
        reader = reader()
    except Exception as err:  # its frequencies cannot be read: reported, not raised
        return RotaryPrecision(name, layer_type, copies, "-", length, None, None, None, None, None, None,
                               f"its frequencies could not be read ({type(err).__name__}: {err})")
    try:
        pairs = _layout(reader)
    except Exception as err:  # it does not follow the (x, position_ids) contract: reported, not raised
        return RotaryPrecision(name, layer_type, copies, reader.reference_source, length, None, None, None, None, None,
                               None, f"{type(err).__name__}: {_checks.first_line(err, 160)}")
    read, errors = [], []
    for group in _groups(sample_positions(limit, length), length):
        positions = torch.tensor(group, dtype=torch.int64)
        try:
            errors.append(_errors(reader, positions, pairs, eps))
        except Exception as err:  # e.g. a cache of max_position_embeddings: read up to here
            quoted = _checks.first_line(err, 160)
            note = f"fails at positions {group[0]:,}-{group[-1]:,}: {type(err).__name__}: {quoted}"
            break
        read += group
    errors_all = torch.cat(errors) if errors else torch.zeros(0, dtype=torch.float64)
    within = [e for p, e in zip(read, errors_all.tolist()) if length is None or p < length]
    beyond = [e for p, e in zip(read, errors_all.tolist()) if length is not None and p >= length]
    worst = int(errors_all.argmax()) if len(read) else None
    over = (errors_all > threshold).nonzero().flatten().tolist()
    first = read[over[0]] if over else None
    previous = read[over[0] - 1] if over and over[0] > 0 else None
    return RotaryPrecision(name, layer_type, copies, reader.reference_source, length, read[-1] if read else None,
                           max(within) if within else None, max(beyond) if beyond else None,
                           None if worst is None else read[worst], first, previous, note)


def _settings(module: nn.Module) -> dict:
    """A module's plain settings: its public attributes that are numbers, strings or None, but
    ``training``."""
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k != "training"
            and (v is None or isinstance(v, (bool, int, float, str)))}


def _same(a: nn.Module, b: nn.Module) -> bool:
    """Whether two rotary modules make the same tables: the same class, and the same RoPE
    configuration and layout (rope's modules) or config object and settings (transformers'), and
    the same buffers."""
    if type(a) is not type(b):
        return False
    if isinstance(a, ROTARY_MODULES):
        ours, theirs = (dict((name, (m.rope_config, m.tables, m.head_dim)) for name, m in module.named_modules()
                             if isinstance(m, RotaryEmbedding)) for module in (a, b))
        if ours != theirs:
            return False
    elif getattr(a, "config", None) is not getattr(b, "config", None) or _settings(a) != _settings(b):
        return False
    ours, theirs = dict(a.named_buffers()), dict(b.named_buffers())
    return ours.keys() == theirs.keys() and all(
        ours[k].dtype == theirs[k].dtype and ours[k].shape == theirs[k].shape and torch.equal(ours[k].cpu(),
                                                                                              theirs[k].cpu())
        for k in ours)


def diagnose(model: nn.Module, *, dtype: torch.dtype | None = None, limit: int | None = None,
             threshold: float = 0.5) -> Diagnosis:
    """The precision of every rotary table a model makes: per rotary module and layer type, the
    worst error against exact angles (in units of the model dtype, :mod:`rope.hf.precision`)
    below and beyond ``max_position_embeddings``, and the first position whose error exceeds
    ``threshold``. Patched or not, covered by :func:`rope.hf.patch` or not; the model is not
    changed (copies of its rotary modules are called).

    Args:
        model: a transformers model (a ``torch.nn.Module`` with rotary modules: submodules with
            an ``inv_freq`` buffer, or rope's).
        dtype: the dtype to call the modules with and measure in (default: that of the model's
            first floating-point parameter).
        limit: the largest position read (default: the larger of 2^20 and four times each
            module's ``max_position_embeddings``).
        threshold: the error in units whose first excess is reported (0.5: the table is no longer
            the exact one rounded to the dtype).

    Returns:
        a :class:`Diagnosis`: its rows, and ``str()`` a Markdown table.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    if dtype is not None:
        dtype = _checks.dtype_choice("dtype", dtype, _checks.FLOAT_DTYPES)
    limit = _checks.optional_integer("limit", limit, minimum=_MAP_POSITIONS, maximum=2**62)
    threshold = _checks.number("threshold", threshold, minimum=0.0)
    found, tables = rotary_modules(model), position_tables(model)
    if not found and not tables:
        raise ValueError(f"model: {type(model).__name__} has no rotary module (no submodule with an inv_freq buffer, "
                         "nor rope's RotaryEmbedding) nor position table: nothing to diagnose")
    dtype = dtype or _model_dtype(model)
    if dtype not in _checks.FLOAT_DTYPES:
        raise ValueError(f"dtype: the model's parameters are {dtype}; pass dtype= one of {_checks.FLOAT_DTYPES}")
    groups: list[tuple[str, nn.Module, list[str]]] = []
    for name, module in found:
        same = next((group for group in groups if _same(group[1], module)), None)
        if same is None:
            groups.append((name, module, []))
        else:
            same[2].append(name)
    rows = []
    for name, module, copies in groups:
        length = _length(_config(module, model))
        module_limit = limit or max(SHORTEST_LIMIT, 4 * (length or 0))
        with torch.no_grad():
            rows += [_read(name, tuple(copies), lambda: _Reader(module, layer_type, dtype), layer_type, dtype, length,
                           module_limit, threshold) for layer_type in _layer_types(module)]
    table_groups: list[tuple[str, torch.Tensor, list[str]]] = []
    for name, table in tables:
        same = next((group for group in table_groups if _same_table(group[1], table)), None)
        if same is None:
            table_groups.append((name, table, []))
        else:
            same[2].append(name)
    config = _config(None, model)
    for name, table, copies in table_groups:
        last = table.shape[0] - 1
        note = "" if limit is None or limit <= last else f"its table holds {last + 1} rows: read to position {last}"
        with torch.no_grad():
            rows.append(_read(name, tuple(copies), lambda: _TableReader(table, config, dtype), None, dtype,
                              _length(config), min(limit or last, last), threshold, note))
    return Diagnosis(tuple(rows), dtype, threshold)


def _same_table(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two position tables hold the same values in the same dtype."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


__all__ = ["DENSE", "PER_OCTAVE", "Diagnosis", "RotaryPrecision", "diagnose", "position_tables", "rotary_modules",
           "sample_positions"]
