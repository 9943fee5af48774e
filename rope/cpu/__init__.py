"""The CPU kernel of the torch path: the rotation of :mod:`rope.rotation` in one pass over memory.

* ``rotary.c`` — the kernel, plain C (no torch headers), with its arithmetic and the proof of
  its one rounding to float16 and bfloat16;
* :mod:`.build` — compiles it on first use with the system's C compiler into a cache folder and
  loads it with ctypes (:func:`.build.library`), or says why it could not
  (:func:`.build.unavailable_reason`);
* :mod:`.rotary` — the launcher (:func:`.rotary.rotate`): checks, strides, threads.

Where no compiler is found (or ``ROPE_CPU_KERNEL=0``), :mod:`rope.rotation` rotates with torch
operations block by block instead: the same numbers, bit for bit, more slowly.
"""
