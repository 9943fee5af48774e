"""Exact rotary tables for transformers' coordinate encoders: angles from a learned projection.

LightGlue (``modeling_lightglue.py``) turns each keypoint's queries and keys by angles that a
bias-free ``nn.Linear`` of the keypoint's two coordinates gives: its ``LightGluePositionalEncoder``
computes, for keypoints p = (x, y) ``[..., 2]`` and the Linear's weight W ``[n, 2]``, the angles
a_i = W_i0 x + W_i1 y (``self.projector(keypoints)``, in the weight's dtype), repeats each twice
(``repeat_interleave(2)``: its ``rotate_half`` pairs coordinates (2i, 2i + 1)) and returns
``((cos, sin),)``, with the projected keypoints after it where ``output_hidden_states`` is set.
The frequencies are the weights: learned, no formula. :class:`CoordinateRotaryEmbedding` computes
the same tables exactly:

* each product W_ic p_c is formed exactly in float64 (a float32, bfloat16 or float16 weight
  times such a coordinate has at most 48 significant bits; a float64 one is split by Dekker's
  product into two float64 numbers whose sum is exact);
* every such term is reduced modulo 2 pi exactly, as turns (fractions of a turn to 2^-124,
  :func:`rope.angles.turns_of_checked_frequencies` of the term itself), and the terms' turns add
  modulo 1 (:func:`rope.angles.add_turns`): the angle a_i is reduced as if summed in exact
  arithmetic, whatever its size (where transformers' float32 sum is off by up to 2^-24 ``|a_i|``:
  2^-8 rad at ``|a_i|`` = 2^16);
* cos and sin of the reduced angle are within 2^-52 of the exact values
  (:func:`rope.angles.cos_sin_of_turns`; on the CPU, where an angle is the sum of two exact terms,
  as LightGlue's of two coordinates in float32, the exact sum is held as two float64 numbers
  instead and torch's float64 cos and sin, correctly reduced there, are corrected by the second:
  within an ulp, at a 25th of the cost), laid out as the encoder lays them out (each entry
  twice), and rounded once (:func:`rope.rotation.round_once`) to the keypoints' dtype, which is
  the dtype of transformers' tables (its Linear's output): every entry within half a unit of
  that dtype of the exact value.

The module holds the model's Linear itself (``projector``, the same object): its weights stay the
model's parameters, trained and loaded under their own names, and :func:`rope.hf.unpatch` puts
the encoder back with that Linear in it. The tables are differentiable in the weights and the
keypoints (:class:`_ExactAngles`: the gradient of cos a is -sin a times that of a, and of sin a
cos a times it, with the exact a), as transformers' are.

Terms must be finite and below 2^127 in magnitude (the range of the reduction; transformers'
float32 angles overflow at 2^128): keypoints or weights that make one larger, or that are not
finite, are refused with a ``ValueError`` naming them (an asynchronous device assertion on CUDA).

EsmFold2's ``EsmFold2RotaryEmbedding`` turns atoms by their reference coordinates (x, y, z in
float32) and their space id, ``forward(ref_pos, ref_space_uid, dtype)``: angles p theta_j of
float32 coordinates and float32 frequencies, and u phi_j of integer ids. :class:`AtomRotaryEmbedding`
reproduces it exactly (each product exact in float64 and reduced as turns, integer ids by
:func:`rope.apply.exact_cos_sin`; within 2^-52 before the one rounding to ``dtype``). EsmFold2's
forward folds a featurized complex, which the probe does not make from names and shapes: it runs
the trunk's input embedder on a complex :func:`rope.hf.part_feeds.complex_inputs` builds, and
:func:`rope.hf.patch` swaps the atom encoders' modules and the module's ``apply_rotary_pos_emb``
beside the ESMC backbone's tables and functions.

:func:`rope.hf.patch` swaps these encoders through :mod:`rope.hf.vision` (:func:`is_coordinate_rotary`
makes them vision rotary modules there), after :func:`reproduce` checked a copy of the model's
against rope's, and :func:`rope.hf.unpatch` puts them back.
"""

from __future__ import annotations

import copy
import inspect
import sys

import torch
from torch import nn

from .. import _checks
from ..angles import add_turns, cos_sin_of_turns, turns_of_checked_frequencies, two_product
from ..apply import exact_cos_sin as exact_angles_cos_sin
from ..apply import has_float64
from ..frequencies import inv_freq
from ..rotation import round_once
from .embedding import Float32Frequencies
from .probing import PROBE_TOLERANCE

LARGEST_TERM = 2.0**127
"""The largest ``|W_ic p_c|`` rope reduces: three float32 pieces hold each term exactly below it."""

_FLOAT32 = 2.0**-22


def _terms(weight: torch.Tensor, keypoints: torch.Tensor) -> list[torch.Tensor]:
    """The float64 numbers whose exact sum is each angle a_i = sum_c W_ic p_c: ``[..., n]`` each,
    one per axis c for weights and keypoints of at most 26 significant bits (float32, bfloat16,
    float16: the product is exact), two per axis (Dekker's product) for float64 ones."""
    w, p = weight.to(torch.float64), keypoints.to(torch.float64)
    narrow = weight.dtype != torch.float64 and keypoints.dtype != torch.float64
    terms = []
    for c in range(weight.shape[1]):
        if narrow:
            terms.append(p[..., c, None] * w[:, c])  # exact: 24 + 24 bits
        else:
            terms.extend(two_product(p[..., c, None], w[:, c]))
    return terms


def _two_terms_cos_sin(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of a + b for two exact float64 terms, on the CPU (25 times faster than the
    turns): Knuth's TwoSum gives the exact sum as s + e (``|e|`` <= 2^-53 ``|s|``), torch's float64
    cos and sin of s are within an ulp of the exact values whatever s (Payne and Hanek's reduction
    in SLEEF and glibc: :func:`rope.angles.cos_sin` relies on it too), and
    cos(s + e) = cos s - e sin s, sin(s + e) = sin s + e cos s to within e^2 / 2."""
    s = a + b
    virtual = s - a
    e = (a - (s - virtual)) + (b - virtual)
    cos, sin = torch.cos(s), torch.sin(s)
    return cos - e * sin, sin + e * cos


def exact_cos_sin(weight: torch.Tensor, keypoints: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cos and sin of a_i = sum_c W_ic p_c, each product formed exactly and the sum
    reduced modulo 2 pi exactly (module docstring), ``keypoints.shape[:-1] + (n,)``; within 2^-52
    of the exact values. Not differentiable (:func:`angle_tables` is).

    Args:
        weight: the projection W ``[n, axes]``, floating.
        keypoints: the coordinates p ``[..., axes]``, floating, on W's device.
    """
    terms = _terms(weight, keypoints)
    if len(terms) == 2 and _checks.reads_are_free(keypoints.device):
        return _two_terms_cos_sin(*terms)
    total = None
    for term in terms:
        limbs = turns_of_checked_frequencies(term.contiguous())
        total = limbs if total is None else add_turns(total, limbs)
    return cos_sin_of_turns(total)


class _ExactAngles(torch.autograd.Function):
    """cos a and sin a of the exact angles a = W p (:func:`exact_cos_sin`), float64; backward:
    d cos a = -sin a da, d sin a = cos a da, da = dW p + W dp, with the exact cos and sin."""

    @staticmethod
    def forward(ctx, weight, keypoints):
        cos, sin = exact_cos_sin(weight, keypoints)
        ctx.save_for_backward(weight, keypoints, cos, sin)
        return cos, sin

    @staticmethod
    def backward(ctx, grad_cos, grad_sin):
        weight, keypoints, cos, sin = ctx.saved_tensors
        grad_angle = torch.zeros_like(cos)
        if grad_cos is not None:
            grad_angle = grad_angle - grad_cos.to(torch.float64) * sin
        if grad_sin is not None:
            grad_angle = grad_angle + grad_sin.to(torch.float64) * cos
        grad_weight = grad_keypoints = None
        if ctx.needs_input_grad[0]:
            grad_weight = torch.einsum("...i,...c->ic", grad_angle, keypoints.to(torch.float64)).to(weight.dtype)
        if ctx.needs_input_grad[1]:
            grad_keypoints = (grad_angle @ weight.to(torch.float64)).to(keypoints.dtype)
        return grad_weight, grad_keypoints


def _checked(weight: torch.Tensor, keypoints: torch.Tensor) -> None:
    """Refuse keypoints and weights of the wrong kind, or whose terms W_ic p_c are not finite or
    reach :data:`LARGEST_TERM`."""
    _checks.float_tensor("keypoints", keypoints)
    _checks.float_tensor("projector.weight", weight, dim=2)
    _checks.same_device("keypoints", keypoints, weight=weight)
    if keypoints.dim() == 0 or keypoints.shape[-1] != weight.shape[1]:
        raise ValueError(f"keypoints must be [..., {weight.shape[1]}] (one coordinate per input of the projector), "
                         f"got shape {tuple(keypoints.shape)}")
    with torch.no_grad():
        _checks.assert_values("keypoints", torch.isfinite(keypoints).all(), "finite values (no NaN or inf)")
        _checks.assert_values("projector.weight", torch.isfinite(weight).all(), "finite values (no NaN or inf)")
        if keypoints.numel() and weight.numel():
            largest = keypoints.detach().abs().to(torch.float64).reshape(-1, weight.shape[1]).amax(dim=0) * \
                weight.detach().abs().to(torch.float64).amax(dim=0)
            _checks.assert_values("keypoints", (largest < LARGEST_TERM).all(),
                                  "coordinates whose products with the projector's weights stay below 2^127 in "
                                  "magnitude (the range of rope's exact reduction)")


def angle_tables(weight: torch.Tensor, keypoints: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the exact angles W p (:func:`exact_cos_sin`), float64 ``[..., n]``,
    differentiable in ``weight`` and ``keypoints``; checked (:data:`LARGEST_TERM`, finite values).
    On a device without float64 (Apple's MPS) they are computed on the CPU.

    Args:
        weight: the projection W ``[n, axes]``, floating.
        keypoints: the coordinates p ``[..., axes]``, floating.
    """
    _checked(weight, keypoints)
    if not has_float64(keypoints.device):
        return _ExactAngles.apply(weight.cpu(), keypoints.cpu())
    return _ExactAngles.apply(weight, keypoints)


class CoordinateRotaryEmbedding(nn.Module):
    """The drop-in for LightGlue's ``LightGluePositionalEncoder`` (module docstring):
    ``forward(keypoints, output_hidden_states=False)`` returns ``((cos, sin),)``, or
    ``((cos, sin), projected)`` with ``output_hidden_states``, where cos and sin ``[..., 2n]``
    hold cos a_i and sin a_i of the exact angles a = W p at entries 2i and 2i + 1, rounded once
    to the keypoints' dtype (on their device), and ``projected`` is the projector's own output
    ``projector(keypoints)`` (the hidden state transformers returns). W is ``projector.weight``,
    the model's parameter.

    Build it with :func:`reproduce`, which reads a stock encoder and checks the result.

    Args:
        projector: the encoder's bias-free ``nn.Linear`` of the coordinates (held, not copied).
        source: the stock class's name, for ``repr``.
    """

    def __init__(self, projector: nn.Linear, *, source: str = ""):
        super().__init__()
        if not isinstance(projector, nn.Linear) or projector.bias is not None:
            raise TypeError(f"projector must be a torch.nn.Linear without bias, got {projector!r}")
        self.projector = projector
        self.source = source

    def extra_repr(self) -> str:
        return f"{self.source or 'coordinates'}: exact angles of projector(keypoints)"

    def pair_cos_sin(self, keypoints: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each exact angle a_i, float64 ``[..., n]``: the tables before the layout.

        Args:
            keypoints: ``[..., axes]``, floating.
        """
        return angle_tables(self.projector.weight, keypoints)

    def forward(self, keypoints: torch.Tensor, output_hidden_states: bool | None = False):
        cos, sin = self.pair_cos_sin(keypoints)
        tables = tuple(round_once(t.repeat_interleave(2, dim=-1), keypoints.dtype).to(keypoints.device)
                       for t in (cos, sin))
        return (tables, self.projector(keypoints)) if output_hidden_states else (tables,)


def _frequencies(base, pairs: int) -> torch.Tensor:
    """theta_j = b^(-j/n) for j < n = ``pairs``, float32 (rope's ``default`` type for a width of
    2n); empty for n = 0."""
    if pairs == 0:
        return torch.zeros(0, dtype=torch.float32)
    return inv_freq({"rope_type": "default", "rope_theta": base}, 2 * pairs)[0]


def _products_cos_sin(positions: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cos and sin of p theta_j, ``positions.shape + (n,)``, for float32 positions and
    frequencies: each product exact in float64 (24 + 24 bits), reduced exactly as turns."""
    products = positions.to(torch.float64)[..., None] * theta.to(torch.float64)
    return cos_sin_of_turns(turns_of_checked_frequencies(products.contiguous()))


class AtomRotaryEmbedding(Float32Frequencies):
    """The drop-in for EsmFold2's ``EsmFold2RotaryEmbedding``, which turns atoms by their place in
    space and their group: ``forward(ref_pos, ref_space_uid, dtype)`` returns ``(cos, sin)``
    ``[..., atoms, 2P]`` (P = head_dim / 2 pairs) in ``dtype``. Pair k < 3 n_s turns by
    x_a theta_j, a = k // n_s the axis of ``ref_pos`` (x, y, z, taken as float32 numbers, as
    EsmFold2's ``ref_pos.float()``) and theta_j = b_s^(-j/n_s), j = k mod n_s; the next n_u pairs
    by u phi_j, u the atom's ``ref_space_uid`` and phi_j = b_u^(-j/n_u); the last P - 3 n_s - n_u
    pairs not at all (angle 0); both halves of the last dimension hold the same P angles
    (``rotate_half``). Every angle is reduced exactly: a float32 coordinate times a float32
    frequency is exact in float64, and is reduced as turns; an integer ``ref_space_uid`` is taken
    exactly (:func:`rope.apply.exact_cos_sin`: EsmFold2's ``ref_space_uid.float()`` rounds ids
    past 2^24), a floating one as its float32 value. cos and sin in float64 within 2^-52, rounded
    once to ``dtype``. The frequencies are rope's (``default`` type, float32), kept float32
    through casts. Nothing here is differentiable (the tables depend on inputs only, no weights).

    Build it with :func:`reproduce_atoms`, which reads a stock module and checks the result.

    Args:
        spatial_pairs: n_s, the pairs per spatial axis, >= 0.
        uid_pairs: n_u, the pairs of the space id, >= 0.
        inactive_pairs: the pairs left unturned, >= 0.
        spatial_base: b_s, > 1.
        uid_base: b_u, > 1.
        source: the stock class's name, for ``repr``.
    """

    FLOAT32_BUFFERS = ("spatial_inv_freq", "uid_inv_freq")

    def __init__(self, spatial_pairs: int, uid_pairs: int, inactive_pairs: int, spatial_base: float,
                 uid_base: float, *, source: str = ""):
        super().__init__()
        self.num_spatial_pairs_per_axis = _checks.integer("spatial_pairs", spatial_pairs, minimum=0)
        self.num_uid_pairs = _checks.integer("uid_pairs", uid_pairs, minimum=0)
        self.num_inactive_channels = _checks.integer("inactive_pairs", inactive_pairs, minimum=0)
        self.spatial_rope_base_frequency = _checks.number("spatial_base", spatial_base)
        self.uid_rope_base_frequency = _checks.number("uid_base", uid_base)
        self.source = source
        self.register_buffer("spatial_inv_freq", _frequencies(spatial_base, self.num_spatial_pairs_per_axis),
                             persistent=False)
        self.register_buffer("uid_inv_freq", _frequencies(uid_base, self.num_uid_pairs), persistent=False)

    def extra_repr(self) -> str:
        return (f"{self.source or 'atoms'}, spatial_pairs={self.num_spatial_pairs_per_axis}, "
                f"uid_pairs={self.num_uid_pairs}, inactive_pairs={self.num_inactive_channels}")

    def pair_cos_sin(self, ref_pos: torch.Tensor, ref_space_uid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the P angles, float64 ``[..., atoms, P]``: the tables before the layout.

        Args:
            ref_pos: the atoms' coordinates ``[..., atoms, 3]``, floating.
            ref_space_uid: their space ids ``[..., atoms]``, integer or floating, on ref_pos's device.
        """
        _checks.float_tensor("ref_pos", ref_pos)
        _checks.tensor("ref_space_uid", ref_space_uid)
        _checks.same_device("ref_pos", ref_pos, ref_space_uid=ref_space_uid)
        if ref_space_uid.dtype.is_complex or ref_space_uid.dtype == torch.bool:
            raise TypeError(f"ref_space_uid must be an integer or floating tensor, got {ref_space_uid.dtype}")
        if ref_pos.dim() == 0 or ref_pos.shape[-1] != 3 or ref_pos.shape[:-1] != ref_space_uid.shape:
            raise ValueError(f"ref_pos must be [..., atoms, 3] and ref_space_uid [..., atoms], got shapes "
                             f"{tuple(ref_pos.shape)} and {tuple(ref_space_uid.shape)}")
        positions = ref_pos.detach().float()
        _checks.assert_values("ref_pos", torch.isfinite(positions).all(), "finite float32 values (no NaN or inf)")
        device = ref_pos.device if has_float64(ref_pos.device) else torch.device("cpu")
        positions, uid = positions.to(device), ref_space_uid.detach().to(device)
        spatial = self.spatial_inv_freq.to(device)
        cos_s, sin_s = _products_cos_sin(positions, spatial)  # [..., atoms, 3, n_s]
        uid_theta = self.uid_inv_freq.to(device)
        if uid.dtype.is_floating_point:
            uid = uid.float()
            _checks.assert_values("ref_space_uid", torch.isfinite(uid).all(), "finite values (no NaN or inf)")
            cos_u, sin_u = _products_cos_sin(uid, uid_theta)
        else:
            cos_u, sin_u = exact_angles_cos_sin(_checks.integer_tensor("ref_space_uid", uid), uid_theta)
        rest = uid.shape + (self.num_inactive_channels,)
        ones = torch.ones(rest, dtype=torch.float64, device=device)
        cos = torch.cat([cos_s.flatten(-2), cos_u, ones], dim=-1)
        sin = torch.cat([sin_s.flatten(-2), sin_u, torch.zeros_like(ones)], dim=-1)
        return cos.to(ref_pos.device), sin.to(ref_pos.device)

    @torch.no_grad()
    def forward(self, ref_pos: torch.Tensor, ref_space_uid: torch.Tensor, dtype: torch.dtype):
        dtype = _checks.dtype_choice("dtype", dtype, _checks.FLOAT_DTYPES)
        cos, sin = self.pair_cos_sin(ref_pos, ref_space_uid)
        return tuple(round_once(torch.cat([t, t], dim=-1), dtype) for t in (cos, sin))


COORDINATE_MODULES = (CoordinateRotaryEmbedding, AtomRotaryEmbedding)
"""rope's coordinate rotary module classes."""

_ATOM_SETTINGS = ("num_spatial_pairs_per_axis", "num_uid_pairs", "num_inactive_channels",
                  "spatial_rope_base_frequency", "uid_rope_base_frequency")


def is_atom_rotary(module: nn.Module) -> bool:
    """Whether ``module`` is an atom rotary module, rope's or transformers' (EsmFold2's form: a
    forward of ``(ref_pos, ref_space_uid, dtype)`` and the settings of :class:`AtomRotaryEmbedding`
    as attributes).

    Args:
        module: any module.
    """
    if isinstance(module, AtomRotaryEmbedding):
        return True
    if not all(hasattr(module, key) for key in _ATOM_SETTINGS):
        return False
    try:
        return list(inspect.signature(module.forward).parameters) == ["ref_pos", "ref_space_uid", "dtype"]
    except (TypeError, ValueError):  # no signature: not this form
        return False


def _is_keypoint_encoder(module: nn.Module) -> bool:
    """LightGlue's form: a class named for positions, of a modeling module that defines
    ``apply_rotary_pos_emb``, whose forward takes ``keypoints`` first and which holds a bias-free
    ``nn.Linear`` ``projector``, its one child."""
    if "posit" not in type(module).__name__.lower() or not callable(
            getattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb", None)):
        return False
    children = list(module.children())
    projector = module._modules.get("projector")
    if len(children) != 1 or not isinstance(projector, nn.Linear) or projector.bias is not None:
        return False
    try:
        return next(iter(inspect.signature(module.forward).parameters), None) == "keypoints"
    except (TypeError, ValueError):  # no signature: not this form
        return False


def is_coordinate_rotary(module: nn.Module) -> bool:
    """Whether ``module`` is a coordinate rotary module, rope's or transformers': a keypoint
    encoder of LightGlue's form (a class named for positions, of a modeling module that defines
    ``apply_rotary_pos_emb``, whose forward takes ``keypoints`` first and which holds a bias-free
    ``nn.Linear`` ``projector``, its one child) or an atom rotary module (:func:`is_atom_rotary`).

    Args:
        module: any module.
    """
    return isinstance(module, COORDINATE_MODULES) or _is_keypoint_encoder(module) or is_atom_rotary(module)


def _refuse(name: str, module: nn.Module, why: str) -> ValueError:
    return ValueError(f"coordinates: {name} ({type(module).__name__}) is not reproduced: {why}; it stays "
                      "transformers'")


def probe_keypoints(axes: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The keypoints :func:`reproduce` compares tables at: ``[1, 18, axes]``, 16 drawn in [-1, 1]
    (LightGlue normalises keypoints so) from a seeded generator, then (3, -0.5, ...) and
    (-0.25, 7, ...), far on one axis each, so that a swapped axis shows.

    Args:
        axes: the coordinates per keypoint.
        device: where they go.
        dtype: their dtype.
    """
    gen = torch.Generator().manual_seed(0)
    near = torch.rand(16, axes, generator=gen, dtype=torch.float64) * 2 - 1
    far = torch.tensor([[3.0, -0.5], [-0.25, 7.0]], dtype=torch.float64)
    far = torch.cat([far, far[:, :1].expand(-1, max(axes - 2, 0))], dim=-1)[:, :axes]
    return torch.cat([near, far])[None].to(device=device, dtype=dtype)


def reproduce(name: str, module: nn.Module) -> nn.Module:
    """rope's replacement for a transformers coordinate rotary module (:func:`is_coordinate_rotary`),
    checked: an atom module by :func:`reproduce_atoms`; a keypoint encoder (LightGlue's) is
    :class:`CoordinateRotaryEmbedding` if a copy of it called on :func:`probe_keypoints` (in its weight's dtype) with
    ``output_hidden_states=True`` must return ``((cos, sin), projected)`` of rope's shapes and
    dtypes, cos and sin within :data:`PROBE_TOLERANCE` of rope's beyond the float32 error of its
    angles, and ``projected`` equal to the projector's output. Raises ``ValueError`` naming the
    module and what differs where rope does not reproduce it.

    Args:
        name: the module's qualified name in its model, for messages.
        module: a transformers coordinate rotary module.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(module, COORDINATE_MODULES) or not is_coordinate_rotary(module):
        raise _refuse(name, module, "it is not a transformers coordinate rotary module (a positional module holding "
                                    "one bias-free Linear projector, forward(keypoints, ...); or forward(ref_pos, "
                                    "ref_space_uid, dtype))")
    if is_atom_rotary(module):
        return reproduce_atoms(name, module)
    projector = module._modules["projector"]
    weight = projector.weight
    if not weight.dtype.is_floating_point:
        raise _refuse(name, module, f"its projector's weight is {weight.dtype}, not floating")
    new = CoordinateRotaryEmbedding(projector, source=type(module).__name__)
    keypoints = probe_keypoints(projector.in_features, weight.device, weight.dtype)
    try:
        with torch.no_grad():
            theirs = copy.deepcopy(module)(keypoints, output_hidden_states=True)
    except Exception as err:  # it does not follow the form it was read as
        raise _refuse(name, module, f"calling a copy of it failed ({type(err).__name__}: "
                                    f"{_checks.first_line(err, 120)})") from err
    with torch.no_grad():
        ours = new(keypoints, output_hidden_states=True)
    if not (isinstance(theirs, tuple) and len(theirs) == 2 and isinstance(theirs[0], tuple) and len(theirs[0]) == 2
            and all(isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                    for a, b in zip(theirs[0], ours[0]))):
        shapes = [tuple(t.shape) for t in ours[0]]
        raise _refuse(name, module, f"it returns no ((cos, sin), projected) of shapes {shapes} with "
                                    "output_hidden_states: another form")
    if not (isinstance(theirs[1], torch.Tensor) and torch.equal(theirs[1], ours[1])):
        raise _refuse(name, module, "its second output is not its projector's output: another form")
    allowance = (keypoints.double().abs()[..., None, :] * weight.detach().double().abs()).sum(-1)
    allowance = allowance.repeat_interleave(2, dim=-1) * _FLOAT32 + PROBE_TOLERANCE
    if weight.dtype != torch.float32:  # tables in a narrower dtype: their own unit too
        allowance = allowance + 2 * torch.finfo(weight.dtype).eps
    gap = max(float(((a.double() - b.double()).abs() - allowance).max()) for a, b in zip(theirs[0], ours[0]))
    if gap > 0:
        raise _refuse(name, module, f"its tables at the probe keypoints are off from cos and sin of "
                                    f"repeat_interleave(projector(keypoints), 2) by {gap:.3g} beyond float32's error: "
                                    "another layout or formula")
    return new


def probe_atoms(device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The atoms :func:`reproduce_atoms` compares tables at: ``ref_pos`` float32 ``[1, 18, 3]``
    (16 drawn in [-30, 30] Angstrom from a seeded generator, then two far on other axes, so that
    a swapped axis shows) and ``ref_space_uid`` int64 ``[1, 18]`` (a shuffle of 0 .. 15, then 1000
    and 4099).

    Args:
        device: where they go.
    """
    gen = torch.Generator().manual_seed(0)
    near = torch.rand(16, 3, generator=gen, dtype=torch.float64) * 60 - 30
    far = torch.tensor([[1000.25, -3.0, 7.5], [2.0, 4099.5, -0.125]], dtype=torch.float64)
    uid = torch.cat([torch.randperm(16, generator=gen), torch.tensor([1000, 4099])])
    return torch.cat([near, far])[None].to(device, torch.float32), uid[None].to(device)


def reproduce_atoms(name: str, module: nn.Module) -> AtomRotaryEmbedding:
    """rope's replacement for a transformers atom rotary module (:func:`is_atom_rotary`),
    checked: its settings must be counts >= 0 and bases rope's ``default`` type takes, and a
    copy of it called on :func:`probe_atoms` (float32 tables) must return rope's ``(cos, sin)``
    (same shapes and dtypes) within :data:`PROBE_TOLERANCE` beyond the float32 error of its
    angles (2^-22 ``|p theta|``). On the device of the module's buffers (the CPU if it has none).
    Raises ``ValueError`` naming the module and what differs where rope does not reproduce it.

    Args:
        name: the module's qualified name in its model, for messages.
        module: a transformers atom rotary module.
    """
    settings = {key: getattr(module, key) for key in _ATOM_SETTINGS}
    try:
        new = AtomRotaryEmbedding(settings["num_spatial_pairs_per_axis"], settings["num_uid_pairs"],
                                  settings["num_inactive_channels"], settings["spatial_rope_base_frequency"],
                                  settings["uid_rope_base_frequency"], source=type(module).__name__)
    except (TypeError, ValueError) as err:
        raise _refuse(name, module, f"its settings {settings} are not rope's form ({_checks.first_line(err, 120)}; "
                                    "num_inactive_channels < 0: its head has fewer pairs than 3 n_s + n_u, and its "
                                    "own forward fails)") from err
    device = next((t.device for t in module.buffers()), torch.device("cpu"))
    new = new.to(device)
    ref_pos, uid = probe_atoms(device)
    try:
        with torch.no_grad():
            theirs = copy.deepcopy(module)(ref_pos, uid, torch.float32)
    except Exception as err:  # it does not follow the form it was read as
        raise _refuse(name, module, f"calling a copy of it failed ({type(err).__name__}: "
                                    f"{_checks.first_line(err, 120)})") from err
    ours = new(ref_pos, uid, torch.float32)
    if not (isinstance(theirs, (tuple, list)) and len(theirs) == 2 and all(
            isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype for a, b in zip(theirs, ours))):
        raise _refuse(name, module, f"it returns no (cos, sin) pair of shape {tuple(ours[0].shape)} float32 at the "
                                    "probe atoms: another form")
    positions = torch.cat([ref_pos.double().repeat_interleave(new.num_spatial_pairs_per_axis, dim=-1),
                           uid.double()[..., None].expand(*uid.shape, new.num_uid_pairs)], dim=-1)
    theta = torch.cat([new.spatial_inv_freq.repeat(3), new.uid_inv_freq]).double().to(device)
    angles = (positions * theta).abs()
    angles = torch.cat([angles, torch.zeros(*uid.shape, new.num_inactive_channels, dtype=torch.float64,
                                            device=device)], dim=-1)
    allowance = torch.cat([angles, angles], dim=-1) * _FLOAT32 + PROBE_TOLERANCE
    gap = max(float(((a.double() - b.double()).abs() - allowance).max()) for a, b in zip(theirs, ours))
    if gap > 0:
        raise _refuse(name, module, f"its tables at the probe atoms are off from rope's by {gap:.3g} beyond float32's "
                                    "error: another layout, axis order or frequencies")
    return new


__all__ = ["COORDINATE_MODULES", "LARGEST_TERM", "PROBE_TOLERANCE", "AtomRotaryEmbedding", "CoordinateRotaryEmbedding",
           "angle_tables", "exact_cos_sin", "is_atom_rotary", "is_coordinate_rotary", "probe_atoms", "probe_keypoints",
           "reproduce", "reproduce_atoms"]
