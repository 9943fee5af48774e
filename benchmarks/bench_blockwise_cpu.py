"""The blockwise attention on one CPU thread against torch's scaled_dot_product_attention.

    python benchmarks/bench_blockwise_cpu.py --out rope/data/bench_blockwise.md

For each sequence length S (one sequence, 32 query heads sharing 8 key heads, head_dim 128, causal
RoPE, float32 q, k and v) it times, on one thread (``--threads``):

* ``SDPA``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` on q
  and k rotated by :func:`rope.apply_rotary` and laid out ``[batch, heads, seq, dim]`` *outside* the
  timing: the attention alone, torch's own CPU kernel;
* ``rope float32``: :func:`rope.attention.blockwise.rotary_attention` on the unrotated inputs, its
  default float32 path (:mod:`rope.attention.blockwise_float32`), the exact rotation included;
* ``rope float64``: the same with ``compute_dtype=torch.float64``, the exact path (``--no-float64``
  leaves it out: it takes several times as long).

Rounds are interleaved (each round runs every contender once, in turn, after one warm-up round) and
the table gives each contender's median over the rounds and its ratio to SDPA's median: on a
shared machine, contenders measured side by side see the same load. ``--check`` runs each
contender once at a tiny size and compares the outputs, without timing: the test suite runs it so
that the script cannot rot. Timings are not tests: nothing asserts them.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
import time

import torch

import rope
from rope.attention.blockwise import rotary_attention

TITLE = "# The blockwise attention vs torch's SDPA (CPU, one thread)"


def contenders(q, k, v, positions, theta, float64: bool) -> dict:
    """name -> a call with no argument; SDPA's inputs are rotated and transposed here, before any timing."""
    q_rot, k_rot = rope.apply_rotary(q, k, positions, theta)
    q_t, k_t, v_t = (t.transpose(1, 2).contiguous() for t in (q_rot, k_rot, v))

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q_t, k_t, v_t, is_causal=True,
                                                                enable_gqa=True).transpose(1, 2)

    calls = {"SDPA": sdpa, "rope float32": lambda: rotary_attention(q, k, v, positions, positions, theta)}
    if float64:
        calls["rope float64"] = lambda: rotary_attention(q, k, v, positions, positions, theta,
                                                         compute_dtype=torch.float64)
    return calls


def inputs(length: int, args, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(args.batch, length, args.heads, args.head_dim, generator=gen)
    k = torch.randn(args.batch, length, args.kv_heads, args.head_dim, generator=gen)
    v = torch.randn(args.batch, length, args.kv_heads, args.head_dim, generator=gen)
    theta, _ = rope.inv_freq({"rope_theta": 10000.0}, args.head_dim)
    return q, k, v, torch.arange(length), theta


def measure(length: int, args) -> dict:
    """name -> the median seconds over ``args.rounds`` interleaved rounds (after one warm-up round)."""
    calls = contenders(*inputs(length, args), float64=not args.no_float64)
    times = {name: [] for name in calls}
    for round_ in range(args.rounds + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def provenance() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return (f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s); "
            f"torch {torch.__version__}; commit {commit or 'unknown'}; {datetime.date.today().isoformat()}")


def run(args) -> str:
    lines = [provenance(), "",
             f"Batch {args.batch}, {args.heads} query heads, {args.kv_heads} key heads, head_dim {args.head_dim}, "
             f"causal RoPE, float32 inputs; medians of {args.rounds} interleaved rounds.", "",
             "| S | mode | ms | / SDPA |", "| ---: | --- | ---: | ---: |"]
    for length in args.lengths:
        medians = measure(length, args)
        for name, seconds in medians.items():
            lines.append(f"| {length} | {name} | {seconds * 1e3:.1f} | {seconds / medians['SDPA']:.2f} |")
        print("\n".join(lines[-len(medians):]), flush=True)
    return "\n".join(lines)


def check(args) -> None:
    """Each contender once at a tiny size (two query blocks of the default 128), outputs compared."""
    args.batch, args.heads, args.kv_heads, args.head_dim = 1, 4, 2, 16
    calls = contenders(*inputs(200, args, seed=1), float64=True)
    outs = {name: call() for name, call in calls.items()}
    exact = outs["rope float64"]
    for name, out in outs.items():
        gap = (out.double() - exact).abs().max().item()
        print(f"{name}: {tuple(out.shape)} {out.dtype}, largest difference from float64 {gap:.1e}")
        if not gap <= 1e-5:
            raise SystemExit(f"{name} differs from the float64 path by {gap:.1e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--no-float64", action="store_true", help="leave out the exact float64 path")
    parser.add_argument("--out", help="also write the markdown table here")
    parser.add_argument("--check", action="store_true", help="run each contender once at a tiny size, no timing")
    args = parser.parse_args(argv)
    if args.check:  # untimed: the process's threads are left as they are
        check(args)
        return 0
    torch.set_num_threads(args.threads)
    table = run(args)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"{TITLE}\n\nWritten by `python benchmarks/bench_blockwise_cpu.py`. Compare ratios within one run: "
                    "on a shared machine the times of separate runs vary by tens of percent.\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
