"""cos/sin error of the fused kernel and of the usual float32 recipe against exact angles, on a GPU;
and how many bfloat16 and float16 outputs of each math differ from the correctly rounded ones.

    python benchmarks/gpu_precision.py

Rotating the unit pair (1, 0) returns (cos, sin) of the angle, so the kernel's output shows its
cos/sin directly. The usual recipe is float32 inv_freq times float32 position, then cos/sin.
The 16-bit outputs are compared with the torch path's (float64, rounded once: correctly rounded up
to ties within 2^-51 of the pair): float-float math (the default) may differ only where the exact
value lies within 2^-43 of the pair from a rounding tie (about one output in 10^10), float64 math
only within 2^-51, float32 math within 6 2^-24 (about one in 10^4).
"""

import torch

import rope
from rope.angles import reduced_angles
from rope.kernels import triton_rotary


def main():
    theta, _ = rope.inv_freq({"rope_theta": 10000.0}, 128)
    for exponent in (10, 16, 20, 24, 28, 31):
        positions = torch.randint(2 ** (exponent - 1), 2**exponent, (4096,))
        if exponent == 31:
            positions[-1] = 2**31 - 1
        exact = reduced_angles(positions, theta)
        unit = torch.zeros(1, len(positions), 1, 128, device="cuda")
        unit[..., :64] = 1.0
        out, _ = rope.apply_rotary(unit, unit, positions.cuda(), theta.cuda(), backend="triton")
        kernel_err = max((out[0, :, 0, :64].double().cpu() - exact.cos()).abs().max().item(),
                         (out[0, :, 0, 64:].double().cpu() - exact.sin()).abs().max().item())
        angle32 = positions.cuda().float()[:, None] * theta.cuda()[None]
        usual_err = (angle32.cos().double().cpu() - exact.cos()).abs().max().item()
        print(f"positions < 2^{exponent}: kernel max |cos/sin error| {kernel_err:.2e}; float32 recipe {usual_err:.2e}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(8, 4096, 32, 128, device="cuda", generator=gen).to(dtype)
        positions = torch.randint(0, 2**31 - 1, (8, 4096), device="cuda", generator=gen)
        correct, _ = rope.apply_rotary(q, q[:, :, :1], positions, theta.cuda(), backend="torch")
        for float64_math, name in ((None, "float-float"), (True, "float64"), (False, "float32")):
            out = torch.empty_like(q)
            triton_rotary.launch(q, q[:, :, :1], out, torch.empty_like(q[:, :, :1]), positions, theta.cuda(),
                                 interleaved=False, rotary_dim=128, scale=1.0, conjugate=False,
                                 float64_math=float64_math)
            print(f"{str(dtype).removeprefix('torch.')} {name} math: {(out != correct).sum().item()} of "
                  f"{q.numel()} outputs differ from the correctly rounded ones")


if __name__ == "__main__":
    main()
