"""rope's exact module in place of a text rotary module that reads positions on several axes laid
out otherwise than M-RoPE's three (:mod:`rope.mrope`): the ``[A, batch, seq]`` position ids of
transformers 5.23's ``HunYuanVLRotaryEmbedding`` (``models/hunyuan_vl/modeling_hunyuan_vl.py``,
XD-RoPE, A = ``len(mrope_section)``, four axes P, W, H, T in HunYuan-VL's checkpoints) and
``NeoMMERotaryEmbedding`` (``models/neomme/modeling_neomme.py``, A = 2: row and column).

Both compute the angles m_a theta_i of every axis a (row a of the position ids) and pair i, in
float32, take cos and sin, and recompose ``rotate_half`` tables of 2p columns (column c holds
frequency i = c mod p) in which each column reads one axis:

* ``blocks`` (HunYuan-VL's ``recomposition_frequencies``): the doubled table ``cat(t, t)`` of each
  axis is split into consecutive blocks of 2 s_0, 2 s_1, .. columns (s = ``mrope_section``, one
  entry per axis, summing to p) and block b is taken from axis b. The two columns of a pair
  (i, i + p) may then read different axes: with s = (2, 2, 2, 2) and p = 8, pair 0's first
  column reads axis 0 and its second axis 2. Their "rotation" by ``q cos + rotate_half(q) sin``
  is then no rotation by one angle; the tables are still what the model computes with, and are
  reproduced as they are. (vLLM's XD-RoPE, rope's ``xdrope`` type of :mod:`rope.xdrope`, gives
  block a the ``xdrope_section[a]`` consecutive pairs, both columns of each: another table, as
  soon as two axes have pairs);
* ``alternating`` (NeoMME's: "row0-col0-row1-col1"): pair i reads axis i mod A, both of its
  columns (the tables ``cat(t, t)`` of one angle per pair).

:class:`AxesRotaryEmbedding` computes each column's angle m_{a(c)} theta_{c mod p} with the angle
reduced modulo 2 pi exactly (float64, :func:`rope.apply.exact_cos_sin`: within 2^-52 of exact for
every int64 position), times the attention factor, and rounds cos and sin once to the model's
dtype (:func:`rope.rotation.round_once`): every entry within half a unit of that dtype of the
exact value, at every position. transformers' float32 angles are off by up to about 2^-24 m
theta_i rad (2^-4 rad at m = 2^20, theta_i = 1). The tables carry no provenance
(:mod:`rope.hf.provenance`): the model's function (Llama's, for both types) rotates by them as
given, in float32 on exactly rounded entries.

:func:`reproduce_axes` is what :func:`rope.hf.install` calls for a module that reads 2 or 4 rows
of position ids (and :func:`find_axes` for one that reads M-RoPE's three rows but no M-RoPE style
reproduces: HunYuan-VL with three sections): it builds each layout from the config (and the
module's own ``mrope_section``), probes it against a copy of the module as install probes M-RoPE
(shuffled positions, different on each axis; lengths on both sides of each length of the config
for the rope types that read one), and returns the first that reproduces it, or raises naming
each layout's gap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .. import _checks
from ..apply import exact_cos_sin
from ..rotation import round_once
from .embedding import (
    LayerTypeRotaryEmbedding,
    RotaryEmbedding,
    head_dim_of,
    layer_type_head_dim,
    layer_type_parameters,
    rope_parameters_from_config,
)
from .probing import PROBE_TOLERANCE, call_module, float32_allowance, output_gap, probe_copy, probes

AXES_LAYOUTS = ("blocks", "alternating")
"""How the columns of the tables read the axes (module docstring): ``blocks`` (HunYuan-VL) and
``alternating`` (NeoMME)."""

_SECTION_KEY = "mrope_section"
"""The key of the config's ``rope_parameters`` (and the attribute of transformers' module) that
holds the blocks' sections: HunYuan-VL's ``mrope_section`` (its legacy ``xdrope_section``, which
its config renames)."""


def column_axes(layout: str, axes: int, pairs: int, sections=None) -> torch.Tensor:
    """The axis each of the 2 ``pairs`` columns of ``rotate_half`` tables reads, int64 ``[2 pairs]``.

    ``blocks``: block b of 2 s_b consecutive columns reads axis b, ``len(sections) == axes``,
    ``sum(sections) == pairs`` (HunYuan-VL). ``alternating``: columns i and i + p read axis
    i mod ``axes`` (NeoMME); ``sections`` must be ``None``.

    Args:
        layout: one of :data:`AXES_LAYOUTS`.
        axes: the rows of position ids, >= 1.
        pairs: the rotated pairs p (rotary_dim / 2), >= 1.
        sections: ``blocks``: the pairs of each axis, ``axes`` integers >= 0.
    """
    _checks.choice("layout", layout, AXES_LAYOUTS)
    axes = _checks.integer("axes", axes, minimum=1)
    pairs = _checks.integer("pairs", pairs, minimum=1)
    if layout == "alternating":
        if sections is not None:
            raise ValueError(f"sections must be None for layout 'alternating' (pair i reads axis i mod {axes}), "
                             f"got {sections!r}")
        return (torch.arange(pairs) % axes).repeat(2)
    if not isinstance(sections, (list, tuple)) or len(sections) != axes:
        raise TypeError(f"sections must be a list of {axes} integers (the pairs of each axis) for layout 'blocks', "
                        f"got {sections!r}")
    sizes = [_checks.integer(f"sections[{a}]", s, minimum=0) for a, s in enumerate(sections)]
    if sum(sizes) != pairs:
        raise ValueError(f"sections {sizes} must sum to the {pairs} rotated pairs (rotary_dim / 2), got {sum(sizes)}")
    return torch.repeat_interleave(torch.arange(axes), 2 * torch.tensor(sizes))


class AxesRotaryEmbedding(RotaryEmbedding):
    """``(cos, sin)`` ``rotate_half`` tables ``[batch, seq, 2p]`` whose column c holds a cos(m
    theta_i) and a sin(m theta_i), a the attention factor, i = c mod p and m the position of axis
    ``column_axes[c]`` (:func:`column_axes`; module docstring): the contract of transformers'
    ``HunYuanVLRotaryEmbedding`` (``blocks``) and of each layer type of ``NeoMMERotaryEmbedding``
    (``alternating``). Angles reduced exactly in float64, each entry rounded once to x's dtype.
    The frequencies theta_i and the attention factor are :class:`RotaryEmbedding`'s of the same
    ``rope_parameters`` (without the ``mrope_section`` the layout reads); ``dynamic`` and
    ``longrope`` read the length max(position_ids) + 1 over every axis, as transformers does.

    ``forward(x, position_ids)``: integer ``position_ids`` ``[axes, batch, seq]`` (one row per
    axis), or ``[batch, seq]`` or ``[1, batch, seq]``, which mean the same position on every axis
    (transformers expands them so). ``mrope_section`` is the blocks' sections (``None`` for
    ``alternating``), under the name of transformers' attribute, which HunYuan-VL's model reads
    for its number of axes.

    Args:
        rope_parameters: a flat ``rope_parameters`` mapping (an ``mrope_section`` in it is the
            layout's, and left out of the frequencies).
        head_dim: the head dimension.
        axes: the rows of position ids, >= 1.
        layout: one of :data:`AXES_LAYOUTS`.
        sections: ``blocks``: the pairs of each axis, ``axes`` integers summing to rotary_dim / 2.
    """

    def __init__(self, *, rope_parameters: Mapping, head_dim: int, axes: int, layout: str, sections=None):
        if not isinstance(rope_parameters, Mapping):
            raise TypeError(f"rope_parameters must be a mapping, got {type(rope_parameters).__name__}")
        params = {key: value for key, value in rope_parameters.items() if key != _SECTION_KEY}
        super().__init__(rope_parameters=params, head_dim=head_dim, tables="rotate_half")
        self.axes = _checks.integer("axes", axes, minimum=1)
        self.layout = _checks.choice("layout", layout, AXES_LAYOUTS)
        self.mrope_section = None if sections is None else list(sections)  # HunYuan-VL's model reads it
        self.register_buffer("column_axes", column_axes(layout, axes, self.inv_freq.shape[0], sections),
                             persistent=False)

    def extra_repr(self) -> str:
        sections = "" if self.mrope_section is None else f", sections={self.mrope_section}"
        return f"axes={self.axes}, layout={self.layout!r}{sections}, head_dim={self.head_dim}"

    def _checked_positions(self, x, position_ids) -> torch.Tensor:
        """``position_ids`` checked against x, as ``[axes, batch, seq]`` (``[batch, seq]`` and
        ``[1, batch, seq]`` expanded: the same position on every axis)."""
        _checks.float_tensor("x", x)
        _checks.integer_tensor("position_ids", position_ids)
        _checks.same_device("x", x, position_ids=position_ids)
        if position_ids.dim() == 2:
            return position_ids.expand(self.axes, -1, -1)
        if position_ids.dim() == 3 and position_ids.shape[0] in (1, self.axes):
            return position_ids.expand(self.axes, -1, -1)
        raise ValueError(f"position_ids must have shape [{self.axes}, batch, seq] (one row per axis: this module's "
                         f"{self.layout} layout reads {self.axes} axes), [1, batch, seq] or [batch, seq], "
                         f"got {tuple(position_ids.shape)}")

    def column_cos_sin(self, position_ids: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every column's angle m_{a(c)} theta_{c mod p}, reduced modulo 2 pi
        exactly (float64), ``[batch, seq, 2p]``.

        Args:
            position_ids: integer ``[axes, batch, seq]``.
            theta: the frequencies theta_i ``[p]``, from :meth:`frequencies`.
        """
        per_column = position_ids[self.column_axes.to(position_ids.device)].movedim(0, -1)  # [batch, seq, 2p]
        return exact_cos_sin(per_column, theta.repeat(2), per_pair=True)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        position_ids = self._checked_positions(x, position_ids)
        theta, attention = self.frequencies(position_ids)
        cos, sin = self.column_cos_sin(position_ids, theta.to(position_ids.device))
        return round_once(cos * attention, x.dtype), round_once(sin * attention, x.dtype)


def _sections(old: nn.Module, layer_type: str | None, axes: int):
    """The old module's ``mrope_section`` for ``layer_type`` where it has one entry per axis, else ``None``."""
    sections = getattr(old, _SECTION_KEY, None)
    if isinstance(sections, Mapping):
        sections = sections.get(layer_type)
    return list(sections) if isinstance(sections, (list, tuple)) and len(sections) == axes else None


def axes_candidates(config: Any, old: nn.Module, axes: int):
    """``(label, module)`` for each layout that could reproduce ``old``, which reads ``axes`` rows
    of position ids: ``blocks`` of the module's own ``mrope_section`` (where it has one entry
    per axis), then ``alternating``; an :class:`AxesRotaryEmbedding` from the config's flat
    ``rope_parameters``, or a :class:`rope.hf.LayerTypeRotaryEmbedding` holding one per layer
    type for parameters nested by layer type. A layout the config does not fit is left out.

    Args:
        config: the model's config (or the sub-config the module was built from).
        old: transformers' rotary module.
        axes: the rows of position ids it reads.
    """
    params = rope_parameters_from_config(config)
    per_type = layer_type_parameters(params)
    cases = {None: params} if per_type is None else per_type
    widths = {t: head_dim_of(config) if t is None else layer_type_head_dim(config, t) for t in cases}
    layouts = [("alternating", {t: None for t in cases})]
    own = {t: _sections(old, t, axes) for t in cases}
    if all(s is not None for s in own.values()):
        layouts.insert(0, ("blocks", own))
    for layout, sections in layouts:
        try:
            made = {t: AxesRotaryEmbedding(rope_parameters=p, axes=axes, layout=layout, sections=sections[t],
                                           head_dim=widths[t]) for t, p in cases.items()}
        except (TypeError, ValueError):  # the config does not fit this layout: not a candidate
            continue
        label = layout if layout == "alternating" else f"blocks of mrope_section {next(iter(own.values()))}"
        if per_type is None:
            yield label, made[None]
            continue
        new = LayerTypeRotaryEmbedding(config)
        for layer_type in new.layer_types:
            new.layer_types[layer_type] = made[layer_type]
        yield label, new


def find_axes(name: str, old: nn.Module, config: Any, device, axes: int) -> tuple[nn.Module | None, list[str]]:
    """The first module of :func:`axes_candidates` whose tables reproduce ``old`` (which reads
    ``axes`` rows of position ids) at install's probe positions, each row shuffled on its own
    (install's ``probes``: lengths on both sides of the config's for the rope types that read
    one), for every layer type, within install's ``PROBE_TOLERANCE`` beyond transformers'
    float32 error, or ``None``; and each layout tried with its gap. A deep copy of ``old`` is
    called, never ``old``.

    Args:
        name: the module's qualified name in the model, for messages.
        old: transformers' rotary module.
        config: the model's config (or the sub-config the module was built from).
        device: the device of ``old``'s buffers (``None``: the CPU).
        axes: the rows of position ids it reads.
    """
    old = probe_copy(name, old)
    tried = []
    for label, new in axes_candidates(config, old, axes):
        new = new.to(device) if device is not None else new
        cases = list(new.layer_types.items()) if isinstance(new, LayerTypeRotaryEmbedding) else [(None, new)]
        worst = 0.0
        for layer_type, embedding in cases:
            for positions in probes(config, embedding, axes, device):
                positions = positions.reshape(axes, 1, -1)  # install's probes are [3, 1, n] only for three rows
                theirs = call_module(name, old, positions, layer_type, device)
                ours = embedding(torch.zeros(1, device=device), positions)
                gap = output_gap(theirs, ours, float32_allowance(embedding, positions))
                worst = float("inf") if gap is None else max(worst, gap)
        if worst <= PROBE_TOLERANCE:
            return new, tried
        tried.append(f"{label}: " + ("other shapes" if worst == float("inf") else f"off by {worst:.3g}"))
    return None, tried


def reproduce_axes(name: str, old: nn.Module, config: Any, device, axes: int) -> nn.Module:
    """:func:`find_axes`'s module for ``old``, which reads ``axes`` rows of position ids (install
    found its tables change with each), or ``ValueError`` naming each layout's gap.

    Args:
        name: the module's qualified name in the model, for messages.
        old: transformers' rotary module.
        config: the model's config (or the sub-config the module was built from).
        device: the device of ``old``'s buffers (``None``: the CPU).
        axes: the rows of position ids it reads.
    """
    new, tried = find_axes(name, old, config, device, axes)
    if new is not None:
        return new
    raise ValueError(f"install: {name} ({type(old).__name__}) reads positions on {axes} axes (position ids [{axes}, "
                     f"batch, seq], its tables change with each row), and no layout of rope.hf.axes reproduces its "
                     f"tables ({'; '.join(tried) or 'no layout fits its config'}): another assignment of table "
                     "columns to axes; nothing was replaced")
