"""Sweep the fused kernel's launch parameters on the benchmark shapes (forward, bf16, one GPU).

    python benchmarks/tune_blocks.py

Prints, per shape, the fraction of the copy ceiling for each (BLOCK_S, BLOCK_H, num_warps, GROUP), best
first: the data behind the autotuner's candidates, rope.kernels.triton_rotary.TUNING_CANDIDATES.
"""

import itertools

import torch

import rope
from bench_rotary import SHAPES, graph_time_ms
from rope.kernels import triton_rotary


def main():
    theta, _ = rope.inv_freq({"rope_theta": 500000.0}, 128)
    theta = theta.cuda()
    for batch, seq, heads_q, heads_k, head_dim in SHAPES:
        q = torch.randn(batch, seq, heads_q, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, seq, heads_k, head_dim, device="cuda", dtype=torch.bfloat16)
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        positions = torch.arange(seq, device="cuda")
        both = torch.cat([q.reshape(-1), k.reshape(-1)])
        both_copy = torch.empty_like(both)
        ceiling = graph_time_ms(lambda: both_copy.copy_(both))
        results = []
        for block_s, block_h, warps, group in itertools.product((1, 2, 4, 8), (2, 4, 8, 16, 32), (2, 4), (1, 2, 0)):
            if block_s * block_h * 64 > 8192 or block_h > triton_rotary.triton.next_power_of_2(heads_q):
                continue
            group = group or triton_rotary.triton.cdiv(heads_q, block_h) + triton_rotary.triton.cdiv(heads_k, block_h)

            def fn():
                triton_rotary.launch(q, k, q_out, k_out, positions, theta, interleaved=False, rotary_dim=128,
                                     scale=1.0, conjugate=False, block_s=block_s, block_h=block_h, group=group,
                                     num_warps=warps)

            results.append((ceiling / graph_time_ms(fn), block_s, block_h, warps, group))
        results.sort(reverse=True)
        print((batch, seq, heads_q, heads_k, head_dim),
              " ".join(f"{r:.3f}@{s},{h},{w},{g}" for r, s, h, w, g in results[:6]), flush=True)


if __name__ == "__main__":
    main()
