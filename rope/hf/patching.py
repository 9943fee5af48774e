"""One call to put rope into a transformers model, and one to take it out again.

:func:`patch` follows Liger-Kernel's ``apply_liger_kernel_to_llama`` and its siblings
(``liger_kernel/transformers/monkey_patch.py``), which replace ``apply_rotary_pos_emb`` by name
in the family's modeling module, where the attention looks it up at every call. Here the family
comes from ``model.config.model_type`` and :data:`rope.hf.FAMILIES`, and the model's rotary
modules are swapped too (:func:`rope.hf.install`). Unlike Liger, everything is checked before
anything changes: a model :func:`patch` cannot reproduce is refused, untouched. The record it
returns says what changed, and :func:`unpatch` undoes it.

The modeling module belongs to the whole process, so replacing its function affects every model
of that module, patched or not. A model that is not patched hands rope's function transformers'
own tables, and gets transformers' formula on them, computed in float32 and rounded once. The
original functions come back when the last patched model of the module is unpatched, or is
garbage-collected while patched. In that second case, a function someone else has replaced since
is left as it is, because there is no caller to tell.

A model that rotates in a method of its attention class (RoFormer, the conformers:
:mod:`rope.hf.methods`) gets that class attribute replaced instead of a module-level function; the
class is shared by every model of the modeling module, so it is counted and restored in the same
way, the very object the class held (a ``staticmethod`` included). RoFormer keeps its own table
(float64 angles rounded once) and V-JEPA 2 makes none (:data:`rope.hf.methods.OWN_TABLES`): no
rotary module is swapped, and their modeling module is their own class's.

A model may hold rotary modules in classes of several modeling modules (CSM's Mimi codec, a
composite's text model of another type: Kimi-K2.5's DeepSeek-V3, PE Audio's ModernBERT). Each such
module gets one convention: the model's own (the module of its class) the model type's row of
:data:`rope.hf.FAMILIES`; every other the row of the ``config.model_type`` of the classes it holds
the rotary modules in (a text model of a covered type, as ``deepseek_v3``: its own row, which
:mod:`rope.hf.coverage` checked its functions compute, and checks again for the composite). So
the coverage table needs no more than one convention per type. Where the model's own module holds
none of its text rotary modules (Kimi-K2.5, LFM3-VL, VideoLLaMA 3: only their vision towers' classes
are their own), its row, the vision convention, replaces nothing: as in Qwen2-VL, the tower's
function stays transformers' on rope's exact tables (:mod:`rope.hf.vision`). A module patched for
one model holds one convention: a model that needs another there, or a module that would need two
at once, is refused.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from .. import _checks
from . import coordinates, methods, time_rotary, vision
from .coverage_table import REFUSED, TRANSFORMERS_VERSION
from .families import FAMILIES, Convention
from .install import Replacement, rotary_replacements, rotary_slots, slot_holder, table_form


@dataclass(frozen=True, eq=False)
class Patch:
    """What :func:`patch` changed in one model. The record holds no reference to the model.

    Args:
        model_type: the model's ``config.model_type``, its key in :data:`rope.hf.FAMILIES`.
        convention: the model's row of :data:`rope.hf.FAMILIES`, the convention of its own
            modeling module.
        modules: ``(module, convention, originals)`` of each modeling module whose functions
            were replaced, the model's own first where it holds rotary modules: the convention
            set in (module docstring), and the ``(name, function)`` pairs as they were before
            that module's first patch, which the last :func:`unpatch` restores. Several where the
            model holds parts of other types (CSM's Mimi codec, a composite's text model).
        rotary_modules: the :class:`rope.hf.Replacement` of each rotary module or position
            table swapped. A module or table that was already rope's has none.
        vision_modules: the :class:`rope.hf.vision.VisionReplacement` of each vision rotary
            module swapped (:mod:`rope.hf.vision`).
        vision_left: ``(name, reason)`` of each vision rotary module rope does not reproduce,
            left as it was.
    """

    model_type: str
    convention: Convention
    modules: tuple[tuple[ModuleType, Convention, tuple[tuple[str, Callable], ...]], ...]
    rotary_modules: tuple[Replacement, ...]
    vision_modules: tuple[vision.VisionReplacement, ...] = ()
    vision_left: tuple[tuple[str, str], ...] = ()

    @property
    def module(self) -> ModuleType:
        """The first modeling module of :attr:`modules`."""
        return self.modules[0][0]

    @property
    def originals(self) -> tuple[tuple[str, Callable], ...]:
        """The original functions of :attr:`module`."""
        return self.modules[0][2]


@dataclass(eq=False)
class _ModuleState:
    """A patched modeling module: the functions it had, the convention set in, and how many
    patched models of it are alive."""

    module: ModuleType
    originals: tuple[tuple[str, Callable], ...]
    convention: Convention
    models: int = 0


_MODULES: dict[str, _ModuleState] = {}
_PATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (Patch, weakref.finalize)


def patch(model: nn.Module) -> Patch:
    """Make a transformers model compute RoPE with rope: install rope's rotary modules (checked
    against the model's own, :func:`rope.hf.install`) and replace the function(s) its family
    rotates q and k with (:data:`rope.hf.FAMILIES`) in the model's modeling module: the one
    that defines the classes holding its rotary modules (or, in GPT-J and CodeGen, the position
    table :func:`rope.hf.install` replaces), or each of them where the model holds parts of other
    types (CSM's Mimi codec, a composite's text model), each with its own convention (module
    docstring; :mod:`rope.hf.coverage` checks that they compute it). Vision
    towers get rope's exact module in place of each vision rotary module it reproduces
    (:mod:`rope.hf.vision`); the others stay the model's, named with the reason in a
    ``UserWarning`` and the record. A vision tower alone (a model whose only rotary modules are
    vision ones, as ``Qwen2VisionTransformerPretrainedModel``) is patched likewise, its modeling
    module being the one that defines the classes holding its vision rotary modules; it is refused
    where rope does not reproduce one of them. Returns the :class:`Patch` record.

    Raises ``TypeError`` for a model that is not an ``nn.Module`` or whose ``config.model_type``
    is not a str. Raises ``ValueError`` when patching would not reproduce the model: no
    ``config.model_type``, or one that is not in :data:`rope.hf.FAMILIES`; rotary modules that
    :func:`rope.hf.install` refuses; tables of another form than the family's; a modeling module
    without its convention's functions, or that another convention patched, or whose function was
    replaced since rope patched it; a modeling module of another type's parts whose convention
    is not known, or that would need two. It also raises ``ValueError`` for a model that is patched
    already, or that contains or is contained in a patched model. Every refusal happens before
    anything changes. If a change fails halfway, the changes made before it are undone.

    Args:
        model: a transformers model of a family in :data:`rope.hf.FAMILIES`.
    """
    model_type, convention = _family(model)
    _refuse_overlap(model)
    vision_only = _vision_only(model)
    try:
        replacements = () if vision_only or convention.name in methods.OWN_TABLES else rotary_replacements(model)
    except ValueError as err:
        raise ValueError(f"patch: {err}") from err
    modules = modeling_modules(model, model_type, convention)
    states = {module.__name__: _MODULES.get(module.__name__) for module, _, _ in modules}
    for module, held, _ in modules:
        if states[module.__name__] is not None:
            _refuse_foreign_state(module, held, states[module.__name__])
    _check_tables(model, replacements, {module: (held, part) for module, held, part in modules})
    swapped, left = vision.vision_replacements(model)
    if vision_only and left:
        raise ValueError(f"patch: the rotary modules of this {type(model).__name__} are vision ones, and "
                         f"{_checks.first_line(left[0][1], 300)}: its tables would stay transformers'; nothing changed")
    record = Patch(model_type, convention, tuple(
        (module, held, states[module.__name__].originals if states[module.__name__] is not None else tuple(
            (name, methods.get(module, name)) for name, _ in held.functions)) for module, held, _ in modules),
        replacements, swapped, left)
    _apply(model, record, first={name for name, state in states.items() if state is None})
    for module, held, functions in record.modules:
        state = _MODULES.setdefault(module.__name__, _ModuleState(module, functions, held))
        state.models += 1
    finalizer = weakref.finalize(model, _release, tuple(states))
    finalizer.atexit = False
    _PATCHES[model] = (record, finalizer)
    return record


def unpatch(model: nn.Module) -> None:
    """Undo :func:`patch`. The model gets its original rotary modules back (vision ones too),
    moved to the device that rope's modules are on now, and its original position tables, moved
    to the device and cast to the dtype of the buffer now (a cast of the model converts buffers,
    as it would have converted the original). The modeling module gets its original functions
    back once no other patched model of it remains (module docstring).

    Raises ``TypeError`` for a model that is not an ``nn.Module``. Raises ``ValueError``, and
    changes nothing, when the model is not patched (or was unpatched already), when its rotary
    modules are no longer the ones :func:`patch` put in (a position table: no longer rope's
    table, moved or cast as the model was), or when this is the last patched model of its
    module and the module's functions were replaced since.

    Args:
        model: a model :func:`patch` patched.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    entry = _PATCHES.get(model)
    if entry is None:
        raise ValueError(f"unpatch: this {type(model).__name__} is not patched (rope.hf.patch was not called on it, "
                         "or it was unpatched already); nothing changed")
    record, finalizer = entry
    moved = [r.name for r in record.rotary_modules if not _still_ropes(_current(model, r), r.new)]
    moved += vision.moved(model, record.vision_modules)
    if moved:
        raise ValueError(f"unpatch: {moved} are no longer the rotary modules rope.hf.patch put in (replaced since); "
                         "nothing changed")
    for module, held, _ in record.modules:
        foreign = _foreign_functions(module, held) if _MODULES[module.__name__].models == 1 else []
        if foreign:
            raise ValueError(f"unpatch: {module.__name__}.{foreign[0]} is no longer rope's function (replaced "
                             "since rope.hf.patch set it); restoring the original would undo that; nothing changed")
    for r in record.rotary_modules:
        setattr(model.get_submodule(r.owner), r.attribute, _original(r, _current(model, r)))
    vision.restore(model, record.vision_modules)
    del _PATCHES[model]
    finalizer()  # one patched model fewer; the last one restores the module's functions


def _family(model) -> tuple[str, Convention]:
    """The model's ``config.model_type`` and its row of :data:`rope.hf.FAMILIES`, or an error."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        raise ValueError(f"patch: {type(model).__name__} has no config.model_type: rope.hf.patch takes a transformers "
                         "model and reads its family from config.model_type; nothing changed")
    if not isinstance(model_type, str):
        raise TypeError(f"model.config.model_type must be a str, got {type(model_type).__name__}")
    if model_type not in FAMILIES:
        why = (f"refused: {REFUSED[model_type]}" if model_type in REFUSED else
               f"not a model type with rotary embeddings in transformers {TRANSFORMERS_VERSION}")
        raise ValueError(f"patch: model_type {model_type!r} is not in rope.hf.FAMILIES ({why}; "
                         "rope.hf.coverage_table lists every type); nothing changed. rope.hf.install and rope's "
                         "apply functions can still be used by hand")
    return model_type, FAMILIES[model_type]


def _refuse_overlap(model: nn.Module) -> None:
    """Raise if ``model`` is patched, or contains or is contained in a patched model."""
    for other in list(_PATCHES.keys()):
        if other is model:
            raise ValueError(f"patch: this {type(model).__name__} is patched already; call rope.hf.unpatch(model) "
                             "first; nothing changed")
        if any(m is other for m in model.modules()) or any(m is model for m in other.modules()):
            raise ValueError(f"patch: this {type(model).__name__} shares modules with a patched "
                             f"{type(other).__name__} (one contains the other); nothing changed")


def _vision_only(model: nn.Module) -> bool:
    """Whether the model's only rotary modules are vision ones (a vision tower alone): no
    ``rotary_emb`` module nor position table, and a vision rotary module of transformers'."""
    return not rotary_slots(model) and bool(vision.vision_rotary_modules(model))


def _rotary_owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every submodule whose class holds a rotary module (vision
    rotary modules aside) or a position table (:func:`rope.hf.install.rotary_slots`; a list's
    holder: :func:`rope.hf.install.slot_holder`) or a rotary time module (MusicFlamingo's:
    :mod:`rope.hf.time_rotary`) or a coordinate rotary module (EsmFold2's atom encoders, beside
    its ESMC backbone's ``rotary_emb``: :mod:`rope.hf.coordinates`), each once; in a vision tower
    alone (:func:`_vision_only`), of every holder of a vision rotary module."""
    if _vision_only(model):
        return vision.owners(model)
    owners = {owner: slot_holder(model, owner) for owner, _, _ in rotary_slots(model)}
    owners.update((name, held) for name, held in vision.owners(model)  # MusicFlamingo's pos_emb: its holder's
                  if any(time_rotary.is_time_rotary(m) or coordinates.is_coordinate_rotary(m)  # module turns
                         for m in held.children()))  # the audio; EsmFold2's turns the atoms
    return list(owners.items())


def _current(model: nn.Module, r: Replacement):
    """What the owner of ``r`` holds under its attribute now, or ``None`` where that is gone."""
    try:
        return getattr(model.get_submodule(r.owner), r.attribute, None)
    except AttributeError:
        return None


def _still_ropes(current, new) -> bool:
    """Whether ``current`` is still what patch put in: the same module; or, for a position table,
    whose tensor a move or cast of the model replaces, rope's table on its device in its dtype."""
    if current is new:
        return True
    return (isinstance(new, torch.Tensor) and isinstance(current, torch.Tensor) and current.shape == new.shape
            and current.is_floating_point()
            and torch.equal(current, new.to(device=current.device, dtype=current.dtype)))


def _original(r: Replacement, current):
    """The original module of ``r`` moved to the device of rope's module now; or the original
    table moved and cast as the buffer ``current`` was."""
    if isinstance(r.old, torch.Tensor):
        return r.old.to(device=current.device, dtype=current.dtype)
    device = next((buffer.device for buffer in r.new.buffers()), None)
    return r.old if device is None else r.old.to(device)


def modeling_modules(model: nn.Module, model_type: str,
                      convention: Convention) -> list[tuple[ModuleType, Convention, str]]:
    """The modules that define the classes holding the model's rotary modules (several where a
    model holds another type's parts: CSM's Mimi codec, a composite's text model; a vision tower's
    alone: its vision rotary modules), the model's own class's module first, each with its
    convention: the model's own ``convention``; another module the :data:`rope.hf.FAMILIES` row of
    the ``config.model_type`` of the classes holding the rotary modules there (module docstring).
    Each module must define its convention's functions. Returns ``(module, convention, the
    model_type whose row it is)`` triples."""
    own, found = type(model).__module__, {}
    owners = [("", model)] if convention.name in methods.OWN_TABLES else _rotary_owners(model)  # its method alone
    for _, owner in owners:
        if type(owner).__module__ == own:
            part, held = model_type, convention
        else:
            part = getattr(getattr(owner, "config", None), "model_type", None)
            held = FAMILIES.get(part) if isinstance(part, str) else None
        if held is None:
            raise ValueError(f"patch: this {type(model).__name__} holds rotary modules in a {type(owner).__name__} of "
                             f"{type(owner).__module__}, whose convention is not known: its config.model_type "
                             f"{part!r} is not in rope.hf.FAMILIES; nothing changed")
        found.setdefault(type(owner).__module__, {})[held.name] = (held, part)
    for name, held in found.items():
        if len(held) > 1:
            raise ValueError(f"patch: {name} holds rotary modules of this {type(model).__name__} under two "
                             f"conventions, {' and '.join(sorted(held))}; one modeling module has one set of "
                             "functions; nothing changed")
    modules = [(sys.modules[name], *next(iter(found[name].values())))
               for name in sorted(found, key=lambda name: (name != own, name))]
    for module, held, part in modules:
        missing = [name for name, _ in held.functions if not callable(methods.get(module, name))]
        if missing:
            raise ValueError(f"patch: {module.__name__} has no function {missing[0]}, which the {held.name} "
                             f"convention of model_type {part!r} replaces (rope.hf.FAMILIES): another "
                             "transformers version or a custom model; nothing changed")
    return modules


def _foreign_functions(module: ModuleType, convention: Convention) -> list[str]:
    """The names of the convention's functions that ``module`` no longer holds rope's function under."""
    return [name for name, function in convention.functions if methods.get(module, name) is not function]


def _refuse_foreign_state(module: ModuleType, convention: Convention, state: _ModuleState) -> None:
    """Raise unless the module patched for other models holds this convention's functions still."""
    if state.convention is not convention:
        raise ValueError(f"patch: {module.__name__} is patched with the {state.convention.name} convention for "
                         f"another model, not {convention.name}; nothing changed")
    foreign = _foreign_functions(module, convention)
    if foreign:
        raise ValueError(f"patch: {module.__name__}.{foreign[0]} is no longer rope's function (replaced since "
                         "rope.hf.patch set it for another model); nothing changed")


def _check_tables(model: nn.Module, replacements: tuple[Replacement, ...],
                  conventions: dict[ModuleType, tuple[Convention, str]]) -> None:
    """Raise unless every rotary module (or position table) the model would hold lays its tables
    out as the function of its holder's modeling module reads them (``conventions``: each
    module's convention and the model_type whose row it is)."""
    new = {(r.owner, r.attribute): r.new for r in replacements}
    for owner, attribute, current in rotary_slots(model):
        form = table_form(new.get((owner, attribute), current))
        held, part = conventions[sys.modules[type(slot_holder(model, owner)).__module__]]
        if form != held.tables:
            name = f"{owner}.{attribute}" if owner else attribute
            raise ValueError(f"patch: {name} returns {form} tables, but model_type {part!r} reads {held.tables} "
                             "tables (rope.hf.FAMILIES): the config's model_type does not describe this model; "
                             "nothing changed")


def _apply(model: nn.Module, record: Patch, *, first: set[str]) -> None:
    """Set the convention's functions in the modules, then swap the rotary modules. If a step
    fails, undo the steps before it: the swaps made so far, and the functions of the modules
    named in ``first`` (those patched for no other model)."""
    for module, held, _ in record.modules:
        for name, function in held.functions:
            methods.put(module, name, function)
    done = []
    try:
        for r in record.rotary_modules:
            setattr(model.get_submodule(r.owner), r.attribute, r.new)
            done.append(r)
        vision.swap(model, record.vision_modules)  # all or none
    except BaseException:
        for r in done:
            setattr(model.get_submodule(r.owner), r.attribute, r.old)
        for module, _, originals in record.modules:
            if module.__name__ in first:
                for name, function in originals:
                    methods.put(module, name, function)
        raise


def _release(module_names: tuple[str, ...]) -> None:
    """One patched model of each module fewer (unpatched or collected). The last one of a module
    restores its original functions wherever rope's are still in place."""
    for module_name in module_names:
        state = _MODULES[module_name]
        state.models -= 1
        if state.models:
            continue
        del _MODULES[module_name]
        for (name, original), (_, ours) in zip(state.originals, state.convention.functions):
            if methods.get(state.module, name) is ours:
                methods.put(state.module, name, original)
