"""How precise a model's rotary tables are: :func:`diagnose` reads them as the model makes them and
measures them against exact angles.

:func:`diagnose` finds every place in a model that makes rotary tables (a rotary module: rope's
own :class:`~rope.hf.RotaryEmbedding`, a submodule with an ``inv_freq`` buffer, one whose class
names rotary or RoPE, a coordinate encoder; or a precomputed table: ``[sin | cos]`` rows or
complex ``freqs_cis``) and reads each, for each layer type where it has several (Gemma 3's
sliding and full attention), in the first of the forms of :mod:`rope.hf.tables` that reads it:
called as the model calls it (``module(x, position_ids[, layer_type])`` with ``x`` in the model's
dtype, with 1-D, M-RoPE or 2-D vision position ids, the same position on every axis; or with a
sequence, coordinates or an image), or a precomputed table's rows. It reads every position below
:data:`DENSE` and :data:`PER_OCTAVE` positions per octave above, up to ``limit`` (default the
larger of 2^20 and four times ``max_position_embeddings``; a precomputed table or an image grid
ends sooner). Each call holds the positions of one octave (and none across
``max_position_embeddings``), so that the length-dependent rope types (``dynamic``,
``longrope``) read the length max(position_ids) + 1 of that call, as in a forward of that length.

The reference is exact: ``a cos(m theta_i)`` and ``a sin(m theta_i)`` with the angle m theta_i
reduced modulo 2 pi exactly (:func:`rope.angles.cos_sin`, within 2^-52), where theta_i are the
model's own frequencies for that call, as its code computes them in float32 (float64 where its
code does): a rotary module's class rebuilt from its config, so that a cast of the model to
bfloat16, which rounds the module's own ``inv_freq``, does not hide in the reference (rope's
modules keep float32 frequencies); a precomputed table's default RoPE formula from its config;
each form's source is in :mod:`rope.hf.tables`, and each row names it. a is the attention factor
(``attention_scaling``). Which pair i each table column holds (``rotate_half``, interleaved,
partial, M-RoPE's or a vision module's sections, one position on every axis) is read from the
tables at the first positions, the column taking the pair its values are closest to.

The error of an entry v of exact value e is ``|v - e|`` in units of the model dtype's spacing at
``max(|e|, a/2)``: the last place of e, but never finer than at half the table's magnitude (an
entry near a zero of cos or sin is judged on the absolute scale of the rotation, which is what
attention sees). A table rounded once from exact values is within 0.5 units everywhere, so the
first position where an error exceeds ``threshold`` = 0.5 units is the first position at which the
table is no longer the exact one rounded to the dtype. Stock transformers computes the angle as a
float32 product, off by up to 2^-24 ``|m theta|``: a float32 model exceeds 0.5 units within the
first few positions, a bfloat16 one once that error starts to move roundings (a few hundred
positions) and by whole units from ``m theta`` near 2^16. Frequencies rounded to bfloat16
(2^-9 relative) are off by whole units of bfloat16 from the first positions. A table computed in
float64 and rounded once (RoFormer's) stays within about half a unit; one of an image grid's
bounded angles (``|angle|`` <= 2 pi theta) within a few units.

A model with none of these has no rotary tables: :func:`diagnose` raises ``ValueError`` saying so,
as it does where none of the places it found reads as rotary tables in any form (a relative
position encoding with an ``inv_freq`` buffer, a sinusoid added to the input), with the reason
each gave; where some read and others do not, those rows say why (``note``).

The error at positions between the samples above :data:`DENSE` is not read: the first position
found is the first sampled one, with the sample before it named. The reference itself is within
2^-52 relative, so float64 tables are measured to about one unit only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import _checks
from . import tables

DENSE = 1024
"""Every position below it is read."""

PER_OCTAVE = 64
"""Positions read per octave [2^k, 2^(k+1)) above :data:`DENSE`, evenly spaced."""

SHORTEST_LIMIT = 2**20
"""The default limit is the larger of this and four times ``max_position_embeddings``."""



@dataclass(frozen=True)
class RotaryPrecision:
    """The precision of one rotary module's (or precomputed table's) tables for one layer type (errors in units of the
    model dtype, :mod:`rope.hf.precision`); the numbers are ``None`` where ``note`` says why the
    tables were not read.

    Args:
        module: the qualified name in the model of the module (or of the table tensor).
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
        form: how they were read (:mod:`rope.hf.tables`), or ``""`` where they were not.
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
    form: str = ""


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
                 f"| first position > {self.threshold:g} | reference; read as |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in self.rows:
            name = f"`{row.module}`" + (f" (+{len(row.copies)} same)" if row.copies else "")
            if row.limit is None:
                lines.append(f"| {name} | {row.layer_type or '-'} | {_count(row.length)} | not read: {row.note} "
                             f"| | | | {row.reference} |")
                continue
            first = "none" if row.first_position is None else _count(row.first_position)
            if row.first_position is not None and row.previous_position not in (None, row.first_position - 1):
                first += f" (sample before: {_count(row.previous_position)})"
            beyond = "-" if row.worst_beyond is None else f"{row.worst_beyond:.3g} (to {_count(row.limit)})"
            note = f" ({row.note})" if row.note else ""
            lines.append(f"| {name} | {row.layer_type or '-'} | {_count(row.length)} | {_value(row.worst_within)} "
                         f"| {beyond}{note} | {_count(row.worst_position)} | {first} | {row.reference}; {row.form} |")
        return "\n".join(lines)

    __str__ = table


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


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


def _text_config(model: nn.Module):
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    return text() if callable(text) else config


def _length(config) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _units(exact: torch.Tensor, attention: float, eps: float) -> torch.Tensor:
    """The dtype's spacing at max(``|exact|``, a/2): eps 2^(floor(log2 x))."""
    magnitude = exact.abs().clamp_min(abs(attention) / 2)
    _, exponent = torch.frexp(magnitude)
    return torch.ldexp(torch.full_like(magnitude, eps), exponent - 1)


def _errors(reader: tables.Reader, positions: torch.Tensor, eps: float) -> torch.Tensor:
    """The largest error of each position's entries, in units (float64 ``[n]``)."""
    got_cos, got_sin = reader.tables(positions)
    cos, sin, attention = reader.exact(positions)
    cos, sin = cos[:, reader.pairs], sin[:, reader.pairs]
    if got_cos.shape[-1] != len(reader.pairs):
        raise ValueError(f"its tables changed width ({got_cos.shape[-1]} columns, {len(reader.pairs)} at first)")
    errors = [((got - exact).abs() / _units(exact, attention, eps)).amax(dim=(0, 2))
              for got, exact in ((got_cos, cos), (got_sin, sin))]
    return torch.maximum(*errors)


def _read(source: tables.Source, copies: tuple[str, ...], layer_type, dtype, length, limit,
          threshold) -> RotaryPrecision:
    eps = torch.finfo(dtype).eps
    try:
        reader = tables.reader(source, layer_type, dtype, limit)
    except Exception as err:  # no form reads it: reported, not raised
        return RotaryPrecision(source.name, layer_type, copies, "-", length, None, None, None, None, None, None,
                               _checks.first_line(err, 400))
    last = limit if reader.last is None else min(limit, reader.last)
    read, errors, note = [], [], reader.note if reader.last is not None and reader.last < limit else ""
    positions_all = [p for p in sample_positions(last, length) if p >= reader.first]
    reader.prepare(positions_all)
    for group in _groups(positions_all, length):
        positions = torch.tensor(group, dtype=torch.int64)
        try:
            errors.append(_errors(reader, positions, eps))
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
    return RotaryPrecision(source.name, layer_type, copies, reader.reference, length, read[-1] if read else None,
                           max(within) if within else None, max(beyond) if beyond else None,
                           None if worst is None else read[worst], first, previous, note, reader.form)



def diagnose(model: nn.Module, *, dtype: torch.dtype | None = None, limit: int | None = None,
             threshold: float = 0.5) -> Diagnosis:
    """The precision of every rotary table a model makes: per rotary module (or precomputed
    table) and layer type, the worst error against exact angles (in units of the model dtype,
    :mod:`rope.hf.precision`) below and beyond ``max_position_embeddings``, and the first
    position whose error exceeds ``threshold``. Patched or not, covered by :func:`rope.hf.patch`
    or not; the model is not changed (copies of its rotary modules are called).

    Args:
        model: a transformers model (a ``torch.nn.Module`` that makes rotary tables in one of
            the forms of :mod:`rope.hf.tables`).
        dtype: the dtype to call the modules with and measure in (default: that of the model's
            first floating-point parameter).
        limit: the largest position read (default: the larger of 2^20 and four times each
            module's ``max_position_embeddings``; a precomputed table or an image ends sooner).
        threshold: the error in units whose first excess is reported (0.5: the table is no longer
            the exact one rounded to the dtype).

    Returns:
        a :class:`Diagnosis`: its rows, and ``str()`` a Markdown table.

    Raises:
        ValueError: the model has no rotary tables (no place that makes them, or none that
            reads in any form: the message gives each one's reason).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    if dtype is not None:
        dtype = _checks.dtype_choice("dtype", dtype, _checks.FLOAT_DTYPES)
    limit = _checks.optional_integer("limit", limit, minimum=tables.MAP_POSITIONS, maximum=2**62)
    threshold = _checks.number("threshold", threshold, minimum=0.0)
    found = tables.sources(model)
    if not found:
        raise ValueError(f"model: {type(model).__name__} has no rotary tables: no rotary module (rope's, one with an "
                         "inv_freq buffer, or one whose class names rotary or RoPE) and no precomputed rotary table "
                         "(sin | cos rows or complex) in it: nothing to diagnose")
    dtype = dtype or _model_dtype(model)
    if dtype not in _checks.FLOAT_DTYPES:
        raise ValueError(f"dtype: the model's parameters are {dtype}; pass dtype= one of {_checks.FLOAT_DTYPES}")
    groups: list[tuple[tables.Source, list[str]]] = []
    for source in found:
        same = next((group for group in groups if tables.same(group[0], source)), None)
        if same is None:
            groups.append((source, []))
        else:
            same[1].append(source.name)
    rows = []
    for source, copies in groups:
        length = _length(source.config if source.config is not None else _text_config(model))
        source_limit = limit or max(SHORTEST_LIMIT, 4 * (length or 0))
        with torch.no_grad():
            rows += [_read(source, tuple(copies), layer_type, dtype, length, source_limit, threshold)
                     for layer_type in tables.layer_types(source)]
    if all(row.limit is None for row in rows):
        reasons = "; ".join(f"{row.module} ({type(source.module).__name__}): {row.note}"
                            for row, (source, _) in zip(rows, groups))
        raise ValueError(f"model: {type(model).__name__} has no rotary tables that diagnose reads: {reasons}")
    return Diagnosis(tuple(rows), dtype, threshold)


__all__ = ["DENSE", "PER_OCTAVE", "Diagnosis", "RotaryPrecision", "diagnose", "sample_positions"]
