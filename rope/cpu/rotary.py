"""The CPU kernel's launchers: :func:`rotate`, the one-pass form of :mod:`rope.rotation`'s rotation,
and :func:`rotate_few`, a decoding step's angles and rotation of q and k in one call.

Shapes::

    x         [batch, seq, heads, head_dim]      float32, float16 or bfloat16, any strides
    cos, sin  [batch or 1, seq or 1, heads or 1, rotary_dim / 2]   float64
    out       [batch, seq, heads, head_dim]      x's dtype, contiguous

For each pair (x_a, x_b) of a row and its table entries c, s: (x_a c - x_b s, x_b c + x_a s),
each product and the sum rounded to float64, the result rounded once to x's dtype (``rotary.c``
proves the rounding). The rotated block is the first ``rotary_dim`` coordinates of each row, or
with ``rotated="last"`` (DeepSeek-V4, :mod:`rope.layouts`) the last; the others are copied. Bit
for bit the numbers of the torch operations in :mod:`rope.rotation`. :func:`rotate_few` computes
its tables itself: cos and sin of the float64 products m theta_i, exact for ``|m|`` < 2^29, as
:mod:`rope.angles` does there.
"""

from __future__ import annotations

import ctypes

import torch

from ..layouts import LAYOUTS, ROTATED, rotary_start
from . import build

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
LARGEST_POSITION = (1 << 29) - 1
"""The largest ``|m|`` of :func:`rotate_few`: m theta_i is an exact float64 product below 2^29."""
THREADED_FROM = 1 << 16
"""Rotated coordinates from which a call uses torch's thread count (starting a thread costs
tens of microseconds: a decoding step runs on the calling thread)."""


def available() -> bool:
    """Whether the kernel is built and loaded (:func:`rope.cpu.build.library`)."""
    return build.library() is not None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
           rotated: str = "first") -> torch.Tensor:
    """x rotated by cos and sin on the layout's pairs (shapes above), for callers that checked
    them: x on the CPU in a dtype of :data:`DTYPE_CODES`, cos and sin float64 on the CPU
    broadcasting as above, ``rotary_dim`` even and at most head_dim, and :func:`available`.

    Args:
        x: the tensor to rotate.
        cos: cos of each pair's angle (any factor folded in).
        sin: sin of each pair's angle.
        layout: ``"half"`` or ``"interleaved"`` (:mod:`rope.layouts`).
        rotary_dim: the rotated width; the other coordinates are copied.
        rotated: ``"first"`` or ``"last"``: which rotary_dim coordinates of a row are rotated.

    Returns:
        The rotated x, contiguous, in x's dtype.

    Raises:
        TypeError, ValueError: for arguments outside the above, naming them; RuntimeError where
            the kernel is not :func:`available`.
    """
    _check(x, cos, sin, layout, rotary_dim, rotated)
    out = torch.empty(x.shape, dtype=x.dtype)
    if out.numel() == 0:
        return out
    batch, seq, heads, _ = x.shape
    pairs = rotary_dim // 2
    cos, sin = (table.expand(batch, seq, heads, pairs) for table in (cos, sin))
    if cos.stride(3) != 1 or sin.stride() != cos.stride():  # the kernel reads pairs contiguously
        cos, sin = cos.contiguous(), sin.contiguous()
    rows = batch * seq * heads
    threads = torch.get_num_threads() if rows * rotary_dim >= THREADED_FROM else 1
    build.library().rope_rotate(
        x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(), (ctypes.c_int64 * 4)(*x.shape),
        (ctypes.c_int64 * 4)(*x.stride()), (ctypes.c_int64 * 3)(*cos.stride()[:3]), rotary_dim,
        rotary_start(x.shape[3], rotary_dim, rotated), DTYPE_CODES[x.dtype], layout == "interleaved", threads)
    return out


def _check_head_tensor(name: str, x) -> None:
    """A float32, float16 or bfloat16 CPU tensor ``[batch, seq, heads, head_dim]``."""
    if not isinstance(x, torch.Tensor) or x.dtype not in DTYPE_CODES or x.device.type != "cpu" or x.dim() != 4:
        raise TypeError(f"{name} must be a float32, float16 or bfloat16 CPU tensor [batch, seq, heads, head_dim], got "
                        + (f"{x.dtype} {x.device.type} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor)
                           else type(x).__name__))


def _check_rotation(layout, rotary_dim, rotated, head_dim: int) -> None:
    """The layout, an even rotary_dim of at most head_dim, and which coordinates turn."""
    if layout not in LAYOUTS:
        raise ValueError(f'layout must be "half" or "interleaved", got {layout!r}')
    if not isinstance(rotated, str) or rotated not in ROTATED:
        raise ValueError(f'rotated must be "first" or "last", got {rotated!r}')
    if type(rotary_dim) is not int or rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be an even int in [2, head_dim = {head_dim}], got {rotary_dim!r}")


def _check(x, cos, sin, layout, rotary_dim, rotated) -> None:
    """What the kernel reads must be what :func:`rotate` documents (it reads raw memory)."""
    _check_head_tensor("x", x)
    _check_rotation(layout, rotary_dim, rotated, x.shape[3])
    wanted = (*x.shape[:3], rotary_dim // 2)
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, torch.Tensor) or table.dtype != torch.float64 or table.device.type != "cpu":
            raise TypeError(f"{name} must be a float64 CPU tensor")
        if table.dim() != 4 or any(n not in (1, w) for n, w in zip(table.shape, wanted)) or table.shape[3] != wanted[3]:
            raise ValueError(f"{name} must broadcast as [batch or 1, seq or 1, heads or 1, rotary_dim / 2] = "
                             f"{list(wanted)}, got {tuple(table.shape)}")
    if not available():
        raise RuntimeError(f"the CPU kernel is not available: {build.unavailable_reason()}")


def rotate_few(q: torch.Tensor, k: torch.Tensor, positions: list[int], position_rows: int, inv_freq: torch.Tensor,
               layout: str, rotary_dim: int, cos_factor: float, sin_factor: float,
               rotated: str = "first") -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated by the angles m theta_i of a few tokens in one call: pair i of a token at
    position m turns by ``(cos_factor cos(m theta_i), sin_factor sin(m theta_i))`` (a negated
    sin_factor gives the transposed rotation); differentiable (the gradient is the transposed
    rotation, computed the same way). For callers that checked the arguments as
    :func:`rope.apply.check_inputs` does, and these: :func:`available`; q and k on the CPU in one
    dtype of :data:`DTYPE_CODES`; ``positions`` the ``position_rows * seq`` positions (rows 1 or
    batch), each of ``|m|`` < 2^29; ``inv_freq`` float32 ``[rotary_dim / 2]``.

    Args:
        q: queries ``[batch, seq, heads_q, head_dim]``.
        k: keys ``[batch, seq, heads_k, head_dim]``.
        positions: the positions, row after row, as Python ints.
        position_rows: 1 (positions shared by the batch) or batch.
        inv_freq: the frequencies theta_i.
        layout: ``"half"`` or ``"interleaved"``.
        rotary_dim: the rotated width.
        cos_factor: multiplies every cos (the attention factor).
        sin_factor: multiplies every sin (the attention factor, negated for the conjugate).
        rotated: ``"first"`` or ``"last"``: which rotary_dim coordinates of a row are rotated.

    Returns:
        ``(q_out, k_out)``, contiguous, in q's dtype.

    Raises:
        TypeError, ValueError: for arguments outside the above, naming them (a value of inv_freq
            that is not finite included); RuntimeError where the kernel is not :func:`available`.
    """
    _check_few(q, k, positions, position_rows, inv_freq, layout, rotary_dim, cos_factor, sin_factor, rotated)
    angles = (positions, position_rows, inv_freq.contiguous(), layout, rotary_dim, rotated)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return _FewTokens.apply(q, k, angles, cos_factor, sin_factor)
    return _rotate_few(q, k, angles, cos_factor, sin_factor)


def _rotate_few(q, k, angles, cos_factor: float, sin_factor: float):
    positions, position_rows, inv_freq, layout, rotary_dim, rotated = angles
    q_out, k_out = torch.empty(q.shape, dtype=q.dtype), torch.empty(k.shape, dtype=k.dtype)
    if q_out.numel() + k_out.numel() == 0:
        return q_out, k_out
    shape = ctypes.c_int64 * 4
    status = build.library().rope_rotate_few(
        (ctypes.c_int64 * len(positions))(*positions), position_rows, inv_freq.data_ptr(), cos_factor, sin_factor,
        q.data_ptr(), q_out.data_ptr(), shape(*q.shape), shape(*q.stride()),
        k.data_ptr(), k_out.data_ptr(), shape(*k.shape), shape(*k.stride()),
        rotary_dim, rotary_start(q.shape[3], rotary_dim, rotated), DTYPE_CODES[q.dtype], layout == "interleaved")
    if status == 1:
        raise ValueError("inv_freq must hold finite values (no NaN or inf)")
    if status:
        raise MemoryError("the CPU kernel could not allocate the tables of a decoding step")
    return q_out, k_out


class _FewTokens(torch.autograd.Function):
    """:func:`rotate_few` under autograd: dq, dk = the transposed rotation of the output gradients."""

    @staticmethod
    def forward(ctx, q, k, angles, cos_factor, sin_factor):
        ctx.options = (angles, cos_factor, sin_factor)
        ctx.set_materialize_grads(False)  # an output unused by the loss gives its input no gradient
        return _rotate_few(q, k, angles, cos_factor, sin_factor)

    @staticmethod
    def backward(ctx, dq, dk):
        angles, cos_factor, sin_factor = ctx.options
        if dq is None and dk is None:
            return (None,) * 5
        given_q = dq if dq is not None else torch.zeros((*dk.shape[:2], 0, dk.shape[3]), dtype=dk.dtype)
        given_k = dk if dk is not None else torch.zeros((*dq.shape[:2], 0, dq.shape[3]), dtype=dq.dtype)
        grad_q, grad_k = _rotate_few(given_q, given_k, angles, cos_factor, -sin_factor)
        return (grad_q if dq is not None else None, grad_k if dk is not None else None, None, None, None)


def _check_few(q, k, positions, position_rows, inv_freq, layout, rotary_dim, cos_factor, sin_factor,
               rotated) -> None:
    """What :func:`rotate_few`'s kernel reads must be what it documents (it reads raw memory)."""
    _check_head_tensor("q", q)
    _check_head_tensor("k", k)
    if q.dtype != k.dtype or (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(f"q {tuple(q.shape)} {q.dtype} and k {tuple(k.shape)} {k.dtype} must agree in dtype, "
                         "batch, seq and head_dim")
    _check_rotation(layout, rotary_dim, rotated, q.shape[3])
    if (not isinstance(inv_freq, torch.Tensor) or inv_freq.dtype != torch.float32 or inv_freq.device.type != "cpu"
            or tuple(inv_freq.shape) != (rotary_dim // 2,)):
        raise TypeError(f"inv_freq must be a float32 CPU tensor [rotary_dim / 2] = [{rotary_dim // 2}]")
    if position_rows not in (1, q.shape[0]) or type(position_rows) is not int:
        raise ValueError(f"position_rows must be 1 or batch = {q.shape[0]}, got {position_rows!r}")
    if (not isinstance(positions, list) or len(positions) != position_rows * q.shape[1]
            or not all(type(m) is int and -LARGEST_POSITION <= m <= LARGEST_POSITION for m in positions)):
        raise ValueError(f"positions must be a list of position_rows * seq = {position_rows * q.shape[1]} ints "
                         f"of magnitude below 2^29")
    for name, factor in (("cos_factor", cos_factor), ("sin_factor", sin_factor)):
        if type(factor) is not float or not abs(factor) <= 2.0**512:
            raise ValueError(f"{name} must be a float of magnitude at most 2^512, got {factor!r}")
    if not available():
        raise RuntimeError(f"the CPU kernel is not available: {build.unavailable_reason()}")
