"""Side-by-side RoPE benchmark on one GPU: forward and backward, bf16, q and k together.

    python benchmarks/bench_rotary.py [--out rope/data/bench_rotary.md]

For each shape (batch, seq, heads_q, heads_k, head_dim) every contender is timed in the same run:

* ``copy``: a device-to-device copy of the same bytes (q and k read once, written once): the ceiling;
* ``hf eager``: transformers' ``apply_rotary_pos_emb`` (cos/sin tables precomputed, not timed);
* ``hf compile``: ``torch.compile`` of the same function;
* ``liger``: Liger-Kernel's ``LigerRopeFunction`` when importable (it rotates in place);
* ``flash-attn``: flash-attention's Triton rotary (``flash_attn.layers.rotary.apply_rotary_emb``,
  one call for q and one for k, out of place) when importable;
* ``rope``: this package's fused kernel (:mod:`rope.kernels.operators`), out of place;
* ``rope in place``: the same kernel writing into q and k (``torch.ops.rope.rotary_``), and in
  the backward row the conjugate rotation written into two gradient-sized buffers, the kernel
  work of an in-place backward: the like-for-like comparison with Liger, which rotates in place
  both ways. rope's autograd never writes into the incoming gradient (autograd may share it
  with another op, whose gradient would then be corrupted), so that row is the kernel alone.

Each call is captured ten times in a CUDA graph and the graph replayed, so the numbers are device
time without Python launch overhead. Reported: GB/s counting q and k read plus written, and that
bandwidth as a fraction of the copy's. Backward is timed as ``torch.autograd.grad`` of the
outputs (for ``rope`` that is the conjugate rotation kernel).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import platform

import torch
import triton

import rope

SHAPES = [
    (4, 4096, 32, 32, 128),
    (4, 4096, 32, 8, 128),
    (1, 32768, 32, 8, 128),
    (16, 1024, 64, 8, 128),
    (1, 2048, 32, 8, 128),
    (256, 1, 32, 8, 128),
]
CALLS_PER_GRAPH = 10
COLUMNS = ["copy", "hf eager", "hf compile", "liger", "flash-attn", "rope", "rope in place"]


_STREAM: list[torch.cuda.Stream] = []


def capture_stream() -> torch.cuda.Stream:
    """The one side stream every forward of a timed backward and every capture runs on: autograd
    replays a backward op on its forward op's stream, which must be the capturing stream."""
    if not _STREAM:
        _STREAM.append(torch.cuda.Stream())
    return _STREAM[0]


def graph_time_ms(fn, replays: int = 20) -> float:
    """Median device time of one call of ``fn``, from replays of a graph holding CALLS_PER_GRAPH calls."""
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: compilation, autotuning, lazy initialisation
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS_PER_GRAPH)
    return sorted(times)[len(times) // 2]


def hf_apply(q, k, cos, sin):
    """transformers' Llama formula on [batch, seq, heads, dim] tensors (unsqueeze_dim=2)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)


def contenders(q, k, positions, theta, cos, sin):
    """name -> (forward fn, backward fn or None)."""
    def with_grad(forward):
        qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
        stream = capture_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            outs = forward(qg, kg)
            grads = tuple(o.detach().clone() for o in outs)  # random data, made outside any capture
        torch.cuda.current_stream().wait_stream(stream)
        return lambda: torch.autograd.grad(outs, (qg, kg), grads, retain_graph=True)

    out = {}
    both = torch.cat([q.reshape(-1), k.reshape(-1)])
    both_copy = torch.empty_like(both)
    copy = lambda: both_copy.copy_(both)  # noqa: E731
    out["copy"] = (copy, copy)  # timed again beside the backward passes
    if importlib.util.find_spec("transformers"):
        out["hf eager"] = (lambda: hf_apply(q, k, cos, sin), with_grad(lambda a, b: hf_apply(a, b, cos, sin)))
        compiled = torch.compile(hf_apply, fullgraph=True)
        out["hf compile"] = (lambda: compiled(q, k, cos, sin), with_grad(lambda a, b: compiled(a, b, cos, sin)))
    if importlib.util.find_spec("liger_kernel"):
        from liger_kernel.ops.rope import LigerRopeFunction

        def liger(a, b):
            return LigerRopeFunction.apply(a.transpose(1, 2), b.transpose(1, 2), cos, sin)

        q_l, k_l = q.clone(), k.clone()
        out["liger"] = (lambda: liger(q_l, k_l), with_grad(lambda a, b: liger(a.clone(), b.clone())))
    if importlib.util.find_spec("flash_attn"):
        from flash_attn.layers.rotary import apply_rotary_emb

        half = cos.shape[-1] // 2
        cos_fa, sin_fa = cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()  # [seq, rotary_dim / 2]

        def flash(a, b):
            return apply_rotary_emb(a, cos_fa, sin_fa), apply_rotary_emb(b, cos_fa, sin_fa)

        out["flash-attn"] = (lambda: flash(q, k), with_grad(flash))
    ours = lambda a, b: rope.apply_rotary(a, b, positions, theta, backend="triton")  # noqa: E731
    out["rope"] = (lambda: ours(q, k), with_grad(ours))
    import rope.kernels.operators  # registers torch.ops.rope.rotary_

    q_i, k_i = q.clone(), k.clone()

    def in_place():
        torch.ops.rope.rotary_(q=q_i, k=k_i, positions=positions, inv_freq=theta, interleaved=False,
                               rotary_dim=q.shape[-1], scale=1.0, conjugate=False)

    grad_q, grad_k = q.clone(), k.clone()

    def conjugate_in_place():
        torch.ops.rope.rotary_(q=grad_q, k=grad_k, positions=positions, inv_freq=theta, interleaved=False,
                               rotary_dim=q.shape[-1], scale=1.0, conjugate=True)

    out["rope in place"] = (in_place, conjugate_in_place)
    return out


def launch_sizes() -> str:
    """The launch sizes the autotuner chose for the kernel's last launch (the last rope contender)."""
    from rope.kernels import triton_rotary

    config = triton_rotary.tuned_kernel.best_config
    return ", ".join(f"{name}={value}" for name, value in config.kwargs.items()) + f", num_warps={config.num_warps}"


def run(shapes, out_path: str | None) -> str:
    torch._dynamo.config.recompile_limit = 64  # one compiled graph per shape and pass
    device = torch.cuda.get_device_name()
    theta, _ = rope.inv_freq({"rope_theta": 500000.0}, 128)
    theta = theta.cuda()
    lines = [
        f"# RoPE forward and backward, bf16, {device}",
        "",
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC with torch {torch.__version__}, "
        f"triton {triton.__version__}, Python {platform.python_version()}, by `python benchmarks/bench_rotary.py`.",
        "GB/s counts q and k read once and written once; `frac` is that bandwidth over the device-to-device",
        "copy of the same bytes in the same run (1.00 = as fast as a copy). Device time from CUDA graph replays.",
        "",
        "| shape (b, s, hq, hk, d) | pass | " + " | ".join(COLUMNS) + " |",
        "| --- | --- | " + " | ".join(["---"] * len(COLUMNS)) + " |",
    ]
    picks = []
    for batch, seq, heads_q, heads_k, head_dim in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, seq, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, seq, heads_k, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        positions = torch.arange(seq, device="cuda") + 1000
        embedding = rope.hf.RotaryEmbedding(rope_parameters={"rope_theta": 500000.0}, head_dim=head_dim).cuda()
        cos, sin = embedding(q, positions[None].expand(batch, seq))
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        results = {}
        for name, (forward, backward) in contenders(q, k, positions, theta, cos, sin).items():
            for pass_name, fn in (("fwd", forward), ("bwd", backward)):
                if fn is None:
                    continue
                try:
                    results[name, pass_name] = nbytes / graph_time_ms(fn) / 1e6
                except Exception as err:  # a peer that fails on a shape is reported, not fatal
                    print(f"{name} {pass_name} failed: {type(err).__name__}: {err}")
        picks.append(f"- {batch}, {seq}, {heads_q}, {heads_k}, {head_dim}: {launch_sizes()}")
        for pass_name in ("fwd", "bwd"):
            ceiling = results.get(("copy", pass_name))
            cells = []
            for name in COLUMNS:
                gbps = results.get((name, pass_name))
                cells.append("n/a" if gbps is None else f"{gbps:.0f} GB/s ({gbps / ceiling:.2f})")
            row = f"| {batch}, {seq}, {heads_q}, {heads_k}, {head_dim} | {pass_name} | " + " | ".join(cells) + " |"
            lines.append(row)
            print(row, flush=True)
    lines += ["", "The autotuner's launch sizes for rope (fwd and bwd share them):", "", *picks]
    text = "\n".join(lines) + "\n"
    if out_path:
        with open(out_path, "w") as f:
            f.write(text)
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="only the first and last shape")
    args = parser.parse_args()
    print(run([SHAPES[0], SHAPES[-1]] if args.quick else SHAPES, args.out))
