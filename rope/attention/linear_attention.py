"""RoPE in linear attention (RoFormer, Su et al. 2021, section 3.3, eq. 19).

Linear attention (Katharopoulos et al. 2020) replaces softmax's exp(q^T k / sqrt(d)) by a product
of non-negative feature maps phi(q)^T varphi(k). RoPE rotates the features in the numerator only::

    out_m = sum_n (R_m phi(q_m))^T (R_n varphi(k_n)) v_n  /  sum_n phi(q_m)^T varphi(k_n)

with n running over n <= m (causal, by index in the sequence) or over the whole sequence. Since
R_m^T R_n = R_{n-m}, the numerator weights depend on positions only through n - m. The
denominator stays un-rotated: rotated features can be negative, and a rotated denominator can
be close to zero or change sign. (Eq. 19 as printed sums the numerator to m and the
denominator to N; here both run over the same range.)

Associativity makes the numerator O(N): with rotated keys k'_n = R_n varphi(k_n), ::

    numerator_m = (R_m phi(q_m))^T S_m,   S_m = sum_{n <= m} k'_n v_n^T   (a prefix sum),
    denominator_m = phi(q_m)^T z_m,       z_m = sum_{n <= m} varphi(k_n).

:func:`rotary_linear_attention` computes this; :func:`rotary_linear_attention_quadratic` is the
float64 O(N^2) reference that forms every weight from explicit rotation matrices.
The same ``feature_map`` is used for phi and varphi, as Katharopoulos et al. do. The causal
prefix sums hold one d x v_dim matrix per token and key head: O(N d v_dim) time and memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .._checks import flag, same_device, tensor
from ..apply import apply_rotary, check_inputs
from ..layouts import check_layout
from ..reference import rotate_by_matrix

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, the feature map of Katharopoulos et al. (2020).

    Args:
        x: any tensor.
    """
    return F.elu(x) + 1.0


def _check_attention_inputs(q, k, v, positions, inv_freq, causal, feature_map, layout) -> None:
    """The checks of rope.apply_rotary, plus v (None: no values), GQA heads and the feature map."""
    check_inputs(q, k, positions, inv_freq, None)
    check_layout(layout)
    if not callable(feature_map):
        raise TypeError(f"feature_map must be callable, got {type(feature_map).__name__}")
    flag("causal", causal)
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"heads of q ({q.shape[2]}) must be a multiple of heads of k ({k.shape[2]})")
    if v is None:
        return
    tensor("v", v)
    same_device("q", q, v=v)
    if v.dim() != 4:
        raise ValueError(f"v must have shape [batch, seq, heads_k, v_dim], got {tuple(v.shape)}")
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the dtype of q and k ({q.dtype}), got {v.dtype}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} must agree with k {tuple(k.shape)} in batch, seq and heads")


def _features(x: torch.Tensor, feature_map: FeatureMap, name: str) -> torch.Tensor:
    out = feature_map(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"feature_map must return a torch.Tensor for {name}, got {type(out).__name__}")
    if out.shape != x.shape:
        raise ValueError(f"feature_map must keep the shape of {name} {tuple(x.shape)}, got {tuple(out.shape)}")
    return out.to(x.dtype)


def _share_kv_heads(x: torch.Tensor, heads_q: int) -> torch.Tensor:
    """Repeat key/value heads (dim 2) so that query head h reads head h // (heads_q / heads_k) (GQA, MQA)."""
    return x.repeat_interleave(heads_q // x.shape[2], dim=2)


def rotary_linear_attention_parts(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    causal: bool = True,
    feature_map: FeatureMap = elu_plus_one,
    layout: str = "half",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The numerator and the un-rotated denominator of RoFormer eq. 19, in O(N).

    Arguments as for :func:`rotary_linear_attention`. Returns ``(numerator, denominator)`` with
    shapes ``[batch, seq, heads_q, v_dim]`` and ``[batch, seq, heads_q]``, computed in float32
    or float64 (the wider of that and the input dtype), not rounded to the input dtype.
    With ``v`` all ones the numerator is the *rotated* denominator
    sum_n (R_m phi(q_m))^T (R_n phi(k_n)), the quantity eq. 19 deliberately avoids.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]``, heads_q a multiple of heads_k.
        v: ``[batch, seq, heads_k, v_dim]``.
        positions: integer positions, ``[seq]`` or ``[batch, seq]``.
        inv_freq: the frequencies theta_i.
        causal: attend to tokens 0 .. m only.
        feature_map: phi, applied to q and k before the rotation.
        layout: ``"half"`` or ``"interleaved"``.
    """
    _check_attention_inputs(q, k, v, positions, inv_freq, causal, feature_map, layout)
    dtype = torch.promote_types(q.dtype, torch.float32)
    phi_q = _features(q.to(dtype), feature_map, "q")
    phi_k = _features(k.to(dtype), feature_map, "k")
    rot_q, rot_k = apply_rotary(phi_q, phi_k, positions, inv_freq, layout=layout)
    # S_m = sum_n R_n phi(k_n) v_n^T and z_m = sum_n phi(k_n), over n <= m or over all n.
    kv = torch.einsum("bshd,bshe->bshde", rot_k, v.to(dtype))
    if causal:
        kv_sum, k_sum = kv.cumsum(dim=1), phi_k.cumsum(dim=1)
    else:
        kv_sum, k_sum = kv.sum(dim=1, keepdim=True), phi_k.sum(dim=1, keepdim=True)
    kv_sum, k_sum = (_share_kv_heads(t, q.shape[2]) for t in (kv_sum, k_sum))
    numerator = torch.einsum("bshd,bshde->bshe", rot_q, kv_sum)
    denominator = (phi_q * k_sum).sum(dim=-1)
    return numerator, denominator


def rotary_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    causal: bool = True,
    feature_map: FeatureMap = elu_plus_one,
    layout: str = "half",
) -> torch.Tensor:
    """Linear attention with RoPE on the features (RoFormer eq. 19), O(N) in the sequence length.

    out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n / sum_n phi(q_m)^T phi(k_n),
    n <= m when ``causal`` (by index in the sequence, whatever the position values), else all n.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]``, heads_q a multiple of heads_k (GQA, MQA).
        v: ``[batch, seq, heads_k, v_dim]``.
        positions: integer positions, ``[seq]`` or ``[batch, seq]``.
        inv_freq: the frequencies theta_i; ``2 * len(inv_freq)`` leading feature coordinates
            rotate, the rest pass through (partial rotary).
        causal: token m attends to tokens 0 .. m of the sequence, else to all of them.
        feature_map: phi, applied to q and k before the rotation; it must keep the shape and,
            for a positive denominator, give non-negative features (default elu(x) + 1 > 0).
        layout: ``"half"`` or ``"interleaved"`` pairing of the rotated coordinates.

    Returns:
        ``[batch, seq, heads_q, v_dim]`` in the dtype of q (accumulated in float32 or wider).
    """
    numerator, denominator = rotary_linear_attention_parts(
        q, k, v, positions, inv_freq, causal=causal, feature_map=feature_map, layout=layout
    )
    return (numerator / denominator[..., None]).to(q.dtype)


def rotary_linear_attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    causal: bool = True,
    feature_map: FeatureMap = elu_plus_one,
    layout: str = "half",
) -> torch.Tensor:
    """The float64 weight matrix of eq. 19, formed pair by pair: O(N^2), for checks and plots.

    A[b, h, m, n] = (R_m phi(q_m))^T (R_n phi(k_n)) / sum_{n'} phi(q_m)^T phi(k_{n'}), with R_m the
    explicit block-diagonal matrix of :func:`rope.reference.rotation_matrix`, zero for n > m when
    ``causal``. Rows need not sum to 1 and entries can be negative.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]``, heads_q a multiple of heads_k.
        positions: integer positions, ``[seq]`` or ``[batch, seq]``.
        inv_freq: the frequencies theta_i.
        causal: attend to tokens 0 .. m only.
        feature_map: phi, applied to q and k before the rotation.
        layout: ``"half"`` or ``"interleaved"``.

    Returns:
        float64 ``[batch, heads_q, seq, seq]``.
    """
    _check_attention_inputs(q, k, None, positions, inv_freq, causal, feature_map, layout)
    phi_q = _features(q.to(torch.float64), feature_map, "q")
    phi_k = _share_kv_heads(_features(k.to(torch.float64), feature_map, "k"), q.shape[2])
    rot_q = rotate_by_matrix(phi_q, positions, inv_freq, layout=layout)
    rot_k = rotate_by_matrix(phi_k, positions, inv_freq, layout=layout)
    rotated = torch.einsum("bmhd,bnhd->bhmn", rot_q, rot_k)
    plain = torch.einsum("bmhd,bnhd->bhmn", phi_q, phi_k)
    if causal:
        seq = q.shape[1]
        allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
        rotated, plain = rotated * allowed, plain * allowed
    return rotated / plain.sum(dim=-1, keepdim=True)


def rotary_linear_attention_quadratic(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    causal: bool = True,
    feature_map: FeatureMap = elu_plus_one,
    layout: str = "half",
) -> torch.Tensor:
    """The float64 O(N^2) reference of :func:`rotary_linear_attention`: out_m = sum_n A_mn v_n with
    the weights of :func:`rotary_linear_attention_weights`. Returns float64.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]``, heads_q a multiple of heads_k.
        v: ``[batch, seq, heads_k, v_dim]``.
        positions: integer positions, ``[seq]`` or ``[batch, seq]``.
        inv_freq: the frequencies theta_i.
        causal: attend to tokens 0 .. m only.
        feature_map: phi, applied to q and k before the rotation.
        layout: ``"half"`` or ``"interleaved"``.

    Returns:
        float64 ``[batch, seq, heads_q, v_dim]``.
    """
    _check_attention_inputs(q, k, v, positions, inv_freq, causal, feature_map, layout)
    weights = rotary_linear_attention_weights(
        q, k, positions, inv_freq, causal=causal, feature_map=feature_map, layout=layout
    )
    values = _share_kv_heads(v.to(torch.float64), q.shape[2])
    return torch.einsum("bhmn,bnhe->bmhe", weights, values)
