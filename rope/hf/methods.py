"""Method conventions: transformers models that rotate inside a method of their attention class
(or in a module-level function of their own signature, with no table).

RoFormer and the conformers (wav2vec2-conformer, wav2vec2-bert, SeamlessM4T) rotate q and k (or
the hidden states q and k are projected from) in a static method or method of their attention
class, not in a module-level function. :func:`rope.hf.patch` replaces that attribute of the class
by rope's version, as it replaces a module-level function: a name ``"*.<attribute>"`` in
:attr:`rope.hf.Convention.functions` means the attribute of the one class of the modeling module
that defines it in its own namespace (:func:`resolve`), read and set as the raw class attribute
(:func:`get`, :func:`put`: a ``staticmethod`` stays one), so that :func:`rope.hf.unpatch` puts
back the very object the class held. A class attribute is shared by every instance of the class,
as a module's function by every model of the module: :mod:`rope.hf.patching` counts the patched
models of each modeling module and restores the original when the last one is unpatched.

rope's versions, each transformers' formula computed in float64 on the tables it is handed (exact
for float32 inputs and tables) and rounded once to the dtype torch's own computation would return
(:func:`rope.rotation.round_once`; the input's dtype promoted with the table's):

* :func:`apply_rotary_position_embeddings`: RoFormer's static method
  ``apply_rotary_position_embeddings(sinusoidal_pos, query_layer, key_layer, value_layer=None)``
  (``modeling_roformer.py``): ``sinusoidal_pos`` ``[..., seq, d]`` is ``[sin | cos]`` of the
  angles m theta_i, theta_i = 10000^(-2i/d), i < d/2, and pair (2i, 2i + 1) of q, k (and v, where
  given: ``rotary_value``) turns by m theta_i. RoFormer's table keeps its own positions (its
  encoder numbers the tokens 0, 1, ... past the cache, no position ids): its
  ``RoFormerSinusoidalPositionalEmbedding`` is computed by numpy in float64 and rounded once to
  float32 in transformers' init, so its entries are already within half a unit of float32 of the
  exact sin and cos (for positions below 2^24) and patch leaves it in place
  (:data:`OWN_TABLES`): only the rotation's roundings change, from one per product and sum to one.
* :func:`apply_rotary_embedding_stacked`: the conformers' ``_apply_rotary_embedding(self,
  hidden_states, relative_position_embeddings)`` (``modeling_wav2vec2_conformer.py``,
  ``modeling_wav2vec2_bert.py``, ``modeling_seamless_m4t.py``): the hidden states
  ``[batch, n, heads * head_size]``, viewed as heads, turn by ``x cos + rotate_half(x) sin`` with
  the stack ``[2, n', 1, 1, head_size]`` of cos and sin of positions 0 .. n' - 1 (n <= n').
  :func:`rope.hf.install` swaps that stack's module for :class:`rope.hf.StackedRotaryTable`
  (exact angles rounded once); where the stack is its untouched output, the rotation uses the
  float64 cos and sin it was rounded from (:data:`EXACT_ATTRIBUTE`), so a half-precision model
  turns by the exact angles too, rounded once.
* :func:`rotate_queries_or_keys`: V-JEPA 2's module-level ``rotate_queries_or_keys(x, pos)``
  (``modeling_vjepa2.py``), a function of its own signature with no table: it forms its
  frequencies and angles at each call in the dtype of x (bfloat16 in a bfloat16 model); rope's
  turns by the exactly reduced angles of rope's float32 frequencies. Its model keeps no table
  either (:data:`OWN_TABLES`).

Accuracy: each output entry is within half a unit of its dtype of the formula evaluated exactly
on the tables used (float64 arithmetic on float32 or narrower inputs and tables loses nothing
before the one rounding: every product is exact and the sum of two is rounded once to 53 bits,
far below half a unit of float32). Against the exact rotation by m theta_i the tables' own
rounding adds at most half a unit of the table's dtype per entry (times ``|x|``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import torch

from .. import _checks
from ..angles import cos_sin
from ..frequencies import inv_freq
from ..rotation import round_once
from .clvp import method_inputs as _clvp_inputs

ANY_CLASS = "*."
"""The prefix of a convention's name for a class attribute (:func:`resolve`)."""

TABLE_FORMS = ("stacked", "none", "angles")
"""The table forms of method conventions beside :data:`rope.hf.TABLE_FORMS`: ``stacked``, the
conformers' one tensor ``[2, n, 1, 1, d]`` of cos then sin (:class:`rope.hf.StackedRotaryTable`);
``none``, no table: the function computes its angles from the positions it is given (V-JEPA 2);
``angles``, CLVP's ``[1, n, d]`` angles, whose cos and sin its attention takes itself
(:class:`rope.hf.RotaryAngleTable`, :mod:`rope.hf.clvp`)."""

OWN_TABLES = frozenset({"roformer", "vjepa2"})
"""The conventions whose models keep their own tables or make none (no rotary module nor position
table for :func:`rope.hf.install` to swap): :func:`rope.hf.patch` replaces their function alone,
and finds the modeling module to patch from the model's own class."""

EXACT_ATTRIBUTE = "rope_exact"
"""The attribute of a stack :class:`rope.hf.StackedRotaryTable` returns: ``(float64 stack,
version)``, the exact cos and sin it was rounded from and the stack's version counter then."""


def resolve(module, name: str) -> tuple[object, str] | None:
    """Where ``name`` lives: ``(module, name)`` for a module-level name; for ``"*.<attribute>"``
    (:data:`ANY_CLASS`), ``(class, attribute)`` of the one class defined in ``module`` whose own
    namespace holds the attribute; ``None`` where no class or several do.

    Args:
        module: a modeling module.
        name: a name of :attr:`rope.hf.Convention.functions`.
    """
    if not name.startswith(ANY_CLASS):
        return module, name
    attribute = name[len(ANY_CLASS):]
    found = [value for value in vars(module).values() if isinstance(value, type)
             and value.__module__ == module.__name__ and attribute in vars(value)]
    return (found[0], attribute) if len(found) == 1 else None


def get(module, name: str, default=None):
    """What ``module`` holds under ``name`` (:func:`resolve`): a module attribute, or the raw class
    attribute (a ``staticmethod`` object as the class holds it, so that identity tells whether it
    is still the one set); ``default`` where there is none.

    Args:
        module: a modeling module.
        name: a name of :attr:`rope.hf.Convention.functions`.
        default: returned where the name resolves to nothing.
    """
    place = resolve(module, name)
    if place is None:
        return default
    holder, attribute = place
    return getattr(holder, attribute, default) if holder is module else vars(holder).get(attribute, default)


def put(module, name: str, value) -> None:
    """Set ``value`` under ``name`` in ``module`` (:func:`resolve`); a plain function set where
    the class holds a ``staticmethod`` is wrapped in one (so the attention calls it unbound).
    Raises ``ValueError`` where the name resolves to nothing.

    Args:
        module: a modeling module.
        name: a name of :attr:`rope.hf.Convention.functions`.
        value: the function (or raw class attribute) to set.
    """
    place = resolve(module, name)
    if place is None:
        raise ValueError(f"{module.__name__} defines no one class with {name.removeprefix(ANY_CLASS)}")
    holder, attribute = place
    if holder is not module and isinstance(vars(holder).get(attribute), staticmethod) and not isinstance(
            value, staticmethod):
        value = staticmethod(value)
    setattr(holder, attribute, value)


def _promoted(x: torch.Tensor, table: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, table.dtype)


def _pairs_turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(x_2i c_i - x_2i+1 s_i, x_2i+1 c_i + x_2i s_i), back in place, c and s ``[..., d/2]``:
    RoFormer's ``x cos_pos + rotate_every_two(x) sin_pos`` with its tables repeated twice in a row."""
    x_a, x_b = x[..., 0::2], x[..., 1::2]
    return torch.stack((x_a * cos - x_b * sin, x_b * cos + x_a * sin), dim=-1).flatten(-2)


def apply_rotary_position_embeddings(sinusoidal_pos, query_layer, key_layer, value_layer=None):
    """transformers-compatible with RoFormer's static method ``RoFormerSelfAttention.
    apply_rotary_position_embeddings``: with ``sin, cos = sinusoidal_pos.chunk(2, dim=-1)`` (each
    ``[..., seq, d/2]``), pair (2i, 2i + 1) of each of q, k and (where given) v becomes
    (x_2i cos_i - x_2i+1 sin_i, x_2i+1 cos_i + x_2i sin_i), computed in float64 and rounded once to
    the dtype torch gives ``x * sinusoidal_pos`` (module docstring).

    Args:
        sinusoidal_pos: the table ``[..., seq, d]``, ``[sin | cos]`` halves, broadcast to q.
        query_layer: queries ``[batch, heads, seq, d]``, floating.
        key_layer: keys, whose shape the table also broadcasts to.
        value_layer: values (rotated too: RoFormer's ``rotary_value``), or ``None``.

    Returns:
        ``(query, key)``, or ``(query, key, value)`` where ``value_layer`` is given.
    """
    xs = {"query_layer": query_layer, "key_layer": key_layer}
    if value_layer is not None:
        xs["value_layer"] = value_layer
    _check_rotated(xs, "sinusoidal_pos", sinusoidal_pos, "[sin | cos] halves")
    sin, cos = sinusoidal_pos.to(torch.float64).chunk(2, dim=-1)
    return tuple(round_once(_pairs_turned(x.to(torch.float64), cos, sin), _promoted(x, sinusoidal_pos))
                 for x in xs.values())


def apply_rotary_embedding_stacked(attention, hidden_states, relative_position_embeddings):
    """transformers-compatible with the conformers' method ``_apply_rotary_embedding(self,
    hidden_states, relative_position_embeddings)``: ``hidden_states`` ``[batch, n, heads *
    head_size]`` viewed as ``[batch, n, heads, head_size]`` becomes ``x cos + rotate_half(x) sin``
    with ``cos, sin = relative_position_embeddings[0, :n], [1, :n]`` (``[n, 1, 1, head_size]``, the
    halves (i, i + head_size/2) turned together), in float64, rounded once to the dtype torch gives
    ``x * cos``. From the untouched stack of :class:`rope.hf.StackedRotaryTable`, the float64 cos
    and sin it was rounded from are used (:data:`EXACT_ATTRIBUTE`).

    Args:
        attention: the attention module (``self``): its ``num_heads`` and ``head_size``.
        hidden_states: ``[batch, n, num_heads * head_size]``, floating.
        relative_position_embeddings: the stack ``[2, n', 1, 1, head_size]``, n' >= n.

    Returns:
        the rotated hidden states, ``[batch, n, num_heads * head_size]``.
    """
    heads = _checks.integer("attention.num_heads", getattr(attention, "num_heads", None), minimum=1)
    size = _checks.integer("attention.head_size", getattr(attention, "head_size", None), minimum=2)
    _checks.float_tensor("hidden_states", hidden_states, dim=3)
    stack = _checks.float_tensor("relative_position_embeddings", relative_position_embeddings, dim=5)
    _checks.same_device("hidden_states", hidden_states, relative_position_embeddings=stack)
    batch, n, width = hidden_states.shape
    if width != heads * size or size % 2:
        raise ValueError(f"hidden_states {tuple(hidden_states.shape)} must be [batch, n, num_heads * head_size] "
                         f"with an even head_size (num_heads {heads}, head_size {size})")
    if stack.shape[0] != 2 or stack.shape[1] < n or stack.shape[2:] != (1, 1, size):
        raise ValueError(f"relative_position_embeddings {tuple(stack.shape)} must be the stack [2, n', 1, 1, "
                         f"head_size] of cos and sin with n' >= n = {n} and head_size {size}")
    exact = _exact_stack(stack)
    cos, sin = (exact if exact is not None else stack.to(torch.float64))[:, :n]
    x = hidden_states.view(batch, n, heads, size).transpose(0, 1).to(torch.float64)  # [n, batch, heads, size]
    half = size // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    out = round_once(x * cos + turned * sin, _promoted(hidden_states, stack))
    return out.transpose(0, 1).reshape(batch, n, width)


def rotate_queries_or_keys(x, pos):
    """transformers-compatible with V-JEPA 2's ``rotate_queries_or_keys(x, pos)``
    (``modeling_vjepa2.py``; its attention calls it on each third of the head, with the patches'
    frame, row or column): with p = D/2 frequencies theta_i = 10000^(-2i/D) and its tables
    ``freq.repeat(..., 2)`` (theta_0 .. theta_{p-1} twice), coordinate j of x turns by the angle
    m theta_{j mod p} of its token's position m: out_j = x_j cos + y_j sin with y = (-x_1, x_0,
    -x_3, x_2, ..), the pairs (2i, 2i + 1) of its ``rotate``, as transformers computes it (the two
    members of a pair read different angles). transformers forms theta_i and m theta_i in the
    dtype of x (bfloat16 for a bfloat16 model); here theta_i are rope's float32 frequencies
    (:func:`rope.inv_freq`), the angles exactly reduced (:func:`rope.angles.cos_sin`) and the
    formula float64, rounded once to the dtype of x.

    Args:
        x: queries or keys ``[batch, heads, n, D]``, floating, D even.
        pos: integer positions, ``[n]`` or ``[batch, heads, n]`` (masked tokens' indices).

    Returns:
        x rotated, in its dtype.
    """
    _checks.float_tensor("x", x, dim=4)
    _checks.integer_tensor("pos", pos)
    _checks.same_device("x", x, pos=pos)
    width = x.shape[-1]
    if width % 2:
        raise ValueError(f"x {tuple(x.shape)} must have an even last dimension D (pairs (2i, 2i + 1))")
    if pos.dim() == 0 or pos.shape[-1] != x.shape[-2]:
        raise ValueError(f"pos {tuple(pos.shape)} must hold one position per token of x {tuple(x.shape)} "
                         "(last dimension n)")
    if not width:
        return x.clone()
    theta, _ = inv_freq({"rope_type": "default", "rope_theta": 10000.0}, width)
    cos, sin = cos_sin(pos.to(torch.int64), theta.to(x.device).repeat(2), float64=True)
    if pos.dim() == 1:
        cos, sin = cos[None, None], sin[None, None]
    elif pos.dim() != 3:
        raise ValueError(f"pos {tuple(pos.shape)} must be [n] or [batch, heads, n]")
    if not _broadcasts_to(cos.shape, x.shape):
        raise ValueError(f"pos {tuple(pos.shape)} does not broadcast to x {tuple(x.shape)}")
    x64 = x.to(torch.float64)
    turned = torch.stack((-x64[..., 1::2], x64[..., 0::2]), dim=-1).flatten(-2)
    return round_once(x64 * cos + turned * sin, x.dtype)


def _exact_stack(stack: torch.Tensor) -> torch.Tensor | None:
    """The float64 stack rope's :class:`rope.hf.StackedRotaryTable` rounded ``stack`` from, where
    ``stack`` is that very tensor, not edited since (its version counter unchanged); else ``None``
    (under ``torch.compile`` too: nothing is proven there)."""
    record = getattr(stack, EXACT_ATTRIBUTE, None)
    if record is None or torch.compiler.is_compiling():
        return None
    exact, version = record
    return exact if stack._version == version and exact.shape == stack.shape else None


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without enlarging it."""
    try:
        return torch.broadcast_shapes(shape, target) == tuple(target)
    except RuntimeError:
        return False


def _check_rotated(xs: dict, table_name: str, table, layout: str) -> None:
    """Raise unless every tensor of ``xs`` is floating, on the table's device, with an even last
    dimension that the floating ``table`` of the same width broadcasts to."""
    _checks.float_tensor(table_name, table)
    for name, x in xs.items():
        _checks.float_tensor(name, x)
    _checks.same_device(table_name, table, **xs)
    if table.dim() == 0 or table.shape[-1] % 2 or not table.shape[-1]:
        raise ValueError(f"{table_name} {tuple(table.shape)} must have an even, non-zero last dimension ({layout})")
    for name, x in xs.items():
        if x.dim() == 0 or x.shape[-1] != table.shape[-1]:
            raise ValueError(f"{table_name} has width {table.shape[-1]}, expected the head_dim of {name} "
                             f"{tuple(x.shape)}: the table spans the whole head")
        if not _broadcasts_to(table.shape, x.shape):
            raise ValueError(f"{table_name} {tuple(table.shape)} does not broadcast to {name} {tuple(x.shape)}")


FUNCTION_TOLERANCE = 1e-5
"""How far a modeling module's method may differ from rope's on float32 inputs of size 1."""


def _roformer_inputs(generator: torch.Generator) -> Iterator[tuple]:
    """RoFormer's arguments: a ``[sin | cos]`` table ``[1, 1, 4, 16]`` of random positions, q, k
    ``[1, 4, 4, 16]``; then with values too."""
    positions = torch.randint(0, 4096, (4, 1), generator=generator).to(torch.float64)
    angles = positions * 10000.0 ** (-torch.arange(8, dtype=torch.float64) / 8)
    table = torch.cat((angles.sin(), angles.cos()), dim=-1).float()[None, None]
    q, k, v = (torch.randn(1, 4, 4, 16, generator=generator) for _ in range(3))
    yield table, q, k
    yield table, q, k, v


def _stacked_inputs(generator: torch.Generator) -> Iterator[tuple]:
    """A conformer attention's ``self`` (4 heads of 16), hidden states ``[2, 5, 64]`` and a stack
    ``[2, 6, 1, 1, 16]`` of cos and sin (one position more than the sequence)."""
    angles = torch.arange(6, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(8, dtype=torch.float64) / 8)
    angles = angles.repeat(1, 2)[:, None, None]
    stack = torch.stack((angles.cos(), angles.sin())).float()
    yield SimpleNamespace(num_heads=4, head_size=16), torch.randn(2, 5, 64, generator=generator), stack


def _patch_position_inputs(generator: torch.Generator) -> Iterator[tuple]:
    """V-JEPA 2's arguments: x ``[2, 3, 5, 8]`` and positions ``[5]``, then ``[2, 3, 5]``."""
    x = torch.randn(2, 3, 5, 8, generator=generator)
    yield x, torch.randint(0, 64, (5,), generator=generator)
    yield x, torch.randint(0, 64, (2, 3, 5), generator=generator)


METHOD_INPUTS: dict[str, Callable[[torch.Generator], Iterator[tuple]]] = {
    "roformer": _roformer_inputs, "wav2vec2-conformer": _stacked_inputs, "vjepa2": _patch_position_inputs,
    "clvp": _clvp_inputs}
"""Each method convention by name, and the random arguments on which a modeling module's method
must return what rope's does (:func:`computes`); also the conventions of module-level functions
of their own signature (V-JEPA 2's, CLVP's: :func:`rope.hf.clvp.method_inputs`)."""


def is_method(convention) -> bool:
    """Whether ``convention`` (a :class:`rope.hf.Convention`) is one of this module's."""
    return convention.name in METHOD_INPUTS


def computes(module, convention) -> bool:
    """Whether ``module`` holds each of ``convention``'s names (:func:`get`) and it returns what
    rope's replacement does, to :data:`FUNCTION_TOLERANCE`, on the random float32 arguments of
    :data:`METHOD_INPUTS`.

    Args:
        module: a modeling module.
        convention: a method convention (:func:`is_method`).
    """
    generator = torch.Generator().manual_seed(0)
    for name, ours in convention.functions:
        theirs = get(module, name)
        if not callable(theirs):
            return False
        for args in METHOD_INPUTS[convention.name](generator):
            try:
                got, expected = theirs(*args), ours(*args)
            except Exception:  # another signature or shape contract: not this convention
                return False
            got, expected = (out if isinstance(out, tuple) else (out,) for out in (got, expected))
            if len(got) != len(expected) or not all(
                    isinstance(a, torch.Tensor) and a.shape == b.shape
                    and float((a - b).abs().max()) <= FUNCTION_TOLERANCE for a, b in zip(got, expected)):
                return False
    return True
