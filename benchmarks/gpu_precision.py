"""cos/sin error of the fused kernel and of the usual float32 recipe against exact angles, on a GPU.

    python benchmarks/gpu_precision.py

Rotating the unit pair (1, 0) returns (cos, sin) of the angle, so the kernel's output shows its
cos/sin directly. The usual recipe is float32 inv_freq times float32 position, then cos/sin.
"""

import torch

import rope
from rope.angles import reduced_angles


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


if __name__ == "__main__":
    main()
