"""The probe that checks a rotary module of rope's against transformers' before it is swapped in
(:func:`rope.hf.install`, :mod:`rope.hf.axes`, :mod:`rope.hf.vision`): the position ids both are
called with, how far their tables may differ (transformers' float32 angles against rope's exact
ones), and the copy of the model's module that is called in its place, so that probing leaves the
model as it was."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .embedding import RotaryEmbedding, laid_out_tables

PROBE_TOLERANCE = 1e-5
"""How far every probe (install's, the vision, image-grid, stacked and axes modules') lets the
model's tables and rope's differ, beyond the error of transformers' float32 angles: at positions
below 8 those are off by less than 1e-6, and at a position m the probe allows a further
2^-20 m theta_i (:data:`PROBE_FLOAT32`, times the attention factor) for the table entries of pair
i (the float32 product m theta_i and float32 frequencies are within a few ulps); a wrong layout,
axis assignment, frequency or length threshold is off by O(1)."""

LENGTH_DEPENDENT = ("dynamic", "longrope", "yarn", "llama3")
"""The rope types whose frequencies depend on a length of the config (``max_position_embeddings``,
``original_max_position_embeddings``): install probes them on both sides of each such length."""

FREQUENCY_ULPS = 4
"""How many float32 ulps a module's ``inv_freq`` may be from rope's frequencies: transformers
computes ``1 / b ** (2j / d)`` in float32 (a power and a division, each within an ulp or two);
a wrong base, width or order is off by far more."""


def first_other_frequency(theirs: torch.Tensor, theta: torch.Tensor) -> int | None:
    """The index of the first entry of a module's frequencies ``theirs`` more than
    :data:`FREQUENCY_ULPS` float32 ulps from rope's ``theta`` (same shape), ``None`` where all agree.

    Args:
        theirs: the module's ``inv_freq``, any float dtype and device.
        theta: rope's frequencies, float32 or float64.
    """
    theirs, theta = (t.detach().to("cpu", torch.float64) for t in (theirs, theta))
    off = ((theirs - theta).abs() > FREQUENCY_ULPS * 2.0**-23 * theta).nonzero()
    return int(off[0]) if off.numel() else None


PROBE_FLOAT32 = 2**-20
"""The allowance per unit of angle for transformers' float32 angles: a table entry of pair i at
position m may be off by 2^-20 m theta_i (times the attention factor) beyond :data:`PROBE_TOLERANCE`."""

_LONGEST_PROBE = 2**24  # float32 holds every position up to here, so transformers' tables are exact enough


def shuffled_positions(rows: int, device) -> torch.Tensor:
    """Positions 0..7 in a fixed shuffled order per row: ``[1, 8]``, or ``[3, 1, 8]`` (M-RoPE's t, h
    and w rows differ, so a wrong assignment of pairs to axes shows)."""
    gen = torch.Generator().manual_seed(0)
    positions = torch.stack([torch.randperm(8, generator=gen) for _ in range(rows)])
    return (positions[:, None] if rows == 3 else positions).to(device)


def length_positions(length: int, rows: int, device) -> torch.Tensor:
    """A few positions of a sequence of ``length`` tokens, the last one (length - 1) included, so
    that ``max(position_ids) + 1`` is ``length``: ``[1, n]``, or ``[3, 1, n]`` (each row in another order)."""
    values = torch.tensor(sorted({0, 1, length // 2, length - 2, length - 1} & set(range(length))))
    positions = torch.stack([values.roll(row) for row in range(rows)])
    return (positions[:, None] if rows == 3 else positions).to(device)


def thresholds(config: Any, embedding: RotaryEmbedding) -> set[int]:
    """Every length of the config a rope type of :data:`LENGTH_DEPENDENT` could switch at: the
    config's own ``max_position_embeddings`` and ``original_max_position_embeddings`` (top level,
    in ``rope_parameters``, in each layer type's) and the ones rope read. Both readings are probed,
    so a length one side reads differently from the other shows."""
    keys = ("max_position_embeddings", "original_max_position_embeddings")
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    mappings = [params, *params.values()] if isinstance(params, Mapping) else []
    values = [mapping.get(key) for mapping in mappings if isinstance(mapping, Mapping) for key in keys]
    values += [getattr(source, key, None) for source in (config, embedding.rope_config) for key in keys]
    return {value for value in values if isinstance(value, int) and not isinstance(value, bool) and value >= 1}


def probes(config: Any, embedding: RotaryEmbedding, rows: int, device) -> list[torch.Tensor]:
    """The position ids install calls both modules with, by increasing length: one position (a
    stateful module such as transformers' dynamic one resets there), the shuffled 0..7, and for a
    rope type of :data:`LENGTH_DEPENDENT`, sequences of length T - 1, T, T + 1 and 2 T for every
    threshold T (:func:`thresholds`), up to 2^24. Increasing, so that transformers' dynamic
    module, which keeps the largest base it has seen, computes each length's own."""
    lengths = set()
    if embedding.rope_config.rope_type in LENGTH_DEPENDENT:
        for threshold in thresholds(config, embedding):
            lengths |= {threshold - 1, threshold, threshold + 1, 2 * threshold}
    probes = [(1, length_positions(1, rows, device)), (8, shuffled_positions(rows, device))]
    probes += [(length, length_positions(length, rows, device)) for length in lengths if 1 < length <= _LONGEST_PROBE]
    return [positions for _, positions in sorted(probes, key=lambda probe: probe[0])]


def float32_allowance(embedding: RotaryEmbedding, positions: torch.Tensor) -> torch.Tensor:
    """2^-20 m theta_i times the attention factor, laid out as ``embedding``'s tables (M-RoPE: the
    largest of the three rows' m): what transformers' float32 angles may be off by beyond
    :data:`PROBE_TOLERANCE`."""
    theta, attention = embedding.frequencies(positions)
    largest = positions.amax(dim=0) if positions.dim() == 3 else positions
    angles = largest.to(torch.float64)[..., None].abs() * theta.to(largest.device, torch.float64)
    form = "pairs" if embedding.tables == "complex" else embedding.tables
    return laid_out_tables(angles, angles, attention * PROBE_FLOAT32, torch.float64, form)[0]


def call_module(name: str, module: nn.Module, positions, layer_type, device):
    """``module(x, positions[, layer_type])`` with a float32 ``x``, or an error naming the module."""
    x = torch.zeros(1, dtype=torch.float32, device=device)
    extra = () if layer_type is None else (layer_type,)
    try:
        return module(x, positions, *extra)
    except Exception as err:  # any failure means the module does not follow the contract
        call = "rotary_emb(x, position_ids" + ("" if layer_type is None else f", {layer_type!r}") + ")"
        raise ValueError(f"install: {name} could not be called as {call} ({type(err).__name__}: {err}); "
                         "nothing was replaced") from err


def output_gap(theirs, ours, allowance: torch.Tensor | None = None, *, same_dtype: bool = False) -> float | None:
    """The largest difference of two module outputs ((cos, sin) or one complex tensor), less
    ``allowance`` (per entry, broadcast); ``None`` when their structure or shapes differ (or, with
    ``same_dtype``, their dtypes: a vision tower's tables must come in the dtype its attention expects)."""
    theirs, ours = (tuple(out) if isinstance(out, (tuple, list)) else (out,) for out in (theirs, ours))
    if not (len(theirs) == len(ours) and all(
            isinstance(a, torch.Tensor) and a.shape == b.shape and a.is_complex() == b.is_complex()
            and (not same_dtype or a.dtype == b.dtype) for a, b in zip(theirs, ours))):
        return None
    gaps = [(a.to(b.dtype) - b).abs().to(torch.float64) for a, b in zip(theirs, ours)]
    if allowance is not None:
        gaps = [gap - allowance.to(gap.device) for gap in gaps]
    return max(float(gap.max()) if gap.numel() else 0.0 for gap in gaps)


def probe_copy(name: str, old: nn.Module) -> nn.Module:
    """A deep copy of ``old`` to call in its place: transformers' rotary modules can change state
    when called (``dynamic`` keeps the largest base it has seen, and its config is standardized
    again), and probing must leave the model exactly as it was. A module that cannot be copied
    is refused rather than called."""
    try:
        return copy.deepcopy(old)
    except Exception as err:  # any failure: the module cannot be probed without the risk of changing it
        raise ValueError(f"install: {name} ({type(old).__name__}) could not be copied for the probe "
                         f"({type(err).__name__}: {err}), and calling the model's own module could change its state; "
                         "nothing was replaced") from err
