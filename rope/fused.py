"""The Triton kernel as PyTorch operators: ``torch.ops.rope.rotary`` and ``torch.ops.rope.rotary_``.

Registered with ``torch.library.custom_op``, a fake (meta) implementation and an autograd
formula, so that ``torch.compile(fullgraph=True)`` traces through them and ``gradcheck`` /
``opcheck`` pass. The backward of y = s R_m x is dx = s R_m^T dy: the same kernel with the sign
of the sines flipped (``conjugate``), written to a new tensor; the incoming gradient is left
alone unless ``grad_in_place`` asks for it to be overwritten (one buffer less per tensor, as
flash-attention's ``inplace`` backward does), which happens only where the two gradients are
contiguous and separate: an expanded or strided gradient (e.g. from ``sum()``), or one buffer
passed as both, still gets new tensors.

Both take an optional last argument ``axes`` for M-RoPE (:mod:`rope.mrope`): pair i then reads
row ``axes[i]`` of ``[3, ...]`` positions.

``rotary_`` rotates q and k in place (no autograd: use it for inference, e.g. on a KV cache).
Importing this module imports Triton; :func:`rope.apply_rotary` does so only when it needs it.
"""

from __future__ import annotations

import torch

from . import triton_rotary


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("rope::rotary", mutates_args=())
def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    interleaved: bool,
    rotary_dim: int,
    scale: float,
    conjugate: bool,
    grad_in_place: bool = False,
    axes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s R q, s R k) (or with R^T when ``conjugate``), new contiguous tensors. ``grad_in_place``
    only changes the backward (see the module docstring); ``axes`` makes it M-RoPE (positions
    ``[3, ...]``, see :func:`rope.triton_rotary.launch`)."""
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    q_out, k_out = q.new_empty(q.shape), k.new_empty(k.shape)
    triton_rotary.launch(
        q, k, q_out, k_out, positions, inv_freq,
        interleaved=interleaved, rotary_dim=rotary_dim, scale=scale, conjugate=conjugate, axes=axes,
    )
    return q_out, k_out


@rotary.register_fake
def _(q, k, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, grad_in_place=False, axes=None):
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _setup_context(ctx, inputs, output):
    _, _, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, grad_in_place, axes = inputs  # defaults in
    ctx.save_for_backward(positions, inv_freq, axes)
    ctx.options = (interleaved, rotary_dim, scale, not conjugate)
    ctx.grad_in_place = grad_in_place


def _rotatable_in_place(grad_q: torch.Tensor, grad_k: torch.Tensor) -> bool:
    """Contiguous (no element written twice) and not sharing storage with each other (one launch
    rotates both, so a shared buffer would be read after another program wrote it)."""
    return (grad_q.is_contiguous() and grad_k.is_contiguous()
            and not torch._C._is_alias_of(grad_q, grad_k))


def _backward(ctx, grad_q, grad_k):
    positions, inv_freq, axes = ctx.saved_tensors
    if ctx.grad_in_place and _rotatable_in_place(grad_q, grad_k):
        rotary_(grad_q, grad_k, positions, inv_freq, *ctx.options, axes)
    else:
        grad_q, grad_k = rotary(grad_q, grad_k, positions, inv_freq, *ctx.options, False, axes)
    return grad_q, grad_k, None, None, None, None, None, None, None, None


rotary.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("rope::rotary_", mutates_args=("q", "k"))
def rotary_(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    interleaved: bool,
    rotary_dim: int,
    scale: float,
    conjugate: bool,
    axes: torch.Tensor | None = None,
) -> None:
    """q <- s R q and k <- s R k in place; the last dimension of q and k must be contiguous.
    ``axes`` as in :func:`rotary` (M-RoPE)."""
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("in-place rotation needs q and k with a contiguous last dimension")
    triton_rotary.launch(
        q, k, q, k, positions, inv_freq,
        interleaved=interleaved, rotary_dim=rotary_dim, scale=scale, conjugate=conjugate, axes=axes,
    )


@rotary_.register_fake
def _(q, k, positions, inv_freq, interleaved, rotary_dim, scale, conjugate, axes=None):
    return None
