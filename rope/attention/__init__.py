"""Attention-side position methods: what changes the scores rather than rotating q and k alone.

* :mod:`.rerope` — ReRoPE and Leaky ReRoPE: relative positions clipped at a window;
* :mod:`.blockwise` — RoPE / ReRoPE attention block by block (online softmax), never forming the
  full score matrix: the float64 reference of the fused kernel
  :mod:`rope.kernels.triton_attention`;
* :mod:`.logn` — log-n attention scaling;
* :mod:`.dual_chunk` — Dual Chunk Attention's relative positions;
* :mod:`.kv_cache` — dynamic NTK with a KV cache: keys cached before or after rotation;
* :mod:`.linear_attention` — RoPE in linear attention, O(N) and the O(N^2) reference;
* :mod:`.encodings` — the encodings before RoPE: sinusoidal, Shaw, T5 buckets, DeBERTa, ALiBi.
"""

from . import blockwise, dual_chunk, encodings, kv_cache, linear_attention, logn, rerope

__all__ = ["blockwise", "dual_chunk", "encodings", "kv_cache", "linear_attention", "logn", "rerope"]
