"""Exercise every launch variant of the fused kernels once, for compute-sanitizer on a GPU.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
        python benchmarks/sanitize_rotary.py

(without the caching allocator's larger blocks the checker sees a read just past a tensor.)

Rotary kernel: padded widths (head_dim 72, rotary_dim 48), ragged head blocks (GQA 7/3), strided
views into a packed qkv tensor, both layouts, the rotated block first and last (DeepSeek-V4's
``rotated="last"``), in place, the backward pass, each GROUP regime, and
M-RoPE (a position row per pair, prefill and decode).

Attention kernels (forward, both backward kernels, decoding): RoPE, ReRoPE and Leaky ReRoPE, causal
and not, over ragged lengths (no multiple of a block), a padded, partially rotated head (72 wide,
48 rotated), a narrower value head (40), GQA 6/2, strided views of a packed projection, per-row
positions, and one query per sequence (the decoding kernel, keys split across programs).
"""

import torch

import rope
from rope.kernels.attention_operators import fused_rotary_attention


def attention():
    gen = torch.Generator(device="cuda").manual_seed(1)
    theta, _ = rope.inv_freq({"rope_theta": 10000.0, "partial_rotary_factor": 48 / 72}, 72)
    theta = theta.cuda()
    batch, heads_q, heads_k = 2, 6, 2
    modes = ({}, {"window": 17}, {"window": 17, "leaky_scale": 16.0})
    for q_len, k_len in ((37, 301), (1, 1029)):  # prefill, then decoding (q_len x group <= 16 rows)
        packed = torch.randn(batch, k_len, heads_q + heads_k, 72 + 40, device="cuda", generator=gen,
                             dtype=torch.bfloat16)
        k, v = packed[:, :, heads_q:, :72], packed[:, :, heads_q:, 72:]  # strided views, last dim contiguous
        q = packed[:, -q_len:, :heads_q, :72]
        k_positions = torch.arange(k_len, device="cuda") + torch.tensor([[0], [1000]], device="cuda")
        q_positions = k_positions[:, -q_len:]
        for causal in (True, False):
            for options in modes:
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                out = fused_rotary_attention(*leaves, q_positions, k_positions, theta, causal=causal, **options)
                grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
                assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), (q_len, options)


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    theta, _ = rope.inv_freq({"rope_theta": 10000.0, "partial_rotary_factor": 48 / 72}, 72)
    theta = theta.cuda()
    for batch, seq, heads_q, heads_k in ((2, 37, 7, 3), (3, 1500, 5, 1), (65, 1, 7, 3)):
        qkv = torch.randn(batch, seq, heads_q + 2 * heads_k, 72, device="cuda", generator=gen, dtype=torch.bfloat16)
        q, k = qkv[:, :, :heads_q], qkv[:, :, heads_q:heads_q + heads_k]
        positions = torch.randint(0, 2**31 - 1, (batch, seq), device="cuda", generator=gen)
        for layout, rotated in ((lay, rot) for lay in ("half", "interleaved") for rot in ("first", "last")):
            q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, rotated=rotated, backend="triton")
            q_leaf = q.detach().clone().requires_grad_()
            q_grad, = torch.autograd.grad(rope.apply_rotary(q_leaf, k, positions, theta, layout=layout,
                                                            rotated=rotated)[0], q_leaf, q_out)
            torch.ops.rope.rotary_(q=q_out, k=k_out, positions=positions, inv_freq=theta,
                                   interleaved=layout == "interleaved", rotary_dim=48, scale=1.0, conjugate=True,
                                   rotated=rotated)
            assert torch.allclose(q_out.float(), q.float(), atol=0.07), "rotate then un-rotate must give q back"
            assert torch.isfinite(q_grad).all()
        position_ids = torch.randint(0, 2**31 - 1, (3, batch, seq), device="cuda", generator=gen)
        axes = rope.mrope.section_axes([8, 8, 8], 24, style="interleaved")
        q_m, k_m = rope.mrope.apply_mrope(q, k, position_ids, theta, axes, backend="triton")
        q_back, _ = rope.mrope.apply_mrope(q_m, k_m, position_ids, theta, axes, conjugate=True, backend="triton")
        assert torch.allclose(q_back.float(), q.float(), atol=0.07), "M-RoPE: rotate then un-rotate must give q back"
    attention()
    torch.cuda.synchronize()
    print("sanitizer workload done")


if __name__ == "__main__":
    main()
