"""The limits of the fused kernels and of the rotation's arguments, each defined once with its reason.

Both sides read them: :mod:`rope.apply` to route a call to the kernel or refuse it
(``backend="triton"``), and the kernels and their operators (:mod:`rope.kernels`) to check their
arguments. This module imports nothing (no Triton, no torch), so neither side imports the other for
a number, and ``import rope`` stays free of Triton.
"""

KERNEL_MAX_HEAD_DIM = 1024
"""The widest head the rotary kernel takes: it holds a head's pairs as one block of
next_power_of_2(head_dim / 2) lanes (``HALF_PAD``, :mod:`rope.kernels.triton_rotary`). Wider heads
take the torch path (``backend="auto"``) or are refused (``"triton"``, ``torch.ops.rope.rotary``)."""

KERNEL_SCALE_RANGE = (2.0**-64, 2.0**64)
"""The attention factors s the rotary kernel takes: its float32 math represents s, or s 2^-k, as a
normal float32 number with room to spare (smaller or larger factors belong to the torch path)."""

MAX_FREQUENCY = 2.0**16
"""The kernels' float32 math (the rotary kernel for float32 q and k, and the attention kernels;
for Leaky ReRoPE also frequencies / leaky_scale) reduces the angles exactly only for ``|theta_i|``
below 2^16 (:mod:`rope.kernels.triton_rotary`, "Accuracy"); larger frequencies give wrong angles.
The rotary kernel's float-float and float64 math take any finite float32 theta_i."""

MAX_POSITION = 2**31
"""The kernels' float32 math holds its accuracy bound for positions ``|m|`` below 2^31
(:mod:`rope.kernels.triton_rotary`): the error of the fixed-point turns grows with ``|m|``. The
rotary kernel's float-float and float64 math and the torch path take every int64 position."""

MROPE_AXES = ("t", "h", "w")
"""The rows of M-RoPE position ids (:mod:`rope.mrope`): time, height, width; ``axes[i]`` is pair i's row."""

MIN_ATTENTION_FACTOR = 2.0**-1022
"""The smallest attention factor :func:`rope.apply_rotary` takes: float64's smallest normal number
(below it, s cos and s sin lose bits to underflow and the torch path's accuracy bound would not hold)."""
