"""apply_rotary, apply_mrope and apply_rotary_2d under hostile input: every bad argument raises
TypeError (wrong type) or ValueError (wrong value) naming it; odd but legal tensors (empty dims,
strided, expanded, non-contiguous) give the same numbers as their contiguous copies."""

import mpmath
import numpy as np
import pytest
import torch

import rope
from rope.axial import apply_rotary_2d
from rope.mrope import apply_mrope, section_axes

GEN = torch.Generator().manual_seed(0)
Q = torch.randn(2, 3, 4, 8, generator=GEN)
K = torch.randn(2, 3, 2, 8, generator=GEN)
POS = torch.tensor([0, 5, 9])
THETA = rope.inv_freq({}, 8)[0]
AXES = section_axes([2, 1, 1], 4)
ROWS = torch.stack([POS, POS + 1, POS + 2])
XY = torch.stack([POS, POS * 2], dim=-1)
THETA_XY = THETA[:2]


def _apply(**change):
    args = dict(q=Q, k=K, positions=POS, inv_freq=THETA)
    args.update(change)
    return rope.apply_rotary(args.pop("q"), args.pop("k"), args.pop("positions"), args.pop("inv_freq"), **args)


BAD_APPLY = [
    # (change, error, the argument the message must name)
    (dict(q=Q.numpy()), TypeError, "q"),
    (dict(q=Q.int(), k=K.int()), TypeError, "q"),
    (dict(q=Q.to(torch.complex64), k=K.to(torch.complex64)), TypeError, "q"),
    (dict(q=Q.bool(), k=K.bool()), TypeError, "q"),
    (dict(q=Q[0]), ValueError, "q"),
    (dict(k=K.double()), TypeError, "dtype"),
    (dict(k=K[:, :2]), ValueError, "must agree"),
    (dict(k=K[..., :6]), ValueError, "must agree"),
    (dict(positions=POS.float()), TypeError, "positions"),
    (dict(positions=POS.bool()), TypeError, "positions"),
    (dict(positions=[0, 5, 9]), TypeError, "positions"),
    (dict(positions=POS[:2]), ValueError, "positions"),
    (dict(positions=torch.arange(4)), ValueError, "positions"),
    (dict(positions=POS[None, None]), ValueError, "positions"),
    (dict(positions=POS.to("meta")), ValueError, "positions"),
    (dict(inv_freq=THETA.double(), backend="triton"), TypeError, "inv_freq"),
    (dict(inv_freq=THETA.double() * 2.0**-110), ValueError, "inv_freq"),
    (dict(inv_freq=THETA.bfloat16()), TypeError, "inv_freq"),
    (dict(inv_freq=THETA.half()), TypeError, "inv_freq"),
    (dict(inv_freq=THETA.tolist()), TypeError, "inv_freq"),
    (dict(inv_freq=THETA[None]), ValueError, "inv_freq"),
    (dict(inv_freq=torch.tensor([1.0, float("nan"), 0.1, 0.01])), ValueError, "inv_freq"),
    (dict(inv_freq=torch.tensor([1.0, float("inf"), 0.1, 0.01])), ValueError, "inv_freq"),
    (dict(inv_freq=THETA[:3], rotary_dim=8), ValueError, "inv_freq"),
    (dict(inv_freq=torch.cat([THETA, THETA])), ValueError, "rotary_dim"),
    (dict(rotary_dim=3), ValueError, "rotary_dim"),
    (dict(rotary_dim=0), ValueError, "rotary_dim"),
    (dict(rotary_dim=-8), ValueError, "rotary_dim"),
    (dict(rotary_dim=8.0), TypeError, "rotary_dim"),
    (dict(rotary_dim=True), TypeError, "rotary_dim"),
    (dict(rotary_dim="8"), TypeError, "rotary_dim"),
    (dict(rotary_dim=6), ValueError, "inv_freq"),
    (dict(layout="neox"), ValueError, "layout"),
    (dict(layout=None), ValueError, "layout"),
    (dict(attention_factor=float("nan")), ValueError, "attention_factor"),
    (dict(attention_factor=float("inf")), ValueError, "attention_factor"),
    (dict(attention_factor=0.0), ValueError, "attention_factor"),
    (dict(attention_factor=-1), ValueError, "attention_factor"),
    (dict(attention_factor="2"), TypeError, "attention_factor"),
    (dict(attention_factor=True), TypeError, "attention_factor"),
    (dict(conjugate="False"), TypeError, "conjugate"),
    (dict(conjugate=1), TypeError, "conjugate"),
    (dict(conjugate=np.bool_(True)), TypeError, "conjugate"),
    (dict(attention_factor=1e-310), ValueError, "attention_factor"),  # subnormal: s cos, s sin lose bits
    (dict(backend="cuda"), ValueError, "backend"),
]


@pytest.mark.parametrize("change, error, name", BAD_APPLY)
def test_apply_rotary_names_every_bad_argument(change, error, name):
    with pytest.raises(error, match=name):
        _apply(**{"backend": "torch", **change})


@pytest.mark.parametrize("change, error, name", [
    (dict(position_ids=ROWS[:2]), ValueError, "position_ids"),
    (dict(position_ids=ROWS.float()), TypeError, "position_ids"),
    (dict(axes=AXES[:3]), ValueError, "axes"),
    (dict(axes=AXES.float()), TypeError, "axes"),
    (dict(axes=AXES + 3), ValueError, "axes"),
    (dict(axes=AXES - 1), ValueError, "axes"),
    (dict(inv_freq=THETA.bfloat16()), TypeError, "inv_freq"),
    (dict(conjugate="yes"), TypeError, "conjugate"),
    (dict(attention_factor=float("nan")), ValueError, "attention_factor"),
])
def test_apply_mrope_names_every_bad_argument(change, error, name):
    args = dict(position_ids=ROWS, inv_freq=THETA, axes=AXES)
    args.update(change)
    with pytest.raises(error, match=name):
        apply_mrope(Q, K, args.pop("position_ids"), args.pop("inv_freq"), args.pop("axes"), backend="torch", **args)


@pytest.mark.parametrize("change, error, name", [
    (dict(positions_xy=XY.float()), TypeError, "positions_xy"),
    (dict(positions_xy=XY[:, :1]), ValueError, "positions_xy"),
    (dict(inv_freq_x=THETA_XY.half()), TypeError, "inv_freq_x"),
    (dict(inv_freq_y=torch.tensor([float("nan"), 1.0])), ValueError, "inv_freq_y"),
    (dict(mixed="True"), TypeError, "mixed"),
    (dict(conjugate=0), TypeError, "conjugate"),
    (dict(layout="gptj"), ValueError, "layout"),
])
def test_apply_rotary_2d_names_every_bad_argument(change, error, name):
    args = dict(positions_xy=XY, inv_freq_x=THETA_XY, inv_freq_y=THETA_XY)
    args.update(change)
    with pytest.raises(error, match=name):
        apply_rotary_2d(Q, K, args.pop("positions_xy"), args.pop("inv_freq_x"), args.pop("inv_freq_y"), **args)


def test_numpy_integers_are_integers():
    out = _apply(rotary_dim=np.int64(8), backend="torch")
    torch.testing.assert_close(out[0], _apply(rotary_dim=8, backend="torch")[0], rtol=0, atol=0)
    _apply(attention_factor=np.float32(1.5), backend="torch")


@pytest.mark.parametrize("shape", [(0, 3, 4, 8), (2, 0, 4, 8), (2, 3, 0, 8)])
def test_empty_dimensions_give_empty_results(shape):
    q = torch.randn(shape)
    k = torch.randn(shape[0], shape[1], 2, 8)
    positions = torch.arange(shape[1])
    q_out, k_out = rope.apply_rotary(q, k, positions, THETA, backend="torch")
    assert q_out.shape == q.shape and k_out.shape == k.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_strided_expanded_and_overlapping_views_give_the_contiguous_result(dtype):
    """A transposed (non-contiguous) q, an expanded k (stride 0: one head shared) and q, k that are
    the same tensor give exactly the results of their contiguous copies; the inputs are unchanged."""
    q = torch.randn(2, 4, 3, 8, generator=GEN).to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
    k = torch.randn(2, 3, 1, 8, generator=GEN).to(dtype).expand(2, 3, 4, 8)
    q = q[:, :3]
    before = (q.clone(), k.clone())
    expected = rope.apply_rotary(q.contiguous(), k.contiguous(), POS, THETA, backend="torch")
    got = rope.apply_rotary(q, k, POS, THETA, backend="torch")
    same = rope.apply_rotary(q, q, POS, THETA, backend="torch")
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(same[0], same[1], rtol=0, atol=0)
    torch.testing.assert_close(same[0], expected[0], rtol=0, atol=0)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])


def test_positions_at_the_int64_extremes_are_exact():
    """theta = 2^-20 at m = 2^20 n turns by exactly n radians, whatever the size of n: cos and sin
    within 2^-52 of mpmath's; at the int64 extremes cos^2 + sin^2 stays 1."""
    mpmath.mp.prec = 200
    theta = torch.tensor([2.0**-20], dtype=torch.float32)
    for n in (1, 3, -5, 2**40, -(2**43) + 1):
        cos, sin = rope.angles.cos_sin(torch.tensor([n * 2**20]), theta)
        assert abs(float(cos) - mpmath.cos(n)) <= 2.0**-52 and abs(float(sin) - mpmath.sin(n)) <= 2.0**-52
    extremes = torch.tensor([-(2**63), 2**63 - 1, -(2**31), 2**31 - 1])
    cos, sin = rope.angles.cos_sin(extremes, THETA)
    torch.testing.assert_close(cos * cos + sin * sin, torch.ones_like(cos), rtol=0, atol=4e-16)


def test_the_cos_sin_of_a_sum_of_products_is_exact_at_any_position():
    """cos_sin_of_sum turns by sum_j m_j theta_ij reduced exactly: within 2^-52 of mpmath's cos and
    sin of the exact sum, for terms up to the int64 extremes whose float64 sum would lose whole turns."""
    mpmath.mp.prec = 200
    gen = torch.Generator().manual_seed(5)
    positions = torch.cat([torch.randint(-(2**62), 2**62, (6, 3), generator=gen),
                           torch.tensor([[2**63 - 1, -(2**63), 7], [0, 0, 0]])])
    scales = torch.tensor([1.0, -1e-3, 2.0**-20], dtype=torch.float64)
    theta = torch.rand(4, 3, generator=gen, dtype=torch.float64) * scales
    cos, sin = rope.angles.cos_sin_of_sum(positions, theta)
    for t, row in enumerate(positions.tolist()):
        for i, frequencies in enumerate(theta.tolist()):
            angle = mpmath.fsum(mpmath.mpf(m) * mpmath.mpf(f) for m, f in zip(row, frequencies))
            assert abs(float(cos[t, i]) - mpmath.cos(angle)) <= 2.0**-52
            assert abs(float(sin[t, i]) - mpmath.sin(angle)) <= 2.0**-52


@pytest.mark.parametrize("call, error, name", [
    (lambda: rope.attention.rerope.rerope_scores(Q, K, POS, POS, THETA, window="3"), TypeError, "window"),
    (lambda: rope.attention.rerope.rerope_scores(Q, K, POS, POS, THETA, window=0), ValueError, "window"),
    (lambda: rope.attention.rerope.rerope_scores_two_pass(Q, K, POS, POS, THETA, window=2, leaky_scale=float("nan")),
     ValueError, "leaky_scale"),
    (lambda: rope.attention.rerope.rerope_scores_two_pass(Q, K, POS, POS, THETA, window=2, leaky_scale=True), TypeError,
     "leaky_scale"),
    (lambda: rope.attention.rerope.rotary_scores(Q, K, POS, POS, THETA.half()), TypeError, "inv_freq"),
    (lambda: rope.attention.rerope.rotary_scores(Q, K[:, :, :0], POS, POS, THETA), ValueError, "heads_k"),
    (lambda: rope.attention.rerope.rerope_positions(POS, POS.float(), window=2), TypeError, "k_positions"),
    (lambda: rope.permute_qk_weight(torch.randn(16, 4), 2.0, 8, to="half"), TypeError, "num_heads"),
    (lambda: rope.permute_qk_weight(torch.randn(16, 4), 2, 8, to="neox"), ValueError, "to"),
    (lambda: rope.permute_qk_weight(torch.randn(16, 4, 1), 2, 8, to="half"), ValueError, "weight"),
    (lambda: rope.permute_qk_weight([1.0] * 16, 2, 8, to="half"), TypeError, "weight"),
    (lambda: rope.layouts.interleaved_to_half(8, 3), ValueError, "rotary_dim"),
    (lambda: rope.layouts.interleaved_to_half(8, 10), ValueError, "rotary_dim"),
    (lambda: rope.layouts.interleaved_to_half(8, 4, "middle"), ValueError, "rotated"),
    (lambda: rope.permute_qk_weight(torch.randn(16, 4), 2, 8, to="half", rotated=None), ValueError, "rotated"),
    (lambda: rope.angles.cos_sin(POS.float(), THETA), TypeError, "positions"),
    (lambda: rope.angles.cos_sin_of_sum(POS[:, None].float(), THETA[:, None]), TypeError, "positions"),
    (lambda: rope.angles.cos_sin_of_sum(POS[:, None], THETA[:, None].half()), TypeError, "inv_freq"),
    (lambda: rope.angles.cos_sin_of_sum(POS[:, None], THETA[:, None] * float("nan")), ValueError, "inv_freq"),
    (lambda: rope.angles.cos_sin_of_sum(POS[:, None], THETA), ValueError, "terms"),
    (lambda: rope.angles.cos_sin_of_sum(POS[:, None], [[0.5]]), TypeError, "inv_freq"),
    (lambda: rope.angles.cos_sin_of_sum(POS[:, None], torch.stack((THETA, THETA), 1)), ValueError, "terms"),
])
def test_other_rotation_functions_name_every_bad_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()
