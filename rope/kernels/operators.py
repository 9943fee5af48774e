"""The Triton kernel as PyTorch operators: ``torch.ops.rope.rotary`` and ``torch.ops.rope.rotary_``.

Registered with ``torch.library.custom_op``, a fake (meta) implementation and an autograd
formula, so that ``torch.compile(fullgraph=True)`` traces through them and ``gradcheck`` /
``opcheck`` pass. The backward of y = s R_m x is dx = s R_m^T dy: the same kernel with the sign
of the sines flipped (``conjugate``), written to a new tensor. The incoming gradient is never
overwritten: autograd may hand one gradient tensor to several consumers (the two inputs of an
addition receive the same one), so a backward that rotated it in place would corrupt the
gradient of every other consumer. There is no gradient with respect to ``inv_freq`` (the
angles are exact integer turns, constants to autograd): a ``inv_freq`` that requires grad is
refused while autograd records.

Both take an optional argument ``axes`` for M-RoPE (:mod:`rope.mrope`): pair i then reads
row ``axes[i]`` of ``[3, ...]`` positions; and ``rotated``, ``"first"`` (the default) or
``"last"``: which rotary_dim coordinates of a head are rotated (DeepSeek-V4 rotates the last,
:mod:`rope.layouts`).

``rotary_`` rotates q and k in place, for inference (e.g. a KV cache): autograd cannot record
an in-place rotation through a custom operator, so q and k that require grad are refused.
Importing this module imports Triton; :func:`rope.apply_rotary` does so only when it needs it.

Checks. Users call these operators directly, and the kernel trusts its arguments (a wrong width
or a short ``positions`` reads and writes out of bounds), so both operators check everything
first, with the errors of the package's policy (:mod:`rope._checks`, README "Errors"):

* PyTorch's dispatcher converts the arguments to the schema's types before any of this code
  runs, and refuses what it cannot convert (a list for a tensor, a ``str`` or ``None`` for a
  number or flag, a ``float`` for ``rotary_dim``) with a ``RuntimeError`` naming the argument.
  It converts as Python does: ``rotary_dim=True`` arrives as 1 (then refused as odd) and
  ``scale=True`` as 1.0. The flags are therefore declared ``Scalar``, not ``bool`` (which would
  turn 0, 2 or ``None`` into a bool silently), and checked to be real bools here;
* metadata (dtypes, shapes, devices, widths, the attention factor; for ``rotary_`` the memory
  layout, :func:`_check_in_place`) is checked by :func:`_check_arguments` in the real *and* the
  fake implementation, so that ``torch.compile`` and ``opcheck`` refuse a bad call while
  tracing, with the same message;
* values (finite ``inv_freq``, below :data:`rope.limits.MAX_FREQUENCY` for float32 q and k; axes in
  {0, 1, 2}; for float32 q and k positions below :data:`rope.limits.MAX_POSITION` in magnitude)
  only exist in the real implementation: an eager ``ValueError``, or on CUDA an asynchronous
  device assertion (:func:`rope._checks.assert_values`), also when the operator runs inside a
  compiled graph. Each tensor's values are checked once (:func:`_checked_once`): a check on CUDA
  is several small kernels, and a decode step, which rotates one token per sequence with the same
  frequencies every time, would otherwise launch them all before its one rotary kernel. A tensor
  is remembered by identity (weakly, with its storage address, offset, shape, strides and dtype)
  and PyTorch's version counter, which every in-place write through it or any view of it
  advances: an unchanged tensor is not checked again, a changed one is. Writes that bypass the
  counter (through ``.data``, a NumPy array or DLPack capsule sharing the memory, another
  library's kernel) go unseen; inference tensors (created under ``torch.inference_mode``) have no
  counter and are checked on every call. Where every tensor has been seen, the call launches one
  kernel, its backward one more;
* ``rotary_`` writes what it reads, so it refuses q and k that share an element, a q or k
  holding an element twice (a stride-0, expanded dimension), and a q or k sharing memory with
  the read-only inputs. Views of one buffer that do not overlap, like q and k sliced from a
  packed qkv projection, are fine: the test is exact (:func:`_sum_reaches`), not a comparison
  of address ranges.

Empty q and k (batch, seq or heads 0) launch nothing.
"""

from __future__ import annotations

import torch
from torch.types import Number
from torch.utils.weak import WeakIdKeyDictionary

try:
    from torch.fx.experimental.symbolic_shapes import optimization_hint as _example_value
except ImportError:  # older torch (2.4, the oldest supported) calls it hint_int
    from torch.fx.experimental.symbolic_shapes import hint_int as _example_value

from .. import _checks
from ..layouts import ROTATED
from ..limits import KERNEL_MAX_HEAD_DIM, KERNEL_SCALE_RANGE, MAX_FREQUENCY, MROPE_AXES
from . import triton_rotary

POSITION_AXES = len(MROPE_AXES)
"""M-RoPE position rows: t, h, w."""


def _check_heads(q: torch.Tensor, k: torch.Tensor) -> None:
    """q ``[batch, seq, heads_q, head_dim]`` and k ``[batch, seq, heads_k, head_dim]`` of one
    floating dtype, head_dim at most the kernel's limit."""
    _checks.head_tensors(q=q, k=k)
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    if (k.shape[0], k.shape[1], k.shape[3]) != (q.shape[0], q.shape[1], q.shape[3]):
        raise ValueError(f"k must agree with q in batch, seq and head_dim (heads may differ): "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.shape[3] > KERNEL_MAX_HEAD_DIM:
        raise ValueError(f"q and k: the kernel takes head_dim up to {KERNEL_MAX_HEAD_DIM}, got {q.shape[3]}")


def _check_positions(positions: torch.Tensor, q: torch.Tensor, axes: torch.Tensor | None) -> None:
    """Integer positions ``[seq]`` or ``[batch, seq]``, with ``axes`` ``[3, seq]`` or ``[3, batch, seq]``
    (M-RoPE's ``position_ids``, the name :func:`rope.mrope.apply_mrope` gives them: errors say both)."""
    name = "positions" if axes is None else "positions (M-RoPE position_ids)"
    _checks.integer_tensor(name, positions)
    batch, seq = q.shape[0], q.shape[1]
    shapes = ((seq,), (batch, seq))
    names = ("[seq]", "[batch, seq]")
    if axes is not None:
        shapes = tuple((POSITION_AXES, *shape) for shape in shapes)
        names = tuple(f"[{POSITION_AXES}, {name[1:]}" for name in names)
    if tuple(positions.shape) not in shapes:
        raise ValueError(f"{name} must have shape {names[0]} = {list(shapes[0])} or {names[1]} = "
                         f"{list(shapes[1])}{' (axes given: M-RoPE rows t, h, w)' if axes is not None else ''}, "
                         f"got {list(positions.shape)}")


def _check_width(inv_freq: torch.Tensor, rotary_dim, head_dim) -> None:
    """rotary_dim even in [2, head_dim] and inv_freq float32 ``[rotary_dim / 2]``. rotary_dim is
    an int (a SymInt when traced with dynamic shapes): the schema converted it."""
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be even, >= 2 and <= head_dim = {head_dim}, got {rotary_dim}")
    _checks.float_tensor("inv_freq", inv_freq, dtypes=(torch.float32,), dim=1)
    if inv_freq.shape[0] != rotary_dim // 2:
        raise ValueError(f"inv_freq must have rotary_dim / 2 = {rotary_dim // 2} entries, got {inv_freq.shape[0]}")


def _check_axes(axes: torch.Tensor | None, rotary_dim) -> None:
    """None, or an integer ``[rotary_dim / 2]`` tensor (its values: :func:`_check_values`)."""
    if axes is None:
        return
    _checks.integer_tensor("axes", axes, dim=1)
    if axes.shape[0] != rotary_dim // 2:
        raise ValueError(f"axes must have rotary_dim / 2 = {rotary_dim // 2} entries (one per pair), "
                         f"got {axes.shape[0]}")


def _check_arguments(q, k, positions, inv_freq, rotary_dim, scale, axes, rotated, **flags) -> None:
    """Everything but tensor values, in the real and the fake implementations alike."""
    for name, value in flags.items():
        _checks.flag(name, value)
    _checks.choice("rotated", rotated, ROTATED)
    _check_heads(q, k)
    read_only = dict(positions=positions, inv_freq=inv_freq, **({} if axes is None else {"axes": axes}))
    _checks.same_device("q", q, k=k, **read_only)
    _check_positions(positions, q, axes)
    _check_width(inv_freq, rotary_dim, q.shape[3])
    _check_axes(axes, rotary_dim)
    _checks.number("scale", scale, positive=True, minimum=KERNEL_SCALE_RANGE[0], maximum=KERNEL_SCALE_RANGE[1])


_CHECKED = WeakIdKeyDictionary()
"""Tensor (the base of a view) -> {(rule, address, offset, shape, strides, dtype): version}: the
values :func:`_checked_once` has checked, and the version counter they were checked at."""


def _checked_once(rule: str, x: torch.Tensor, check) -> None:
    """``check()``, a check of ``x``'s values by ``rule``, unless x (the same tensor, or the same
    view of the same base) passed it before and has not been written since (its version counter
    is the one recorded); then nothing runs on the device. A check that raises records nothing."""
    if x.is_inference():  # no version counter to tell a change by
        check()
        return
    seen = _CHECKED.setdefault(x if x._base is None else x._base, {})
    view = (rule, x.data_ptr(), x.storage_offset(), tuple(x.shape), x.stride(), x.dtype)
    if seen.get(view) != x._version:
        check()
        seen[view] = x._version


def _check_values(q: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                  axes: torch.Tensor | None) -> None:
    """Finite frequencies, axes in {0, 1, 2}, and where the kernel takes float32 math (float32 q
    and k) frequencies below :data:`rope.limits.MAX_FREQUENCY` and positions below
    :data:`rope.limits.MAX_POSITION` in magnitude (float-float and float64 math take every int64
    position):
    eager off CUDA, device assertions on it; each once per tensor and version (:func:`_checked_once`)."""
    float32_math = triton_rotary.default_math(q.dtype) == "float32"
    _checked_once("finite", inv_freq, lambda: _checks.finite_frequencies("inv_freq", inv_freq))
    if float32_math and inv_freq.numel():
        _checked_once("below 2^16", inv_freq, lambda: _checks.assert_values(
            "inv_freq", (inv_freq.abs() < MAX_FREQUENCY).all(),
            f"values below 2^16 in magnitude for {q.dtype} q and k (the kernel's float32 math)"))
    if float32_math and positions.numel():
        _checked_once("within 2^31", positions, lambda: triton_rotary.check_positions_in_range(
            "positions", positions, f"values in (-2^31, 2^31) for {q.dtype} q and k (the kernel's float32 math; "
            "float-float and float64 math and the torch path take any int64 position)"))
    if axes is not None:
        _checked_once("axes", axes, lambda: _checks.assert_values(
            "axes", ((axes >= 0) & (axes < POSITION_AXES)).all(),
            "values in {0, 1, 2} (the rows t, h, w of positions)"))


def _sum_reaches(lo: int, hi: int, terms: list[tuple[int, int, int]]) -> bool:
    """Whether integers v_t in [low_t, high_t] exist with lo <= sum_t c_t v_t <= hi, for
    ``terms`` (c_t, low_t, high_t) with c_t > 0 in decreasing order.

    Depth first from the largest c_t, trying only the v_t from which the remaining terms (whose
    sum lies in [sum c low, sum c high]) can still land in [lo, hi]: exact. For the strides of
    real layouts, where each stride exceeds the span of the smaller ones, that is a few values per
    term; contrived strides (as_strided) may take more, never a wrong answer."""
    if not terms:
        return lo <= 0 <= hi
    (c, low, high), rest = terms[0], terms[1:]
    rest_min = sum(c_r * low_r for c_r, low_r, _ in rest)
    rest_max = sum(c_r * high_r for c_r, _, high_r in rest)
    first = max(low, -((rest_max - lo) // c))  # ceil((lo - rest_max) / c)
    last = min(high, (hi - rest_min) // c)
    return any(_sum_reaches(lo - c * v, hi - c * v, rest) for v in range(first, last + 1))


def _terms(*terms: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """Terms (c, low, high) for :func:`_sum_reaches`: c v with c < 0 as (-c)(-v), equal c merged
    (v + w over two intervals is exactly the interval of the sums), c = 0 dropped, largest c first."""
    merged: dict[int, tuple[int, int]] = {}
    for c, low, high in terms:
        if c < 0:
            c, low, high = -c, -high, -low
        if c:
            low_0, high_0 = merged.get(c, (0, 0))
            merged[c] = (low_0 + low, high_0 + high)
    return [(c, low, high) for c, (low, high) in sorted(merged.items(), reverse=True)]


def _concrete(n) -> int:
    """n, or for a symbolic int (traced with dynamic shapes) the value it has in the example
    inputs, without a guard: the real implementation repeats the overlap checks on every call."""
    return n if isinstance(n, int) else _example_value(n)


def _rows(x: torch.Tensor) -> list[tuple[int, int]]:
    """(stride, size) of x's dimensions but the last, for sizes above 1: x is the rows
    ``[storage_offset + sum_d i_d stride_d, ... + head_dim)`` of its storage (in elements)."""
    dims = ((_concrete(stride), _concrete(size)) for stride, size in zip(x.stride()[:-1], x.shape[:-1]))
    return [(stride, size) for stride, size in dims if size > 1]


def _repeats_an_element(x: torch.Tensor) -> bool:
    """Whether two index tuples i != j of x (last dimension contiguous) address one element.

    With c = i - j, that is |sum_d c_d stride_d| < head_dim (two rows of head_dim elements meet)
    for some c != 0, |c_d| < size_d; by the symmetry c -> -c the first non-zero c_d is positive."""
    if x.is_contiguous():
        return False
    rows, width = _rows(x), _concrete(x.shape[-1])
    return any(
        _sum_reaches(1 - width, width - 1,
                     _terms((stride, 1, size - 1), *((s, 1 - n, n - 1) for s, n in rows[d + 1:])))
        for d, (stride, size) in enumerate(rows)
    )


def _share_an_element(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether q and k (one dtype, last dimensions contiguous, of one length w) share an element:
    a row of q at o_q + sum i_d a_d and one of k at o_k + sum j_e b_e (elements of the
    storage) meet when their starts differ by less than w, i.e. sum i a - sum j b lies in
    [o_k - o_q - w + 1, o_k - o_q + w - 1]."""
    if _concrete(q.numel()) == 0 or _concrete(k.numel()) == 0 or not torch._C._is_alias_of(q, k):
        return False
    width, shift = _concrete(q.shape[-1]), _concrete(k.storage_offset()) - _concrete(q.storage_offset())
    terms = _terms(*((a, 0, n - 1) for a, n in _rows(q)), *((-b, 0, n - 1) for b, n in _rows(k)))
    return _sum_reaches(shift - width + 1, shift + width - 1, terms)


def _check_in_place(q, k, positions, inv_freq, axes) -> None:
    """What rotating q and k in place needs: contiguous last dimensions, no element written twice
    or by both, nothing written that is read as positions, frequencies or axes, and no tensor
    that requires grad (autograd cannot record the rotation: the gradient would silently skip it)."""
    for name, x in (("q", q), ("k", k)):
        _refuse_grad(name, x, "rotary_ rotates in place, which autograd cannot record through this operator; "
                     "use torch.ops.rope.rotary (differentiable), or pass a detached tensor")
        if x.stride(-1) != 1:
            raise ValueError(f"in-place rotation needs {name} with a contiguous last dimension (stride 1), "
                             f"got strides {tuple(x.stride())}")
        if _repeats_an_element(x):
            raise ValueError(f"{name} holds some elements more than once (a stride-0 or expanded dimension, "
                             f"strides {tuple(x.stride())}): it cannot be rotated in place")
    if _share_an_element(q, k):
        raise ValueError("q and k overlap in memory (one buffer passed as both, or overlapping views): "
                         "they cannot be rotated in place")
    read_only = dict(positions=positions, inv_freq=inv_freq, **({} if axes is None else {"axes": axes}))
    for name, x in (("q", q), ("k", k)):
        for other, t in read_only.items():
            if x.numel() and t.numel() and torch._C._is_alias_of(x, t):
                raise ValueError(f"{name} shares memory with {other}: rotating it in place would change {other}")


def _launch(q, k, q_out, k_out, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, axes,
            rotated) -> None:
    """The kernel, where there is something to rotate."""
    if q.numel() or k.numel():
        triton_rotary.launch(
            q, k, q_out, k_out, positions, inv_freq,
            interleaved=interleaved, rotary_dim=rotary_dim, scale=scale, conjugate=conjugate, axes=axes,
            rotated=rotated,
        )


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("rope::rotary", mutates_args=())
def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    interleaved: Number,
    rotary_dim: int,
    scale: float,
    conjugate: Number,
    axes: torch.Tensor | None = None,
    rotated: str = "first",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s R q, s R k) (or with R^T when ``conjugate``), new contiguous tensors; ``axes`` makes it
    M-RoPE (positions ``[3, ...]``, see :func:`rope.kernels.triton_rotary.launch`). q and k may
    overlap (they are only read).

    Args:
        q: queries ``[batch, seq, heads_q, head_dim]``, float16, bfloat16, float32 or float64.
        k: keys ``[batch, seq, heads_k, head_dim]``, of q's dtype.
        positions: integer ``[seq]`` or ``[batch, seq]``; with ``axes``, ``[3, seq]`` or ``[3, batch, seq]``.
        inv_freq: the rotary_dim/2 frequencies theta_i, float32.
        interleaved: pairs (2i, 2i + 1) if True, (i, i + rotary_dim/2) if False (a bool).
        rotary_dim: the rotated width, even, in [2, head_dim]; the rest passes through.
        scale: the attention factor s, in :data:`rope.limits.KERNEL_SCALE_RANGE`.
        conjugate: rotate by R^T instead (a bool).
        axes: the M-RoPE axis of each pair, integer ``[rotary_dim / 2]`` with values 0, 1, 2, or ``None``.
        rotated: ``"first"`` or ``"last"``: which rotary_dim coordinates of a head are rotated.

    Returns:
        ``(q_out, k_out)``, of q's and k's dtype and shape.

    Raises:
        TypeError, ValueError: for any bad argument, naming it (module docstring, "Checks").
    """
    _check_arguments(q, k, positions, inv_freq, rotary_dim, scale, axes, rotated,
                     interleaved=interleaved, conjugate=conjugate)
    _check_values(q, positions, inv_freq, axes)
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    q_out, k_out = q.new_empty(q.shape), k.new_empty(k.shape)
    _launch(q, k, q_out, k_out, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, axes, rotated)
    return q_out, k_out


@rotary.register_fake
def _(q, k, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, axes=None, rotated="first"):
    _check_arguments(q, k, positions, inv_freq, rotary_dim, scale, axes, rotated,
                     interleaved=interleaved, conjugate=conjugate)
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _setup_context(ctx, inputs, output):
    """Runs only while autograd records (some input requires grad): refuses a ``inv_freq`` that
    requires grad, whose gradient would otherwise be silently missing."""
    _, _, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, axes, rotated = inputs  # defaults filled in
    _refuse_grad("inv_freq", inv_freq, "the rotation has no gradient with respect to the frequencies "
                 "(exact integer turns); pass inv_freq.detach() if none is needed")
    ctx.save_for_backward(positions, inv_freq, axes)
    ctx.options = dict(interleaved=interleaved, rotary_dim=rotary_dim, scale=scale, conjugate=not conjugate,
                       rotated=rotated)


def _refuse_grad(name: str, x: torch.Tensor, why: str) -> None:
    if x.requires_grad:
        raise ValueError(f"{name} requires grad: {why}")


def _backward(ctx, grad_q, grad_k):
    positions, inv_freq, axes = ctx.saved_tensors
    grad_q, grad_k = rotary(q=grad_q, k=grad_k, positions=positions, inv_freq=inv_freq, axes=axes, **ctx.options)
    return grad_q, grad_k, None, None, None, None, None, None, None, None


rotary.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("rope::rotary_", mutates_args=("q", "k"))
def rotary_(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    interleaved: Number,
    rotary_dim: int,
    scale: float,
    conjugate: Number,
    axes: torch.Tensor | None = None,
    rotated: str = "first",
) -> None:
    """q <- s R q and k <- s R k in place; the last dimension of q and k must be contiguous, and
    q and k must not overlap (separate views of one buffer, e.g. of a packed qkv, are fine).
    ``axes`` as in :func:`rotary` (M-RoPE).

    Args:
        q: queries, rotated in place, ``[batch, seq, heads_q, head_dim]``, float16, bfloat16, float32 or float64.
        k: keys, rotated in place, ``[batch, seq, heads_k, head_dim]``, of q's dtype.
        positions: integer ``[seq]`` or ``[batch, seq]``; with ``axes``, ``[3, seq]`` or ``[3, batch, seq]``.
        inv_freq: the rotary_dim/2 frequencies theta_i, float32.
        interleaved: pairs (2i, 2i + 1) if True, (i, i + rotary_dim/2) if False (a bool).
        rotary_dim: the rotated width, even, in [2, head_dim]; the rest passes through.
        scale: the attention factor s, in :data:`rope.limits.KERNEL_SCALE_RANGE`.
        conjugate: rotate by R^T instead (a bool).
        axes: the M-RoPE axis of each pair, integer ``[rotary_dim / 2]`` with values 0, 1, 2, or ``None``.
        rotated: ``"first"`` or ``"last"``: which rotary_dim coordinates of a head are rotated.

    Raises:
        TypeError, ValueError: for any bad argument, naming it (module docstring, "Checks").
    """
    _check_arguments(q, k, positions, inv_freq, rotary_dim, scale, axes, rotated,
                     interleaved=interleaved, conjugate=conjugate)
    _check_in_place(q, k, positions, inv_freq, axes)
    _check_values(q, positions, inv_freq, axes)
    _launch(q, k, q, k, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, axes, rotated)


@rotary_.register_fake
def _(q, k, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, axes=None, rotated="first"):
    _check_arguments(q, k, positions, inv_freq, rotary_dim, scale, axes, rotated,
                     interleaved=interleaved, conjugate=conjugate)
    _check_in_place(q, k, positions, inv_freq, axes)
