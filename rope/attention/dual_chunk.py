"""Dual Chunk Attention (DCA; An et al. 2024, "Training-Free Long-Context Scaling of Large
Language Models", section 3): the relative position RoPE sees for each query/key pair.

A model pre-trained on c tokens has seen relative positions 0 .. c - 1. DCA splits the sequence
into chunks of s tokens (chunk_size) and gives every key the position ``P_k[j] = j mod s``.
A query gets one of three positions, depending on where the key lies (token indices i, j,
chunk indices i // s and j // s; the paper's M[i][j] = P_q[i] - P_k[j]):

* intra-chunk (same chunk, Eq. 2): ``P_q = i mod s``, so M = i - j, the true distance;
* successive-chunk (key in the chunk just before, Eq. 7): ``P_q = [s, s+1, .., s+w-1, c-1, .., c-1]``
  within each chunk, i.e. ``min(s + i mod s, c - 1)``; the first w queries of a chunk keep the
  true distance i - j to the previous chunk, the others are capped;
* inter-chunk (key two or more chunks back, Eq. 5): ``P_q = c - 1``, so M = c - 1 - (j mod s),
  between c - s and c - 1 (Eq. 6).

Here ``local_window`` is the paper's w and the pre-training length is taken as c = s + w (the
paper: "w ... can be directly set to the difference between pretraining length and chunk size
c - s"; it uses s = 3c/4). Every causal entry then lies in [0, c - 1] = [0, s + w - 1].

Naming differs in the authors' code (HKUNLP/ChunkLlama, ``chunkllama_attn_replace.py``): its
``chunk_size`` (3/4 of the pre-training length by default) plays the role of c = s + w, its
chunk length ``chunk_size - local_window`` is the s here, and it caps the successive- and
inter-chunk query positions at ``chunk_size`` rather than ``chunk_size - 1``, so its largest
relative position is one more than the paper's c - 1 (still below the pre-training length).
"""

from __future__ import annotations

import torch

from .._checks import integer


def dual_chunk_relative_positions(q_len: int, k_len: int, *, chunk_size: int, local_window: int) -> torch.Tensor:
    """DCA's relative position matrix M, int64 ``[q_len, k_len]``.

    Keys are tokens 0 .. k_len - 1; the queries are the last q_len of them (query row r is token
    ``k_len - q_len + r``, as in decoding with a cache). For causal pairs (key at or before the
    query) M is the paper's intra-, successive- or inter-chunk value above, so
    ``0 <= M <= chunk_size + local_window - 1``. Keys after the query, which the causal mask
    removes, get the plain (negative) i - j.

    Args:
        q_len: the number of queries, the last q_len of the keys (1 <= q_len <= k_len).
        k_len: the number of keys, tokens 0 .. k_len - 1.
        chunk_size: s, the tokens per chunk (>= 1).
        local_window: w, the successive-chunk window, 0 <= w <= s (the paper sets w = c - s).
    """
    q_len = integer("q_len", q_len, minimum=1)
    k_len = integer("k_len", k_len, minimum=1)
    if q_len > k_len:
        raise ValueError(f"q_len must be <= k_len (queries are the last q_len keys), got {q_len} > {k_len}")
    s = integer("chunk_size", chunk_size, minimum=1)
    w = integer("local_window", local_window, minimum=0)
    if w > s:
        raise ValueError(f"local_window must be <= chunk_size ({s}), got {w}")
    c = s + w
    i = torch.arange(k_len - q_len, k_len)[:, None]
    j = torch.arange(k_len)[None, :]
    key_position = j % s
    intra = i % s - key_position
    successive = torch.clamp(s + i % s, max=c - 1) - key_position
    inter = (c - 1) - key_position
    chunk_gap = i // s - j // s
    causal = torch.where(chunk_gap == 0, intra, torch.where(chunk_gap == 1, successive, inter))
    return torch.where(j <= i, causal, i - j)
