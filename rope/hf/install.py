"""Swapping rope's rotary module into a loaded transformers model, after checking it reproduces
the model's own tables; and, for the models that keep their tables in a buffer of each attention
(GPT-J, CodeGen: :data:`POSITION_TABLES`), rope's exactly rounded table into that buffer."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..mrope import MROPE_STYLES
from .axes import find_axes, reproduce_axes
from .clvp import RotaryAngleTable, reproduce_angles, returns_angles
from .embedding import (
    ROTARY_MODULES,
    TABLE_FORMS,
    LayerTypeRotaryEmbedding,
    RotaryEmbedding,
    head_dim_of,
    layer_type_head_dim,
    layer_type_parameters,
    position_table,
    rope_parameters_from_config,
    rotary_embedding,
)
from .probing import (
    PROBE_FLOAT32,
    PROBE_TOLERANCE,
    call_module,
    float32_allowance,
    output_gap,
    probe_copy,
    probes,
    shuffled_positions,
)
from .self_rotating import StackedRotaryTable, is_stacked_rotary, reproduce_stacked
from .vision import is_vision_rotary

POSITION_TABLES = ("embed_positions",)
"""Names of the buffers in which a model's attention keeps its rotary table by position and looks
up the rows of its position ids (GPT-J, CodeGen: ``embed_positions``, made by
``create_sinusoidal_positions``): row m is (sin m theta_0, .., sin m theta_{p-1}, cos m theta_0,
.., cos m theta_{p-1}), so each half is a table of the ``pairs`` form."""

ROTARY_OPTIONS = ("position_embedding_type", "position_embeddings_type", "use_mem_rope")
"""The config options with which a type rotates only in some configurations (ESM and Granite
4.0-H: ``position_embedding_type``, the wav2vec2 conformers: ``position_embeddings_type``,
Zamba 2: ``use_mem_rope``): a model without rotary modules whose config has one is refused with
its value named, unless that value is one of :data:`ROTATING`."""

ROTATING = ("rotary", "rope", True)
"""The values of :data:`ROTARY_OPTIONS` with which a type rotates."""

def _table_gap(name: str, old: nn.Module, new: nn.Module, config: Any, device) -> float | None:
    """The largest difference between the tables of ``old`` and ``new`` at probe positions
    (:func:`~rope.hf.probing.probes`), over every layer type, beyond transformers' float32 error
    (:func:`~rope.hf.probing.float32_allowance`); ``None`` where they differ in shape or in what position ids
    they take. A module that takes M-RoPE's three rows of position ids must be matched by an
    M-RoPE module, which the three-row probe checks whichever kind ``new`` is. ``old`` itself is
    never called: a deep copy of it is (:func:`~rope.hf.probing.probe_copy`). Raises if it cannot be called."""
    old = probe_copy(name, old)
    cases = list(new.layer_types.items()) if isinstance(new, LayerTypeRotaryEmbedding) else [(None, new)]
    worst = 0.0
    for layer_type, embedding in cases:
        mrope = embedding.mrope_axes is not None
        for positions in probes(config, embedding, 3 if mrope else 1, device):
            gap = output_gap(call_module(name, old, positions, layer_type, device),
                       embedding(torch.zeros(1, device=device), positions), float32_allowance(embedding, positions))
            if gap is None:
                return None
            worst = max(worst, gap)
        if not mrope and layer_type is None:  # does the old module read three rows of position ids?
            try:
                theirs = old(torch.zeros(1, dtype=torch.float32, device=device), shuffled_positions(3, device))
            except Exception:  # it does not take them: nothing to match
                continue
            if output_gap(theirs, embedding(torch.zeros(1, device=device), shuffled_positions(1, device))) is not None:
                return None  # it reduced three rows to tables of one: M-RoPE, which this module is not
    return worst


_STYLE_KEYS = ("mrope_style", "mrope_interleaved", "interleaved")


def _candidates(config: Any, old: nn.Module, form: str):
    """Modules to try for one table form: from the config as it is; where the old module names
    another ``rope_type`` than the config (Molmo 2's ``rotary_emb_unscaled``: ``default``), the
    config's parameters with that type; and where the old module has
    M-RoPE sections (``mrope_section``, or one per layer type) and the config names no style
    (:data:`_STYLE_KEYS`: the modeling code fixes it, Qwen3-Omni, Cosmos 3 and Cohere Compass
    interleave, ERNIE 4.5 VL alternates), with the module's sections in each of
    :data:`rope.mrope.MROPE_STYLES` (the config's own reading, chunked, aside)."""
    yield rotary_embedding(config, tables=form)
    params = rope_parameters_from_config(config)
    rope_type = getattr(old, "rope_type", None)
    if isinstance(rope_type, str) and layer_type_parameters(params) is None and rope_type != params.get("rope_type"):
        try:
            retyped = RotaryEmbedding(rope_parameters={**params, "rope_type": rope_type}, head_dim=head_dim_of(config),
                                      tables=form)
        except ValueError:  # the config lacks keys of that type: not a candidate
            retyped = None
        if retyped is not None:
            yield retyped
    sections = getattr(old, "mrope_section", None)
    per_type = layer_type_parameters(params)
    cases = {None: params} if per_type is None else per_type
    if sections is None or any(key in p for p in cases.values() for key in _STYLE_KEYS):
        return
    if per_type is None and isinstance(sections, Mapping) or per_type is not None and not (
            isinstance(sections, Mapping) and set(sections) >= set(per_type)):
        return  # sections not laid out as the config's parameters: nothing to try
    own = {layer_type: list(sections if layer_type is None else sections[layer_type]) for layer_type in cases}
    for style in MROPE_STYLES:
        if style == "chunked" and all(p.get("mrope_section") is not None and list(p["mrope_section"]) == own[t]
                                      for t, p in cases.items()):
            continue  # the config's own reading, yielded first
        try:
            styled = {t: RotaryEmbedding(rope_parameters={**p, "mrope_section": own[t], "mrope_style": style},
                                         head_dim=head_dim_of(config) if t is None else layer_type_head_dim(config, t),
                                         tables=form) for t, p in cases.items()}
        except ValueError:  # the sections do not fit this assignment (or at all): not a candidate
            continue
        if per_type is None:
            yield styled[None]
            continue
        new = LayerTypeRotaryEmbedding(config, tables=form)
        for layer_type in new.layer_types:
            new.layer_types[layer_type] = styled[layer_type]
        yield new


def _frequency_buffers(old: nn.Module) -> dict[str, torch.Tensor]:
    """The old module's frequency buffers: ``inv_freq``, ``original_inv_freq`` and, per layer
    type, ``{layer_type}_inv_freq`` (transformers' names)."""
    return {name: buffer for name, buffer in old.named_buffers(recurse=False) if name.endswith("inv_freq")}


_CASTS = {torch.bfloat16: "model.bfloat16()", torch.float16: "model.half()"}
_HALF_DTYPES = tuple(_CASTS)


def _rounded_frequencies(old: nn.Module, config: Any) -> tuple[str, torch.dtype] | None:
    """``(buffer name, dtype)`` when a frequency buffer of ``old`` holds theta_i rounded to a
    half-precision dtype: stored in float16 or bfloat16 (the model was cast), or stored wider but
    equal to rope's float32 frequencies of ``config`` rounded to one (cast and cast back)."""
    buffers = _frequency_buffers(old)
    for name, buffer in buffers.items():
        if buffer.dtype in _HALF_DTYPES:
            return name, buffer.dtype
    thetas = [m.inv_freq for m in rotary_embedding(config).modules() if isinstance(m, RotaryEmbedding)]
    for name, buffer in buffers.items():
        values = buffer.detach().to("cpu", torch.float64)
        for theta in thetas:
            if theta.shape != values.shape or torch.equal(values, theta.double()):
                continue
            for dtype in _HALF_DTYPES:
                if torch.equal(values, theta.to(dtype).double()):
                    return name, dtype
    return None


def _cast_error(name: str, old: nn.Module, buffer: str, dtype: torch.dtype, device) -> ValueError:
    """The error for a module whose frequencies a cast rounded, with the fixes that restore them."""
    dtype_name, stored = (str(d).removeprefix("torch.") for d in (dtype, old._buffers[buffer].dtype))
    how = f"in {dtype_name}" if stored == dtype_name else f"rounded to {dtype_name} (stored in {stored})"
    fixes = ("call rope.hf.install(model) before casting the model (rope's module keeps its float32 frequencies "
             "through .half() and .to(dtype))")
    if getattr(old, "config", None) is not None:
        module = f"model.{name}"
        fixes += (f"; or, on a model already cast, first rebuild the module in float32: "
                  f"{module} = type({module})({module}.config).to({str(device or 'cpu')!r})")
    return ValueError(
        f"install: {name} ({type(old).__name__}) holds its frequencies {buffer} {how}: the model was cast "
        f"({_CASTS[dtype]} or model.to(torch.{dtype_name})), which rounds that buffer (transformers issue #29496), so "
        f"its tables are off and no rope module reproduces them; nothing was replaced. Fix: {fixes}"
    )


def _refuse_without_positions(name: str, old: nn.Module) -> None:
    """Raise where ``old.forward`` takes no position ids as its second argument (a name with
    ``pos``): EfficientLoFTR's module reads the height and width of a feature map ``x`` instead,
    EsmFold2's the atoms' coordinates in space (``ref_pos``, then ``ref_space_uid``)."""
    try:
        parameters = list(inspect.signature(old.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the probe's call decides
        return
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if (len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in parameters)) or (
            len(positional) >= 2 and "pos" not in positional[1].name):
        names = ", ".join(p.name for p in parameters)
        raise ValueError(f"install: {name} ({type(old).__name__}) is called as forward({names}): it takes no "
                         "position ids, so it does not follow the contract rotary_emb(x, position_ids) of "
                         "rope.hf.RotaryEmbedding; nothing was replaced")


OTHER_ROWS = (2, 4)
"""Rows of position ids other than M-RoPE's three that a module may read (NeoMME's row and column,
HunYuan-VL's four XD-RoPE axes): install gives a module whose tables change with them
:mod:`rope.hf.axes`'s module, or refuses it naming what differs."""


def _other_rows(name: str, old: nn.Module, config: Any, device) -> int | None:
    """The row count of :data:`OTHER_ROWS` of position ids that ``old`` takes and returns tables
    of the shape it returns for one row, but other values than for the first row alone: it
    reads positions on that many axes (:mod:`rope.hf.axes`); ``None`` where there is none. A deep
    copy is called."""
    per_type = layer_type_parameters(rope_parameters_from_config(config))
    extra = () if per_type is None else (next(iter(per_type)),)
    old = probe_copy(name, old)
    x = torch.zeros(1, dtype=torch.float32, device=device)
    gen = torch.Generator().manual_seed(1)
    for rows in OTHER_ROWS:
        positions = torch.stack([torch.randperm(8, generator=gen) for _ in range(rows)])[:, None].to(device)
        try:
            gap = output_gap(old(x, positions, *extra), old(x, positions[0], *extra))
        except Exception:  # it does not take them: nothing to match
            continue
        if gap is not None and gap > 0:
            return rows
    return None


def _reproduce(name: str, old: nn.Module, config: Any, device) -> nn.Module:
    """The rope rotary module of ``config`` (:func:`rotary_embedding`, or with M-RoPE sections
    :func:`_candidates` tries; for positions on other axes :mod:`rope.hf.axes`'s) whose tables
    reproduce ``old``, or an error (naming the cast that rounded ``old``'s frequencies, where that
    is the cause)."""
    _refuse_without_positions(name, old)
    rows = _other_rows(name, old, config, device)
    if rows is not None:  # positions on 2 or 4 axes: rope.hf.axes's module, or a refusal naming what differs
        return reproduce_axes(name, old, config, device, rows)
    found = []
    for form in TABLE_FORMS:
        for new in _candidates(config, old, form):
            new = new.to(device) if device is not None else new
            gap = _table_gap(name, old, new, config, device)
            if gap is not None and gap <= PROBE_TOLERANCE:
                return new
            mrope = next((m for m in new.modules() if isinstance(m, RotaryEmbedding) and m.mrope_axes is not None),
                         None)
            label = form if mrope is None else (
                f"{form} with {mrope.rope_config.mrope_style} mrope_section {list(mrope.rope_config.mrope_section)}")
            found.append(f"{label}: " + ("other shapes" if gap is None else f"off by {gap:.3g}"))
    sections = getattr(old, "mrope_section", None)
    if isinstance(sections, (list, tuple)) and len(sections) == 3:  # three axes otherwise laid out (HunYuan-VL's)
        new, tried = find_axes(name, old, config, device, 3)
        if new is not None:
            return new
        found += [f"rope.hf.axes {label}" for label in tried]
    rounded = _rounded_frequencies(old, config)
    if rounded is not None:
        raise _cast_error(name, old, *rounded, device)
    raise ValueError(
        f"install: {name} ({type(old).__name__}) is not reproduced by rope.hf.RotaryEmbedding: its (cos, sin) at "
        f"probe positions differ in every table form ({'; '.join(found)}): another scaling or convention; "
        "nothing was replaced"
    )


@dataclass(frozen=True, eq=False)
class Replacement:
    """One rotary module or table :func:`install` swaps: the attribute ``attribute`` of
    ``model.get_submodule(owner)``, from ``old`` (the model's) to ``new`` (rope's, checked to
    reproduce ``old``): a rotary module (:func:`rotary_slots`), or a position table buffer
    (:data:`POSITION_TABLES`). ``owner`` is the owner's qualified name, ``""`` for the model
    itself: a record does not keep the model alive.

    Args:
        owner: the qualified name of the module that holds the attribute (``""``: the model).
        old: the model's rotary module or table.
        new: rope's rotary module or table that reproduces it.
        attribute: ``"rotary_emb"`` (or another rotary slot's attribute, :func:`rotary_slots`), or
            the name of a position table buffer.
    """

    owner: str
    old: nn.Module | torch.Tensor
    new: nn.Module | torch.Tensor
    attribute: str = "rotary_emb"

    @property
    def name(self) -> str:
        """The qualified name of the rotary module or table in the model (``model.rotary_emb``)."""
        return f"{self.owner}.{self.attribute}" if self.owner else self.attribute

    @property
    def tables(self) -> str:
        """The :data:`TABLE_FORMS` entry of the tables the model's function receives from ``new``:
        its module's, or ``pairs`` for a position table (its sin and cos halves)."""
        return table_form(self.new)


def table_form(rotary: nn.Module | torch.Tensor) -> str:
    """The :data:`TABLE_FORMS` entry of the tables a rotary module returns (``rotary.tables`` for
    rope's), or ``"pairs"`` for a position table, whose halves hold each angle once.

    Args:
        rotary: a rotary module or a position table.
    """
    return "pairs" if isinstance(rotary, torch.Tensor) else getattr(rotary, "tables", None)


ROTARY_CLASS_SUFFIX = "RotaryEmbedding"
"""The ending of the class names of transformers' rotary modules: a child module of that class
is a rotary slot whatever its attribute (Molmo 2's ``rotary_emb_unscaled``, LFM2-MoE's
``pos_emb``, the entries of Granite SWA's ``rotary_embs`` list), as is any child named ``rotary_emb``."""


def rotary_slots(model: nn.Module) -> list[tuple[str, str, nn.Module | torch.Tensor]]:
    """Where ``model`` keeps its rotary tables: ``(owner, attribute, value)`` for every child
    module named ``rotary_emb`` or of a class named ``...RotaryEmbedding``
    (:data:`ROTARY_CLASS_SUFFIX`; vision rotary modules aside: :mod:`rope.hf.vision`) or a
    conformer's ``...RotaryPositionalEmbedding`` (:mod:`rope.hf.self_rotating`), and every
    floating 2-D buffer named in :data:`POSITION_TABLES`, ``owner`` the qualified name of the
    module holding it (an ``nn.ModuleList`` for an entry of a list: ``attribute`` is then its
    index). A rotary module's own parts are not searched.

    Args:
        model: a ``torch.nn.Module``.
    """
    slots, inside = [], []
    for owner, module in model.named_modules():
        if any(f"{owner}.".startswith(prefix) for prefix in inside):
            continue  # a part of a rotary module (rope's per-layer-type modules) or of a vision one
        if owner and is_vision_rotary(module):
            inside.append(f"{owner}.")
            continue
        for attribute, child in module.named_children():
            if (attribute == "rotary_emb" or type(child).__name__.endswith(ROTARY_CLASS_SUFFIX)
                    or is_stacked_rotary(child) or isinstance(child, RotaryAngleTable)) and not is_vision_rotary(child):
                slots.append((owner, attribute, child))
                inside.append(f"{owner}.{attribute}." if owner else f"{attribute}.")
        for attribute in POSITION_TABLES:
            table = module._buffers.get(attribute)
            if isinstance(table, torch.Tensor) and table.dim() == 2 and table.is_floating_point():
                slots.append((owner, attribute, table))
    return slots


def slot_holder(model: nn.Module, owner: str) -> nn.Module:
    """The module whose class holds the slots of ``owner``: ``model.get_submodule(owner)``, or
    for an ``nn.ModuleList`` or ``nn.ModuleDict`` the nearest module above it that is neither
    (its class, in a modeling module, made the list).

    Args:
        model: a ``torch.nn.Module``.
        owner: the qualified name of a submodule (``""``: the model).
    """
    while True:
        module = model.get_submodule(owner)
        if not owner or not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            return module
        owner = owner.rpartition(".")[0]


def table_embedding(config: Any, width: int) -> RotaryEmbedding:
    """rope's module whose frequencies a position table of ``width`` columns holds
    (:data:`POSITION_TABLES`): the config's RoPE parameters (GPT-J's and CodeGen's have none: base
    10000) on ``width / 2`` pairs.

    Args:
        config: the model's transformers config.
        width: the table's columns, twice its pairs.
    """
    params = rope_parameters_from_config(config)
    params.pop("partial_rotary_factor", None)  # the table's width is the rotary width already
    return RotaryEmbedding(rope_parameters=params, head_dim=width)


def _reproduce_table(name: str, old: torch.Tensor, config: Any) -> torch.Tensor | None:
    """rope's table in place of the position table ``old`` (:func:`rope.hf.position_table`, in
    its dtype, on its device), checked against every row of ``old`` to :data:`~rope.hf.probing.PROBE_TOLERANCE`
    beyond transformers' float32 angles and, for a half-precision table, one unit of its dtype;
    ``None`` where ``old`` is rope's table already, bit for bit; else an error."""
    rows, width = old.shape
    if width % 2 or not rows:
        raise ValueError(f"install: {name} is a table of shape {tuple(old.shape)}: not one row of sin and cos "
                         "halves per position; nothing was replaced")
    embedding = table_embedding(config, width).to(old.device)
    new = position_table(embedding, rows, old.dtype)
    if torch.equal(new, old):
        return None
    positions = torch.arange(rows, device=old.device)
    theta, attention = embedding.frequencies(positions[None])
    allowance = positions[:, None].to(torch.float64) * theta.to(torch.float64) * abs(attention) * PROBE_FLOAT32
    allowance = allowance.repeat(1, 2) + (torch.finfo(old.dtype).eps if old.dtype in _HALF_DTYPES else 0.0)
    gap = float(((old.to(torch.float64) - new.to(torch.float64)).abs() - allowance).max())
    rounded = next((dtype for dtype in _HALF_DTYPES if old.dtype not in _HALF_DTYPES
                    and torch.equal(old.to(dtype).to(old.dtype), old)), None)
    if gap > PROBE_TOLERANCE and rounded is not None:
        dtype_name, stored = (str(d).removeprefix("torch.") for d in (rounded, old.dtype))
        raise ValueError(f"install: {name} holds {dtype_name} numbers only (stored in {stored}): the model was cast to "
                         f"{dtype_name} and back, which rounded its table; nothing was replaced. Fix: call "
                         "rope.hf.install(model) (or rope.hf.patch) before casting the model")
    if gap > PROBE_TOLERANCE:
        raise ValueError(f"install: {name} ({rows} rows of sin and cos halves) is not reproduced by rope's table of "
                         f"{embedding.rope_config.rope_type} RoPE of theta {embedding.rope_config.rope_theta:g} on "
                         f"{width // 2} pairs: off by {gap:.3g}; nothing was replaced")
    return new


def rotary_replacements(model: nn.Module) -> tuple[Replacement, ...]:
    """What :func:`install` would swap in ``model``, each replacement checked, the model untouched:
    one :class:`Replacement` per rotary module (:func:`rotary_slots`: ``rotary_emb`` and the like)
    that is not rope's already (vision rotary modules aside: :mod:`rope.hf.vision`), and per
    position table (:data:`POSITION_TABLES`) that is not rope's table already. Raises as
    :func:`install` does.

    Args:
        model: a transformers model (a ``torch.nn.Module`` with ``rotary_emb`` submodules or
            position tables).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = rotary_slots(model)
    if not found:
        aside = " but vision rotary modules (rope.hf.vision's, which rope.hf.patch swaps)" if any(
            is_vision_rotary(m) for m in model.modules()) else ""
        config = getattr(model, "config", None)
        options = [f"{key}={getattr(config, key)!r}" for key in ROTARY_OPTIONS
                   if getattr(config, key, ROTATING[0]) not in ROTATING]
        why = (f"; its config sets {', '.join(options)}: the model does not rotate in this configuration (its type "
               "is covered where the config makes it rotate, rope.hf.coverage)") if options else ""
        raise ValueError(f"install: {type(model).__name__} has no submodule named rotary_emb nor a position table "
                         f"buffer ({', '.join(POSITION_TABLES)}){aside}: nothing to replace (install swaps the "
                         f"rotary_emb modules of transformers models){why}")
    replacements = []
    for owner, attribute, old in found:
        if isinstance(old, (*ROTARY_MODULES, StackedRotaryTable, RotaryAngleTable)):
            continue
        name = f"{owner}.{attribute}" if owner else attribute
        config = getattr(old, "config", None) or getattr(model, "config", None)
        if config is None:
            raise ValueError(f"install: {name} has no config, and neither has the model; nothing was replaced")
        if isinstance(old, torch.Tensor):
            new = _reproduce_table(name, old, config)
            if new is not None:
                replacements.append(Replacement(owner, old, new, attribute))
            continue
        if is_stacked_rotary(old):  # a conformer's table of its own positions 0 .. n - 1 (CLVP's: their angles)
            new = reproduce_angles(name, old) if returns_angles(old) else reproduce_stacked(name, old, config)
            replacements.append(Replacement(owner, old, new, attribute))
            continue
        device = next((buffer.device for buffer in old.buffers()), None)
        new = _reproduce(name, old, config, device)
        if getattr(old, "config", None) is not None:  # as transformers' modules: Granite SWA's model reads its theta
            new.config = old.config
        replacements.append(Replacement(owner, old, new, attribute))
    return tuple(replacements)


def install(model: nn.Module) -> int:
    """Replace every rotary module of a transformers model (``rotary_emb``, or another child of a
    ``...RotaryEmbedding`` class: :func:`rotary_slots`) by rope's rotary module
    built from the model's config (:func:`rotary_embedding`: :class:`RotaryEmbedding`, or
    :class:`LayerTypeRotaryEmbedding` for ``rope_parameters`` nested by layer type); returns how
    many were replaced.

    Every replacement is first checked: the old and new modules must return the same ``(cos,
    sin)`` at a few probe positions (shuffled per axis for M-RoPE, for every layer type if the
    config has several; for the rope types of :data:`~rope.hf.probing.LENGTH_DEPENDENT`, also sequences ending
    on both sides of each length of the config), to within :data:`~rope.hf.probing.PROBE_TOLERANCE` beyond
    transformers' float32 error, in one of the :data:`TABLE_FORMS`, which the new module then
    keeps, with the old module's ``config`` (which a model may read). The probe calls a deep copy
    of the old module, never the module itself, so that a stateful one (transformers'
    ``dynamic``) is left exactly as it was. A module that reads M-RoPE's three rows of position
    ids is only matched by an M-RoPE module; where the config names no ``mrope_section`` (the
    model class has a default) or no M-RoPE style (the modeling code fixes it), the old module's
    sections are tried in each assignment style. A module that reads positions on 2 or 4 axes
    (NeoMME, HunYuan-VL), or on M-RoPE's three in blocks no M-RoPE style lays out (HunYuan-VL
    with three sections), gets :mod:`rope.hf.axes`'s module, probed the same way
    (:func:`rope.hf.axes.find_axes`), or is refused naming each layout's gap.

    A conformer's rotary module (``...RotaryPositionalEmbedding``, wav2vec2-conformer,
    wav2vec2-bert, SeamlessM4T: a stack of the cos and sin of its sequence's positions, no
    position ids) gets rope's :class:`rope.hf.self_rotating.StackedRotaryTable`, checked on a few
    sequence lengths (:func:`rope.hf.self_rotating.reproduce_stacked`); CLVP's, which returns the
    angles of those positions, gets :class:`rope.hf.RotaryAngleTable` (:func:`rope.hf.clvp.reproduce_angles`).

    A model whose attention keeps its table in a buffer (GPT-J, CodeGen: :data:`POSITION_TABLES`)
    gets rope's table of the same rows in that buffer instead (:func:`rope.hf.position_table`:
    the sin and cos of exactly reduced angles, rounded once to the buffer's dtype), after the same
    check on every row. A later cast of the model rounds that buffer again (from the float32
    table: within half a unit of the new dtype and a float32 rounding).

    Raises ``ValueError``, leaving the model untouched, where a module no form reproduces (a
    convention rope does not know, instead of running with wrong positions; a model cast to
    float16 or bfloat16, whose module's frequencies the cast rounded, is named as such, with the
    fix), or where the model has no ``rotary_emb`` submodule nor position table at all. A model
    whose rotary modules and tables are all rope's already is left as it is: install returns 0
    (installing twice is harmless). Install before casting a model: rope's module keeps float32
    frequencies through casts. :func:`rope.hf.patch` installs and also replaces the model's
    apply function, undoably.

    Args:
        model: a transformers model (a ``torch.nn.Module`` with ``rotary_emb`` submodules).
    """
    replacements = rotary_replacements(model)
    for replacement in replacements:
        setattr(model.get_submodule(replacement.owner), replacement.attribute, replacement.new)
    return len(replacements)
