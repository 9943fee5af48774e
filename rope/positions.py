"""Position ids for packed batches and for sequences sharded across devices.

:func:`rope.apply_rotary` (and its kernel) takes one integer position per token, so every
layout of tokens is a matter of computing those positions:

* a KV-cache step or a chunk of a long prompt: ``torch.arange(seq) + offset``;
* sequences packed end to end into one row (``cu_seqlens`` = [0, n_0, n_0 + n_1, ...], as in
  flash-attention's varlen API): :func:`packed_positions`;
* context parallelism, a sequence split over ``world_size`` ranks, contiguously or in the
  load-balanced "zigzag" order used with causal attention (rank r holds chunks r and 2W - 1 - r
  of 2W equal chunks): :func:`context_parallel_positions`.
"""

from __future__ import annotations

import torch

from ._checks import INT64_MAX, flag, integer, integer_tensor, same_device


def packed_positions(cu_seqlens: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Positions of sequences packed end to end: token t of sequence j, which occupies
    [cu_seqlens[j], cu_seqlens[j + 1]), gets ``offsets[j] + t - cu_seqlens[j]`` (offsets default 0,
    e.g. the lengths already in each sequence's KV cache). Returns int64 ``[cu_seqlens[-1]]``.

    Both are integer tensors of any dtype whose values fit int64 (uint64 is refused:
    :func:`rope._checks.integer_tensor`), read as int64 before any arithmetic; an offset that
    would put a token past the largest int64 position is a ``ValueError``.

    Args:
        cu_seqlens: the cumulative lengths ``[0, n_0, n_0 + n_1, ...]``, non-decreasing, ``[sequences + 1]``.
        offsets: the position of each sequence's first token, ``[sequences]`` (default 0).
    """
    integer_tensor("cu_seqlens", cu_seqlens, dim=1)
    cu = cu_seqlens.to(torch.int64)
    if cu.numel() < 2 or cu[0].item() != 0:
        raise ValueError("cu_seqlens must start at 0 and hold at least one sequence: [0, n_0, n_0 + n_1, ...]")
    if (cu[1:] < cu[:-1]).any():
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu_seqlens.tolist()}")
    lengths = cu[1:] - cu[:-1]  # no overflow: 0 <= cu[j] <= cu[-1]
    total = int(cu[-1])
    token = torch.arange(total, device=cu.device)
    positions = token - torch.repeat_interleave(cu[:-1], lengths, output_size=total)
    if offsets is not None:
        integer_tensor("offsets", offsets, dim=1)
        same_device("cu_seqlens", cu_seqlens, offsets=offsets)
        if offsets.numel() != lengths.numel():
            raise ValueError(f"offsets must have one entry per sequence ({lengths.numel()}), got {offsets.numel()}")
        offsets = offsets.to(torch.int64)
        too_far = (lengths > 0) & (offsets > INT64_MAX - (lengths - 1))
        if too_far.any():
            j = int(too_far.nonzero()[0, 0])
            raise ValueError(f"offsets[{j}] = {int(offsets[j])} puts the last of its {int(lengths[j])} tokens past the "
                             f"largest int64 position ({INT64_MAX})")
        positions = positions + torch.repeat_interleave(offsets, lengths, output_size=total)
    return positions


def context_parallel_positions(seq_len: int, world_size: int, rank: int, *, zigzag: bool = False) -> torch.Tensor:
    """The positions of the tokens rank ``rank`` holds when a sequence of ``seq_len`` tokens is
    split over ``world_size`` ranks: one contiguous chunk each, or (``zigzag``) chunks ``rank`` and
    ``2 world_size - 1 - rank`` of ``2 world_size``. ``seq_len`` must divide evenly.

    Args:
        seq_len: the length of the whole sequence, a positive multiple of the number of chunks.
        world_size: the number of ranks W.
        rank: this rank, in [0, W).
        zigzag: the load-balanced order of causal attention, two chunks per rank.

    Returns:
        int64 ``[seq_len / world_size]``.
    """
    seq_len = integer("seq_len", seq_len)
    world_size = integer("world_size", world_size, minimum=1)
    rank = integer("rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must satisfy 0 <= rank < world_size = {world_size}, got {rank}")
    chunks = 2 * world_size if flag("zigzag", zigzag) else world_size
    if seq_len <= 0 or seq_len % chunks:
        raise ValueError(f"seq_len {seq_len} must be a positive multiple of {chunks} (the number of chunks)")
    size = seq_len // chunks
    owned = (rank, chunks - 1 - rank) if zigzag else (rank,)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in owned])
