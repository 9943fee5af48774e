"""RoPE inside attention on a GPU: time and peak memory, side by side in one run.

    python benchmarks/bench_attention.py --out rope/data/bench_attention.md

For each sequence length S (one sequence, GQA heads, head_dim 128, bfloat16, causal) it measures,
forward and forward + backward:

* the fused kernel without its rotation (``launch(..., rotate=False)``): the ceiling RoPE inside
  attention is held to (target: at most 2% slower);
* RoPE inside attention (``rope.kernels.attention_operators.fused_rotary_attention``);
* the separate pass it replaces: ``rope.apply_rotary`` (the rotary kernel) then PyTorch's
  ``scaled_dot_product_attention`` with the flash backend, reading GQA's shared key heads in place
  (``enable_gqa``) if the backend accepts it, as copies otherwise (the table says which);
* ReRoPE and Leaky ReRoPE inside attention (target: at most 1.1x the fused causal RoPE);
* the O(S^2) ReRoPE reference as its authors' code computes it (two full logit matrices in the
  inputs' dtype, selected by the window, softmax, times V), until it runs out of memory.

Then decoding: one new token per sequence (``--decode-batch`` sequences) against a KV cache of S
tokens, forward only:

* the decoding kernel without rotation on the cache (the ceiling);
* RoPE inside attention on an *unrotated* cache (every cached key rotated as it is loaded, which
  lets the frequencies change with the length): the decoding kernel
  (``rope.kernels.triton_attention_decode``, keys split across programs), and the prefill kernel on
  the same step;
* the usual decode step: the new token's query rotated by the rotary kernel, then SDPA over a
  cache whose keys were rotated when they were inserted.

Times are medians of ``triton.testing.do_bench``; peak memory is ``torch.cuda.max_memory_allocated``
above the inputs. The table records the device, versions, commit and date. ``--check`` runs every
method once at tiny sizes (Triton's interpreter on the CPU without a GPU) and compares their
outputs, without timing: the test suite runs it so that the script cannot rot between GPU sessions.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is imported

import rope
from rope.kernels.attention_operators import fused_rotary_attention
from rope.kernels.triton_attention import launch
from rope.kernels.triton_attention_backward import launch_backward
from rope.kernels.triton_attention_decode import launch_decode


def separate_pass(q, k, v, positions, inv_freq, window=None):
    """The usual stack: rotate q and k (the rotary kernel on CUDA), then SDPA (flash where it runs).

    GQA's shared key heads are read in place (``enable_gqa``) where the backend accepts it;
    otherwise k and v are repeated per query head inside the step, as stacks without it do.
    """
    q_rot, k_rot = rope.apply_rotary(q, k, positions, inv_freq)
    group = q.shape[2] // k.shape[2]
    in_place = gqa_in_place(q.device.type, q.dtype)
    if not in_place:
        k_rot, v = k_rot.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    with torch.nn.attention.sdpa_kernel(_sdpa_backends(q.device.type)):
        out = torch.nn.functional.scaled_dot_product_attention(q_rot.transpose(1, 2), k_rot.transpose(1, 2),
                                                               v.transpose(1, 2), is_causal=True,
                                                               enable_gqa=in_place)
    return out.transpose(1, 2)


def _sdpa_backends(device: str):
    """The flash backend on CUDA (what the separate pass is held to); the math backend on the CPU."""
    backend = torch.nn.attention.SDPBackend
    return [backend.FLASH_ATTENTION] if device == "cuda" else [backend.MATH]


@functools.cache
def gqa_in_place(device: str, dtype: torch.dtype) -> bool:
    """Whether SDPA with ``_sdpa_backends(device)`` accepts ``enable_gqa`` for this dtype (tried once)."""
    q = torch.zeros(1, 4, 16, 64, device=device, dtype=dtype)
    k = torch.zeros(1, 2, 16, 64, device=device, dtype=dtype)
    try:
        with torch.nn.attention.sdpa_kernel(_sdpa_backends(device)):
            torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    except RuntimeError:
        return False
    return True


def rerope_reference(q, k, v, positions, inv_freq, window, leaky_scale=None):
    """ReRoPE (Leaky ReRoPE) as the reference code computes it: two S x S logit matrices in the
    inputs' dtype (pass 1 plain RoPE; pass 2 queries at w and keys unrotated, or the frequencies
    theta / k with queries at m + w (k - 1)), selected by r < w, softmax, times V."""
    group = q.shape[2] // k.shape[2]
    q1, k1 = rope.apply_rotary(q, k, positions, inv_freq)
    if leaky_scale is None:
        q2 = rope.apply_rotary(q, q, torch.full_like(positions, window), inv_freq)[0]
        k2 = k
    else:
        leaky = (inv_freq.double() / leaky_scale).float()  # rounded to float32, as a model would hold it
        shifted = positions + round(window * (leaky_scale - 1))  # integer for the integer scales used here
        q2 = rope.apply_rotary(q, q, shifted, leaky)[0]
        k2 = rope.apply_rotary(k, k, positions, leaky)[0]

    def logits(a, b):
        return torch.einsum("bihd,bjhd->bhij", a, b.repeat_interleave(group, dim=2))

    r = positions[:, None] - positions[None, :]
    x = torch.where(r < window, logits(q1, k1), logits(q2, k2)) / math.sqrt(q.shape[3])
    x = x.masked_fill(r < 0, -math.inf)
    p = torch.softmax(x.float(), dim=-1).to(v.dtype)
    return torch.einsum("bhij,bjhd->bihd", p, v.repeat_interleave(group, dim=2))


def methods(window: int, leaky_scale: float):
    """name -> (forward(q, k, v, positions, inv_freq), the method the ratio column divides by)."""
    def no_rotation(q, k, v, positions, inv_freq):
        return _LaunchWithoutRotation.apply(q, k, v, positions, inv_freq)

    return {
        "kernel without rotation": (no_rotation, None),
        "RoPE inside attention": (lambda q, k, v, p, f: fused_rotary_attention(q, k, v, p, p, f),
                                  "kernel without rotation"),
        "apply_rotary + SDPA": (separate_pass, "RoPE inside attention"),
        "ReRoPE inside attention": (lambda q, k, v, p, f: fused_rotary_attention(q, k, v, p, p, f, window=window),
                                    "RoPE inside attention"),
        "Leaky ReRoPE inside attention": (
            lambda q, k, v, p, f: fused_rotary_attention(q, k, v, p, p, f, window=window, leaky_scale=leaky_scale),
            "RoPE inside attention"),
        "ReRoPE reference (two S x S passes)": (lambda q, k, v, p, f: rerope_reference(q, k, v, p, f, window),
                                                "ReRoPE inside attention"),
    }


class _LaunchWithoutRotation(torch.autograd.Function):
    """The fused kernels with ``rotate=False``, differentiable, for the baseline's backward."""

    @staticmethod
    def forward(ctx, q, k, v, positions, inv_freq):
        out, lse = launch(q, k, v, positions, positions, inv_freq, rotate=False)
        ctx.save_for_backward(q, k, v, positions, inv_freq, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, positions, inv_freq, out, lse = ctx.saved_tensors
        dq, dk, dv = launch_backward(q, k, v, positions, positions, inv_freq, out, lse, grad_out.contiguous(),
                                     rotate=False)
        return dq, dk, dv, None, None


def decode_methods():
    """name -> (step(q, k_cache, v_cache, positions, inv_freq), the method the ratio column divides by),
    q the new tokens [batch, 1, heads, d] at the last position, the caches [batch, S, kv_heads, d]."""
    def rotated_cache(q, k, v, positions, inv_freq):
        k_rot = rope.apply_rotary(k, k, positions, inv_freq)[0]  # done at insertion in a real cache: not timed
        return lambda: _sdpa_decode(rope.apply_rotary(q, q, positions[-1:], inv_freq)[0], k_rot, v)

    return {
        "decode: kernel without rotation": (
            lambda q, k, v, p, f: lambda: launch_decode(q, k, v, p[-1:], p, f, causal=False, rotate=False)[0], None),
        "decode: RoPE inside attention, unrotated cache": (
            lambda q, k, v, p, f: lambda: launch_decode(q, k, v, p[-1:], p, f, causal=False)[0],
            "decode: kernel without rotation"),
        "decode: the prefill kernel on the same step": (
            lambda q, k, v, p, f: lambda: launch(q, k, v, p[-1:], p, f, causal=False)[0],
            "decode: RoPE inside attention, unrotated cache"),
        "decode: apply_rotary + SDPA, rotated cache": (
            rotated_cache, "decode: RoPE inside attention, unrotated cache"),
    }


def _sdpa_decode(q_rot, k_rot, v):
    """SDPA of one query per sequence over the whole cache (GQA read in place: ``enable_gqa``)."""
    out = torch.nn.functional.scaled_dot_product_attention(q_rot.transpose(1, 2), k_rot.transpose(1, 2),
                                                           v.transpose(1, 2), enable_gqa=True)
    return out.transpose(1, 2)


def inputs(length, args, device, requires_grad=False, batch=None, q_len=None):
    """q [batch, q_len or S, heads, d], k and v [batch, S, kv_heads, d], positions 0 .. S - 1, inv_freq."""
    gen = torch.Generator(device=device).manual_seed(length)
    batch = batch or args.batch
    dtype = getattr(torch, args.dtype)

    def normal(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype).requires_grad_(requires_grad)

    q = normal(batch, q_len or length, args.heads, args.head_dim)
    k = normal(batch, length, args.kv_heads, args.head_dim)
    v = normal(batch, length, args.kv_heads, args.head_dim)
    inv_freq = rope.inv_freq({"rope_theta": 5e5}, args.head_dim)[0].to(device)
    return q, k, v, torch.arange(length, device=device), inv_freq


def measure(function, length, args, device, backward: bool):
    """(milliseconds, peak MiB above the inputs) or (None, None) when it runs out of memory."""
    import triton.testing

    q, k, v, positions, inv_freq = inputs(length, args, device, requires_grad=backward)

    def step():
        out = function(q, k, v, positions, inv_freq)
        if backward:
            out.backward(torch.ones_like(out))
        return out

    try:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        milliseconds = triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
        return milliseconds, peak
    except torch.OutOfMemoryError:
        return None, None
    finally:
        q.grad = k.grad = v.grad = None
        torch.cuda.empty_cache()


def measure_decode(make_step, length, args, device):
    """Milliseconds of one decode step (``make_step`` builds it from the inputs, untimed), or None
    when it runs out of memory."""
    import triton.testing

    q, k, v, positions, inv_freq = inputs(length, args, device, batch=args.decode_batch, q_len=1)
    try:
        step = make_step(q, k, v, positions, inv_freq)
        return triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
    except torch.OutOfMemoryError:
        return None
    finally:
        torch.cuda.empty_cache()


def provenance(device) -> list[str]:
    import triton

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    name = torch.cuda.get_device_name(device) if device == "cuda" else "CPU (Triton interpreter)"
    return [f"device: {name}", f"torch {torch.__version__}, triton {triton.__version__}",
            f"commit {commit or 'unknown'}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"]


def run(args) -> str:
    device = "cuda"
    lines = ["# RoPE inside attention: time and memory", "", *[f"- {line}" for line in provenance(device)],
             f"- batch {args.batch}, heads {args.heads} (key heads {args.kv_heads}), head_dim {args.head_dim}, "
             f"{args.dtype}, causal; window {args.window}, leaky scale {args.leaky_scale}",
             "- the separate pass's SDPA (flash) reads the shared key heads "
             + ("in place (`enable_gqa`)" if gqa_in_place(device, getattr(torch, args.dtype))
                else "as copies: `enable_gqa` refused, k and v repeated inside the timed step"), "",
             "| S | method | forward ms | ratio | forward + backward ms | ratio | peak MiB (forward) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    table = methods(args.window, args.leaky_scale)
    for length in args.lengths:
        results = {}
        for name, (function, _) in table.items():
            results[name] = (*measure(function, length, args, device, backward=False),
                             measure(function, length, args, device, backward=True)[0])
        for name, (_, against) in table.items():
            forward, peak, both = results[name]
            base = results.get(against, (None, None, None))

            def cell(value, base_value):
                return "out of memory" if value is None else f"{value:.3f}", (
                    f"{value / base_value:.3f}" if value and base_value else "")

            forward_cell, forward_ratio = cell(forward, base[0])
            both_cell, both_ratio = cell(both, base[2])
            lines.append(f"| {length} | {name} | {forward_cell} | {forward_ratio} | {both_cell} | {both_ratio} | "
                         + ("" if peak is None else f"{peak:.0f}") + " |")
            print(lines[-1], flush=True)
    lines += ["", "ratio: to the method the row is held against (RoPE inside attention: the kernel without rotation; "
              "the separate pass and the ReRoPE kernels: RoPE inside attention; the reference: the ReRoPE kernel).",
              "", f"## Decoding: {args.decode_batch} sequences, one new token each, against a cache of S tokens", "",
              "| S | method | ms | ratio |", "| --- | --- | --- | --- |"]
    table = decode_methods()
    for length in args.lengths:
        times = {name: measure_decode(make_step, length, args, device) for name, (make_step, _) in table.items()}
        for name, (_, against) in table.items():
            value, base = times[name], times.get(against)
            ratio = f"{value / base:.3f}" if value and base else ""
            lines.append(f"| {length} | {name} | " + ("out of memory" if value is None else f"{value:.3f}")
                         + f" | {ratio} |")
            print(lines[-1], flush=True)
    lines += ["", "ratio: RoPE inside attention to the decoding kernel without rotation; the prefill kernel and the "
              "usual step (its keys rotated at insertion, not timed) to RoPE inside attention."]
    return "\n".join(lines) + "\n"


def check(args) -> None:
    """Every method once at a tiny size on the available device; the outputs agree."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.batch, args.heads, args.kv_heads, args.head_dim, args.window, length = 1, 4, 2, 32, 8, 48
    table = methods(args.window, args.leaky_scale)
    outputs = {}
    for name, (function, _) in table.items():
        q, k, v, positions, inv_freq = inputs(length, args, device, requires_grad=True)
        out = function(q, k, v, positions, inv_freq)
        out.float().sum().backward()
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v)), name
        outputs[name] = out.detach().float()
    def gap(a, b):
        return (outputs[a] - outputs[b]).abs().max().item()

    rope_gap, rerope_gap = gap("RoPE inside attention", "apply_rotary + SDPA"), gap(
        "ReRoPE inside attention", "ReRoPE reference (two S x S passes)")
    method_gap = gap("ReRoPE inside attention", "RoPE inside attention")
    print(f"largest differences: fused RoPE vs separate pass {rope_gap:.3g}, fused ReRoPE vs reference "
          f"{rerope_gap:.3g}, ReRoPE vs RoPE {method_gap:.3g}")
    assert max(rope_gap, rerope_gap) < method_gap / 10  # bfloat16 roundings, far below the methods' difference
    args.decode_batch = 2
    steps = {name: make_step(*inputs(length, args, device, batch=2, q_len=1))
             for name, (make_step, _) in decode_methods().items()}
    decoded = {name: step().float() for name, step in steps.items()}
    unrotated, rotated = (decoded[f"decode: {name}"] for name in (
        "RoPE inside attention, unrotated cache", "apply_rotary + SDPA, rotated cache"))
    decode_gap, rotation_effect = (unrotated - rotated).abs().max().item(), (
        unrotated - decoded["decode: kernel without rotation"]).abs().max().item()
    print(f"decoding: unrotated cache vs rotated cache {decode_gap:.3g}, "
          f"with vs without rotation {rotation_effect:.3g}")
    prefill_gap = (unrotated - decoded["decode: the prefill kernel on the same step"]).abs().max().item()
    assert max(decode_gap, prefill_gap) < rotation_effect / 10
    print("check: every method ran forward and backward; the fused kernels agree with their references")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**n for n in range(10, 18)])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--decode-batch", type=int, default=16, help="sequences in the decoding rows")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--leaky-scale", type=float, default=16.0)
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--check", action="store_true", help="run each method once at a tiny size, no timing")
    args = parser.parse_args(argv)
    if args.check:
        check(args)
        return 0
    if not torch.cuda.is_available():
        print("bench_attention.py needs a CUDA GPU (or --check)", file=sys.stderr)
        return 2
    text = run(args)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
