"""Exercise every launch variant of the fused kernel once, for compute-sanitizer on a GPU.

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_rotary.py

Padded widths (head_dim 72, rotary_dim 48), ragged head blocks (GQA 7/3), strided views into a
packed qkv tensor, both layouts, in place, the backward pass, each GROUP regime, and M-RoPE (a
position row per pair, prefill and decode).
"""

import torch

import rope


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    theta, _ = rope.inv_freq({"rope_theta": 10000.0, "partial_rotary_factor": 48 / 72}, 72)
    theta = theta.cuda()
    for batch, seq, heads_q, heads_k in ((2, 37, 7, 3), (3, 1500, 5, 1), (65, 1, 7, 3)):
        qkv = torch.randn(batch, seq, heads_q + 2 * heads_k, 72, device="cuda", generator=gen, dtype=torch.bfloat16)
        q, k = qkv[:, :, :heads_q], qkv[:, :, heads_q:heads_q + heads_k]
        positions = torch.randint(0, 2**31 - 1, (batch, seq), device="cuda", generator=gen)
        for layout in ("half", "interleaved"):
            q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, backend="triton")
            q_leaf = q.detach().clone().requires_grad_()
            q_grad, = torch.autograd.grad(rope.apply_rotary(q_leaf, k, positions, theta, layout=layout)[0], q_leaf,
                                          q_out)
            torch.ops.rope.rotary_(q=q_out, k=k_out, positions=positions, inv_freq=theta,
                                   interleaved=layout == "interleaved", rotary_dim=48, scale=1.0, conjugate=True)
            assert torch.allclose(q_out.float(), q.float(), atol=0.07), "rotate then un-rotate must give q back"
            assert torch.isfinite(q_grad).all()
        position_ids = torch.randint(0, 2**31 - 1, (3, batch, seq), device="cuda", generator=gen)
        axes = rope.mrope.section_axes([8, 8, 8], 24, style="interleaved")
        q_m, k_m = rope.mrope.apply_mrope(q, k, position_ids, theta, axes, backend="triton")
        q_back, _ = rope.mrope.apply_mrope(q_m, k_m, position_ids, theta, axes, conjugate=True, backend="triton")
        assert torch.allclose(q_back.float(), q.float(), atol=0.07), "M-RoPE: rotate then un-rotate must give q back"
    torch.cuda.synchronize()
    print("sanitizer workload done")


if __name__ == "__main__":
    main()
