"""Float64 reference forms of RoPE, for the book and the tests.

Three equivalent ways to write y = R_m x (RoFormer, Su et al. 2021):

* matrix form (eq. 15): R_m is block diagonal with 2x2 blocks
  [[cos m theta_i, -sin m theta_i], [sin m theta_i, cos m theta_i]] acting on pair i;
* complex form (eq. 12-13): pair i read as z_i = x_a + i x_b is multiplied by e^{i m theta_i};
* elementwise form (eq. 34): y = x * cos_vec + x_rot * sin_vec, where x_rot sends pair
  (x_a, x_b) to (-x_b, x_a) and cos_vec, sin_vec repeat cos/sin(m theta_i) on both members of pair i.

Which coordinates form pair i is the layout (:mod:`rope.layouts`). The angles of float32
frequencies and integer positions are reduced modulo 2 pi exactly; any other angle is the float64
product of the position and the frequency, each taken at its exact value: real (fractional)
positions are honoured by all three forms, and frequencies given as Python numbers or lists are
float64 (a tensor keeps its dtype). These are slow and exact; :func:`rope.apply_rotary` is the
fast path that must agree with them.
"""

from __future__ import annotations

import torch

from .angles import exact_angles
from .layouts import check_layout, pair_indices


def _frequencies(inv_freq) -> torch.Tensor:
    """``inv_freq`` as a tensor: a tensor as it is, Python numbers (a list, a float) as float64,
    never rounded to float32."""
    if isinstance(inv_freq, torch.Tensor):
        return inv_freq
    return torch.as_tensor(inv_freq, dtype=torch.float64)


def _angles(position, inv_freq) -> torch.Tensor:
    """m theta_i: reduced modulo 2 pi exactly for float32 theta_i and integer m
    (:func:`rope.angles.exact_angles`), else the float64 product."""
    if not isinstance(position, torch.Tensor):  # a Python float stays float64, an int an integer
        position = torch.as_tensor(position, dtype=torch.float64 if isinstance(position, float) else None)
    inv_freq = _frequencies(inv_freq)
    if inv_freq.dtype == torch.float32 and not position.dtype.is_floating_point:
        if position.dim() and position.shape[-1] == 1:  # [..., 1] against [pairs]: [..., pairs]
            position = position[..., 0]
        return exact_angles(position, inv_freq.reshape(-1))
    return position.to(torch.float64) * inv_freq.to(torch.float64)


def rotation_matrix(position, inv_freq, *, head_dim: int | None = None, layout: str = "half") -> torch.Tensor:
    """R_m as an explicit float64 ``[head_dim, head_dim]`` matrix (identity past the rotary width).

    Args:
        position: the position m, an int or a real number (or a 0-d tensor).
        inv_freq: the rotary_dim/2 frequencies theta_i: a tensor, or Python numbers (float64).
        head_dim: the matrix's size, at least the rotary width (default the rotary width).
        layout: ``"half"`` or ``"interleaved"``.
    """
    check_layout(layout)
    inv_freq = _frequencies(inv_freq)
    rotary_dim = 2 * inv_freq.numel()
    head_dim = rotary_dim if head_dim is None else head_dim
    if head_dim < rotary_dim:
        raise ValueError(f"head_dim {head_dim} is smaller than the rotary width {rotary_dim}")
    angles = _angles(position, inv_freq.reshape(-1))
    cos, sin = torch.cos(angles), torch.sin(angles)
    a, b = pair_indices(rotary_dim, layout)
    matrix = torch.eye(head_dim, dtype=torch.float64)
    matrix[a, a] = cos
    matrix[a, b] = -sin
    matrix[b, a] = sin
    matrix[b, b] = cos
    return matrix


def _position_grid(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """positions broadcast to ``[batch, seq]``."""
    return positions.expand(x.shape[0], x.shape[1]) if positions.dim() == 1 else positions


def rotate_by_matrix(x, positions, inv_freq, *, layout: str = "half", attention_factor: float = 1.0):
    """y[b, s, h] = attention_factor * R_{positions[b, s]} x[b, s, h] (tail unscaled), float64.
    Each position is taken at its value: an integer exactly, a real one as a float64 number.

    Args:
        x: ``[batch, seq, heads, head_dim]``.
        positions: ``[seq]`` or ``[batch, seq]``, integer or real.
        inv_freq: the rotary_dim/2 frequencies theta_i: a tensor, or Python numbers (float64).
        layout: ``"half"`` or ``"interleaved"``.
        attention_factor: multiplies the rotated coordinates.
    """
    x = x.to(torch.float64)
    grid = _position_grid(x, positions)
    head_dim = x.shape[-1]
    inv_freq = _frequencies(inv_freq)
    rotary_dim = 2 * inv_freq.numel()
    scale = torch.ones(head_dim, dtype=torch.float64)
    scale[:rotary_dim] = attention_factor
    mats = torch.stack([rotation_matrix(m.item(), inv_freq, head_dim=head_dim, layout=layout)  # int or float64
                        for m in grid.reshape(-1)])
    mats = mats.reshape(*grid.shape, head_dim, head_dim) * scale[:, None]
    return torch.einsum("bsij,bshj->bshi", mats, x)


def rotate_by_complex(x, positions, inv_freq, *, layout: str = "half"):
    """Pair i as a complex number times e^{i m theta_i}, float64.

    Args:
        x: ``[batch, seq, heads, head_dim]``.
        positions: ``[seq]`` or ``[batch, seq]``, integer or real.
        inv_freq: the rotary_dim/2 frequencies theta_i: a tensor, or Python numbers (float64).
        layout: ``"half"`` or ``"interleaved"``.
    """
    x = x.to(torch.float64)
    grid = _position_grid(x, positions)
    inv_freq = _frequencies(inv_freq)
    rotary_dim = 2 * inv_freq.numel()
    a, b = pair_indices(rotary_dim, layout)
    z = torch.complex(x[..., a], x[..., b])
    w = z * torch.exp(1j * _angles(grid[..., None, None], inv_freq))
    y = x.clone()
    y[..., a], y[..., b] = w.real, w.imag
    return y


def rotate_elementwise(x, positions, inv_freq, *, layout: str = "half"):
    """y = x * cos_vec + x_rot * sin_vec (RoFormer eq. 34), float64.

    Args:
        x: ``[batch, seq, heads, head_dim]``.
        positions: ``[seq]`` or ``[batch, seq]``, integer or real.
        inv_freq: the rotary_dim/2 frequencies theta_i: a tensor, or Python numbers (float64).
        layout: ``"half"`` or ``"interleaved"``.
    """
    x = x.to(torch.float64)
    grid = _position_grid(x, positions)
    inv_freq = _frequencies(inv_freq)
    rotary_dim = 2 * inv_freq.numel()
    a, b = pair_indices(rotary_dim, layout)
    angles = _angles(grid[..., None, None], inv_freq)  # [batch, seq, 1, rotary_dim/2]
    cos_vec = torch.ones(*angles.shape[:-1], x.shape[-1], dtype=torch.float64)
    sin_vec = torch.zeros_like(cos_vec)
    cos_vec[..., a], cos_vec[..., b] = torch.cos(angles), torch.cos(angles)
    sin_vec[..., a], sin_vec[..., b] = torch.sin(angles), torch.sin(angles)
    x_rot = torch.zeros_like(x)
    x_rot[..., a], x_rot[..., b] = -x[..., b], x[..., a]
    return x * cos_vec + x_rot * sin_vec
