"""The rotary kernel against a device-to-device copy of the same bytes: the GPU check's quick timing.

    python benchmarks/gpu_microbench.py [--out microbench.md]

For a few bf16 shapes (batch, seq, heads_q, heads_k, head_dim): the copy of q and k (the
ceiling: each byte read once and written once), ``rope.apply_rotary`` on the kernel (forward, in
bfloat16's default float-float math), its backward (``torch.autograd.grad``: the conjugate
rotation), ``torch.ops.rope.rotary_`` (in place), and the forward in the two other maths
(``triton_rotary.launch(..., float64_math=True)`` and ``False``): float64 math is what a GPU with
slow float64 must not take by default. GB/s counts q and k read plus written; ``frac`` is that
over the copy's, in the same run.
Device time from CUDA graph replays (``bench_rotary.graph_time_ms``); the full comparison with
the peers is ``bench_rotary.py``.

Without CUDA each contender runs once, untimed, at a tiny shape (so the script cannot rot), and
the script exits with status 3 after a line ``SKIP: ...`` (benchmarks/gpu_check.py records it as
skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any module holding @triton.jit is imported

import rope
import rope.kernels.operators  # registers torch.ops.rope.rotary_
from bench_rotary import capture_stream, graph_time_ms  # the same folder: CUDA graph replays
from rope.kernels import triton_rotary

SHAPES = [(4, 4096, 32, 8, 128), (1, 32768, 32, 8, 128), (256, 1, 32, 8, 128)]
TINY_SHAPE = (1, 4, 2, 1, 16)
SKIPPED = 3


def contenders(shape, device):
    """name -> fn of one call, for bf16 q and k of ``shape`` at positions from 1000."""
    batch, seq, heads_q, heads_k, head_dim = shape
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, seq, heads_q, head_dim, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, seq, heads_k, head_dim, device=device, dtype=torch.bfloat16, generator=gen)
    positions = torch.arange(seq, device=device) + 1000
    theta = rope.inv_freq({"rope_theta": 500000.0}, head_dim)[0].to(device)
    both = torch.cat([q.reshape(-1), k.reshape(-1)])
    both_copy = torch.empty_like(both)
    q_leaf, k_leaf = q.clone().requires_grad_(), k.clone().requires_grad_()
    # autograd replays a backward op on its forward op's stream, which must be the capturing stream
    with torch.cuda.stream(capture_stream()) if device == "cuda" else contextlib.nullcontext():
        outs = rope.apply_rotary(q_leaf, k_leaf, positions, theta, backend="triton")
    if device == "cuda":
        torch.cuda.current_stream().wait_stream(capture_stream())
    grads = (torch.randn_like(q), torch.randn_like(k))
    q_in, k_in = q.clone(), k.clone()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)

    def forward_in(float64_math):
        return lambda: triton_rotary.launch(q, k, q_out, k_out, positions, theta, interleaved=False,
                                            rotary_dim=head_dim, scale=1.0, conjugate=False, float64_math=float64_math)

    return {
        "copy": lambda: both_copy.copy_(both),
        "rope fwd": lambda: rope.apply_rotary(q, k, positions, theta, backend="triton"),
        "rope bwd": lambda: torch.autograd.grad(outs, (q_leaf, k_leaf), grads, retain_graph=True),
        "rope in place": lambda: torch.ops.rope.rotary_(q=q_in, k=k_in, positions=positions, inv_freq=theta,
                                                        interleaved=False, rotary_dim=head_dim, scale=1.0,
                                                        conjugate=False),
        "rope fwd, float64 math": forward_in(True),
        "rope fwd, float32 math": forward_in(False),
    }, 2 * both.numel() * both.element_size()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the markdown table here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        for fn in contenders(TINY_SHAPE, "cpu")[0].values():
            fn()
        print(f"SKIP: no CUDA (each contender ran once, untimed, at {TINY_SHAPE} in the interpreter)")
        return SKIPPED
    lines = [f"# Rotary kernel against a copy of the same bytes, bf16, {torch.cuda.get_device_name()}", "",
             "| shape (b, s, hq, hk, d) | contender | GB/s | frac of copy |", "| --- | --- | --- | --- |"]
    for shape in SHAPES:
        fns, nbytes = contenders(shape, "cuda")
        copy_rate = None
        for name, fn in fns.items():
            rate = nbytes / graph_time_ms(fn) / 1e6
            copy_rate = copy_rate or rate  # the copy comes first
            lines.append(f"| {', '.join(map(str, shape))} | {name} | {rate:.0f} | {rate / copy_rate:.2f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
