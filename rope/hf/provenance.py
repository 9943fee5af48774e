"""Where a table came from: the exact positions and frequencies behind rope's ``(cos, sin)``, and
the proof that the tables a model hands back are still the ones rope made.

:class:`rope.hf.RotaryEmbedding` returns tables rounded to the model's dtype; the functions of
:mod:`rope.hf.functions` can do better than those tables only if they know the integer positions
and float32 frequencies the tables were made from. Each table pair therefore carries a
:class:`TableSource` (the attribute ``rope_source`` of its first tensor, ``cos`` or Llama 4's
``freqs_cis``), and :func:`untouched_source` hands it out only while rotating from it is the
same as rotating by the tables given, up to their rounding:

* the tensors are the very objects the module returned *together*: a sliced, negated, scaled or
  converted table (``cos[..., :8]``, ``-sin``, ``2 * cos``, ``cos.float()`` where that converts)
  is a new tensor without the attribute, and ``sin`` from another call, or another ``sin`` paired
  with rope's ``cos``, is not the partner recorded (weak references: the record keeps neither
  alive);
* neither was changed in place since: every in-place operation on a tensor or on a view of it
  (``cos.mul_(2)``, ``sin[0] = 0``, ``torch.neg(sin, out=sin)``) bumps the version counter autograd
  keeps for it, and the counters must still read what they read when the tables were made. Writes
  through ``tensor.data`` bypass that counter, as they bypass autograd, and are not seen;
* the positions and frequencies are private copies, so later edits of the caller's
  ``position_ids`` or the module's buffers change nothing.

Under ``torch.compile`` nothing is proven (the tables are traced values) and the functions use
the tables given.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

ATTRIBUTE = "rope_source"


@dataclass(frozen=True, eq=False)
class TableSource:
    """What one call of :class:`rope.hf.RotaryEmbedding` made its tables from.

    ``position_ids`` ``[batch, seq]`` (``[3, batch, seq]`` with M-RoPE) and the float32
    ``inv_freq`` are private copies; ``form`` is the :data:`rope.hf.TABLE_FORMS` entry of the
    tables; ``tables`` and ``versions`` identify the returned tensors and their version counters
    at the moment they were returned.

    Args:
        position_ids: a private copy of the positions, ``[batch, seq]`` or ``[3, batch, seq]``.
        inv_freq: a private copy of the float32 frequencies theta_i.
        attention_factor: the factor the tables were multiplied by.
        mrope_axes: the M-RoPE axis of each pair, or ``None``.
        form: the :data:`rope.hf.TABLE_FORMS` entry of the tables.
        tables: weak references to the returned tensors.
        versions: their version counters when returned.
        exact: the float64 cos and sin of every pair's angle, ``[batch, seq, pairs]``, that the
            tables were rounded from: what the torch path rotates by in every layer, as
            transformers' layers share its tables (computed once per forward).
    """

    position_ids: torch.Tensor
    inv_freq: torch.Tensor
    attention_factor: float
    mrope_axes: torch.Tensor | None
    form: str
    tables: tuple[weakref.ref, ...]
    versions: tuple[int, ...]
    exact: tuple[torch.Tensor, torch.Tensor]


def attach(tables: tuple[torch.Tensor, ...], *, position_ids: torch.Tensor, inv_freq: torch.Tensor,
           attention_factor: float, mrope_axes: torch.Tensor | None, form: str,
           exact: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Record on ``tables[0]`` the source of the tables (``(cos, sin)``, or one complex tensor),
    with private copies of the positions and frequencies.

    Args:
        tables: the tables returned, ``(cos, sin)`` or one complex tensor.
        position_ids: the positions they were made from.
        inv_freq: the frequencies they were made from.
        attention_factor: the factor they were multiplied by.
        mrope_axes: the M-RoPE axis of each pair, or ``None``.
        form: their :data:`rope.hf.TABLE_FORMS` entry.
        exact: the float64 cos and sin they were rounded from, ``[batch, seq, pairs]``, tensors
            no one else holds.
    """
    tables[0].rope_source = TableSource(
        position_ids=position_ids.clone(), inv_freq=inv_freq.clone(), attention_factor=attention_factor,
        mrope_axes=mrope_axes, form=form, tables=tuple(weakref.ref(t) for t in tables),
        versions=tuple(t._version for t in tables), exact=exact,
    )


def recorded_form(table: torch.Tensor) -> str | None:
    """The table form rope made ``table`` in (even if it was edited since), or ``None`` for a
    tensor rope did not return: what tells a function that it was handed the wrong layout.

    Args:
        table: a table handed to a function of :mod:`rope.hf.functions`.
    """
    source = getattr(table, ATTRIBUTE, None)
    return source.form if isinstance(source, TableSource) else None


def untouched_source(*tables: torch.Tensor) -> TableSource | None:
    """The :class:`TableSource` of ``tables`` if they are provably the untouched tensors one call
    of :class:`rope.hf.RotaryEmbedding` returned together (module docstring), else ``None``.

    Args:
        tables: the tables handed back, ``(cos, sin)`` or one complex tensor.
    """
    source = getattr(tables[0], ATTRIBUTE, None)
    if not isinstance(source, TableSource) or torch.compiler.is_compiling():
        return None
    if len(tables) != len(source.tables) or any(ref() is not t for ref, t in zip(source.tables, tables)):
        return None
    if tuple(t._version for t in tables) != source.versions:
        return None
    return source
