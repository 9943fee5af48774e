"""transformers-compatible rotation functions, to patch in for a model's own.

Each has the signature and result of a transformers function and computes in float32 or better.
Given tables from :class:`rope.hf.RotaryEmbedding`, they rotate from the exact positions and
frequencies the tables were made from (``rope_source``) with :func:`rope.apply_rotary` or
:func:`rope.mrope.apply_mrope`: the fused kernel on CUDA, float64 on the CPU. Other tables take
the model's own table formula.
"""

from __future__ import annotations

import torch

from ..apply import apply_rotary
from ..layouts import interleaved_to_half
from ..mrope import apply_mrope

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(x_0, x_1, x_2, x_3, ..) -> (-x_1, x_0, -x_3, x_2, ..): the pairs (2i, 2i + 1) turned by 90 degrees."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """transformers-compatible (Llama and most models): ``q * cos + rotate_half(q) * sin`` on the
    first ``cos.shape[-1]`` coordinates (the rest pass through), in float32 or better, rounded
    once to q's dtype. ``position_ids`` is accepted for the older signature and ignored."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "half")


def apply_rotary_pos_emb_interleaved(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible for the models that pair coordinates (2i, 2i + 1) but build
    ``rotate_half`` tables (GLM, GLM-4, ERNIE 4.5): pair i of the first ``cos.shape[-1]``
    coordinates turns by the angle of ``cos[..., i]``, as their ``apply_rotary_pos_emb`` does by
    taking the first half of the table and repeating each entry twice."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "interleaved")


def apply_rotary_pos_emb_single(x, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with the one-tensor ``apply_rotary_pos_emb(x, cos, sin)`` of Gemma 4:
    :func:`apply_rotary_pos_emb` on x alone (from rope's tables the key slot gets one head of x,
    and its result is dropped)."""
    source = getattr(cos, "rope_source", None)
    if source is not None and unsqueeze_dim in (1, 2) and x.dim() == 4:
        one_head = x.narrow(unsqueeze_dim, 0, 1)
        return _rotate_from_source(x, one_head, *source, heads_dim=unsqueeze_dim, layout="half")[0]
    return _apply(x, x, cos, sin, unsqueeze_dim, "half")[0]


def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """transformers-compatible with DeepSeek-V2/V3's ``apply_rotary_pos_emb_interleave``
    (``rope_interleave``): pair i is (2i, 2i + 1) of the input, from ``rotate_half`` tables, and the
    rotated pairs come out in the half-split order, (y_a of every pair, then y_b of every pair).
    That is the half-split rotation of the input with its coordinates reordered from interleaved
    to half-split (:func:`rope.layouts.interleaved_to_half`), which is how it is computed here."""
    order = interleaved_to_half(q.shape[-1], cos.shape[-1]).to(q.device)
    return apply_rotary_pos_emb(q[..., order], k[..., order], cos, sin, unsqueeze_dim=unsqueeze_dim)


def apply_rotary_emb_complex(xq, xk, freqs_cis):
    """transformers-compatible with Llama 4's ``apply_rotary_emb``: q and k ``[batch, seq, heads,
    head_dim]``, pairs (2i, 2i + 1) read as complex numbers and multiplied by ``freqs_cis[b, s, i]``,
    in float32 or better, rounded once to q's dtype. Given the ``freqs_cis`` that
    :class:`RotaryEmbedding` (``tables="complex"``) returned, it rotates from the exact angles."""
    source = getattr(freqs_cis, "rope_source", None)
    if source is not None and xq.dim() == xk.dim() == 4:
        return _rotate_from_source(xq, xk, *source, heads_dim=2, layout="interleaved")

    def rotate(x):
        dtype = torch.promote_types(x.dtype, torch.float32)
        pairs = torch.view_as_complex(x.to(dtype).reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(pairs * freqs_cis[:, :, None, :].to(pairs.dtype)).flatten(3).to(x.dtype)

    return rotate(xq), rotate(xk)


def _apply(q, k, cos, sin, unsqueeze_dim, layout):
    source = getattr(cos, "rope_source", None)
    if source is not None and unsqueeze_dim in (1, 2) and q.dim() == k.dim() == 4:
        return _rotate_from_source(q, k, *source, heads_dim=unsqueeze_dim, layout=layout)
    rotary_dim = cos.shape[-1]
    if sin.shape != cos.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have the same shape")
    if rotary_dim % 2 or rotary_dim > q.shape[-1] or rotary_dim > k.shape[-1]:
        raise ValueError(f"cos has width {rotary_dim}; expected an even width <= head_dim {q.shape[-1]}")
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    turn = rotate_half
    if layout == "interleaved":  # angle i of the first half, for both coordinates of pair i
        cos = cos[..., : rotary_dim // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : rotary_dim // 2].repeat_interleave(2, dim=-1)
        turn = rotate_pairs_interleaved

    def rotate(x):
        dtype = torch.promote_types(x.dtype, torch.float32)
        head, tail = x[..., :rotary_dim].to(dtype), x[..., rotary_dim:]
        y = head * cos.to(dtype) + turn(head) * sin.to(dtype)
        return torch.cat((y.to(x.dtype), tail), dim=-1)

    return rotate(q), rotate(k)


def _rotate_from_source(q, k, position_ids, theta, attention, axes, tables, *, heads_dim, layout):
    """rope.apply_rotary (rope.mrope.apply_mrope with M-RoPE axes) on [batch, heads, seq, dim]
    (heads_dim 1) or [batch, seq, heads, dim] views; a batch of one position row is shared.
    Tables with each angle twice in a row come from models that pair (2i, 2i + 1): the half-split
    function on them is a mistake and raises."""
    if tables == "interleaved" and layout == "half":
        raise ValueError("cos holds each angle twice in a row (the tables of Cohere and GLM-4V, whose models pair "
                         "coordinates (2i, 2i + 1)): use rope.hf.apply_rotary_pos_emb_interleaved")
    if heads_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    if axes is None:
        positions = position_ids[0] if position_ids.dim() == 2 and position_ids.shape[0] == 1 else position_ids
        q_out, k_out = apply_rotary(q, k, positions, theta.to(q.device), layout=layout, attention_factor=attention)
    else:
        positions = position_ids[:, 0] if position_ids.shape[1] == 1 else position_ids
        q_out, k_out = apply_mrope(q, k, positions, theta.to(q.device), axes, layout=layout,
                                   attention_factor=attention)
    return (q_out.transpose(1, 2), k_out.transpose(1, 2)) if heads_dim == 1 else (q_out, k_out)
