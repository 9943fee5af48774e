"""Applying the rotation: y = R_m x for every token and head, the production torch path.

For pair i = (x_a, x_b) of a head at position m, with angle m * theta_i (RoFormer eq. 34):

    y_a = x_a cos(m theta_i) - x_b sin(m theta_i)
    y_b = x_b cos(m theta_i) + x_a sin(m theta_i)

multiplied by ``attention_factor``; coordinates past ``rotary_dim`` pass through unchanged.
The angle m * theta_i, its cos and sin, and the products are computed in float64 from the
integer position and the float32 theta_i, and the result is rounded once to the input dtype.
At position 2^20 the usual recipe (float32 product, float32 cos) is off by about 0.06 in cos;
here the product is float64: exact for float32 theta_i below m = 2^29, and off by at most
2^-53 |m theta_i| beyond (about 1e-7 rad at m = 2^31, still far below a bfloat16 or float16 ulp).

On CUDA the fused Triton kernel (:mod:`rope.fused`) does the same in one launch, with float32
math, exactly reduced angles (:mod:`rope.angles`) and one rounding of the output.
"""

from __future__ import annotations

import importlib.util

import torch

from .checks import head_tensors, integer_tensor, tensor
from .layouts import check_layout, pair_indices

KERNEL_MAX_HEAD_DIM = 1024
BACKENDS = ("auto", "torch", "triton")
HAS_TRITON = importlib.util.find_spec("triton") is not None


def check_inputs(q, k, positions, inv_freq, rotary_dim):
    """Validate apply_rotary's tensors (shapes, dtypes, devices) and return the rotary width."""
    head_tensors(q=q, k=k)
    tensor("positions", positions)
    tensor("inv_freq", inv_freq)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, seq and head_dim (heads may differ)"
        )
    for name, t in (("k", k), ("positions", positions), ("inv_freq", inv_freq)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    integer_tensor("positions", positions)
    batch, seq = q.shape[0], q.shape[1]
    if tuple(positions.shape) not in ((seq,), (batch, seq)):
        raise ValueError(f"positions must have shape [seq] = [{seq}] or [batch, seq] = [{batch}, {seq}], "
                         f"got {tuple(positions.shape)}")
    if inv_freq.dim() != 1 or not inv_freq.dtype.is_floating_point:
        raise ValueError(f"inv_freq must be a 1-D float tensor, got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    head_dim = q.shape[3]
    if rotary_dim is None:
        rotary_dim = 2 * inv_freq.shape[0]
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even int, got {rotary_dim!r}")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds head_dim {head_dim}")
    if inv_freq.shape[0] != rotary_dim // 2:
        raise ValueError(f"inv_freq has {inv_freq.shape[0]} entries, expected rotary_dim/2 = {rotary_dim // 2}")
    return rotary_dim


def use_kernel(q: torch.Tensor, backend: str) -> bool:
    """Whether ``backend`` ("auto", "torch" or "triton") runs the fused kernel on q's device;
    raises if "triton" was asked for and cannot run."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return False
    if backend == "auto":
        return q.is_cuda and q.shape[-1] <= KERNEL_MAX_HEAD_DIM and HAS_TRITON
    if not HAS_TRITON:
        raise ValueError("backend='triton' needs the triton package (pip install triton)")
    if q.shape[-1] > KERNEL_MAX_HEAD_DIM:
        raise ValueError(f"backend='triton' takes head_dim up to {KERNEL_MAX_HEAD_DIM}, got {q.shape[-1]}")
    return True


def rotation_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """m * theta_i in float64, shape ``positions.shape + (rotary_dim/2,)``."""
    return positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 values to ``dtype`` once, to nearest even.

    torch converts float64 to float16/bfloat16 through float32, which rounds twice and can land
    one ulp off. Rounding to float32 *to odd* first (truncate, then set the last bit if anything
    was dropped) makes the second rounding exact, because float32 carries more than two extra
    bits (Boldo and Melquiond, "When double rounding is odd", 2005).
    """
    if dtype not in (torch.float16, torch.bfloat16):
        return x.to(dtype)
    nearest = x.to(torch.float32)
    inexact = nearest.to(torch.float64) != x
    rounded_up = nearest.abs().to(torch.float64) > x.abs()
    toward_zero = torch.where(rounded_up, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)
    odd = (toward_zero.view(torch.int32) | 1).view(torch.float32)
    return torch.where(inexact & x.isfinite(), odd, nearest).to(dtype)


def rotate_pairs(x, cos, sin, layout, rotary_dim):
    """(x_a, x_b) -> (x_a cos - x_b sin, x_b cos + x_a sin) on the layout's pairs, float64, rounded once."""
    a, b = (idx.to(x.device) for idx in pair_indices(rotary_dim, layout))
    x64 = x.to(torch.float64)
    xa, xb = x64[..., a], x64[..., b]
    out = x64.clone()
    out[..., a] = xa * cos - xb * sin
    out[..., b] = xb * cos + xa * sin
    return round_once(out, x.dtype)


def check_factor_and_grad(attention_factor, grad_in_place) -> None:
    """Raise unless ``attention_factor`` is a positive number and ``grad_in_place`` a bool."""
    if isinstance(attention_factor, bool) or not isinstance(attention_factor, (int, float)) or attention_factor <= 0:
        raise ValueError(f"attention_factor must be a positive number, got {attention_factor!r}")
    if not isinstance(grad_in_place, bool):
        raise TypeError(f"grad_in_place must be a bool, got {type(grad_in_place).__name__}")


def rotate_by_angles(q, k, angles, *, layout, rotary_dim, attention_factor=1.0, conjugate=False):
    """q and k rotated by float64 pair angles ``[seq, pairs]`` (shared by the batch) or ``[batch,
    seq, pairs]``: cos and sin times the attention factor (sin negated for the conjugate),
    :func:`rotate_pairs` on both."""
    angles = (angles[None] if angles.dim() == 2 else angles)[:, :, None, :]  # [batch or 1, seq, 1, pairs]
    cos = torch.cos(angles) * attention_factor
    sin = torch.sin(angles) * attention_factor
    if conjugate:
        sin = -sin
    return rotate_pairs(q, cos, sin, layout, rotary_dim), rotate_pairs(k, cos, sin, layout, rotary_dim)


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    attention_factor: float = 1.0,
    conjugate: bool = False,
    backend: str = "auto",
    grad_in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by their positions.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]``; heads_k may differ from heads_q (GQA, MQA).
        positions: integer positions, ``[seq]`` (shared by the batch) or ``[batch, seq]``
            (offsets, packed sequences: any values).
        inv_freq: the rotary_dim/2 frequencies theta_i, e.g. from :func:`rope.inv_freq`.
        layout: ``"half"`` (pairs (i, i + d/2)) or ``"interleaved"`` (pairs (2i, 2i + 1)).
        rotary_dim: rotated width d (default ``2 * len(inv_freq)``); the rest of the head passes through.
        attention_factor: multiplies cos and sin (YaRN, LongRoPE), as transformers does.
        conjugate: rotate by -m * theta_i, the transpose R_m^T (the inverse when attention_factor is 1).
        backend: ``"torch"`` (float64 math, any device), ``"triton"`` (the fused kernel, float32
            math, float64 for float64 inputs; differentiable), or ``"auto"``: the kernel for CUDA
            tensors when Triton is installed, torch otherwise.
        grad_in_place: on the kernel path, let the backward overwrite the incoming gradients
            with the input gradients when both are contiguous and separate buffers (saves a q-
            and a k-sized buffer; the tensors autograd passes in are destroyed). The torch
            path's backward is autograd's own and ignores it.

    Returns:
        ``(q_out, k_out)`` in the dtype of q and k, each value rounded once (from float64 on the
        torch path, from float32 in the kernel).
    """
    rotary_dim = check_inputs(q, k, positions, inv_freq, rotary_dim)
    check_layout(layout)
    check_factor_and_grad(attention_factor, grad_in_place)
    if use_kernel(q, backend):
        from .fused import rotary

        return rotary(q, k, positions, inv_freq, layout == "interleaved", rotary_dim, float(attention_factor),
                      conjugate, grad_in_place)
    return rotate_by_angles(q, k, rotation_angles(positions, inv_freq), layout=layout, rotary_dim=rotary_dim,
                            attention_factor=attention_factor, conjugate=conjugate)
