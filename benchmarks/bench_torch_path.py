"""rope's torch path against transformers' eager RoPE on the CPU, side by side in one run.

    python benchmarks/bench_torch_path.py                   # prints a markdown table
    python benchmarks/bench_torch_path.py --out rope/data/bench_torch_path.md --threads 1

Every contender rotates the same q and k (``[batch, seq, heads, head_dim]`` storage; transformers
reads them as ``[batch, heads, seq, head_dim]`` views, as its attention does) and returns new
tensors:

* ``copy``: ``q.clone(), k.clone()``, the bytes every out-of-place rotation must move;
* ``transformers eager``: ``LlamaRotaryEmbedding`` (float32 angles, cos/sin in the model dtype)
  plus ``apply_rotary_pos_emb``, the recipe most models run;
* ``transformers compiled``: the same under ``torch.compile`` (skipped if it cannot compile here);
* ``rope torch``: :func:`rope.apply_rotary` with ``backend="torch"`` (exact angles, float64
  products, one rounding);
* ``rope float32 route``: the same with float64 switched off, as on devices without float64.

Times are the median of ``--repeat`` runs after a warm-up; the table reports each contender's time
and its ratio to transformers eager (below 1 is faster). Timings are not tests: nothing asserts
them.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import rope
import rope.apply

SHAPES = [(1, 2048, 32, 8, 128), (8, 1, 32, 8, 128)]  # (batch, seq, heads_q, heads_k, head_dim): prefill, decode
DTYPES = [torch.float32, torch.bfloat16]


def _median_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _transformers_contenders(head_dim: int, positions: torch.Tensor):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim)
    module = LlamaRotaryEmbedding(config)
    position_ids = positions[None]

    def eager(q, k):
        cos, sin = module(q, position_ids)
        return apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)

    return eager


def _contenders(head_dim: int, positions: torch.Tensor, theta: torch.Tensor):
    eager = _transformers_contenders(head_dim, positions)
    contenders = {
        "copy": lambda q, k: (q.clone(), k.clone()),
        "transformers eager": eager,
        "rope torch": lambda q, k: rope.apply_rotary(q, k, positions, theta, backend="torch"),
        "rope float32 route": _float32_route(positions, theta),
    }
    try:
        compiled = torch.compile(eager)
        q = torch.randn(1, positions.numel(), 2, head_dim)
        compiled(q, q)
        contenders["transformers compiled"] = compiled
    except Exception as err:  # no C++ compiler, or an unsupported platform: reported, not fatal
        print(f"torch.compile skipped: {type(err).__name__}: {err}")
    return contenders


def _float32_route(positions, theta):
    def run(q, k):
        saved = rope.apply.has_float64
        rope.apply.has_float64 = lambda device: False
        try:
            return rope.apply_rotary(q, k, positions, theta, backend="torch")
        finally:
            rope.apply.has_float64 = saved

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    lines = [
        f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
        f"torch {torch.__version__}; median of {args.repeat} runs.",
        "",
        "| shape (b, s, hq, hk, d) | dtype | contender | ms | / transformers eager |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for batch, seq, heads_q, heads_k, head_dim in SHAPES:
        positions = torch.arange(seq) + 1000
        theta, _ = rope.inv_freq({}, head_dim)
        contenders = _contenders(head_dim, positions, theta)
        for dtype in DTYPES:
            q = torch.randn(batch, seq, heads_q, head_dim, generator=gen).to(dtype)
            k = torch.randn(batch, seq, heads_k, head_dim, generator=gen).to(dtype)
            times = {name: _median_seconds(lambda fn=fn: fn(q, k), args.repeat) for name, fn in contenders.items()}
            for name, seconds in times.items():
                ratio = seconds / times["transformers eager"]
                lines.append(f"| {batch, seq, heads_q, heads_k, head_dim} | {str(dtype).removeprefix('torch.')} "
                             f"| {name} | {seconds * 1e3:.2f} | {ratio:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# rope's torch path vs transformers' eager RoPE (CPU)\n\n"
                    "Written by `python benchmarks/bench_torch_path.py`. Compare ratios within one run: on a shared "
                    "machine the times of separate runs vary by tens of percent.\n\n" + table + "\n")


if __name__ == "__main__":
    main()
