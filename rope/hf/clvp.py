"""rope's rotary module and function for CLVP (``modeling_clvp.py`` of transformers 5.23: the
``clvp``, ``clvp_encoder`` types), whose rotary module returns angles, not cos and sin.

transformers' contract. ``ClvpRotaryPositionalEmbedding.forward(hidden_states)`` returns the
angles ``[1, n, d]`` of its sequence's own positions m = 0 .. n - 1 (n = ``hidden_states.shape[1]``):
m theta_i twice (``torch.cat((freqs, freqs))``), theta_i = 10000^(-2i/d), formed as a float32
product (in the dtype of its ``inv_freq`` buffer). Its only consumer is ``ClvpSelfAttention``,
which reads the rotary width ``d = rotary_pos_emb.shape[-1]``, takes ``cos, sin =
rotary_pos_emb.cos().squeeze(0), rotary_pos_emb.sin().squeeze(0)`` (``[n, d]``) and calls the
module-level ``apply_rotary_pos_emb(q, k, v, cos, sin, position_ids)`` on the first d coordinates
of q, k and v: the rows ``position_ids`` of the tables, unsqueezed at dimension 1, turn each of the
three by ``x cos + rotate_half(x) sin`` (halves (i, i + d/2)); the attention concatenates the rest
of the head back and goes on in the dtype of what the function returns (its matmuls, softmax and
``out_proj``). ``ClvpEncoder`` computes the angles once per forward and hands them to every layer;
CLVP's decoder does not rotate.

rope's replacements, together exact:

* :class:`RotaryAngleTable` (:func:`rope.hf.install` swaps it in, checked by
  :func:`reproduce_angles`): the angles m theta_i of rope's float32 frequencies reduced exactly
  to [-pi, pi) (:func:`rope.angles.exact_angles`: one rounding, within 2^-51 rad), float64 while
  the attention's modeling module holds :func:`apply_rotary_pos_emb_values` (:func:`rope.hf.patch`),
  so that the attention's own ``.cos()`` and ``.sin()`` are float64 (within about 2^-51 of the
  exact values, far below any rounding to float32); else (installed alone, transformers' function
  in place) rounded once to the dtype of ``hidden_states``, so that transformers' function returns
  the model's dtype and no float64 reaches the attention's matmuls (cos and sin of an angle in
  [-pi, pi) rounded to float32 are within about 2^-23 of the exact ones, where transformers'
  float32 products m theta_i are off by up to 2^-24 m theta_i rad).
* :func:`apply_rotary_pos_emb_values`: the same signature and result as transformers' function,
  computed in float64 and rounded once (:func:`rope.rotation.round_once`) to the dtype of each of
  q, k, v where the tables are float64 (rope's module: the attention continues in the model's
  dtype), else to the dtype torch gives ``x * cos``: each output entry within half a unit of its
  dtype of the formula on the tables it is handed; with rope's float64 tables, within half a unit
  (plus about 2^-50 ``|x|``) of the exact rotation by m theta_i.

Positions past the sequence. The table has the n rows of the forward's own positions; position
ids outside 0 .. n - 1 have no row, in transformers (an ``IndexError``, or a wrap-around for
negative ids) as here (a ``ValueError`` naming ``position_ids``: nothing wraps around). So a
CLVP model runs only at positions below its sequence's length, whatever position ids it is given;
the exactness of the angles at large positions is tested on the module and function directly
(``tests/test_hf_clvp.py``).
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Iterator

import torch
from torch import nn

from .. import _checks
from ..angles import exact_angles
from ..frequencies import inv_freq
from ..rotation import round_once
from .embedding import Float32Frequencies
from .probing import PROBE_TOLERANCE, probe_copy

BASE = 10000.0
"""CLVP's RoPE base, fixed in its modeling code (no config key)."""

FUNCTION_NAME = "apply_rotary_pos_emb"
"""The name CLVP's attention looks its rotation function up by in its modeling module."""

PROBE_LENGTHS = (1, 8, 3)
"""Sequence lengths :func:`reproduce_angles` calls both modules with (the stock module caches
the angles of the last length: 3 after 8 reads fresh ones)."""


def apply_rotary_pos_emb_values(q, k, v, cos, sin, position_ids, unsqueeze_dim=1):
    """transformers-compatible with CLVP's ``apply_rotary_pos_emb(q, k, v, cos, sin, position_ids,
    unsqueeze_dim=1)`` (``modeling_clvp.py``): with ``c = cos[position_ids].unsqueeze(unsqueeze_dim)``
    and ``s`` likewise, each x of q, k, v becomes ``x c + rotate_half(x) s``, rotate_half(x) =
    (-x_2, x_1) for the halves (x_1, x_2) of the last dimension (pairs (i, i + d/2)), computed in
    float64 and rounded once: to the dtype of x where the tables are float64 (those of rope's
    :class:`RotaryAngleTable`), else to the dtype torch gives ``x * cos`` (module docstring).

    Args:
        q: queries, floating, last dimension d (the rotary part of the head).
        k: keys, floating, last dimension d.
        v: values, floating, last dimension d (CLVP rotates them too).
        cos: ``[n, d]``, floating: cos of the angles of positions 0 .. n - 1.
        sin: ``[n, d]``, same dtype as cos.
        position_ids: integer, each in 0 .. n - 1 (rows of the tables), e.g. ``[batch, seq]``.
        unsqueeze_dim: where the looked-up rows get the heads' dimension (1: q ``[batch, heads,
            seq, d]``).

    Returns:
        ``(q, k, v)`` rotated.
    """
    xs = {"q": q, "k": k, "v": v}
    for name, x in xs.items():
        _checks.float_tensor(name, x)
    _checks.float_tensor("cos", cos, dim=2)
    _checks.float_tensor("sin", sin, dim=2)
    _checks.integer_tensor("position_ids", position_ids)
    _checks.same_device("cos", cos, sin=sin, position_ids=position_ids, **xs)
    if sin.shape != cos.shape or sin.dtype != cos.dtype:
        raise ValueError(f"sin ({tuple(sin.shape)}, {sin.dtype}) must have the shape and dtype of cos "
                         f"({tuple(cos.shape)}, {cos.dtype})")
    rows, width = cos.shape
    if width % 2 or not width:
        raise ValueError(f"cos {tuple(cos.shape)} must be [n, d] with an even, non-zero d (halves (i, i + d/2))")
    dim = _checks.integer("unsqueeze_dim", unsqueeze_dim, minimum=-position_ids.dim() - 2,
                          maximum=position_ids.dim() + 1)
    if position_ids.numel():
        ids = position_ids.to(torch.int64)
        _checks.assert_values("position_ids", ((ids >= 0) & (ids < rows)).all(),
                              f"rows of the tables, 0 .. {rows - 1}: transformers' table holds the positions of "
                              "its sequence only")
    ids = position_ids.to(torch.int64).clamp(0, max(rows - 1, 0))  # no-op on valid ids; CUDA asserts after the read
    c, s = (table.to(torch.float64)[ids].unsqueeze(dim) for table in (cos, sin))
    out = []
    for name, x in xs.items():
        if x.dim() == 0 or x.shape[-1] != width:
            raise ValueError(f"{name} {tuple(x.shape)} must have the tables' width d = {width} as last dimension")
        try:
            shape = torch.broadcast_shapes(c.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != tuple(x.shape):
            raise ValueError(f"cos[position_ids].unsqueeze({unsqueeze_dim}) {tuple(c.shape)} does not broadcast to "
                             f"{name} {tuple(x.shape)}")
        x64 = x.to(torch.float64)
        turned = torch.cat((-x64[..., width // 2:], x64[..., : width // 2]), dim=-1)
        dtype = x.dtype if cos.dtype == torch.float64 else torch.promote_types(x.dtype, cos.dtype)
        out.append(round_once(x64 * c + turned * s, dtype))
    return tuple(out)


class RotaryAngleTable(Float32Frequencies):
    """``forward(hidden_states)`` -> ``[1, n, 2 p]``: the angles m theta_i of positions m = 0 ..
    n - 1 (n = ``hidden_states.shape[1]``), each pair's twice (both halves), reduced exactly to
    [-pi, pi) (:func:`rope.angles.exact_angles`), theta_i = base^(-2i/d) as rope's float32
    frequencies; float64 while the modeling module named ``modeling`` holds
    :func:`apply_rotary_pos_emb_values` under :data:`FUNCTION_NAME`, else rounded once to the dtype
    of ``hidden_states`` (module docstring). Computed at every call (transformers caches the last
    length's; the encoder calls it once per forward).

    Args:
        head_dim: the rotary width d: p = d / 2 pairs.
        modeling: the name of the modeling module whose attention rotates with these angles.
        base: the RoPE base (CLVP's: :data:`BASE`).
    """

    tables = "angles"

    def __init__(self, head_dim: int, modeling: str, base: float = BASE):
        super().__init__()
        theta, _ = inv_freq({"rope_type": "default", "rope_theta": base}, head_dim)
        self.head_dim, self.modeling, self.base = head_dim, modeling, base
        self.inv_freq = nn.Buffer(theta, persistent=False)

    def exact(self) -> bool:
        """Whether the attention will rotate with rope's function (the angles stay float64)."""
        held = getattr(sys.modules.get(self.modeling), FUNCTION_NAME, None)
        return held is not None and inspect.unwrap(held) is apply_rotary_pos_emb_values

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() < 2:
            raise TypeError("hidden_states must be a tensor [batch, seq, ...], got "
                            f"{getattr(hidden_states, 'shape', type(hidden_states).__name__)}")
        positions = torch.arange(hidden_states.shape[1], device=self.inv_freq.device)
        angles = exact_angles(positions, self.inv_freq).repeat(1, 2)[None]
        return angles if self.exact() else round_once(angles, hidden_states.dtype)


def returns_angles(module: nn.Module) -> bool:
    """Whether a self-rotating module (``forward(hidden_states)``, an ``inv_freq`` buffer of p
    entries: :func:`rope.hf.self_rotating.is_stacked_rotary`) returns angles ``[1, n, 2 p]`` as
    CLVP's does, rather than a conformer's stack ``[2, n, 1, 1, d]``: rope's
    :class:`RotaryAngleTable`, or a deep copy of ``module`` (it caches) called on 3 positions."""
    if isinstance(module, RotaryAngleTable):
        return True
    theta = module._buffers.get("inv_freq")
    try:
        out = copy.deepcopy(module)(torch.zeros(1, 3, 1, device=theta.device))
    except Exception:  # another contract: not this one
        return False
    return isinstance(out, torch.Tensor) and tuple(out.shape) == (1, 3, 2 * theta.numel())


def reproduce_angles(name: str, old: nn.Module) -> RotaryAngleTable:
    """rope's :class:`RotaryAngleTable` for CLVP's rotary module ``old`` (width from ``old``'s
    frequencies, base :data:`BASE`, the modeling module of ``old``'s class), on ``old``'s device,
    checked against a deep copy of ``old`` on float32 hidden states of each of
    :data:`PROBE_LENGTHS`: same shape, cos and sin of the angles within :data:`PROBE_TOLERANCE`.
    Raises ``ValueError`` naming what differs otherwise.

    Args:
        name: the module's qualified name in the model, for messages.
        old: transformers' rotary module (:func:`returns_angles`).
    """
    theirs = old._buffers["inv_freq"]
    new = RotaryAngleTable(2 * theirs.numel(), type(old).__module__).to(theirs.device)
    probe = probe_copy(name, old)
    for length in PROBE_LENGTHS:
        hidden = torch.zeros(1, length, 1, device=theirs.device)
        a, b = probe(hidden), new(hidden)
        if not isinstance(a, torch.Tensor) or a.shape != b.shape:
            got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            raise ValueError(f"install: {name} ({type(old).__name__}) returns {got} for {length} positions where "
                             f"rope's RotaryAngleTable returns {tuple(b.shape)} (angles of positions 0 .. n - 1): "
                             "another contract; nothing was replaced")
        a, b = a.to(torch.float64), b.to(torch.float64)
        gap = float(torch.maximum((a.cos() - b.cos()).abs(), (a.sin() - b.sin()).abs()).max())
        if gap > PROBE_TOLERANCE:
            raise ValueError(f"install: {name} ({type(old).__name__}) is not reproduced by rope's RotaryAngleTable "
                             f"of base {BASE:g} on {theirs.numel()} pairs: the cos and sin of its angles of {length} "
                             f"positions are off by {gap:.3g} (another base, width or layout; or frequencies rounded "
                             "by a cast of the model: install before casting); nothing was replaced")
    return new


def method_inputs(generator: torch.Generator) -> Iterator[tuple]:
    """CLVP's function's arguments for :func:`rope.hf.methods.computes`: q, k, v ``[2, 4, 5, 16]``,
    float32 tables ``[6, 16]`` of positions 0 .. 5 and position ids ``[2, 5]`` drawn from them."""
    angles = torch.arange(6, dtype=torch.float64)[:, None] * BASE ** (-torch.arange(8, dtype=torch.float64) / 8)
    angles = angles.repeat(1, 2)
    q, k, v = (torch.randn(2, 4, 5, 16, generator=generator) for _ in range(3))
    yield q, k, v, angles.cos().float(), angles.sin().float(), torch.randint(0, 6, (2, 5), generator=generator)
