"""rope.xpos (XPos, Sun et al. 2022) against the formula written here in float64 and in mpmath,
against flash-attention's, lucidrains' and torchscale's formulas as their code writes them, the
relative property of the scores, gradients in every dtype, and refused arguments."""

import math

import mpmath
import pytest
import torch

from helpers import FLOAT_DTYPES, ulp
from rope.xpos import MAX_EXPONENT, apply_xpos, xpos_scales

mpmath.mp.prec = 200


def frequencies(d, base=10000.0):
    """theta_j = base^(-2j/d) as float32 numbers (the usual table)."""
    return 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)


def split(x, layout, d):
    """The pairs (x_a, x_b) of the rotated width d."""
    if layout == "half":
        return x[..., : d // 2], x[..., d // 2: d]
    return x[..., 0:d:2], x[..., 1:d:2]


def join(y_a, y_b, tail, layout):
    if layout == "half":
        return torch.cat((y_a, y_b, tail), dim=-1)
    return torch.cat((torch.stack((y_a, y_b), dim=-1).flatten(-2), tail), dim=-1)


def xpos_formula(x, positions, theta, layout, d, scale_base, center, sign):
    """zeta_i^(sign (m - c)/B) R(m theta_i) x in float64, zeta_i = (2i/d + 0.4)/1.4, for positions
    below 2^29 (m theta_i exact in float64); also each coordinate's pair magnitude scale |(x_a, x_b)|."""
    x = x.to(torch.float64)
    m = positions.to(torch.float64).reshape(*positions.shape[:-1] or (1,), positions.shape[-1], 1, 1)
    zeta = (2 * torch.arange(d // 2, dtype=torch.float64) / d + 0.4) / 1.4
    scale = zeta ** (sign * (m - center) / scale_base)
    angle = m * theta.to(torch.float64)
    x_a, x_b = split(x, layout, d)
    y_a = scale * (x_a * torch.cos(angle) - x_b * torch.sin(angle))
    y_b = scale * (x_b * torch.cos(angle) + x_a * torch.sin(angle))
    size = (scale * torch.hypot(x_a, x_b)).expand_as(y_a)
    return join(y_a, y_b, x[..., d:], layout), join(size, size, torch.zeros_like(x[..., d:]), layout)


def assert_within(out, reference, size, pair_bound):
    """``|out - reference|`` <= half an ulp of out's dtype + pair_bound * (the pair's scaled magnitude)."""
    err = (out.to(torch.float64) - reference).abs()
    bound = 0.5 * ulp(reference, out.dtype) * (1 + 1e-6) + pair_bound * size + 1e-300
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{out.dtype}: error reaches {worst:.3f} x the bound"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_matches_the_formula_in_every_dtype(dtype, layout):
    """Every output within half an ulp (plus 2^-40 of the pair, the float64 reference's own error
    included) of the formula, with [batch, seq] positions of either sign, a centre, partial rotary."""
    batch, seq, d, head_dim = 2, 7, 12, 16
    q = torch.randn(batch, seq, 3, head_dim).to(dtype)
    k = torch.randn(batch, seq, 1, head_dim).to(dtype)
    positions = torch.randint(-1500, 1500, (batch, seq))  # factors below 3.5^6: float16 holds the outputs
    center, scale_base = int(torch.randint(-200, 200, ()).item()), 300.5
    theta = frequencies(d)
    q_out, k_out = apply_xpos(q, k, positions, theta, scale_base=scale_base, center=center, layout=layout)
    assert q_out.dtype == k_out.dtype == dtype
    for out, x, sign in ((q_out, q, 1), (k_out, k, -1)):
        reference, size = xpos_formula(x, positions, theta, layout, d, scale_base, center, sign)
        assert_within(out, reference, size, 2.0**-40)
        assert torch.equal(out[..., d:], x[..., d:])


def mp_factor(i, d, m, center, scale_base, sign):
    """zeta_i^(sign (m - c)/B) in mpmath, zeta_i = (10 i + 2d)/(7d) as an exact ratio."""
    return (mpmath.mpf(10 * i + 2 * d) / (7 * d)) ** (sign * mpmath.mpf(m - center) / mpmath.mpf(scale_base))


def mp_rotation(values, positions, theta, d, scale_base, center, sign):
    """The exact zeta^(sign (m - c)/B) R(m theta) x of half-layout heads, zeta_i = (10 i + 2d)/(7d)
    as an exact ratio, in mpmath at 200 bits: (outputs, pair magnitudes), nested lists."""
    out, sizes = [], []
    for row, m in zip(values, positions):
        y, size = list(map(mpmath.mpf, row)), [0.0] * len(row)
        for i in range(d // 2):
            factor = mp_factor(i, d, m, center, scale_base, sign)
            angle = mpmath.mpf(m) * mpmath.mpf(float(theta[i]))
            x_a, x_b = mpmath.mpf(row[i]), mpmath.mpf(row[i + d // 2])
            y[i] = factor * (x_a * mpmath.cos(angle) - x_b * mpmath.sin(angle))
            y[i + d // 2] = factor * (x_b * mpmath.cos(angle) + x_a * mpmath.sin(angle))
            size[i] = size[i + d // 2] = float(factor * mpmath.hypot(x_a, x_b))
        out.append(y)
        sizes.append(size)
    return out, sizes


@pytest.mark.parametrize("scale_base", [512, 300.7])
def test_exact_at_the_edges_of_the_range(scale_base):
    """float64 outputs within half an ulp + 2^-41 of the pair of the exact value (mpmath), and the
    factors within 2^-42.5, at positions up to the largest accepted distance from the centre."""
    d, center = 8, int(torch.randint(-2**40, 2**40, ()).item())
    reach = math.floor(MAX_EXPONENT * scale_base)
    offsets = [reach, -reach, reach - int(torch.randint(1, 1000, ()).item()), 3]
    positions = torch.tensor([center + o for o in offsets])
    theta = frequencies(d) * (1 + torch.rand(d // 2))  # float32 numbers of no special form
    x = torch.randn(1, len(offsets), 1, d, dtype=torch.float64)
    q_out, k_out = apply_xpos(x, x, positions, theta, scale_base=scale_base, center=center)
    up, down = xpos_scales(positions, d // 2, scale_base=scale_base, center=center)
    for out, factors, sign in ((q_out, up, 1), (k_out, down, -1)):
        exact, sizes = mp_rotation(x[0, :, 0].tolist(), positions.tolist(), theta, d, scale_base, center, sign)
        for t, m in enumerate(positions.tolist()):
            for i in range(d // 2):
                factor = mp_factor(i, d, m, center, scale_base, sign)
                assert abs(mpmath.mpf(float(factors[t, i])) / factor - 1) <= 2.0**-42.5
            for j in range(d):
                value, reference = float(out[0, t, 0, j]), exact[t][j]
                half_ulp = float(ulp(torch.tensor(float(reference), dtype=torch.float64), torch.float64)) / 2
                assert abs(mpmath.mpf(value) - reference) <= half_ulp + 2.0**-41 * sizes[t][j], (m, j)


# The sources' formulas, as their code writes them (float64 here), each over positions 0 .. L-1
# (torchscale: offset .. offset + L-1) and its own centre.

def rotate_half_neox(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def flash_attention(q, k, theta, scale_base):
    """flash_attn/layers/rotary.py, RotaryEmbedding(scale_base=...), interleaved=False: scale =
    (arange(0, d, 2) + 0.4 d)/(1.4 d), power = (arange(L) - L // 2)/scale_base, q by cos*scale
    and sin*scale, k by cos/scale and sin/scale, x cos + rotate_half(x) sin."""
    seq, d = q.shape[1], q.shape[-1]
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), theta.double())
    scale = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    power = (torch.arange(seq, dtype=torch.float64) - seq // 2) / scale_base
    scale = scale ** power[:, None]
    out = []
    for x, s in ((q, scale), (k, 1 / scale)):
        cos, sin = (torch.cat((t, t), dim=-1)[None, :, None, :] for t in (freqs.cos() * s, freqs.sin() * s))
        out.append(x * cos + rotate_half_neox(x) * sin)
    return out


def lucidrains(q, k, theta, scale_base):
    """rotary_embedding_torch, RotaryEmbedding(dim, use_xpos=True, xpos_scale_base=...),
    rotate_queries_and_keys: freqs repeated "(n r)", scale = ((arange(0, d, 2) + 0.4 d)/(1.4 d)) **
    ((t - len(t) // 2)/scale_base) repeated "(d r)", q times scale, k times scale ** -1."""
    seq, d = q.shape[1], q.shape[-1]
    t = torch.arange(seq, dtype=torch.float64)
    freqs = torch.repeat_interleave(torch.outer(t, theta.double()), 2, dim=-1)
    power = (t - len(t) // 2) / scale_base
    scale = ((torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)) ** power[:, None]
    scale = torch.repeat_interleave(scale, 2, dim=-1)[None, :, None, :]
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]
    return [x * cos * s + rotate_every_two(x) * sin * s for x, s in ((q, scale), (k, scale**-1))]


def torchscale(q, k, theta, scale_base, offset):
    """torchscale/component/xpos_relative_position.py, XPOS(head_dim, scale_base): min_pos =
    -(length + offset) // 2, scale ** arange(min_pos, max_pos)/scale_base, angles at 0 ..
    length + offset - 1, the last ``length`` rows; q with scale, k with 1/scale (downscale)."""
    length, d = q.shape[1], q.shape[-1]
    min_pos = -(length + offset) // 2
    max_pos = length + offset + min_pos
    base = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    scale = base ** (torch.arange(min_pos, max_pos, 1, dtype=torch.float64) / scale_base)[:, None]
    angles = torch.outer(torch.arange(0, length + offset, dtype=torch.float64), theta.double())
    sin, cos, scale = angles.sin()[-length:], angles.cos()[-length:], scale[-length:]
    out = []
    for x, s in ((q, scale), (k, 1 / scale)):
        c, n = (torch.repeat_interleave(t * s, 2, dim=-1)[None, :, None, :] for t in (cos, sin))
        out.append(x * c + rotate_every_two(x) * n)
    return out


@pytest.mark.parametrize("source", ["flash_attention", "lucidrains", "torchscale"])
def test_reproduces_the_sources_with_their_centre(source):
    seq, d, scale_base, offset = 9, 16, 512, 4
    q, k = torch.randn(2, seq, 2, d, dtype=torch.float64), torch.randn(2, seq, 1, d, dtype=torch.float64)
    theta = frequencies(d)
    if source == "torchscale":
        expected = torchscale(q, k, theta, scale_base, offset)
        positions, center, layout = torch.arange(offset, offset + seq), (seq + offset + 1) // 2, "interleaved"
    else:
        expected = (flash_attention if source == "flash_attention" else lucidrains)(q, k, theta, scale_base)
        positions, center = torch.arange(seq), seq // 2
        layout = "half" if source == "flash_attention" else "interleaved"
    got = apply_xpos(q, k, positions, theta, scale_base=scale_base, center=center, layout=layout)
    for out, ref in zip(got, expected):
        torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13)
    if center:  # the formula without centring gives other q and k
        assert not torch.allclose(apply_xpos(q, k, positions, theta, scale_base=scale_base, layout=layout)[0],
                                  expected[0])


def test_scores_depend_on_relative_positions_only():
    """q'_m . k'_n is unchanged when every position moves by one amount and the centre by another,
    and for m > n decays like zeta^((m - n)/B) against RoPE's score."""
    seq, d = 6, 8
    q, k = torch.randn(1, seq, 1, d, dtype=torch.float64), torch.randn(1, seq, 1, d, dtype=torch.float64)
    theta = frequencies(d)
    positions = torch.randint(0, 2000, (seq,))

    def scores(shift, center):
        q_out, k_out = apply_xpos(q, k, positions + shift, theta, center=center)
        return torch.einsum("bqhd,bkhd->qk", q_out, k_out)

    base = scores(0, 0)
    shift = int(torch.randint(-10**12, 10**12, ()).item())
    moved = scores(shift, shift + int(torch.randint(-10**5, 10**5, ()).item()))
    torch.testing.assert_close(moved, base, rtol=1e-11, atol=1e-11)
    # q_m . k_n = sum_i zeta_i^((m - n)/B) (q_i . R((n - m) theta_i) k_i), written out per pair
    zeta = (2 * torch.arange(d // 2, dtype=torch.float64) / d + 0.4) / 1.4
    m, n = positions[:, None, None].double(), positions[None, :, None].double()
    angle = (n - m) * theta.double()
    q_a, q_b = (t[0, :, 0][:, None, :] for t in split(q, "half", d))
    k_a, k_b = (t[0, :, 0][None, :, :] for t in split(k, "half", d))
    pair = q_a * (k_a * angle.cos() - k_b * angle.sin()) + q_b * (k_b * angle.cos() + k_a * angle.sin())
    torch.testing.assert_close(base, (zeta ** ((m - n) / 512) * pair).sum(-1), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_gradients_against_float64_autograd(dtype):
    """dq = zeta^x R^T dq' in q's dtype, within half an ulp (plus 2^-40 of the pair) of float64
    autograd through the formula written above."""
    d = 8
    q = torch.randn(2, 5, 2, d + 2).to(dtype).requires_grad_()
    k = torch.randn(2, 5, 1, d + 2).to(dtype).requires_grad_()
    positions, theta = torch.randint(-1000, 1000, (2, 5)), frequencies(d)
    weights = [torch.randn(2, 5, h, d + 2, dtype=torch.float64) for h in (2, 1)]
    q_out, k_out = apply_xpos(q, k, positions, theta, scale_base=256, center=7, layout="interleaved")
    ((q_out * weights[0].to(dtype)).sum() + (k_out * weights[1].to(dtype)).sum()).backward()
    for x, sign, w in ((q, 1, weights[0]), (k, -1, weights[1])):
        x64 = x.detach().double().requires_grad_()
        y, _ = xpos_formula(x64, positions, theta, "interleaved", d, 256, 7, sign)
        (y * w.to(dtype).double()).sum().backward()
        g = w.to(dtype).double()  # dq' = w, so the pair magnitudes of dq are zeta^x |(w_a, w_b)|
        _, size = xpos_formula(g, positions, theta, "interleaved", d, 256, 7, sign)
        assert x.grad.dtype == dtype
        assert_within(x.grad, x64.grad, size, 2.0**-40)


def test_overflow_gives_inf_never_nan():
    """float64 inputs near the top of the range with k's factor up to 2^1022: +-inf or the exact
    finite value, never NaN (the overflow guard); q's factor down to 2^-1022 stays accurate."""
    d = 4
    x = torch.tensor([1e300, -1e300, 3.0, 1e-300], dtype=torch.float64).repeat(1, 2, 1, 1)
    reach = math.floor(MAX_EXPONENT * 512)
    q_out, k_out = apply_xpos(x, x, torch.tensor([reach, reach - 1]), frequencies(d))
    assert not k_out.isnan().any() and k_out.isinf().any()
    assert torch.isfinite(q_out).all() and (q_out != 0).any()


def test_bad_arguments_are_refused_by_name():
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 1, 8)
    positions, theta = torch.arange(3), frequencies(8)
    cases = [
        (TypeError, "scale_base", {"scale_base": "512"}),
        (TypeError, "scale_base", {"scale_base": True}),
        (ValueError, "scale_base", {"scale_base": 0}),
        (ValueError, "scale_base", {"scale_base": -512.0}),
        (ValueError, "scale_base", {"scale_base": float("nan")}),
        (ValueError, "scale_base", {"scale_base": 2.0**44}),
        (TypeError, "center", {"center": 1.5}),
        (TypeError, "center", {"center": True}),
        (ValueError, "center", {"center": 2**63}),
        (ValueError, "layout", {"layout": "gptj"}),
        (ValueError, "rotary_dim", {"rotary_dim": 7}),
        (ValueError, "positions", {"center": -math.floor(MAX_EXPONENT * 512) - 1}),
    ]
    for error, name, options in cases:
        with pytest.raises(error, match=name):
            apply_xpos(q, k, positions, theta, **options)
    with pytest.raises(ValueError, match="positions"):
        apply_xpos(q, k, torch.tensor([0, 1, 2**62]), theta)
    with pytest.raises(TypeError, match="positions"):
        apply_xpos(q, k, positions.float(), theta)
    with pytest.raises(TypeError, match="inv_freq"):
        apply_xpos(q, k, positions, theta.half())
    with pytest.raises(TypeError, match="dtype"):
        apply_xpos(q, k.double(), positions, theta)
    with pytest.raises(ValueError, match="pairs"):
        xpos_scales(positions, 0)
