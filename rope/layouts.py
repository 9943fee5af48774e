"""The two ways a head's coordinates are paired for rotation, and conversion between them.

RoPE rotates d/2 coordinate pairs (x_a, x_b) of the first d = rotary_dim coordinates by angle
m * theta_i. Which coordinates form pair i is the layout:

* ``"half"`` (GPT-NeoX, Llama in Hugging Face, ``rotate_half``): pair i is (i, i + d/2);
* ``"interleaved"`` (GPT-J, the RoFormer paper, Meta's original Llama code): pair i is (2i, 2i+1).

Which d coordinates of a head are rotated is the second choice, ``rotated``:

* ``"first"`` (every partial-rotary model but one: GPT-NeoX, Phi, GLM, ...): coordinates
  0 .. d-1; the last head_dim - d pass through;
* ``"last"`` (DeepSeek-V4): coordinates head_dim-d .. head_dim-1, the first head_dim - d pass
  through ("nope" then "rope" in each head). Its pairs are interleaved, (2i, 2i+1) counted from
  the block's start: transformers' ``apply_rotary_pos_emb`` in
  ``models/deepseek_v4/modeling_deepseek_v4.py`` rotates ``x[..., -rope_dim:]`` with
  ``rotate_half`` on ``x[..., 0::2]``, ``x[..., 1::2]``, and d = ``qk_rope_head_dim`` =
  head_dim * ``partial_rotary_factor`` (64 of 512); vLLM's ``DeepseekV4ScalingRotaryEmbedding``
  (``vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py``) passes
  ``rope_dim_offset = head_size - rotary_dim`` and ``vllm/models/deepseek_v4/common/rope.py``
  builds it with ``is_neox_style=False``, ``rope_dim = rope_head_dim``
  (https://github.com/vllm-project/vllm, https://github.com/huggingface/transformers). So
  DeepSeek-V4 is ``layout="interleaved", rotated="last"``; both layouts are taken with both.

Both layouts are the same rotation up to a fixed permutation P of the coordinates: R_half = P R_int P^T.
Since scores are q^T R_m^T R_n k, permuting the rows of W_q and W_k by P turns a checkpoint
trained in one layout into one that gives identical attention scores in the other.
"""

from __future__ import annotations

import torch

from ._checks import choice, integer, tensor

LAYOUTS = ("half", "interleaved")
ROTATED = ("first", "last")
"""Which rotary_dim coordinates of a head are rotated (module docstring)."""


def check_layout(layout: str) -> None:
    choice("layout", layout, LAYOUTS)


def rotary_start(head_dim: int, rotary_dim: int, rotated: str) -> int:
    """The index of the first rotated coordinate: 0 for ``rotated="first"``, head_dim - rotary_dim
    for ``"last"``; the rotated block is [start, start + rotary_dim), the rest passes through.

    Args:
        head_dim: the head dimension.
        rotary_dim: the rotated width, at most head_dim.
        rotated: ``"first"`` or ``"last"`` (:data:`ROTATED`), already checked.
    """
    return head_dim - rotary_dim if rotated == "last" else 0


def rotated_block_first(x: torch.Tensor, rotary_dim: int, rotated: str) -> torch.Tensor:
    """x with its rotated block moved to the front of the last dimension: x itself for
    ``rotated="first"`` (or a block as wide as the head), else ``[x[..., -rotary_dim:], x[..., :-rotary_dim]]``.

    The same permutation of the coordinates of q and k leaves every dot product q . k (so every
    attention logit, rotated or not) unchanged; this is how attention takes ``rotated="last"``
    through the code and kernels that rotate the first block, at the cost of one copy of q and k.

    Args:
        x: ``[..., head_dim]``.
        rotary_dim: the rotated width d, at most head_dim, already checked.
        rotated: ``"first"`` or ``"last"`` (:data:`ROTATED`), already checked.
    """
    if rotated == "first" or rotary_dim in (0, x.shape[-1]):
        return x
    return torch.cat((x[..., -rotary_dim:], x[..., :-rotary_dim]), dim=-1)


def pair_indices(rotary_dim: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (a_i, b_i) of the two coordinates of pair i, i = 0 .. rotary_dim/2 - 1
    (``rotary_dim``: an even int >= 0).

    Args:
        rotary_dim: the rotated width d, an even int >= 0.
        layout: ``"half"`` or ``"interleaved"``.

    Returns:
        ``(a, b)``, two int64 tensors ``[rotary_dim/2]``.
    """
    rotary_dim = integer("rotary_dim", rotary_dim, minimum=0, even=True)
    check_layout(layout)
    half = rotary_dim // 2
    if layout == "half":
        return torch.arange(half), torch.arange(half, rotary_dim)
    return torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)


def interleaved_to_half(head_dim: int, rotary_dim: int | None = None, rotated: str = "first") -> torch.Tensor:
    """The permutation p with x_half = x_interleaved[..., p]: (0, 2, 4, .., 1, 3, 5, ..) on the rotated
    block, the other coordinates fixed. ``rotary_dim`` defaults to ``head_dim``, which must then be
    even (pairs); with ``rotated="last"`` the block is the last rotary_dim coordinates (DeepSeek-V4).

    Args:
        head_dim: the head dimension, a positive int.
        rotary_dim: the rotated width, even and at most head_dim; the coordinates outside it stay.
        rotated: which coordinates are rotated, ``"first"`` or ``"last"`` (:data:`ROTATED`).

    Returns:
        p, an int64 tensor ``[head_dim]``.
    """
    head_dim = integer("head_dim", head_dim, minimum=1)
    if rotary_dim is None:
        if head_dim % 2:
            raise ValueError(f"head_dim must be even when rotary_dim is None (the rotary width, in pairs, defaults "
                             f"to head_dim), got {head_dim}")
        rotary_dim = head_dim
    else:
        rotary_dim = integer("rotary_dim", rotary_dim, minimum=2, even=True)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be even and in (0, head_dim={head_dim}], got {rotary_dim}")
    choice("rotated", rotated, ROTATED)
    a, b = pair_indices(rotary_dim, "interleaved")
    start = rotary_start(head_dim, rotary_dim, rotated)
    return torch.cat([torch.arange(start), start + a, start + b, torch.arange(start + rotary_dim, head_dim)])


def half_to_interleaved(head_dim: int, rotary_dim: int | None = None, rotated: str = "first") -> torch.Tensor:
    """The inverse of :func:`interleaved_to_half`.

    Args:
        head_dim: as in :func:`interleaved_to_half`.
        rotary_dim: as in :func:`interleaved_to_half`.
        rotated: as in :func:`interleaved_to_half`.
    """
    return torch.argsort(interleaved_to_half(head_dim, rotary_dim, rotated))


def permute_qk_weight(
    weight: torch.Tensor, num_heads: int, head_dim: int, *, to: str, rotary_dim: int | None = None,
    rotated: str = "first",
) -> torch.Tensor:
    """Reorder the output rows of a q or k projection (weight ``[num_heads * head_dim, in]`` or a
    bias ``[num_heads * head_dim]``) so that a model written for one layout runs in the other.

    ``to="half"`` converts an interleaved checkpoint (Meta's Llama, GPT-J) for ``rotate_half`` code
    (this is what transformers' Llama conversion script does); ``to="interleaved"`` goes back.

    Args:
        weight: the projection's weight ``[num_heads * head_dim, in]`` or bias ``[num_heads * head_dim]``.
        num_heads: the number of heads the rows hold (the key-value heads for k under GQA).
        head_dim: the head dimension.
        to: the layout to convert to, ``"half"`` or ``"interleaved"``.
        rotary_dim: the rotated width of each head (default head_dim); the other rows stay.
        rotated: which rotary_dim rows of each head are rotated, ``"first"`` or ``"last"``
            (DeepSeek-V4's "nope" then "rope" heads, :data:`ROTATED`).

    Returns:
        The reordered tensor, of weight's shape, dtype and device.
    """
    choice("to", to, LAYOUTS)
    tensor("weight", weight)
    num_heads = integer("num_heads", num_heads, minimum=1)
    head_dim = integer("head_dim", head_dim, minimum=1)
    if weight.dim() not in (1, 2) or weight.shape[0] != num_heads * head_dim:
        raise ValueError(
            f"weight must be [num_heads * head_dim, in] or [num_heads * head_dim] = [{num_heads * head_dim}], "
            f"got {tuple(weight.shape)}"
        )
    convert = interleaved_to_half if to == "half" else half_to_interleaved
    perm = convert(head_dim, rotary_dim, rotated)
    rows = weight.reshape(num_heads, head_dim, *weight.shape[1:])
    return rows[:, perm.to(weight.device)].reshape(weight.shape)
