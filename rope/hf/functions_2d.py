"""transformers-compatible rotation functions of vision and video attentions beyond :mod:`rope.hf.functions`.

Each has the signature of a transformers function and its result: the model's formula on the
tables it is given, computed in float64 and rounded once to the dtype of each input
(:func:`rope.rotation.round_once`). transformers computes these in float32 (each product and sum
rounded) and casts back; here a float32 (or narrower) input times a float32 table is exact in
float64, the sum of two such products is rounded once there (relative error at most 2^-53), and
the result once more to the input's dtype: within half an ulp of the exact formula plus 2^-52 of
the pair's magnitude. The tables are used as given: these modules' rotary modules hand them to
their attention directly, and rope's (:mod:`rope.hf.vision`) are exactly rounded. Values are
not checked (a check would wait for the device at every attention call): a non-finite entry
gives non-finite outputs where transformers' formula reads it, as there.

:func:`rope.hf.patch` covers ``llama4_vision_model`` with the first and ``edgetam_video`` with
the other two (its forward needs an inference session, which :mod:`rope.hf.coverage`'s probe does
not make: it is probed by its memory attention, :func:`rope.hf.part_feeds.edgetam_memory_attention`);
they are checked against their formulas in ``tests/test_hf_functions_2d.py``.

==========================================  ======================  ============  ==================
function                                    models                  tables        pairs
==========================================  ======================  ============  ==================
:func:`apply_rotary_emb_complex_vision`     Llama 4's vision        complex       (2i, 2i + 1)
                                            tower
:func:`apply_rotary_pos_emb_2d_self_attn`   EdgeTAM video's memory  interleaved   (2i, 2i + 1)
                                            self-attention
:func:`apply_rotary_pos_emb_2d_cross_attn`  EdgeTAM video's memory  interleaved   (2i, 2i + 1), keys
                                            cross-attention                       in groups
==========================================  ======================  ============  ==================
"""

from __future__ import annotations

import torch

from .. import _checks
from ..rotation import round_once
from . import provenance
from .functions import rotate_pairs_interleaved


def apply_rotary_emb_complex_vision(query, key, freqs_ci):
    """transformers-compatible with Llama 4's ``vision_apply_rotary_emb``: query and key ``[batch,
    seq, heads, head_dim]``, pairs (2i, 2i + 1) read as complex numbers and multiplied by
    ``freqs_ci`` viewed as ``[1, seq, 1, head_dim / 2]`` (its vision rotary module's table is
    ``[seq, 1, head_dim / 2]``, the class token's angles zero): pair i of token s becomes
    (x_2i c - x_2i+1 s', x_2i s' + x_2i+1 c) with c + i s' = ``freqs_ci[s, i]``. transformers
    computes it in complex64 (also for float64 inputs); here in complex128, each output rounded
    once to its input's dtype.

    Args:
        query: queries ``[batch, seq, heads, head_dim]``, floating, head_dim even.
        key: keys ``[batch, seq, heads, head_dim]`` (batch and heads may differ).
        freqs_ci: complex, ``seq * head_dim / 2`` entries, the last dimension ``head_dim / 2``.

    Returns:
        ``(query_out, key_out)``, each in its input's dtype.
    """
    for name, x in (("query", query), ("key", key)):
        _checks.float_tensor(name, x, dim=4)
    _checks.tensor("freqs_ci", freqs_ci)
    if not freqs_ci.dtype.is_complex:
        raise TypeError(f"freqs_ci must be a complex tensor (complex64 or complex128), got {freqs_ci.dtype}")
    _checks.same_device("query", query, key=key, freqs_ci=freqs_ci)
    seq, head_dim = query.shape[1], query.shape[-1]
    if head_dim % 2:
        raise ValueError(f"query {tuple(query.shape)} must have an even head_dim (pairs (2i, 2i + 1))")
    if key.shape[1] != seq or key.shape[-1] != head_dim:
        raise ValueError(f"key {tuple(key.shape)} must have the seq and head_dim of query {tuple(query.shape)}")
    if freqs_ci.dim() == 0 or freqs_ci.shape[-1] != head_dim // 2 or freqs_ci.numel() != seq * (head_dim // 2):
        raise ValueError(f"freqs_ci {tuple(freqs_ci.shape)} must hold seq * head_dim / 2 = {seq} * {head_dim // 2} "
                         f"entries, head_dim / 2 in its last dimension (query {tuple(query.shape)})")
    table = freqs_ci.reshape(1, seq, 1, head_dim // 2).to(torch.complex128)
    return tuple(_complex_product(x, table) for x in (query, key))


def apply_rotary_pos_emb_2d_self_attn(q, k, cos, sin):
    """transformers-compatible with EdgeTAM video's ``apply_rotary_pos_emb_2d_self_attn`` (its
    memory attention's self-attention; the formula of SAM 2's and SAM 3's
    ``apply_rotary_pos_emb_2d``): ``q cos + rotate_pairwise(q) sin`` with ``rotate_pairwise``
    turning the pairs (2i, 2i + 1) and the tables ``[seq, head_dim]`` (each angle twice in a row)
    broadcast to q as they are; in float64, each output rounded once to its input's dtype.

    Args:
        q: queries ``[..., seq, head_dim]``, floating.
        k: keys, laid out as q.
        cos: the interleaved cos table, ``[seq, width]`` (or any shape that broadcasts to q), width
            even and at most head_dim (the rest of the head passes through).
        sin: the sin table, of cos's shape.

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    xs = {"q": q, "k": k}
    _check_tables("apply_rotary_pos_emb_2d_self_attn", xs, {"cos": cos, "sin": sin})
    return tuple(_pairwise(x, cos, sin) for x in xs.values())


def apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos_k, sin_k, num_k_exclude_rope: int = 0,
                                       repeat_freqs_k: int = 1):
    """transformers-compatible with EdgeTAM video's ``apply_rotary_pos_emb_2d_cross_attn`` (its
    memory attention's cross-attention to the memory): q as :func:`apply_rotary_pos_emb_2d_self_attn`
    with ``cos``, ``sin``; of k ``[batch, heads, n, head_dim]``, the last ``num_k_exclude_rope``
    keys (object pointers) pass through, and the other n - e form ``repeat_freqs_k`` groups (one
    per memory frame) of g = (n - e) / ``repeat_freqs_k`` keys each: in every group the first g -
    s keys (temporal) pass through and the last s, with s = ``cos_k.shape[-2]`` (spatial), key j
    of them turned by row j of ``cos_k``, ``sin_k`` (``x cos_k + rotate_pairwise(x) sin_k``, the
    tables repeated once per group as transformers repeats them). In float64, each output
    rounded once to its input's dtype; with every key excluded, k is returned as given.

    Args:
        q: queries ``[..., seq, head_dim]``, floating.
        k: keys ``[batch, heads, n, head_dim]``, floating.
        cos: the interleaved cos table of the queries, ``[seq, width]`` (or any shape that
            broadcasts to q).
        sin: the sin table, of cos's shape.
        cos_k: the interleaved cos table of the spatial keys of one group, ``[s, width]`` (or
            ``[..., s, width]`` broadcasting to ``[batch, heads, s]``).
        sin_k: the sin table of the keys, of cos_k's shape.
        num_k_exclude_rope: how many keys at the end of k pass through, in [0, n].
        repeat_freqs_k: the number of groups, at least 1, dividing n - num_k_exclude_rope.

    Returns:
        ``(q_out, k_out)``, each in its input's dtype.
    """
    function = "apply_rotary_pos_emb_2d_cross_attn"
    _check_tables(function, {"q": q}, {"cos": cos, "sin": sin})
    _checks.float_tensor("k", k, dim=4)
    excluded = _checks.integer("num_k_exclude_rope", num_k_exclude_rope, minimum=0, maximum=k.shape[-2])
    groups = _checks.integer("repeat_freqs_k", repeat_freqs_k, minimum=1)
    if _checks.float_tensor("cos_k", cos_k).dim() < 2:
        raise ValueError(f"cos_k must be [spatial keys, width] or more, got shape {tuple(cos_k.shape)}")
    if _checks.float_tensor("sin_k", sin_k).shape != cos_k.shape:
        raise ValueError(f"sin_k {tuple(sin_k.shape)} must have the shape of cos_k {tuple(cos_k.shape)}")
    rotated = k.shape[-2] - excluded
    if rotated == 0:  # every key excluded: transformers returns k as it is
        return _pairwise(q, cos, sin), k[..., rotated:, :]
    if rotated % groups:
        raise ValueError(f"k {tuple(k.shape)} less num_k_exclude_rope={excluded} keys leaves {rotated}, not a "
                         f"multiple of repeat_freqs_k={groups}")
    per_group, spatial = rotated // groups, cos_k.shape[-2]
    if spatial > per_group:
        raise ValueError(f"cos_k {tuple(cos_k.shape)} has {spatial} rows (spatial keys), more than the {per_group} "
                         f"keys of each of the repeat_freqs_k={groups} groups of k {tuple(k.shape)}")
    grouped = k[..., :rotated, :].unflatten(-2, (groups, per_group))  # [batch, heads, groups, keys, head_dim]
    temporal = per_group - spatial
    given = tuple(cos_k.shape)
    _check_form(function, "cos_k", cos_k)  # before the views below, which carry no record of it
    cos_k, sin_k = cos_k.unsqueeze(-3), sin_k.unsqueeze(-3)  # the group dimension: the same rows for every group
    if not _broadcasts_to(cos_k.shape[:-1], grouped[..., temporal:, :].shape[:-1]):
        raise ValueError(f"cos_k {given} does not broadcast to the spatial keys of k {tuple(k.shape)} ([batch, heads, "
                         f"{spatial}] in each group)")
    _check_tables(function, {"k": grouped[..., temporal:, :]}, {"cos_k": cos_k, "sin_k": sin_k})
    keys = torch.cat((grouped[..., :temporal, :], _pairwise(grouped[..., temporal:, :], cos_k, sin_k)), dim=-2)
    return _pairwise(q, cos, sin), torch.cat((keys.flatten(-3, -2), k[..., rotated:, :]), dim=-2)


def _check_tables(function: str, xs: dict, tables: dict) -> None:
    """Raise unless the inputs ``xs`` are float tensors and the two ``tables`` (cos, then sin, by
    name) float tensors of one shape on their device, not rope's tables of another form than
    interleaved, of an even width at most each input's head_dim, broadcasting as they are to each
    input (its last dimension aside) without enlarging it."""
    for name, x in xs.items():
        _checks.float_tensor(name, x)
    (cos_name, cos), (sin_name, sin) = tables.items()
    _checks.float_tensor(cos_name, cos)
    _checks.float_tensor(sin_name, sin)
    first = next(iter(xs))
    _checks.same_device(first, xs[first], **{n: x for n, x in xs.items() if n != first}, **tables)
    if cos.dim() == 0:
        raise ValueError(f"{cos_name} must have at least one dimension (the table width), got a 0-D tensor")
    if sin.shape != cos.shape:
        raise ValueError(f"{sin_name} {tuple(sin.shape)} must have the shape of {cos_name} {tuple(cos.shape)}")
    _check_form(function, cos_name, cos)
    width = cos.shape[-1]
    for name, x in xs.items():
        head_dim = x.shape[-1] if x.dim() else 0
        if width % 2 or not 0 < width <= head_dim:
            raise ValueError(f"{cos_name} has width {width}, expected an even width in [2, head_dim] (head_dim of "
                             f"{name} {tuple(x.shape)})")
        if not _broadcasts_to(cos.shape[:-1], x.shape[:-1]):
            raise ValueError(f"{cos_name} {tuple(cos.shape)} does not broadcast to {name} {tuple(x.shape)}")


def _check_form(function: str, name: str, table: torch.Tensor) -> None:
    """Raise where ``table`` is one of rope's tables of another form than interleaved."""
    form = provenance.recorded_form(table)
    if form is not None and form != "interleaved":
        raise ValueError(f"{name} holds rope's {form} tables, which rope.hf.{function} does not read (it reads "
                         "interleaved ones: each angle twice in a row)")


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without enlarging it."""
    try:
        return torch.broadcast_shapes(shape, target) == tuple(target)
    except RuntimeError:
        return False


def _pairwise(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_pairwise(x) sin`` on the first ``cos.shape[-1]`` coordinates of x in
    float64, rounded once to x's dtype; the other coordinates pass through."""
    width = cos.shape[-1]
    head = x[..., :width].to(torch.float64)
    turned = head * cos.to(torch.float64) + rotate_pairs_interleaved(head) * sin.to(torch.float64)
    return torch.cat((round_once(turned, x.dtype), x[..., width:]), dim=-1)


def _complex_product(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Pairs (2i, 2i + 1) of x as complex128 numbers times ``table`` (complex128, broadcasting),
    rounded once to x's dtype."""
    pairs = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2).contiguous())
    return round_once(torch.view_as_real(pairs * table).flatten(-2), x.dtype)
