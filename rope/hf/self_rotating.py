"""rope's exact module in place of a rotary module that makes the table of its sequence's own
positions, with no position ids: the conformers' ``RotaryPositionalEmbedding`` of transformers
5.23 (``modeling_wav2vec2_conformer.py``, ``modeling_wav2vec2_bert.py``,
``modeling_seamless_m4t.py``, used with ``position_embeddings_type="rotary"``).

Such a module is called as ``forward(hidden_states)`` (``[batch, n, hidden]``) and returns one
stack ``[2, n, 1, 1, d]``: ``cos`` then ``sin`` of the angles m theta_i of positions m = 0 .. n - 1,
each pair's angle twice (the two halves of the head, ``torch.cat((freqs, freqs))``), in the
dtype of ``hidden_states``; theta_i = base^(-2i/d) with ``base = config.rotary_embedding_base``
and d the head width. Its attention rotates its query and key by ``x cos + rotate_half(x) sin``
in its own method (``_apply_rotary_embedding``), which :func:`rope.hf.install` leaves as it is and
:func:`rope.hf.patch` replaces (:mod:`rope.hf.methods`). transformers forms
m theta_i in float32 (off by up to about 2^-24 m theta_i rad, 2^-8 rad at m = 2^16 for theta_i
= 1) and rounds cos and sin from there; :class:`StackedRotaryTable` reduces m theta_i exactly
(:func:`rope.apply.exact_cos_sin`, rope's float32 frequencies of the config) and rounds each
entry of the stack once to the dtype of ``hidden_states``: within half a unit of that dtype of
the exact cos and sin. The stack it returns carries the float64 stack it was rounded from
(:data:`rope.hf.methods.EXACT_ATTRIBUTE`), from which :func:`rope.hf.patch`'s replacement of the
attention's method (:func:`rope.hf.methods.apply_rotary_embedding_stacked`) rotates while the
stack is untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..apply import exact_cos_sin
from ..frequencies import inv_freq
from ..rotation import round_once
from .embedding import Float32Frequencies
from .methods import EXACT_ATTRIBUTE
from .probing import PROBE_TOLERANCE, probe_copy

STACKED_CLASS_SUFFIX = "RotaryPositionalEmbedding"
"""The ending of the class names of transformers' rotary modules of this kind."""

PROBE_LENGTHS = (1, 8, 3)
"""Sequence lengths install's probe calls both modules with (the stock module caches the table
of the last length: 3 after 8 reads a fresh one)."""


def is_stacked_rotary(module: nn.Module) -> bool:
    """Whether ``module`` is a rotary module of this kind: a class named ``...RotaryPositionalEmbedding``
    (:data:`STACKED_CLASS_SUFFIX`) with an ``inv_freq`` buffer, or rope's :class:`StackedRotaryTable`."""
    return isinstance(module, StackedRotaryTable) or (
        type(module).__name__.endswith(STACKED_CLASS_SUFFIX) and isinstance(module._buffers.get("inv_freq"),
                                                                               torch.Tensor))


class StackedRotaryTable(Float32Frequencies):
    """``forward(hidden_states)`` -> ``[2, n, 1, 1, 2 p]``: ``cos`` then ``sin`` of the exactly
    reduced angles m theta_i, m = 0 .. n - 1 (n = ``hidden_states.shape[1]``), each pair's twice
    (both halves), rounded once to ``hidden_states.dtype``, on the device of the frequencies: the
    contract of transformers' conformer rotary modules (module docstring). The table is computed
    at every call (transformers caches the last length's; the encoder calls it once per forward).

    Args:
        base: the RoPE base (``config.rotary_embedding_base``).
        head_dim: the head width d, rotated whole: p = d / 2 pairs of frequencies base^(-2i/d).
    """

    tables = "stacked"

    def __init__(self, base: float, head_dim: int):
        super().__init__()
        theta, _ = inv_freq({"rope_type": "default", "rope_theta": base}, head_dim)
        self.base, self.head_dim = base, head_dim
        self.inv_freq = nn.Buffer(theta, persistent=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() < 2:
            raise TypeError("hidden_states must be a tensor [batch, seq, ...], got "
                            f"{getattr(hidden_states, 'shape', type(hidden_states).__name__)}")
        positions = torch.arange(hidden_states.shape[1], device=self.inv_freq.device)
        cos, sin = exact_cos_sin(positions, self.inv_freq)
        stack = torch.stack([cos, sin]).repeat(1, 1, 2)[:, :, None, None, :]
        out = round_once(stack, hidden_states.dtype)
        if stack.dtype == torch.float64 and out is not stack:  # for rope.hf.methods: rotate by the exact values
            setattr(out, EXACT_ATTRIBUTE, (stack, out._version))
        return out


def reproduce_stacked(name: str, old: nn.Module, config: Any) -> StackedRotaryTable:
    """rope's :class:`StackedRotaryTable` for the model's module ``old`` (base from
    ``config.rotary_embedding_base``, width from ``old``'s frequencies), on ``old``'s device,
    checked against a deep copy of ``old`` (never ``old`` itself: it caches) on float32 hidden
    states of each of :data:`PROBE_LENGTHS`: same shape and dtype, and entries within
    :data:`PROBE_TOLERANCE`. Raises ``ValueError`` naming what differs otherwise.

    Args:
        name: the module's qualified name in the model, for messages.
        old: transformers' conformer rotary module (:func:`is_stacked_rotary`).
        config: the model's config (or the sub-config the module was built from).
    """
    base = getattr(config, "rotary_embedding_base", None)
    if not isinstance(base, (int, float)) or isinstance(base, bool) or not base > 1:
        raise ValueError(f"install: {name} ({type(old).__name__}): its config has no rotary_embedding_base above 1 "
                         f"(got {base!r}), which its frequencies come from; nothing was replaced")
    theirs = old._buffers["inv_freq"]
    new = StackedRotaryTable(float(base), 2 * theirs.numel()).to(theirs.device)
    probe = probe_copy(name, old)
    for length in PROBE_LENGTHS:
        hidden = torch.zeros(1, length, 1, device=theirs.device)
        a, b = probe(hidden), new(hidden)
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            raise ValueError(f"install: {name} ({type(old).__name__}) returns {got} for {length} positions where "
                             f"rope's StackedRotaryTable returns {tuple(b.shape)} {b.dtype} (cos and sin of "
                             "positions 0 .. n - 1): another contract; nothing was replaced")
        gap = float((a.to(torch.float64) - b.to(torch.float64)).abs().max())
        if gap > PROBE_TOLERANCE:
            raise ValueError(f"install: {name} ({type(old).__name__}) is not reproduced by rope's StackedRotaryTable "
                             f"of base {base:g} on {theirs.numel()} pairs: its cos and sin of {length} positions are "
                             f"off by {gap:.3g} (another base, width or layout; or frequencies rounded by a cast of "
                             "the model: install before casting); nothing was replaced")
    return new
