"""Every kernel variant once against the library's float64 references: the GPU check's smoke step.

    python benchmarks/gpu_smoke.py [--tiny] [--out smoke.md]

Rotary kernel (``rope.apply_rotary(..., backend="triton")``, ``torch.ops.rope.rotary_``,
``rope.kernels.triton_rotary.launch``): both layouts, float32/float16/bfloat16/float64, each of
the three maths (float32, float-float, float64) on the dtypes that take it by default or on
request, partial rotary over a padded width, GQA, in place, the conjugate rotation and the
backward (autograd: dx = s R^T dy), the decode shape (one token per sequence) and M-RoPE. Each
output is held to the kernel's promise (rope/kernels/triton_rotary.py) against the exact rotation,
the torch path on float64 inputs (exactly reduced angles, within 2^-50 of exact): the rounding of
a value within Delta of it, so ``|out - ref| <= ulp/2 + 2 Delta + 2^-50 |pair|``, with Delta =
6 2^-24 |pair| (float32 math), 2^-43 |pair| (float-float math) or 2^-51 |pair| (float64 math),
``|pair| <= s sqrt(2) max|x|``.

Attention kernels (``rope.kernels.attention_operators.fused_rotary_attention``): RoPE, ReRoPE
and Leaky ReRoPE, causal and not, forward and backward, and decoding (one query per sequence,
the decoding kernel), against float64 autograd through ``rope.attention.blockwise.rotary_attention``
on the CPU. Bounds as tests/test_fused_attention.py: the output within ``4 (16 u + 2^-24 L) max|v|``
(u the unit roundoff, L the largest possible logit), each gradient within ``32 u max|g|`` (float32)
or ``4 u max|g|`` (bfloat16). At the float limits (tests/test_attention_limits.py): softmax_scale
1e37, whose scaled logits are beyond float32's range, gives the hard maximum bit for bit in the
prefill and decoding kernels, and the backward at 1e30 no NaN; float16 q and k up to 65000 (rotated
operands beyond float16's range, prescaled) stay within float16's rounding of the reference; logits
beyond float32's range are recomputed in float64 (rope.kernels.triton_attention_repair), within an
ulp of the reference, and on CUDA an ordinary call captured in a CUDA graph replays bit for bit.

Prints a table (case, reference, worst error over its bound, result); exit status 1 if any case
fails. Without CUDA it runs in Triton's interpreter on the CPU (``--tiny`` sizes), which is how
the test suite keeps it from rotting (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from functools import partial

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any module holding @triton.jit is imported

import rope
import rope.kernels.operators  # registers torch.ops.rope.rotary_
from rope.attention.blockwise import rotary_attention
from rope.kernels import triton_rotary
from rope.kernels.attention_operators import fused_rotary_attention

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers import ulp  # the suite's: the spacing of a dtype's numbers at |x|

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
UNIT = {torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
GRADIENT_SLACK = {torch.bfloat16: 4, torch.float32: 32}


def sizes(tiny: bool) -> dict:
    """The problem sizes: a few programs in the interpreter, a few thousand tokens on a GPU."""
    if tiny:
        return dict(batch=2, seq=5, heads_q=4, heads_k=2, head_dim=16, q_len=12, k_len=19, attn_dim=16)
    return dict(batch=2, seq=777, heads_q=8, heads_k=2, head_dim=128, q_len=200, k_len=333, attn_dim=64)


def rotary_ratio(out: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, arithmetic: str | None = None,
                 factor: float = 1.0):
    """Worst |out - ref| over the bound (module docstring) of the kernel's ``arithmetic`` (None: the
    math ``launch`` takes for x's dtype); at most 1 passes, NaN fails."""
    arithmetic = arithmetic or triton_rotary.default_math(x.dtype)
    pair = factor * 2**0.5 * x.to("cpu", torch.float64).abs().amax(-1, keepdim=True)
    if arithmetic == "float64":
        delta = 2.0**-51 * pair + 2.0**-1070 * factor
    elif arithmetic == "float-float":
        delta = 2.0**-43 * pair + 2.0**-145 * max(1.0, factor)
    else:
        delta = 6 * 2.0**-24 * pair + 2.0**-148 * max(1.0, factor)
    reference_error = 2.0**-50 * pair
    bound = 0.5 * ulp(ref.abs() + reference_error, out.dtype) + 2 * delta + reference_error
    return ((out.to("cpu", torch.float64) - ref).abs() / bound).max().item()


def exact(x, positions, theta, **options):
    """The torch path on float64 x: the exact rotation to 2^-50 (rope/apply.py)."""
    return rope.apply_rotary(x.double(), x.double(), positions, theta, backend="torch", **options)[0].cpu()


def inputs(s, dtype, seed, *, seq=None, batch=None, head_dim=None, heads_k=None):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch or s["batch"], seq or s["seq"])
    q = torch.randn(*shape, s["heads_q"], head_dim or s["head_dim"], generator=gen, dtype=torch.float64)
    k = torch.randn(*shape, heads_k or s["heads_k"], head_dim or s["head_dim"], generator=gen, dtype=torch.float64)
    positions = torch.randint(0, 2**31 - 1, shape, generator=gen)  # every row its own, up to the kernel's bound
    return q.to(dtype).to(DEVICE), k.to(dtype).to(DEVICE), positions.to(DEVICE)


def theta_for(width: int, device=DEVICE) -> torch.Tensor:
    return rope.inv_freq({"rope_theta": 10000.0}, width)[0].to(device)


def rotary_cases(s):
    """name -> function returning the worst error-over-bound of that case."""
    cases = {}

    def out_of_place(dtype, layout, seed, factor=1.0):
        def run():
            q, k, positions = inputs(s, dtype, seed)
            theta = theta_for(s["head_dim"])
            q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, attention_factor=factor,
                                             backend="triton")
            return max(rotary_ratio(q_out, exact(q, positions, theta, layout=layout, attention_factor=factor), q,
                                    factor=factor),
                       rotary_ratio(k_out, exact(k, positions, theta, layout=layout, attention_factor=factor), k,
                                    factor=factor))
        return run

    for layout in ("half", "interleaved"):
        for name, dtype in DTYPES.items():
            cases[f"rotary {layout} {name}, GQA"] = out_of_place(dtype, layout, seed=len(cases))
    cases["rotary half bf16, attention factor 1.5"] = out_of_place(torch.bfloat16, "half", 20, factor=1.5)
    cases["rotary interleaved fp16, attention factor 0.3"] = out_of_place(torch.float16, "interleaved", 21, factor=0.3)

    def launcher(dtype, float64_math, seed):
        def run():
            q, k, positions = inputs(s, dtype, seed)
            theta = theta_for(s["head_dim"])
            q_out, k_out = torch.empty_like(q), torch.empty_like(k)
            triton_rotary.launch(q, k, q_out, k_out, positions, theta, interleaved=False, rotary_dim=s["head_dim"],
                                 scale=1.0, conjugate=False, float64_math=float64_math)
            arithmetic = triton_rotary.default_math(dtype, float64_math)
            return max(rotary_ratio(q_out, exact(q, positions, theta), q, arithmetic),
                       rotary_ratio(k_out, exact(k, positions, theta), k, arithmetic))
        return run

    cases["rotary fp32, float64_math on"] = launcher(torch.float32, True, 30)
    cases["rotary fp32, float64_math off"] = launcher(torch.float32, False, 31)
    cases["rotary bf16, float64_math off (float32 math)"] = launcher(torch.bfloat16, False, 32)
    cases["rotary bf16, float64_math on"] = launcher(torch.bfloat16, True, 33)
    cases["rotary fp16, float64_math on"] = launcher(torch.float16, True, 34)
    cases["rotary bf16, float-float math (default)"] = launcher(torch.bfloat16, None, 35)

    def partial_rotary(layout):
        def run():  # head_dim 40 rotated over 24: padded pair blocks and a pass-through tail
            q, k, positions = inputs(s, torch.bfloat16, 40, head_dim=40)
            theta = theta_for(24)
            q_out, _ = rope.apply_rotary(q, k, positions, theta, layout=layout, rotary_dim=24, backend="triton")
            return rotary_ratio(q_out, exact(q, positions, theta, layout=layout, rotary_dim=24), q)
        return run

    cases["rotary partial 24 of 40, half"] = partial_rotary("half")
    cases["rotary partial 24 of 40, interleaved"] = partial_rotary("interleaved")

    def in_place(layout):
        def run():  # rotary_ writes exactly what the out-of-place kernel returns
            q, k, positions = inputs(s, torch.bfloat16, 50)
            theta = theta_for(s["head_dim"])
            q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, backend="triton")
            torch.ops.rope.rotary_(q=q, k=k, positions=positions, inv_freq=theta, interleaved=layout == "interleaved",
                                   rotary_dim=s["head_dim"], scale=1.0, conjugate=False)
            return 0.0 if torch.equal(q, q_out) and torch.equal(k, k_out) else math.inf
        return run

    cases["rotary_ in place, half (bit for bit)"] = in_place("half")
    cases["rotary_ in place, interleaved (bit for bit)"] = in_place("interleaved")

    def conjugate(dtype):
        def run():
            q, k, positions = inputs(s, dtype, 60)
            theta = theta_for(s["head_dim"])
            q_out, _ = rope.apply_rotary(q, k, positions, theta, conjugate=True, backend="triton")
            return rotary_ratio(q_out, exact(q, positions, theta, conjugate=True), q)
        return run

    cases["rotary conjugate fp32"] = conjugate(torch.float32)
    cases["rotary conjugate bf16"] = conjugate(torch.bfloat16)

    def backward(dtype, layout):
        def run():  # d(s R x) = s R^T dy: the conjugate rotation of the incoming gradient
            q, k, positions = inputs(s, dtype, 70)
            theta = theta_for(s["head_dim"])
            leaf = q.detach().clone().requires_grad_()
            grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(71), dtype=torch.float64)
            grad_out = grad_out.to(dtype).to(DEVICE)
            out, _ = rope.apply_rotary(leaf, k, positions, theta, layout=layout, backend="triton")
            grad, = torch.autograd.grad(out, leaf, grad_out)
            return rotary_ratio(grad, exact(grad_out, positions, theta, layout=layout, conjugate=True), grad_out)
        return run

    cases["rotary backward fp32, half"] = backward(torch.float32, "half")
    cases["rotary backward bf16, interleaved"] = backward(torch.bfloat16, "interleaved")

    def decode(dtype):
        def run():  # seq 1, a batch of sequences, MQA: the launcher folds the batch into tokens
            q, k, positions = inputs(s, dtype, 80, seq=1, batch=5, heads_k=1)
            theta = theta_for(s["head_dim"])
            q_out, k_out = rope.apply_rotary(q, k, positions, theta, backend="triton")
            return max(rotary_ratio(q_out, exact(q, positions, theta), q),
                       rotary_ratio(k_out, exact(k, positions, theta), k))
        return run

    cases["rotary decode (5 sequences x 1 token, MQA) fp32"] = decode(torch.float32)
    cases["rotary decode (5 sequences x 1 token, MQA) bf16"] = decode(torch.bfloat16)

    def mrope(dtype, layout, seq):
        def run():
            q, k, _ = inputs(s, dtype, 90, seq=seq)
            gen = torch.Generator().manual_seed(91)
            position_ids = torch.randint(0, 2**31 - 1, (3, q.shape[0], seq), generator=gen).to(DEVICE)
            pairs = s["head_dim"] // 2
            section = [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]
            axes = rope.mrope.section_axes(section, pairs, style="interleaved")
            theta = theta_for(s["head_dim"])
            q_out, k_out = rope.apply_mrope(q, k, position_ids, theta, axes, layout=layout, backend="triton")

            def reference(x):
                return rope.apply_mrope(x.double(), x.double(), position_ids, theta, axes, layout=layout,
                                        backend="torch")[0].cpu()
            return max(rotary_ratio(q_out, reference(q), q), rotary_ratio(k_out, reference(k), k))
        return run

    cases["M-RoPE fp32, half"] = mrope(torch.float32, "half", s["seq"])
    cases["M-RoPE bf16, interleaved"] = mrope(torch.bfloat16, "interleaved", s["seq"])
    cases["M-RoPE decode bf16"] = mrope(torch.bfloat16, "half", 1)
    return cases


def attention_cases(s):
    """name -> function returning the worst error-over-bound of output and gradients."""
    modes = {"RoPE": {}, "ReRoPE": {"window": 5}, "Leaky ReRoPE": {"window": 5, "leaky_scale": 16.0}}

    def run_case(dtype, options, seed, q_len, causal=True):
        gen = torch.Generator().manual_seed(seed)
        batch, heads_q, heads_k, d, k_len = 1, s["heads_q"], s["heads_k"], s["attn_dim"], s["k_len"]
        q, k, v, grad_out = (torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype) for shape in (
            (batch, q_len, heads_q, d), (batch, k_len, heads_k, d), (batch, k_len, heads_k, d),
            (batch, q_len, heads_q, d)))
        k_positions = torch.arange(k_len) + 3
        q_positions = k_positions[-q_len:]  # the last q_len keys' positions: every causal row sees a key
        theta = theta_for(d, "cpu")
        leaves = [t.to(DEVICE).requires_grad_() for t in (q, k, v)]
        out = fused_rotary_attention(*leaves, q_positions.to(DEVICE), k_positions.to(DEVICE), theta.to(DEVICE),
                                     causal=causal, **options)
        grads = torch.autograd.grad(out, leaves, grad_out.to(DEVICE))
        exact_leaves = [t.double().requires_grad_() for t in (q, k, v)]
        expected = rotary_attention(*exact_leaves, q_positions, k_positions, theta, causal=causal, **options)
        expected_grads = torch.autograd.grad(expected, exact_leaves, grad_out.double())
        largest = q.double().norm(dim=-1).max().item() * k.double().norm(dim=-1).max().item() / math.sqrt(d)
        unit = UNIT[dtype]
        out_bound = 4 * v.double().abs().max().item() * (16 * unit + 2.0**-24 * largest + 2 * unit * largest * (
            dtype != torch.float32))  # bfloat16: the rotated operands rounded, u |logit| each
        ratios = [(out.detach().cpu().double() - expected).abs().max().item() / out_bound]
        for g, e in zip(grads, expected_grads):
            bound = GRADIENT_SLACK[dtype] * unit * e.abs().max().item()
            ratios.append((g.cpu().double() - e).abs().max().item() / bound)
        return max(ratios)

    cases = {}
    for seed, (name, options) in enumerate(modes.items()):
        cases[f"attention {name} causal fp32, fwd+bwd"] = partial(run_case, torch.float32, options, seed, s["q_len"])
        cases[f"attention decoding (1 query) {name} fp32, fwd+bwd"] = partial(run_case, torch.float32, options,
                                                                               20 + seed, 1)
    cases["attention RoPE non-causal fp32, fwd+bwd"] = partial(run_case, torch.float32, {}, 10, s["q_len"], False)
    cases["attention Leaky ReRoPE causal bf16, fwd+bwd"] = partial(run_case, torch.bfloat16, modes["Leaky ReRoPE"],
                                                                   11, s["q_len"])

    def huge_scale(dtype, options):
        """softmax_scale 1e37 (accepted: log2(e) s is within float32's range), logits of tens: every scaled
        logit beyond float32's range, the exact output the hard maximum (integer values: bit for bit) in the
        prefill and the decoding kernels; then the backward at 1e30 (finite LSEs of about 1e31) without NaN.
        0 when all holds, inf otherwise (tests/test_attention_limits.py)."""
        from rope.kernels.triton_attention import launch
        from rope.kernels.triton_attention_backward import launch_backward
        from rope.kernels.triton_attention_decode import launch_decode

        gen = torch.Generator().manual_seed(30)
        q = 3 * torch.randn(1, 4, 2, 16, generator=gen, dtype=torch.float64)
        k = 3 * torch.randn(1, 40, 1, 16, generator=gen, dtype=torch.float64)
        q[:, 0] = -2 * k[:, 0]  # the first query sees only key 0, at logit -2 |k_0|^2
        v = torch.randint(-8, 9, (1, 40, 1, 16), generator=gen).double()
        q_positions, k_positions, theta = torch.tensor([0, 11, 26, 39]), torch.arange(40), theta_for(12, "cpu")
        exact = rotary_attention(q, k, v, q_positions, k_positions, theta, softmax_scale=1e300, **options)
        inputs = [t.to(DEVICE) for t in (q.to(dtype), k.to(dtype), v.to(dtype), q_positions, k_positions, theta)]
        outs = [launch(*inputs, softmax_scale=1e37, **options)[0],
                launch_decode(*inputs, softmax_scale=1e37, splits=3, **options)[0]]
        ok = all(torch.equal(out.cpu().double(), exact) for out in outs)
        inputs[0][:, 0] = -inputs[0][:, 0]  # logit +2 |k_0|^2: every LSE finite at 1e30
        out, lse = launch(*inputs, softmax_scale=1e30, **options)
        grads = launch_backward(*inputs, out, lse, torch.ones_like(out), softmax_scale=1e30, **options)
        ok = ok and bool(lse.isfinite().all()) and not any(bool(g.isnan().any()) for g in grads)
        return 0.0 if ok else math.inf

    for dtype_name in ("fp16", "bf16", "fp32"):
        for name in ("RoPE", "ReRoPE"):
            cases[f"attention {name} softmax_scale 1e37 {dtype_name}, hard maximum + bwd at 1e30"] = partial(
                huge_scale, DTYPES[dtype_name], modes[name])

    def largest_float16(options, attention_factor):
        """float16 q, k up to 65000 (turned pairs beyond float16's range: the prescaled operands), softmax_scale
        1e-9: prefill, decoding and backward finite and within float16's rounding of the operands of the
        float64 reference (the worst error over that bound, as tests/test_attention_limits.py)."""
        from rope.kernels.triton_attention import launch
        from rope.kernels.triton_attention_backward import launch_backward
        from rope.kernels.triton_attention_decode import launch_decode

        gen = torch.Generator().manual_seed(31)
        q, k = (torch.randn(1, n, heads, 16, generator=gen, dtype=torch.float64) for n, heads in ((4, 2), (40, 1)))
        q, k = ((t / t.abs().amax() * 65000).half() for t in (q, k))
        v = torch.randint(-8, 9, (1, 40, 1, 16), generator=gen).half()
        q_positions, k_positions, theta = torch.tensor([0, 11, 26, 39]), torch.arange(40), theta_for(12, "cpu")
        options = dict(options, softmax_scale=1e-9, attention_factor=attention_factor)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        expected = rotary_attention(*leaves, q_positions, k_positions, theta, **options)
        grad_out = torch.randn(expected.shape, generator=gen, dtype=torch.float64)
        expected_grads = torch.autograd.grad(expected, leaves, grad_out)
        inputs = [t.to(DEVICE) for t in (q, k, v, q_positions, k_positions, theta)]
        logit_error = 2.0**-10 * 1e-9 * attention_factor**2 * 16 * 65000**2
        ratios = []
        for out, _ in (launch(*inputs, **options), launch_decode(*inputs, splits=3, **options)):
            error = (out.cpu().double() - expected).abs().max().item()
            ratios.append(error / (16 * logit_error + 8 * 2.0**-11) if out.isfinite().all() else math.inf)
        out, lse = launch(*inputs, **options)
        grads = launch_backward(*inputs, out, lse, grad_out.half().to(DEVICE), **options)
        for got, exact in zip(grads, expected_grads):
            error = (got.cpu().double() - exact).abs().max().item()
            bound = 8 * logit_error * exact.abs().max().item() + 1e-3
            ratios.append(error / bound if got.isfinite().all() else math.inf)
        return max(ratios)

    for name in ("RoPE", "Leaky ReRoPE"):
        cases[f"attention {name} fp16 q, k up to 65000 (a = 1.5), fwd+decoding+bwd"] = partial(
            largest_float16, modes[name], 1.5)

    def overflowing_logits(dtype, q_len):
        """Logits of 2^128 (1 + m / 128) (k's first tail coordinate 2^63 (1 + m / 128), one query's 2^65),
        softmax_scale 2^-120: beyond float32's range, NaN in the kernels, so those rows (and, in the backward,
        their slice) are recomputed in float64 (rope.kernels.triton_attention_repair): the worst error of
        output and gradients over an ulp of the float64 reference's (tests/test_attention_limits.py)."""
        gen = torch.Generator().manual_seed(32)
        q, k = (torch.randn(1, n, heads, 16, generator=gen, dtype=torch.float64) for n, heads in ((q_len, 2), (40, 1)))
        k[..., 12] = 2.0**63 * (1 + torch.randint(0, 4, (1, 40, 1), generator=gen) / 128)
        q[..., 12] = 0.0
        q[0, -1, 0, 12] = 2.0**65
        v = torch.randint(-8, 9, (1, 40, 1, 16), generator=gen).double()
        grad_out = torch.randint(-4, 5, (1, q_len, 2, 16), generator=gen).double()
        k_positions, theta = torch.arange(40), theta_for(12, "cpu")
        q_positions = k_positions[-q_len:]
        exact_leaves = [t.to(dtype).double().requires_grad_() for t in (q, k, v)]
        expected = rotary_attention(*exact_leaves, q_positions, k_positions, theta, softmax_scale=2.0**-120,
                                    compute_dtype=torch.float64)
        expected_grads = torch.autograd.grad(expected, exact_leaves, grad_out)
        leaves = [t.to(dtype).to(DEVICE).requires_grad_() for t in (q, k, v)]
        out = fused_rotary_attention(*leaves, q_positions.to(DEVICE), k_positions.to(DEVICE), theta.to(DEVICE),
                                     softmax_scale=2.0**-120)
        grads = torch.autograd.grad(out, leaves, grad_out.to(dtype).to(DEVICE))
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-23
        ratios = []  # the recomputed: the last query's row of head 0, and the gradients (one slice: all of them)
        for got, exact in ((out[0, -1, 0], expected[0, -1, 0]), *zip(grads, expected_grads)):
            error = (got.detach().cpu().double() - exact.to(dtype).double()).abs().max().item()
            ratios.append(error / (ulp * exact.abs().max().item()) if got.isfinite().all() else math.inf)
        return max(ratios)

    for dtype_name in ("fp32", "bf16"):
        for q_len, kernel in ((12, "prefill"), (1, "decoding")):  # prefill: 12 x 2 rows per key head
            cases[f"attention logits beyond float32's range {dtype_name} {kernel}, rows recomputed, fwd+bwd"] = partial(
                overflowing_logits, DTYPES[dtype_name], q_len)

    def captured_graph():
        """An ordinary fused call (prefill and decoding) captured in a CUDA graph: the results check cannot read
        its flag there (it is a device assertion while capturing), and the replay gives the eager call's output
        bit for bit. 0 when it does, inf otherwise."""
        gen = torch.Generator().manual_seed(33)
        q, k, v = (torch.randn(1, n, heads, 64, generator=gen).to(DEVICE) for n, heads in ((32, 4), (64, 2), (64, 2)))
        positions, theta = torch.arange(64, device=DEVICE), theta_for(64, DEVICE)
        ok = True
        for q_len in (32, 1):
            call = partial(fused_rotary_attention, q[:, -q_len:], k, v, positions[-q_len:], positions, theta)
            eager = call()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                call()  # warm-up outside the capture (compiles the kernel)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = call()
            graph.replay()
            torch.cuda.synchronize()
            ok = ok and torch.equal(captured, eager)
        return 0.0 if ok else math.inf

    if DEVICE == "cuda":
        cases["attention prefill and decoding captured in a CUDA graph (no host read of the check)"] = captured_graph
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="interpreter sizes (the CPU dry run)")
    parser.add_argument("--out", help="write the markdown table here")
    args = parser.parse_args(argv)
    s = sizes(args.tiny)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (Triton interpreter)"
    lines = [f"# Smoke: every kernel variant against float64 references ({device}, "
             f"{'tiny' if args.tiny else 'GPU'} sizes)", "",
             "| case | reference | worst error / bound | seconds | result |", "| --- | --- | --- | --- | --- |"]
    failed = 0
    for reference, cases in (("torch path, float64 (exact rotation)", rotary_cases(s)),
                             ("blockwise float64 + autograd", attention_cases(s))):
        for name, case in cases.items():
            start = time.perf_counter()
            try:
                ratio, note = case(), ""
            except Exception as err:  # a crash is that case's failure, not the end of the table
                ratio, note = math.nan, f" ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
            ok = ratio <= 1.0  # NaN fails
            failed += not ok
            lines.append(f"| {name} | {reference} | {ratio:.3g}{note} | {time.perf_counter() - start:.1f} | "
                         f"{'pass' if ok else 'FAIL'} |")
            print(lines[-1], flush=True)
    lines += ["", f"{len(lines) - 4 - failed} passed, {failed} failed"]
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(lines[-1])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
