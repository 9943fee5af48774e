"""The fused Triton kernel (Triton is optional: ``import rope`` does not load this package).

* :mod:`.triton_rotary` — the kernel and its launcher;
* :mod:`.operators` — the kernel as ``torch.ops.rope.rotary`` and ``torch.ops.rope.rotary_``,
  with fake implementations, autograd and the argument checks;
* :mod:`.targets` — compiles the kernel for GPU targets without a GPU and checks its machine code
  (``python -m rope.kernels.targets``).

:func:`rope.apply_rotary` imports :mod:`.operators` when it first takes the kernel path.
"""
