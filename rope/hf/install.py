"""Swapping rope's rotary module into a loaded transformers model, after checking it reproduces
the model's own tables."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .embedding import TABLE_FORMS, RotaryEmbedding

PROBE_TOLERANCE = 1e-5
"""How far install's probe lets the old and new tables differ: transformers' float32 angles at
positions below 8 are off by less than 1e-6; a wrong layout or axis assignment is off by O(1)."""


def _probe_positions(embedding: RotaryEmbedding, device) -> torch.Tensor:
    """Positions 0..7 in a fixed shuffled order per row: ``[1, 8]``, or ``[3, 1, 8]`` with M-RoPE
    (t, h, w differ, so a wrong assignment of pairs to axes shows)."""
    gen = torch.Generator().manual_seed(0)
    rows = 3 if embedding.mrope_axes is not None else 1
    positions = torch.stack([torch.randperm(8, generator=gen) for _ in range(rows)])
    return (positions[:, None] if rows == 3 else positions).to(device)


def _table_gap(name: str, old: nn.Module, new: RotaryEmbedding, device) -> float | None:
    """The largest difference between the (cos, sin) of ``old`` and ``new`` at probe positions,
    over every layer type; ``None`` where the shapes differ. Raises if ``old`` cannot be called."""
    x = torch.zeros(1, dtype=torch.float32, device=device)
    cases = [(None, new)] if new.layer_types is None else list(new.layer_types.items())
    worst = 0.0
    for layer_type, embedding in cases:
        positions = _probe_positions(embedding, device)
        extra = () if layer_type is None else (layer_type,)
        try:
            theirs = old(x, positions, *extra)
        except Exception as err:  # any failure means the module does not follow the contract
            call = "rotary_emb(x, position_ids" + ("" if layer_type is None else f", {layer_type!r}") + ")"
            raise ValueError(f"install: {name} could not be called as {call} "
                             f"({type(err).__name__}: {err}); nothing was replaced") from err
        ours = new(x, positions, *extra)
        if new.tables == "complex":  # one complex tensor each
            theirs, ours = (theirs,), (ours,)
        if not (isinstance(theirs, tuple) and len(theirs) == len(ours)
                and all(isinstance(a, torch.Tensor) and a.shape == b.shape and a.is_complex() == b.is_complex()
                        for a, b in zip(theirs, ours))):
            return None
        worst = max(worst, *(float((a.to(b.dtype) - b).abs().max()) for a, b in zip(theirs, ours)))
    return worst


def _reproduce(name: str, old: nn.Module, config: Any, device) -> RotaryEmbedding:
    """The :class:`RotaryEmbedding` of ``config`` whose table form reproduces ``old``, or an error."""
    found = []
    for form in TABLE_FORMS:
        new = RotaryEmbedding(config, tables=form)
        new = new.to(device) if device is not None else new
        gap = _table_gap(name, old, new, device)
        if gap is not None and gap <= PROBE_TOLERANCE:
            return new
        found.append(f"{form}: " + ("other shapes" if gap is None else f"off by {gap:.3g}"))
    raise ValueError(
        f"install: {name} ({type(old).__name__}) is not reproduced by rope.hf.RotaryEmbedding: its (cos, sin) at "
        f"probe positions differ in every table form ({'; '.join(found)}): another scaling or convention; "
        "nothing was replaced"
    )


def install(model: nn.Module) -> int:
    """Replace every ``rotary_emb`` submodule of a transformers model by :class:`RotaryEmbedding`
    built from the model's config; returns how many were replaced.

    Every replacement is first checked: the old and new modules must return the same ``(cos,
    sin)`` at a few probe positions (shuffled per axis for M-RoPE, for every layer type if the
    config has several), to within :data:`PROBE_TOLERANCE`, in one of the :data:`TABLE_FORMS`,
    which the new module then keeps. A module no form reproduces (a convention rope does not
    know) raises ValueError and the model is left untouched, instead of running with wrong
    positions.
    """
    replacements = []
    for owner_name, module in model.named_modules():
        old = getattr(module, "rotary_emb", None)
        if isinstance(old, nn.Module) and not isinstance(old, RotaryEmbedding):
            config = getattr(old, "config", None) or model.config
            device = next((buffer.device for buffer in old.buffers()), None)
            name = f"{owner_name}.rotary_emb" if owner_name else "rotary_emb"
            replacements.append((module, _reproduce(name, old, config, device)))
    for module, new in replacements:
        module.rotary_emb = new
    return len(replacements)
