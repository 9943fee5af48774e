"""rope's torch path against transformers' eager RoPE on the CPU, side by side in one run.

    python benchmarks/bench_torch_path.py                      # prints the markdown tables
    python benchmarks/bench_torch_path.py --out rope/data/bench_torch_path.md

Every contender rotates the same q and k (``[batch, seq, heads, head_dim]`` storage; transformers
reads them as ``[batch, heads, seq, head_dim]`` views, as its attention does) and returns new
tensors; "fwd+bwd" also back-propagates given output gradients into q and k:

* ``copy``: ``q.clone(), k.clone()``, the bytes every out-of-place rotation must move;
* ``transformers eager``: ``LlamaRotaryEmbedding`` (its tables computed per call, as a model's
  forward does: float32 angles, cos/sin in the model dtype) plus ``apply_rotary_pos_emb``;
* ``transformers compiled``: the same under ``torch.compile`` (``--compile``; skipped where it
  cannot compile);
* ``torchtune``: ``RotaryPositionalEmbeddings`` where torchtune is installed;
* ``rope``: :func:`rope.apply_rotary` with ``backend="torch"`` (exactly reduced angles, float64
  products, each output rounded once; the CPU kernel of :mod:`rope.cpu` where it builds).

Rows are the shapes of issue 27: a prefill, a smaller batch, and one decoding token at positions
4099 and 2^20 + 3. Times are medians over ``--rounds`` rounds in which the contenders take turns
(so that a slow phase of a shared machine hits all of them), each round starting with the next
contender (so that none always runs after the same one: fresh memory after another's large frees
page-faults), each after a warm-up; the tables give
each contender's time and its ratio to transformers eager (below 1 is faster), once with one thread
and once with all of torch's threads. A last table times a whole 4-layer float32 Llama forward,
with and without ``rope.hf.patch``. Timings are not tests: nothing asserts them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time

import torch

import rope
import rope.cpu.build

# (batch, seq, heads_q, heads_k, head_dim, first position)
SHAPES = [(1, 2048, 32, 8, 128, 0), (4, 512, 16, 16, 64, 0), (1, 1, 32, 8, 128, 4099), (1, 1, 32, 8, 128, 2**20 + 3)]
DTYPES = [torch.float32, torch.bfloat16]
PASSES = ["fwd", "fwd+bwd"]


def _transformers_eager(head_dim: int, positions: torch.Tensor):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    module = LlamaRotaryEmbedding(LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim))
    position_ids = positions[None]

    def eager(q, k):
        cos, sin = module(q, position_ids)
        q_out, k_out = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    return eager


def _torchtune(head_dim: int, positions: torch.Tensor):
    try:
        from torchtune.modules import RotaryPositionalEmbeddings
    except ImportError:
        return None
    module = RotaryPositionalEmbeddings(head_dim, max_seq_len=int(positions.max()) + 1)
    input_pos = positions[None]
    return lambda q, k: (module(q, input_pos=input_pos), module(k, input_pos=input_pos))


def contenders(head_dim: int, positions: torch.Tensor, compile_eager: bool) -> dict:
    """The rotations timed for one row: name -> fn(q, k) -> (q_out, k_out)."""
    theta, _ = rope.inv_freq({}, head_dim)
    eager = _transformers_eager(head_dim, positions)
    found = {
        "copy": lambda q, k: (q.clone(), k.clone()),
        "transformers eager": eager,
        "rope": lambda q, k: rope.apply_rotary(q, k, positions, theta, backend="torch"),
    }
    if (tune := _torchtune(head_dim, positions)) is not None:
        found["torchtune"] = tune
    if compile_eager:
        torch._dynamo.reset()  # a row's own compilations (dtypes, passes) below the recompile limit
        try:
            compiled = torch.compile(eager, dynamic=False)
            probe = torch.randn(1, positions.numel(), 2, head_dim)
            compiled(probe, probe)
            found["transformers compiled"] = compiled
        except Exception as err:  # no C++ compiler, or an unsupported platform: reported, not fatal
            print(f"torch.compile skipped: {type(err).__name__}: {err}")
    return found


def _step(fn, q, k, grads):
    """One call, and with ``grads`` its backward into q and k."""
    if grads is None:
        with torch.no_grad():
            return fn(q, k)
    q.grad = k.grad = None
    outs = fn(q, k)
    torch.autograd.backward(outs, grads)
    return outs


def time_row(found: dict, q, k, grads, rounds: int) -> dict:
    """Median seconds per contender over ``rounds`` rounds of one call each (decoding rows: 200
    calls, timed together), the contenders taking turns within a round."""
    calls = 200 if q.shape[1] == 1 else 1
    samples = {name: [] for name in found}
    for fn in found.values():  # warm-up
        for _ in range(3):
            _step(fn, q, k, grads)
    names = list(found)
    for round_ in range(rounds):
        # each round starts one contender later: none always follows the same one (a contender
        # that frees much memory makes the next one's fresh allocations page-fault)
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            fn = found[name]
            start = time.perf_counter()
            for _ in range(calls):
                _step(fn, q, k, grads)
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(times) for name, times in samples.items()}


def rotation_table(threads: int, rounds: int, compile_eager: bool) -> list[str]:
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    names = None
    lines = []
    for batch, seq, heads_q, heads_k, head_dim, first in SHAPES:
        positions = torch.arange(seq) + first
        found = contenders(head_dim, positions, compile_eager)
        if names is None:
            names = [n for n in found if n != "transformers eager"]
            lines += ["| shape (b, s, hq/hk, d), first position | pass | dtype | transformers eager ms | "
                      + " | ".join(f"{n} / eager" for n in names) + " |",
                      "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in names) + " |"]
        for pass_ in PASSES:
            for dtype in DTYPES:
                q = torch.randn(batch, seq, heads_q, head_dim, generator=gen).to(dtype)
                k = torch.randn(batch, seq, heads_k, head_dim, generator=gen).to(dtype)
                grads = None
                if pass_ == "fwd+bwd":
                    q.requires_grad_(), k.requires_grad_()
                    grads = tuple(torch.randn(x.shape, generator=gen).to(dtype) for x in (q, k))
                times = time_row(found, q, k, grads, rounds)
                eager = times["transformers eager"]
                ratios = " | ".join(f"{times[n] / eager:.2f}" if n in times else "-" for n in names)
                lines.append(f"| ({batch}, {seq}, {heads_q}/{heads_k}, {head_dim}), {first} | {pass_} | "
                             f"{str(dtype).removeprefix('torch.')} | {eager * 1e3:.3f} | {ratios} |")
    return lines


def model_table(threads: int, rounds: int) -> list[str]:
    """A 4-layer float32 Llama forward (batch 1, 512 tokens), transformers' own RoPE against
    rope.hf.patch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=128)
    model = LlamaForCausalLM(config).eval()
    tokens = torch.randint(0, 1000, (1, 512), generator=torch.Generator().manual_seed(1))

    def forward(_q=None, _k=None):
        with torch.no_grad():
            return model(tokens).logits, None

    samples = {"transformers": [], "rope.hf.patch": []}
    for _ in range(rounds):
        for name in samples:
            with contextlib.ExitStack() as stack:
                if name == "rope.hf.patch":
                    rope.hf.patch(model)
                    stack.callback(rope.hf.unpatch, model)
                forward()
                start = time.perf_counter()
                forward()
                samples[name].append(time.perf_counter() - start)
    base, patched = (statistics.median(samples[n]) for n in samples)
    return ["| model | transformers ms | rope.hf.patch ms | patched / transformers |", "| --- | ---: | ---: | ---: |",
            f"| Llama, 4 layers, float32, 512 tokens | {base * 1e3:.1f} | {patched * 1e3:.1f} | {patched / base:.2f} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--compile", action="store_true", help="also time transformers under torch.compile")
    parser.add_argument("--out", default=None, help="also write the markdown tables to this file")
    args = parser.parse_args()
    all_threads = torch.get_num_threads()
    kernel = rope.cpu.build.unavailable_reason() or "loaded"
    text = [f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}; "
            f"median of {args.rounds} interleaved rounds; rope's CPU kernel (rope.cpu): {kernel}.", ""]
    for threads in sorted({1, all_threads}):
        text += [f"### {threads} thread{'s' if threads > 1 else ''}", ""]
        text += rotation_table(threads, args.rounds, args.compile) + [""]
        text += model_table(threads, max(3, args.rounds // 3)) + [""]
    table = "\n".join(text)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# rope's torch path vs transformers' eager RoPE (CPU)\n\n"
                    "Written by `python benchmarks/bench_torch_path.py`. Ratios are measured side by side in one run "
                    "(time / transformers eager time; below 1 is faster); compare ratios, not times, across runs.\n\n"
                    + table + "\n")


if __name__ == "__main__":
    main()
