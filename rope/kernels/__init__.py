"""The fused Triton kernels (Triton is optional: ``import rope`` does not load this package).

* :mod:`.triton_rotary` — the rotary kernel and its launcher;
* :mod:`.triton_attention` — RoPE, ReRoPE and Leaky ReRoPE inside attention: q and k rotated on
  load in a FlashAttention-2 style forward kernel, and its launcher;
  :mod:`.triton_attention_backward` its backward kernels; :mod:`.triton_attention_decode` the
  decoding kernel (few queries, the keys split across programs);
* :mod:`.attention_operators` — those kernels as differentiable operators,
  ``torch.ops.rope.fused_attention`` and :func:`.attention_operators.fused_rotary_attention`;
* :mod:`.operators` — the kernel as ``torch.ops.rope.rotary`` and ``torch.ops.rope.rotary_``,
  with fake implementations, autograd and the argument checks;
* :mod:`.targets` — compiles the kernels for GPU targets without a GPU and checks the rotary
  kernel's machine code
  (``python -m rope.kernels.targets``).

:func:`rope.apply_rotary` imports :mod:`.operators` when it first takes the kernel path.
"""
