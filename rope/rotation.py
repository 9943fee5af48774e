"""The torch path's arithmetic: pairs rotated by given cos and sin, each output rounded once.

For pair i = (x_a, x_b) and the cos c and sin s of its angle (RoFormer eq. 34)::

    y_a = x_a c - x_b s,        y_b = x_b c + x_a s,

computed in float64 (float32 where the device has no float64) and rounded once to x's dtype;
the rotated block is the first ``rotary_dim`` coordinates of a head, or with ``rotated="last"``
(DeepSeek-V4, :mod:`rope.layouts`) the last, and the others pass through. The gradient is the
same rotation with s negated.

Error. With c and s within 2^-52 of cos and sin, the float64 value is within 2^-50.5 ``|(x_a, x_b)|``
of the exact rotation (two products and a sum, each rounded once, plus the error of c and s on
``|x_a| + |x_b|`` <= sqrt 2 ``|(x_a, x_b)|``), and one rounding to the output dtype adds half an ulp:
the accuracy promise of :mod:`rope.apply`.

Rounding once. torch rounds float64 to bfloat16 and float16 through float32, twice, which is one
ulp off exactly where the float32 value lands on a tie of the output dtype (a number halfway
between two of its neighbours) without being the float64 value itself. :func:`round_once` rounds
to odd on the way instead (Boldo and Melquiond 2005). On the CPU the rotation takes a cheaper
test: it rounds through float32 and looks for float32 values on such a tie (for bfloat16 the low 16
bits of the float32 pattern are 0x8000; float16 values are scaled by 2^-112 first, exactly, which
gives all of float16's ties, subnormal ones included, one pattern too: bit 12 set and the 12 below
it clear), and redoes with :func:`round_once` only the rows (one head of one token) that hold one,
about one value in 2^16 of random data. Why the test suffices: the ties of bfloat16 and float16
are float32 numbers, and rounding to float32 is monotone and fixes them, so a float64 value
strictly between two ties rounds to float32 strictly between them too, or onto one; only in the
second case can the two roundings differ.

Speed on the CPU (the torch path's home: CPU, and devices without Triton). Where a C compiler
is, the CPU kernel of :mod:`rope.cpu` does all of this in one pass over memory: each value read,
rotated in float64 and rounded once on the spot (the same numbers, bit for bit). Elsewhere torch
operations do it, each one pass over memory, so the rotation runs block by block, a few tokens at
a time (:data:`BLOCK_ELEMENTS`), in float64 buffers that are reused and small enough for the
cache; blocks larger than glibc's mmap threshold would also be mapped fresh, and page-faulted, on
every call. Per block: one conversion to float64, two multiplies and two multiply-adds (the half
layout) or one complex multiply (interleaved pairs), one conversion back (float32 first for
bfloat16 and float16), and the tie test, two operations on int32. A decoding call's few tokens
(q and k together) are one block (:func:`rotate_small`).

Overflow. ``safe`` (:func:`rotate_pairs`) scales each pair by a power of two first, so that an
output beyond the range is +-inf, never inf - inf = NaN: needed where x's range reaches that of
float64, or the factor folded into c and s is huge.
"""

from __future__ import annotations

import threading

import torch

from . import _checks
from .cpu import rotary as cpu_rotary
from .layouts import rotary_start

BLOCK_ELEMENTS = 1 << 18
"""Rotated coordinates per block on the CPU: float64 input and output buffers of 2 MiB each (held
in the shared L3 cache; larger blocks lose to memory traffic, smaller ones to the overhead of
each operation)."""

_BELOW_FLOAT32 = (1 << 29) - 1  # the float64 significand bits that float32 does not have
_buffers = threading.local()  # per thread, so that concurrent calls never share a buffer


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values to ``dtype`` once, to nearest even.

    torch converts float64 to float16/bfloat16 through float32, which rounds twice and can land
    one ulp off. Rounding to float32 *to odd* first (truncate, then set the last bit if anything
    was dropped) makes the second rounding exact, because float32 carries more than two extra
    bits (Boldo and Melquiond, "When double rounding is odd", 2005). On the float64 bit pattern
    that is: clear the 29 low significand bits and set the lowest kept one if any was set (NaN
    stays NaN, infinities and the sign are untouched). Below float32's normal range (``|x|`` <
    2^-126, bfloat16 only: float16's range lies inside float32's normal range) float32 has fewer
    bits, so those entries round to odd on float32's subnormal grid instead. Differentiable as
    a conversion is.

    Args:
        x: the values to round, float64 (other dtypes are converted plainly).
        dtype: the dtype to round to.

    Returns:
        x in ``dtype``.
    """
    if x.dtype != torch.float64 or dtype not in (torch.float16, torch.bfloat16):
        return x.to(dtype)
    if x.requires_grad and torch.is_grad_enabled():  # the bit operations have no gradient
        return _RoundOnce.apply(x, dtype)
    return _round_once(x, dtype)


class _RoundOnce(torch.autograd.Function):
    """:func:`round_once` with the gradient of a plain conversion."""

    @staticmethod
    def forward(ctx, x, dtype):
        return _round_once(x, dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(torch.float64), None


def _round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    bits = x.view(torch.int64)
    sticky = ((bits & _BELOW_FLOAT32) + _BELOW_FLOAT32) & (1 << 29)  # bit 29 set iff a dropped bit was
    out = ((bits & ~_BELOW_FLOAT32) | sticky).view(torch.float64).to(torch.float32).to(dtype)
    if dtype == torch.bfloat16:
        tiny = out.abs() <= 2.0**-126  # rounding is monotone: every |x| < 2^-126 lands here
        if _may_hold_true(tiny):
            out = torch.where(tiny, _round_to_odd_float32(x).to(dtype), out)
    return out


def _may_hold_true(mask: torch.Tensor) -> bool:
    """Whether ``mask`` has a true entry: asked where that is free (the CPU), else assumed."""
    return not _checks.reads_are_free(mask.device) or bool(mask.any())


def _round_to_odd_float32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to float32 toward zero, with the last bit set if that was inexact."""
    nearest = x.to(torch.float32)
    inexact = nearest.to(torch.float64) != x
    rounded_up = nearest.abs().to(torch.float64) > x.abs()
    toward_zero = torch.where(rounded_up, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)
    return torch.where(inexact, (toward_zero.view(torch.int32) | 1).view(torch.float32), nearest)


def pair_views(x: torch.Tensor, layout: str, rotary_dim: int):
    """``(x_a, x_b, tail)``: views of the two coordinates of every pair (:mod:`rope.layouts`)
    and of the coordinates past ``rotary_dim``.

    Args:
        x: a tensor whose last dimension is the head, ``[..., head_dim]``.
        layout: ``"half"`` or ``"interleaved"``.
        rotary_dim: the rotated width; the coordinates past it are the tail.
    """
    half = rotary_dim // 2
    if layout == "half":
        return x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    pairs = x[..., :rotary_dim].unflatten(-1, (half, 2))
    return pairs[..., 0], pairs[..., 1], x[..., rotary_dim:]


def _join_pairs(y_a, y_b, tail, layout: str) -> torch.Tensor:
    if layout == "half":
        return torch.cat((y_a, y_b, tail), dim=-1)
    return torch.cat((torch.stack((y_a, y_b), dim=-1).flatten(-2), tail), dim=-1)


def _rotated_pair(x_a, x_b, cos, sin, safe: bool):
    """(x_a cos - x_b sin, x_b cos + x_a sin) in the dtype of cos. ``safe``: the pair is first
    divided by 2^k, k the exponent of its larger coordinate (exact: only large pairs are
    scaled), and multiplied back in two exact steps, so that no intermediate overflows and an
    output beyond the range is +-inf, not inf - inf = NaN."""
    if not safe:
        return x_a * cos - x_b * sin, x_b * cos + x_a * sin
    exponent = torch.frexp(torch.maximum(x_a.abs(), x_b.abs())).exponent.clamp(min=0)
    one = torch.ones_like(x_a, dtype=cos.dtype)
    down, up, rest = (torch.ldexp(one, e) for e in (-exponent, exponent // 2, exponent - exponent // 2))
    x_a, x_b = x_a * down, x_b * down
    return (x_a * cos - x_b * sin) * up * rest, (x_b * cos + x_a * sin) * up * rest


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
                 *, safe: bool | None = None, rotated: str = "first") -> torch.Tensor:
    """(x_a, x_b) -> (x_a cos - x_b sin, x_b cos + x_a sin) on the layout's pairs, computed in
    the dtype of cos and sin (float64, or float32 where float64 does not exist) and rounded once
    to x's dtype; the tail passes through. cos and sin broadcast against ``x_a`` (e.g.
    ``[batch, seq, 1, pairs]``). Differentiable: the gradient is the transposed rotation, computed
    and rounded the same way. ``safe`` guards against intermediate overflow
    (:func:`_rotated_pair`); by default it is on where x's range reaches that of cos's dtype,
    which suffices for ``|cos|, |sin|`` <= 2^512.

    Args:
        x: the tensor to rotate, ``[..., head_dim]``.
        cos: cos of each pair's angle, broadcasting against ``x_a``.
        sin: sin of each pair's angle, of cos's shape and dtype.
        layout: ``"half"`` or ``"interleaved"`` (:mod:`rope.layouts`).
        rotary_dim: the rotated width; the coordinates past it pass through.
        safe: guard against intermediate overflow; ``None`` chooses as above.
        rotated: ``"first"`` or ``"last"`` (:data:`rope.layouts.ROTATED`): which rotary_dim
            coordinates are rotated; the others pass through.

    Returns:
        The rotated x, in x's dtype and shape.
    """
    return rotate_tensors((x,), cos, sin, layout, rotary_dim, safe=safe, rotated=rotated)[0]


def rotate_tensors(xs: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor, layout: str,
                   rotary_dim: int, *, safe: bool | None = None, rotated: str = "first") -> tuple[torch.Tensor, ...]:
    """:func:`rotate_pairs` of several tensors by the same cos and sin (queries and keys), in
    one pass where they are small enough for one block on the CPU (decoding); differentiable.

    Args:
        xs: the tensors to rotate, ``[..., head_dim]`` each; on the CPU block path
            ``[batch, seq, heads, head_dim]`` of one dtype, batch and seq (heads may differ).
        cos: cos of each pair's angle, broadcasting against each ``x_a``.
        sin: sin of each pair's angle, of cos's shape and dtype.
        layout: ``"half"`` or ``"interleaved"`` (:mod:`rope.layouts`).
        rotary_dim: the rotated width; the coordinates past it pass through.
        safe: guard against intermediate overflow (:func:`rotate_pairs`).
        rotated: which rotary_dim coordinates are rotated (:func:`rotate_pairs`).

    Returns:
        The rotated tensors, each in its dtype and shape.
    """
    if safe is None:
        safe = xs[0].dtype == cos.dtype or cos.dtype == torch.float32
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        return _Rotation.apply(cos, sin, layout, rotary_dim, safe, rotated, *xs)
    return _rotate_once(xs, cos, sin, layout, rotary_dim, safe, rotated=rotated)  # no autograd record to make


def _rotate_once(xs, cos, sin, layout, rotary_dim, safe, *, rotated: str = "first",
                 views: bool = True) -> tuple[torch.Tensor, ...]:
    """Each x rotated and rounded once (no autograd); ``views``: small results may be views of one
    tensor (not for autograd, which refuses in-place changes to such outputs). ``rotated="last"``:
    the CPU kernel takes the block's start; the torch operations rotate the narrowed block as a
    whole head and join the first coordinates to it (one more copy, off the kernel's path)."""
    if rotated == "last" and any(x.shape[-1] > rotary_dim for x in xs):
        if cpu_rotary.available() and all(_by_blocks(x, cos, safe) for x in xs):
            return tuple(cpu_rotary.rotate(x, cos, sin, layout, rotary_dim, rotated) for x in xs)
        starts = [rotary_start(x.shape[-1], rotary_dim, rotated) for x in xs]
        blocks = _rotate_once(tuple(x.narrow(-1, start, rotary_dim) for x, start in zip(xs, starts)), cos, sin,
                              layout, rotary_dim, safe, views=False)
        return tuple(torch.cat((x.narrow(-1, 0, start), y), dim=-1) for x, start, y in zip(xs, starts, blocks))
    if all(_by_blocks(x, cos, safe) for x in xs):
        if cpu_rotary.available():  # one pass over memory for each x
            return tuple(cpu_rotary.rotate(x, cos, sin, layout, rotary_dim) for x in xs)
        rotated = sum(x.numel() // x.shape[3] for x in xs) * rotary_dim if xs[0].shape[3] else 0
        if len(xs) > 1 and rotated <= BLOCK_ELEMENTS and _joinable(xs):
            return _rotate_together(xs, cos, sin, layout, rotary_dim, views)
        return tuple(_rotate_by_blocks(x, cos, sin, layout, rotary_dim) for x in xs)
    out = []
    for x in xs:
        x_a, x_b, tail = pair_views(x, layout, rotary_dim)
        y_a, y_b = _rotated_pair(x_a.to(cos.dtype), x_b.to(cos.dtype), cos, sin, safe)
        out.append(_join_pairs(round_once(y_a, x.dtype), round_once(y_b, x.dtype), tail, layout))
    return tuple(out)


class _Rotation(torch.autograd.Function):
    """y = R x rounded once for each x, with dx = R^T dy rounded once (cos and sin are constants)."""

    @staticmethod
    def forward(ctx, cos, sin, layout, rotary_dim, safe, rotated, *xs):
        ctx.save_for_backward(cos, sin)
        ctx.options = (layout, rotary_dim, safe, rotated)
        ctx.set_materialize_grads(False)  # an output unused by the loss gives its input no gradient
        return _rotate_once(xs, cos, sin, layout, rotary_dim, safe, rotated=rotated, views=False)

    @staticmethod
    def backward(ctx, *grads):
        cos, sin = ctx.saved_tensors
        given = [g for g in grads if g is not None]
        layout, rotary_dim, safe, rotated = ctx.options
        back = iter(rotate_tensors(tuple(given), cos, -sin, layout, rotary_dim, safe=safe, rotated=rotated)
                    if given else ())
        return (None,) * 6 + tuple(None if g is None else next(back) for g in grads)


# --- The CPU path: block by block, in reused float64 buffers -------------------------------------


def _by_blocks(x: torch.Tensor, cos: torch.Tensor, safe: bool) -> bool:
    """Whether the block path applies: float64 arithmetic on the CPU for float32, float16 or
    bfloat16 ``[batch, seq, heads, head_dim]`` data without the overflow guard, cos broadcasting
    as ``[batch or 1, seq or 1, heads or 1, pairs]``, where values are read at no cost (the tie
    test reads them: :func:`rope._checks.reads_are_free`)."""
    return (cos.dtype == torch.float64 and not safe and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and x.dim() == 4 and cos.dim() == 4 and x.device == cos.device and _checks.reads_are_free(x.device))


def _buffer(name: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """This thread's reused buffer ``name``: ``numel`` elements of ``dtype`` (grown when too small)."""
    store = _buffers.__dict__
    held = store.get(name)
    if held is None or held.numel() < numel or held.dtype != dtype:
        held = store[name] = torch.empty(numel, dtype=dtype)
    return held[:numel]


def _blocks(batch: int, seq: int, per_token: int):
    """(batch slice, seq slice) blocks of about :data:`BLOCK_ELEMENTS` rotated coordinates: whole
    sequences of several batch rows where a sequence fits, else tokens of one row at a time."""
    if seq * per_token <= BLOCK_ELEMENTS:
        rows = max(1, BLOCK_ELEMENTS // max(1, seq * per_token))
        return [(slice(start, start + rows), slice(None)) for start in range(0, batch, rows)]
    tokens = max(1, BLOCK_ELEMENTS // per_token)
    return [(slice(row, row + 1), slice(start, start + tokens))
            for row in range(batch) for start in range(0, seq, tokens)]


def _table_block(table: torch.Tensor, rows: slice, tokens: slice) -> torch.Tensor:
    """The block of a broadcasting table ``[batch or 1, seq or 1, ...]``."""
    return table[rows if table.shape[0] != 1 else slice(None), tokens if table.shape[1] != 1 else slice(None)]


_FLOAT16_SCALE = 2.0**-112  # float16's normal range [2^-14, 2^16) moved onto float32's [2^-126, 2^-96)
_TIE_SHIFT = {torch.bfloat16: 16, torch.float16: 19}
_FRESH_BELOW = 1 << 14  # elements: below it a block's buffers are allocated, not taken from the held ones


def _workspace(shape: torch.Size, dtype: torch.dtype) -> tuple:
    """Views ``shape`` of this thread's buffers: x and y in float64, and for float16 and bfloat16
    y in float32 and an int32 scratch."""
    numel = shape.numel()
    narrow = dtype != torch.float32
    if numel < _FRESH_BELOW:  # allocating is cheaper than slicing a held buffer
        return (torch.empty(shape, dtype=torch.float64), torch.empty(shape, dtype=torch.float64),
                torch.empty(shape, dtype=torch.float32) if narrow else None,
                torch.empty(shape, dtype=torch.int32) if narrow else None)
    x64, y64 = (_buffer(name, torch.float64, numel).view(shape) for name in ("x64", "y64"))
    if not narrow:
        return x64, y64, None, None
    return x64, y64, _buffer("y32", torch.float32, numel).view(shape), _buffer("bits", torch.int32, numel).view(shape)


def _rotate_by_blocks(x, cos, sin, layout, rotary_dim):
    """:func:`_rotate_once` on the CPU for float32, float16 and bfloat16, block by block.

    float16 and bfloat16 go through float32; the rows (one head of one token) where a float32
    value lands on a tie of the output dtype are marked as they pass and redone at the end with
    :func:`round_once` (:func:`_redo_rows`). A float32 value v of bfloat16 data is on a tie when
    its low 16 bits are 0x8000; float16 data is scaled by 2^-112 first (exact, folded into the
    tables), which puts float16's ties in the same place for all its range, subnormals included:
    bit 12 set and the 12 below it clear. Shifted left by 16 or 19 bits, such a v is the int32
    minimum."""
    dtype = x.dtype
    out = torch.empty(x.shape, dtype=dtype)
    if rotary_dim < x.shape[-1]:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    scale = _FLOAT16_SCALE if dtype == torch.float16 else 1.0
    tables = (cos * scale, sin * scale) if scale != 1.0 else (cos, sin)  # exact: a power of two
    if layout == "interleaved":
        tables = (torch.complex(*tables),)
    ties = None if dtype == torch.float32 else torch.empty(x.shape[:-1], dtype=torch.int32)
    x_rot, out_rot = x[..., :rotary_dim], out[..., :rotary_dim]
    if x_rot.numel() <= BLOCK_ELEMENTS:  # one block: no slicing (decoding, small batches)
        _rotate_block(x_rot, out_rot, tables, ties, scale)
    else:
        for rows, tokens in _blocks(x.shape[0], x.shape[1], x.shape[2] * rotary_dim):
            _rotate_block(x_rot[rows, tokens], out_rot[rows, tokens],
                          tuple(_table_block(table, rows, tokens) for table in tables),
                          None if ties is None else ties[rows, tokens], scale)
    if ties is not None:
        _redo_rows(out, x, cos, sin, layout, rotary_dim, (ties == -(2**31)).nonzero().unbind(1))
    return out


def _rotate_block(block, target, tables, ties, scale: float) -> None:
    """One block of :func:`_rotate_by_blocks`: ``tables`` (cos, sin) for the half layout or
    (cos + i sin,) for interleaved pairs, of the block's tokens; ``ties`` (int32, one per row)
    receives the marks of the rows to redo, for float16 and bfloat16."""
    if block.numel() == 0:
        return
    x64, y64, y32, bits = _workspace(block.shape, block.dtype)
    x64.copy_(block)
    _products(x64, y64, tables)
    if y32 is None:
        target.copy_(y64)
        return
    y32.copy_(y64)
    torch.bitwise_left_shift(y32.view(torch.int32), _TIE_SHIFT[block.dtype], out=bits)
    torch.amin(bits, dim=-1, out=ties)
    if scale != 1.0:
        torch.mul(y32, 1 / scale, out=target)  # exact in float32, then the one rounding
    else:
        target.copy_(y32)


def _joinable(xs) -> bool:
    """Whether tensors ``[batch, seq, heads, head_dim]`` can share one block: one dtype, batch,
    seq and head_dim."""
    first = xs[0]
    return all(x.dtype == first.dtype and x.shape[:2] == first.shape[:2] and x.shape[3] == first.shape[3]
               for x in xs)


def rotate_small(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
                 rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated together in one block on the CPU, for callers that checked what
    :func:`rotate_tensors` checks: float32, float16 or bfloat16 ``[batch, seq, heads, head_dim]``
    of one dtype, batch and seq, at most :data:`BLOCK_ELEMENTS` rotated coordinates in all, cos and
    sin float64 ``[batch or 1, seq, 1, pairs]`` of at most 2^512, no gradient to record. The
    outputs may be views of one tensor (one token).

    Args:
        q: queries ``[batch, seq, heads_q, head_dim]``.
        k: keys ``[batch, seq, heads_k, head_dim]``.
        cos: float64 cos of the angles.
        sin: float64 sin of the angles.
        layout: ``"half"`` or ``"interleaved"``.
        rotary_dim: the rotated width.
    """
    return _rotate_together((q, k), cos, sin, layout, rotary_dim, True)


def _rotate_together(xs, cos, sin, layout, rotary_dim, views: bool) -> tuple[torch.Tensor, ...]:
    """:func:`_rotate_by_blocks` of small tensors in one block (queries and keys at decoding): their
    heads side by side in one float64 buffer. For float16 and bfloat16 the tie test is one for the
    whole block (:func:`_may_be_on_a_tie`), and where it fires the whole block is rounded by
    :func:`round_once` instead (rare: a value lands on a tie with probability 2^-16)."""
    dtype, (batch, seq) = xs[0].dtype, xs[0].shape[:2]
    width = xs[0].shape[3]
    heads = [x.shape[2] for x in xs]
    x64 = torch.empty((batch, seq, sum(heads), rotary_dim), dtype=torch.float64)
    torch.cat(xs if rotary_dim == width else [x.narrow(3, 0, rotary_dim) for x in xs], dim=2, out=x64)
    y64 = torch.empty_like(x64)
    scale = _FLOAT16_SCALE if dtype == torch.float16 else 1.0
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale  # exact: a power of two
    _products(x64, y64, (cos, sin) if layout == "half" else (torch.complex(cos, sin),))
    y = y64
    if dtype != torch.float32:
        y = y64.to(torch.float32)
        if _may_be_on_a_tie(y, dtype):
            y = round_once(y64.mul_(1 / scale) if scale != 1.0 else y64, dtype)
        elif scale != 1.0:
            y.mul_(1 / scale)  # exact in float32, before the one rounding
    if rotary_dim == width:
        y = y.to(dtype)  # the one rounding, for all tensors at once
        if views and batch * seq == 1:  # each tensor's part is contiguous: views of one result
            return tuple(y.narrow(2, start, h) for start, h in zip(_starts(heads), heads))
    out = []
    for x, start, h in zip(xs, _starts(heads), heads):
        rotated = torch.empty(x.shape, dtype=dtype)
        rotated.narrow(3, 0, rotary_dim).copy_(y.narrow(2, start, h))
        if rotary_dim < width:
            rotated.narrow(3, rotary_dim, width - rotary_dim).copy_(x.narrow(3, rotary_dim, width - rotary_dim))
        out.append(rotated)
    return tuple(out)


def _may_be_on_a_tie(y32: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a float32 value of ``y32`` may lie on a tie of ``dtype``: for bfloat16 one minimum
    over its int16 halves, -2^15 where a low half is 0x8000 (and where a high one is: -0.0 and
    negative float32 subnormals, which only cost the exact rounding); for float16 (values scaled
    by 2^-112) the shifted pattern of :func:`_rotate_by_blocks`."""
    if dtype == torch.bfloat16:
        return int(y32.view(torch.int16).amin()) == -(2**15)
    return int(torch.bitwise_left_shift(y32.view(torch.int32), _TIE_SHIFT[dtype]).amin()) == -(2**31)


def _starts(sizes: list[int]) -> list[int]:
    """The offsets of consecutive parts of ``sizes``."""
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += size
    return starts


def _products(x64, y64, tables) -> None:
    """y64 = the rotation of x64 by ``tables``: (cos, sin) for the half layout (two multiplies and
    two multiply-adds) or (cos + i sin,) for interleaved pairs (one complex multiply)."""
    if len(tables) == 2:
        half = x64.shape[-1] // 2
        x_a, x_b, y_a, y_b = (t.narrow(-1, start, half) for t in (x64, y64) for start in (0, half))
        torch.mul(x_a, tables[0], out=y_a).addcmul_(x_b, tables[1], value=-1)
        torch.mul(x_b, tables[0], out=y_b).addcmul_(x_a, tables[1])
    else:
        pairs = (*x64.shape[:-1], x64.shape[-1] // 2, 2)
        torch.mul(torch.view_as_complex(x64.view(pairs)), tables[0], out=torch.view_as_complex(y64.view(pairs)))


def _redo_rows(out, x, cos, sin, layout, rotary_dim, index) -> None:
    """Rotate rows ``index`` (batch, token and head indices) of x again with :func:`round_once`."""
    if index[0].numel() == 0:
        return
    rows = x[index][..., :rotary_dim].to(torch.float64)
    table = tuple(i if n != 1 else torch.zeros_like(i) for i, n in zip(index, cos.shape[:3]))
    x_a, x_b, _ = pair_views(rows, layout, rotary_dim)
    y_a, y_b = _rotated_pair(x_a, x_b, cos[table], sin[table], False)
    y_a, y_b = round_once(y_a, x.dtype), round_once(y_b, x.dtype)
    out[index + (slice(None, rotary_dim),)] = _join_pairs(y_a, y_b, y_a[..., :0], layout)
