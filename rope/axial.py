"""RoPE for two-dimensional positions (image patches at column x, row y).

The relative property in 2D asks R_{(x_m, y_m)}^T R_{(x_n, y_n)} = R_{(x_n - x_m, y_n - y_m)}.
R_{(x, y)} = exp(x B_x + y B_y) satisfies it when B_x, B_y are skew-symmetric and commute
(Su Jianlin, "Transformer upgrade path 4: rotary position embedding for 2D positions").
Commuting skew-symmetric matrices are block diagonal in one common basis, so pair i of the
head rotates by one angle that is linear in the position:

* axial (RoPE-Axial): pair i rotates by x * theta_x,i for the first ``len(inv_freq_x)`` pairs
  and by y * theta_y,j for the next ``len(inv_freq_y)`` pairs; for d = 4,
  R_{(x, y)} = blockdiag(R(x theta), R(y theta));
* mixed (RoPE-Mixed, Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024):
  every pair i rotates by x * theta_x,i + y * theta_y,i.

"Pair i" is the pair of :func:`rope.layouts.pair_indices`: (i, i + d/2) in the ``"half"``
layout, (2i, 2i + 1) in the ``"interleaved"`` layout, so the axial split is by pair index,
not by coordinate: in the half layout the x pairs are coordinates 0..d/4-1 with d/2..3d/4-1.
This keeps :func:`rope.permute_qk_weight` valid between the two layouts. Angles, cos, sin
and products are float64, rounded once to the input dtype: the torch path of
:func:`rope.apply_rotary` (:func:`rope.apply.rotate_by_cos_sin`), fed the angles of each pair.
There is no kernel path: a mixed angle is the sum of two products, not one position per pair.
"""

from __future__ import annotations

import math

import torch

from . import _checks
from ._checks import integer_tensor
from .angles import add_turns, cos_sin_of_turns, cos_sin_of_turns_float32, turns, turns_of_checked_frequencies
from .apply import check_inputs, has_float64, rotate_by_cos_sin
from .frequencies import inv_freq
from .layouts import LAYOUTS
from .registry import register_rope_type


def axial_inv_freq(head_dim: int, *, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inv_freq_x, inv_freq_y)``, each theta_j = base^(-4j/head_dim), j = 0 .. head_dim/4 - 1.

    Each axis gets the 1D RoPE frequencies of a head of width head_dim/2 (float32, as
    :func:`rope.inv_freq`). RoPE-Axial in Heo et al. (2024) uses base 100 for ViT grids.

    Args:
        head_dim: the head dimension, a positive multiple of 4.
        base: the base of the frequencies, > 1.
    """
    head_dim = _checks.integer("head_dim", head_dim, minimum=4)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a positive multiple of 4 (two axes, pairs), got {head_dim}")
    base = _checks.number("base", base)
    if not base > 1:
        raise ValueError(f"base must be > 1 (theta_j = base^(-4j/head_dim) falls with j), got {base}")
    theta, _ = inv_freq({"rope_theta": base}, head_dim // 2)
    return theta, theta.clone()


def _axial_frequencies(cfg, dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """The ``axial`` and ``mllama4`` rope_types: the d/2 frequencies (theta, theta) with
    theta_j = b^(-4j/d), j = 0 .. d/4 - 1: pair i < d/4 turns by the first axis, pair d/4 + j by
    the second, each with the 1D frequencies of a head of width d/2 (:func:`axial_inv_freq`;
    rotate with :func:`apply_rotary_2d` and ``theta[:d//4]``, ``theta[d//4:]``). Attention factor 1.

    * ``axial`` is the default ``rope_type`` of transformers' vision towers
      (``compute_axial_rope_parameters`` of Qwen2-VL ... Qwen3-VL, GLM-4V, SAM 2/3,
      ``models/qwen3_vl/modeling_qwen3_vl.py``, https://github.com/huggingface/transformers):
      inv_freq = 1 / b^(arange(0, d/2, 2) / (d/2)), angles cat(h theta, w theta) in the half layout
      (Pixtral's variant, (theta_{2j}, theta_{2j+1}) of a full head, is not this type);
    * ``mllama4`` is Llama 4's vision tower (vLLM's ``Llama4VisionRotaryEmbedding``,
      ``vllm/model_executor/layers/rotary_embedding/llama4_vision_rope.py``; transformers'
      ``Llama4VisionRotaryEmbedding``): the same frequencies in the interleaved layout, turned by
      the 1-based patch column and row (:func:`llama4_vision_positions`).
    """
    if dim % 4:
        raise ValueError(f"rope_type {cfg.rope_type!r} splits the rotary width between two axes: it must be a "
                         f"multiple of 4, got d = {dim}")
    theta, _ = inv_freq({"rope_theta": cfg.rope_theta}, dim // 2)
    return torch.cat([theta, theta]), 1.0


register_rope_type("axial", _axial_frequencies)
register_rope_type("mllama4", _axial_frequencies)


def llama4_vision_positions(num_patches: int) -> torch.Tensor:
    """Llama 4's vision positions ``[num_patches + 1, 2]`` (int64) for :func:`apply_rotary_2d`:
    patch n of a square grid of side s = sqrt(num_patches) at (n mod s + 1, n div s + 1), 1-based,
    and the class token last, at (0, 0) (it does not turn), as vLLM's
    ``Llama4VisionRotaryEmbedding`` and transformers' build them (``ID_CLS_TOKEN`` masked to angle 0).

    Args:
        num_patches: the number of image patches, (image_size // patch_size)^2, a positive square.
    """
    num_patches = _checks.integer("num_patches", num_patches, minimum=1)
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(f"num_patches must be a square number (a square grid of patches), got {num_patches}")
    index = torch.arange(num_patches, dtype=torch.int64)
    patches = torch.stack([index % side + 1, index // side + 1], dim=-1)
    return torch.cat([patches, torch.zeros(1, 2, dtype=torch.int64)])


def mixed_inv_freq(head_dim: int, *, base: float = 10.0, angle: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE-Mixed initial frequencies ``(inv_freq_x, inv_freq_y)``, head_dim/2 entries each.

    With magnitudes r_j = base^(-4j/head_dim) (j < head_dim/4) and direction angle phi
    (Heo et al. 2024, one random phi per head, then learned), pair j rotates along
    r_j (cos phi, sin phi) and pair head_dim/4 + j along r_j (-sin phi, cos phi), the
    perpendicular direction. phi = 0 gives the axial frequencies exactly.

    Args:
        head_dim: the head dimension, a positive multiple of 4.
        base: the base of the magnitudes r_j, > 1.
        angle: the direction angle phi, in radians.
    """
    angle = _checks.number("angle", angle)
    magnitude, _ = axial_inv_freq(head_dim, base=base)
    magnitude = magnitude.to(torch.float64)
    cos, sin = math.cos(angle), math.sin(angle)
    inv_freq_x = torch.cat([magnitude * cos, -magnitude * sin])
    inv_freq_y = torch.cat([magnitude * sin, magnitude * cos])
    return inv_freq_x.to(torch.float32), inv_freq_y.to(torch.float32)


def _check_positions_xy(q: torch.Tensor, positions_xy) -> None:
    integer_tensor("positions_xy", positions_xy)
    if isinstance(q, torch.Tensor) and q.dim() == 4:
        batch, seq = q.shape[0], q.shape[1]
        if tuple(positions_xy.shape) not in ((seq, 2), (batch, seq, 2)):
            raise ValueError(
                f"positions_xy must have shape [seq, 2] = [{seq}, 2] or [batch, seq, 2] = [{batch}, {seq}, 2] "
                f"(last axis: x, y), got {tuple(positions_xy.shape)}"
            )


def _check_frequencies(inv_freq_x, inv_freq_y, mixed: bool) -> torch.Tensor:
    """The frequencies side by side (validated: finite float32, as :func:`rope.apply_rotary`
    takes them); mixed needs one (x, y) pair per rotated pair."""
    _checks.finite_frequencies("inv_freq_x", inv_freq_x, dtypes=_checks.FREQUENCY_DTYPES)
    _checks.finite_frequencies("inv_freq_y", inv_freq_y, dtypes=_checks.FREQUENCY_DTYPES)
    _checks.same_device("inv_freq_x", inv_freq_x, inv_freq_y=inv_freq_y)
    if mixed and inv_freq_x.shape != inv_freq_y.shape:
        raise ValueError(
            f"mixed=True needs inv_freq_x and inv_freq_y of equal length (one x and one y frequency per pair), "
            f"got {inv_freq_x.shape[0]} and {inv_freq_y.shape[0]}"
        )
    if not mixed and (inv_freq_x.numel() == 0 or inv_freq_y.numel() == 0):
        raise ValueError("axial RoPE needs at least one frequency per axis in inv_freq_x and inv_freq_y")
    return inv_freq_x if mixed else torch.cat([inv_freq_x, inv_freq_y.to(inv_freq_x.device)])


def pair_cos_sin(positions_xy: torch.Tensor, inv_freq_x, inv_freq_y, *,
                 mixed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angle of every rotated pair, shape ``positions_xy.shape[:-1] + (pairs,)``,
    reduced modulo 2 pi exactly (:mod:`rope.angles`; float64, float32 where float64 does not exist).

    axial: (x theta_x,0, ..., x theta_x,a-1, y theta_y,0, ..., y theta_y,b-1);
    mixed: x theta_x,i + y theta_y,i, the two turns added exactly before the cosine.
    ``positions_xy``: integer ``[..., 2]``; the frequencies as :func:`apply_rotary_2d` takes them.

    Args:
        positions_xy: integer ``[..., 2]``, last axis x, y.
        inv_freq_x: the x frequencies, as :func:`apply_rotary_2d` takes them.
        inv_freq_y: the y frequencies, as :func:`apply_rotary_2d` takes them.
        mixed: RoPE-Mixed (the two angles added) instead of axial (side by side).
    """
    _checks.flag("mixed", mixed)
    integer_tensor("positions_xy", positions_xy)
    if positions_xy.dim() == 0 or positions_xy.shape[-1] != 2:
        raise ValueError(f"positions_xy must have shape [..., 2] (last axis: x, y), got {tuple(positions_xy.shape)}")
    _check_frequencies(inv_freq_x, inv_freq_y, mixed)
    _checks.same_device("positions_xy", positions_xy, inv_freq_x=inv_freq_x, inv_freq_y=inv_freq_y)
    return _pair_cos_sin(positions_xy, inv_freq_x, inv_freq_y, mixed)


def _pair_cos_sin(positions_xy, inv_freq_x, inv_freq_y, mixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pair_cos_sin` of checked arguments."""
    x_turns = turns(positions_xy[..., 0, None], turns_of_checked_frequencies(inv_freq_x))
    y_turns = turns(positions_xy[..., 1, None], turns_of_checked_frequencies(inv_freq_y))
    limbs = add_turns(x_turns, y_turns) if mixed else torch.cat((x_turns, y_turns), dim=-2)
    return (cos_sin_of_turns if has_float64(positions_xy.device) else cos_sin_of_turns_float32)(limbs)


def apply_rotary_2d(
    q: torch.Tensor,
    k: torch.Tensor,
    positions_xy: torch.Tensor,
    inv_freq_x: torch.Tensor,
    inv_freq_y: torch.Tensor,
    *,
    layout: str = "half",
    mixed: bool = False,
    conjugate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by their 2D positions.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]`` (heads_k may differ: GQA, MQA).
        positions_xy: integer ``[seq, 2]`` or ``[batch, seq, 2]``; ``[..., 0]`` is x, ``[..., 1]`` is y.
        inv_freq_x, inv_freq_y: 1-D frequencies. Axial: pairs 0 .. a-1 rotate by x * inv_freq_x
            (a = len(inv_freq_x)), pairs a .. a+b-1 by y * inv_freq_y; rotated width 2(a + b).
            Mixed: equal lengths p, pair i rotates by x * inv_freq_x[i] + y * inv_freq_y[i];
            rotated width 2p. Coordinates past the rotated width pass through.
        layout: ``"half"`` or ``"interleaved"`` (which coordinates form pair i).
        mixed: RoPE-Mixed instead of axial.
        conjugate: rotate by minus the angles, the transpose (inverse) rotation.

    Returns:
        ``(q_out, k_out)`` in the dtype of q and k, each value rounded once from float64.
    """
    _checks.flag("mixed", mixed)
    _checks.choice("layout", layout, LAYOUTS)
    _checks.flag("conjugate", conjugate)
    _check_positions_xy(q, positions_xy)
    combined = _check_frequencies(inv_freq_x, inv_freq_y, mixed)
    rotary_dim = check_inputs(q, k, positions_xy[..., 0], combined, None, values=False)  # values: just checked
    _checks.same_device("q", q, inv_freq_y=inv_freq_y)
    cos, sin = _pair_cos_sin(positions_xy, inv_freq_x, inv_freq_y, mixed)
    return rotate_by_cos_sin(q, k, cos, sin, layout=layout, rotary_dim=rotary_dim, conjugate=conjugate)
