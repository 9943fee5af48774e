"""Attention at the float limits: a finite input never gives NaN (README, "Non-finite values").

The blockwise operator (rope.attention.blockwise) under scales, attention factors and inputs whose
logits lie beyond float64's range, against references written from the formula:

* the hard-maximum limit: as s L grows, softmax(s L) V tends to the mean of v over each row's
  largest logits, its LSE to s max L + log(count) (mpmath, then rounded: ±inf beyond the range),
  the gradients of q and k to 0 (out) and to s c d(max L) (lse), the gradient of v to dO on the
  maxima;
* exact power-of-two rescalings: q 2^e, k 2^f and s 2^-(e+f) give the logits, hence the output
  and LSE, of q, k and s, and the gradients scaled by 2^-e and 2^-f (float64 autograd of the whole
  matrix);
* the float32 path (rope.attention.blockwise_float32, the default for float16/bfloat16/float32
  inputs): within its range the same limits in float32, beyond it the float64 path's result
  rounded to float32 (its backward the float64 one), never NaN.

The fused Triton kernels (rope.kernels: prefill, decoding, backward) against the same references:
the hard maximum under a huge scale, the scales refused by name, and the rows whose float32
arithmetic overflows (logits of 2^128 and beyond, values near float32's largest) recomputed in
float64 (rope.kernels.triton_attention_repair), every other row bit for bit the kernels' own.
"""

import math
from functools import partial

import mpmath
import pytest
import torch

import rope
from rope.attention import blockwise_float32, rerope
from rope.attention.blockwise import blockwise_attention, rotary_attention
from rope.attention.logn import logn_scale

METHODS = {"rope": (None, None), "rerope": (3, None), "leaky": (3, 4.0)}


def case(seed, *, q_len=7, k_len=9, heads_q=2, heads_k=1, head_dim=8, pairs=4, dtype=torch.float64):
    """Random q, k, v with small-integer v (so that dO . v and dO . out are exact sums), contiguous
    positions (the queries are the last q_len keys) and float32 frequencies."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, q_len, heads_q, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, k_len, heads_k, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randint(-8, 9, (2, k_len, heads_k, 3), generator=gen).to(dtype)
    k_positions = torch.arange(k_len) + 3
    q_positions = k_positions[-q_len:]
    theta = rope.inv_freq({"rope_theta": 100.0}, 2 * pairs)[0]
    return q, k, v, q_positions, k_positions, theta


def negative_first_row(seed, **shapes):
    """A case with q_len = k_len whose first query sees only the first key, at its own position, with the
    logit -2 |k_0|^2: under a huge scale its LSE is -inf (and other rows' +inf)."""
    q, k, v, q_positions, k_positions, theta = case(seed, q_len=9, k_len=9, **shapes)
    q[:, 0] = (-2 * k[:, 0].double()).to(q.dtype)
    return q, k, v, q_positions, k_positions, theta


def logits(q, k, q_positions, k_positions, theta, *, window=None, leaky_scale=None, part="all"):
    """Unscaled float64 logits [batch, heads_q, q_len, k_len] (training form), of the rotary coordinates
    only (``part="rotary"``), of the tail only (``"tail"``) or of both (``"all"``)."""
    keep = torch.arange(q.shape[3]) < 2 * theta.numel()
    keep = {"all": torch.ones_like(keep), "rotary": keep, "tail": ~keep}[part]
    q, k = (torch.where(keep, t.double(), 0.0) for t in (q, k))
    if window is None:
        return rerope.rotary_scores(q, k, q_positions, k_positions, theta)
    return rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale)


def masked(x, q_positions, k_positions):
    return x.masked_fill(k_positions[None, :] > q_positions[:, None], -math.inf)


def hard_maximum(x, v):
    """The limit of softmax(s x) V as s -> inf: the mean of v over each row's maxima, and the weights."""
    top = x.amax(dim=-1, keepdim=True)
    weights = (x == top).to(torch.float64)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    values = v.to(torch.float64).repeat_interleave(x.shape[1] // v.shape[2], dim=2)
    return torch.einsum("bhij,bjhd->bihd", weights, values), weights


def assert_separated(x, relative=1e-6):
    """The reference's maxima are clear: every row's largest logit exceeds the next by far more than rounding."""
    top2 = x.topk(2, dim=-1).values
    finite = torch.isfinite(top2[..., 1])
    gap = (top2[..., 0] - top2[..., 1])[finite]
    assert (gap > relative * top2[..., 0].abs()[finite]).all()


def limit_lse(x, factors):
    """factor * max x + log(count of maxima) per row, in mpmath, rounded to float64 (±inf beyond its range);
    ``factors`` the scale of each query row (a list of Python floats)."""
    top = x.amax(dim=-1)
    count = (x == top[..., None]).sum(dim=-1)
    rows = [[[float(mpmath.mpf(f) * mpmath.mpf(t) + mpmath.log(c)) for t, c, f in zip(ts, cs, factors)]
             for ts, cs in zip(th, ch)] for th, ch in zip(top.tolist(), count.tolist())]
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("softmax_scale", [1e308, 2.0**1023, 1.7976931348623157e308, 1e30])
@pytest.mark.parametrize("block_size", [2, 64])
def test_a_huge_scale_gives_the_hard_maximum(method, softmax_scale, block_size):
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = negative_first_row(1)
    x = masked(logits(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale),
               q_positions, k_positions)
    assert_separated(x)
    out, lse = blockwise_attention(q, k, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                                   softmax_scale=softmax_scale, block_size=block_size)
    expected, _ = hard_maximum(x, v)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    expected_lse = limit_lse(x, [softmax_scale] * x.shape[2])
    torch.testing.assert_close(lse, expected_lse, rtol=1e-12, atol=0)
    if softmax_scale > 1e300:  # rows beyond float64's range both ways
        assert (lse == math.inf).any() and (lse == -math.inf).any()


@pytest.mark.parametrize("logn_length", [2, 5])
def test_a_huge_scale_with_log_n_scaling(logn_length):
    q, k, v, q_positions, k_positions, theta = case(2)
    x = masked(logits(q, k, q_positions, k_positions, theta), q_positions, k_positions)
    assert_separated(x)
    out, lse = blockwise_attention(q, k, v, q_positions, k_positions, theta, softmax_scale=1.5e308,
                                   logn_length=logn_length, block_size=3)
    torch.testing.assert_close(out, hard_maximum(x, v)[0], rtol=0, atol=0)
    factors = [mpmath.mpf(1.5e308) * mpmath.mpf(c) for c in logn_scale(q_positions, logn_length).tolist()]
    assert max(factors) > mpmath.mpf(1.7976931348623157e308)  # s c itself beyond float64's range
    torch.testing.assert_close(lse, limit_lse(x, factors), rtol=1e-12, atol=0)


@pytest.mark.parametrize("attention_factor", [1e200, 1e154, 1.7976931348623157e308])
@pytest.mark.parametrize("method", METHODS)
def test_a_huge_attention_factor_gives_the_hard_maximum_of_the_rotary_logits(attention_factor, method):
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = case(3, head_dim=10, pairs=3)  # a tail of 4 coordinates
    x = masked(logits(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale, part="rotary"),
               q_positions, k_positions)
    assert_separated(x)
    out = rotary_attention(q, k, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                           attention_factor=attention_factor, block_size=4)
    torch.testing.assert_close(out, hard_maximum(x, v)[0], rtol=0, atol=0)


def dense(q, k, v, q_positions, k_positions, theta, *, softmax_scale, window=None, leaky_scale=None,
          attention_factor=1.0, logn_length=None):
    """softmax(s c L + mask) V and its LSE, the whole matrix in float64 (differentiable; c the row's log-n factor
    max(1, ln(m + 1) / ln L), else 1): the reference for inputs whose logits fit float64."""
    rotary = torch.arange(q.shape[3]) < 2 * theta.numel()
    q2, k2 = (torch.where(rotary, attention_factor * t, t) for t in (q, k))
    scale = softmax_scale if logn_length is None else softmax_scale * logn_scale(q_positions, logn_length)[:, None]
    x = masked(scale * logits(q2, k2, q_positions, k_positions, theta, window=window,
                              leaky_scale=leaky_scale), q_positions, k_positions)
    values = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(x, dim=-1), values), torch.logsumexp(x, dim=-1)


def grads(function, inputs, seed=0):
    """d(out . dO + lse . dL)/d(q, k, v) for random dO, dL, by autograd."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    out, lse = function(*leaves)
    gen = torch.Generator().manual_seed(seed)
    d_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    d_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    ((out * d_out).sum() + (lse * d_lse).sum()).backward()
    return out.detach(), lse.detach(), [t.grad for t in leaves]


SHIFTS = {  # (q exponent, k exponent, v exponent): inputs 2^e times ordinary ones, the scale 2^-(eq + ek) times
    "huge q and k": (530, 530, 0),
    "huge q, tiny k": (1000, -1000, 0),
    "tiny q, huge k": (-1000, 1000, 0),
    "tiny q and k": (-510, -510, 0),
    "largest q": (1019, 50, 0),
    "largest k": (50, 1019, 0),
    "huge values": (0, 0, 1017),
    "tiny values": (0, 0, -1000),
}


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("method", METHODS)
def test_power_of_two_rescalings_are_exact(shift, method):
    """q 2^e, k 2^f, v 2^g and s 2^-(e+f): the logits of q, k, s (output times 2^g, the same LSE), and
    gradients 2^-e, 2^-f and 1 times those of q, k, v (v times 2^g, dO times 2^-g)."""
    window, leaky_scale = METHODS[method]
    eq, ek, ev = SHIFTS[shift]
    q, k, v, q_positions, k_positions, theta = case(4)
    v = v + torch.randn(v.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    options = dict(window=window, leaky_scale=leaky_scale)
    scale = 0.5

    def ordinary(q, k, v):
        return dense(q, k, v, q_positions, k_positions, theta, softmax_scale=scale, **options)

    def rescaled(q, k, v):
        out, lse = blockwise_attention(q, k, v, q_positions, k_positions, theta, block_size=3,
                                       softmax_scale=math.ldexp(scale, -(eq + ek)), **options)
        return out * 2.0**-ev, lse  # the gradient of out enters as dO 2^-g

    out, lse, (dq, dk, dv) = grads(ordinary, (q, k, v))
    got_out, got_lse, (gq, gk, gv) = grads(rescaled, (q * 2.0**eq, k * 2.0**ek, v * 2.0**ev))
    for got, expected in ((got_out, out), (got_lse, lse), (gq * 2.0**eq, dq), (gk * 2.0**ek, dk), (gv * 2.0**ev, dv)):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10 * expected.abs().max().item())


@pytest.mark.parametrize("factor_exponent", [530, -530])
def test_the_attention_factor_is_exact_beyond_the_range(factor_exponent):
    """a = 2^e with s = 2^-2e (e > 0): softmax of the rotary logits, the tail's weight 2^-2e negligible; a = 2^-e
    with s = 1: softmax of the tail's logits, the rotary part's weight 2^-2e negligible."""
    q, k, v, q_positions, k_positions, theta = case(5, head_dim=10, pairs=3)
    a = 2.0**factor_exponent
    scale = 2.0**-1060 if factor_exponent > 0 else 1.0
    out = rotary_attention(q, k, v, q_positions, k_positions, theta, attention_factor=a, softmax_scale=scale,
                           block_size=2)
    part = "rotary" if factor_exponent > 0 else "tail"
    x = masked(logits(q, k, q_positions, k_positions, theta, part=part), q_positions, k_positions)
    values = v.double().repeat_interleave(2, dim=2)
    expected = torch.einsum("bhij,bjhd->bihd", torch.softmax(x, dim=-1), values)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12 * expected.abs().max().item())


@pytest.mark.parametrize("scale", [2.0**1023, 2.0**100])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("method", METHODS)
def test_gradients_in_the_hard_maximum_limit(dtype, method, scale):
    """s = 2^1023 (the float64 path for every dtype) and s = 2^100 (the float32 path for float16, bfloat16 and
    float32 inputs: logits of about 2^102 fit float32): the output's gradient is 0 in q and k (the softmax is
    saturated) and dO on each row's maximum in v; the LSE's is s dL d(max L), ±inf beyond the dtype's range,
    never NaN (rows with an LSE of ±inf included)."""
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = negative_first_row(6, dtype=dtype)
    x = masked(logits(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale),
               q_positions, k_positions)
    assert_separated(x)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = blockwise_attention(*leaves, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                                   softmax_scale=scale, block_size=3)
    assert lse.isinf().any() == (scale > 2.0**128)
    gen = torch.Generator().manual_seed(7)
    d_out = torch.randint(-4, 5, out.shape, generator=gen).double()
    (out * d_out).sum().backward(retain_graph=True)
    _, weights = hard_maximum(x, v)
    expected_dv = torch.einsum("bhij,bihd->bjhd", weights, d_out).unflatten(2, (1, 2)).sum(dim=3)
    assert (leaves[0].grad == 0).all() and (leaves[1].grad == 0).all()
    torch.testing.assert_close(leaves[2].grad, expected_dv.to(dtype), rtol=0, atol=0)

    for t in leaves:
        t.grad = None
    d_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    (lse * d_lse).sum().backward()
    # d(s max_j L_ij)/dq_i = s d_i R_m^T R_n k_argmax: the gradient of max L by autograd, times s exactly
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    top = masked(logits(q64, k64, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale),
                 q_positions, k_positions).amax(dim=-1)
    (top * d_lse).sum().backward()
    for got, unit in ((leaves[0].grad, q64.grad), (leaves[1].grad, k64.grad)):
        expected = torch.where(unit == 0, 0.0, unit * scale).to(dtype)  # rounded once: ±inf beyond the range
        assert not got.isnan().any()
        tol = max(2 * torch.finfo(dtype).eps, 1e-12)
        finite = expected[expected.isfinite()].double().abs().amax().item() if expected.isfinite().any() else 0.0
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol * finite)
    assert (leaves[2].grad == 0).all()


def test_the_backward_operator_keeps_an_lse_of_inf():
    """The backward operator given the forward's LSE of ±inf recomputes those rows: the hard maximum's dv."""
    q, k, v, q_positions, k_positions, theta = negative_first_row(8)
    out, lse = blockwise_attention(q, k, v, q_positions, k_positions, theta, softmax_scale=1e308, block_size=2)
    assert (lse == math.inf).any() and (lse == -math.inf).any()
    d_out = torch.ones_like(out)
    dq, dk, dv = torch.ops.rope.blockwise_attention_backward(q, k, v, q_positions, k_positions, theta, out, lse, d_out,
                                                             torch.zeros_like(lse), softmax_scale=1e308, block_size=2)
    x = masked(logits(q, k, q_positions, k_positions, theta), q_positions, k_positions)
    _, weights = hard_maximum(x, v)
    expected_dv = torch.einsum("bhij,bihd->bjhd", weights, d_out).unflatten(2, (1, 2)).sum(dim=3)
    torch.testing.assert_close(dv, expected_dv, rtol=0, atol=0)
    assert (dq == 0).all() and (dk == 0).all()


def test_float64_inputs_near_the_largest_value_never_give_nan():
    """q, k ~ 1e300 with the default scale: logits far beyond float64's range, the hard maximum."""
    q, k, v, q_positions, k_positions, theta = case(9)
    big_q, big_k = q * 1e300, k * 1e300
    out = rotary_attention(big_q, big_k, v, q_positions, k_positions, theta, block_size=4)
    x = masked(logits(q, k, q_positions, k_positions, theta), q_positions, k_positions)
    torch.testing.assert_close(out, hard_maximum(x, v)[0], rtol=0, atol=0)


# --- the fused Triton kernels (rope.kernels): float32 logits, the row maximum taken before the scale ---------------


def kernel_case(seed, dtype, *, method="rope"):
    """Four queries (at keys 0, 11, 26 and 39) against 40 keys in three key blocks, heads 2 / 1, head_dim 16 with
    six pairs (a tail of four), q and k of about 3 (logits of tens; the third query's a hundred times smaller): the
    first query sees only key 0, with the logit -2 |k_0|^2."""
    gen = torch.Generator().manual_seed(seed)
    q = 3 * torch.randn(1, 4, 2, 16, generator=gen, dtype=torch.float64)
    k = 3 * torch.randn(1, 40, 1, 16, generator=gen, dtype=torch.float64)
    q[:, 0] = -2 * k[:, 0]
    q[:, 2] /= 100
    v = torch.randint(-8, 9, (1, 40, 1, 16), generator=gen).to(torch.float64)
    theta = rope.inv_freq({"rope_theta": 100.0}, 12)[0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = [q.to(dtype), k.to(dtype), v.to(dtype), torch.tensor([0, 11, 26, 39]), torch.arange(40), theta]
    return [t.to(device) for t in tensors]


def rounded_logits(q, k, q_positions, k_positions, theta, window=None, leaky_scale=None):
    """The kernels' logits in float64: q and k turned exactly, rounded to their dtype, then multiplied (the
    second pass in the bent frame)."""
    q, k, q_positions, k_positions, theta = (t.cpu() for t in (q, k, q_positions, k_positions, theta))

    def logits(frame):
        q_rot = rerope.rotate_exactly(q, *frame(q_positions, True), "half").to(q.dtype).double()
        k_rot = rerope.rotate_exactly(k, *frame(k_positions, False), "half").to(k.dtype).double()
        return torch.einsum("bihd,bjhd->bhij", q_rot, k_rot.repeat_interleave(q.shape[2] // k.shape[2], dim=2))

    x = logits(lambda positions, query: (positions, theta))
    if window is not None:
        bent = logits(lambda positions, query: rerope.bent_frame(positions, theta, window, leaky_scale, query))
        x = torch.where((q_positions[:, None] - k_positions[None, :]) < window, x, bent)
    return masked(x, q_positions, k_positions)


KERNEL_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
@pytest.mark.parametrize("method", METHODS)
def test_the_fused_kernels_take_any_scale_they_accept(dtype, kernel, method):
    """softmax_scale = 1e37 (log2(e) s within float32's range, so accepted): the scaled logits are beyond
    float32's range both ways, the output is the hard maximum, bit for bit (integer values), and the LSE
    s max L, ±inf beyond float32's range."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_decode import launch_decode

    window, leaky_scale = METHODS[method]
    inputs = kernel_case(11, dtype)
    x = rounded_logits(*inputs[:2], *inputs[3:], window, leaky_scale)
    top2 = x.topk(2, dim=-1).values
    assert ((top2[..., 0] - top2[..., 1]) > 1e-3 * top2[..., 0].abs()).all()  # the kernels' maxima are these
    options = dict(window=window, leaky_scale=leaky_scale, softmax_scale=1e37)
    if kernel == "prefill":
        out, lse = launch(*inputs, **options)
    else:
        out, lse = launch_decode(*inputs, splits=3, **options)
    expected, _ = hard_maximum(x, inputs[2].cpu())
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.cpu(), expected.to(dtype), rtol=0, atol=0)
    expected_lse = limit_lse(x, [1e37] * x.shape[2]).to(torch.float32)  # ±inf beyond float32's range
    assert expected_lse.isinf().any() and expected_lse.isfinite().any()
    torch.testing.assert_close(lse.cpu(), expected_lse, rtol=1e-5, atol=0)


@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_the_fused_kernels_take_the_smallest_scale_they_accept(kernel):
    """The kernels take log2(e) softmax_scale from 2^-120: below float32's smallest normal number 2^-126 it would
    be 0 (0 times a masked logit's -inf: NaN), below 2^-120 a logit lost beyond float32's range could weigh
    (rope.kernels.triton_attention_repair), so such a scale is refused by name before any work; the smallest one
    accepted gives the softmax's limit at s -> 0, the mean of v over each row's unmasked keys."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_decode import launch_decode

    run = launch if kernel == "prefill" else launch_decode
    inputs = kernel_case(12, torch.float32)
    smallest = 2.0**-120 / math.log2(math.e) * (1 + 2.0**-40)  # log2(e) s >= 2^-120 after its float64 rounding
    for scale in (5e-324, 1e-300, 2.0**-126 / math.log2(math.e), 2.0**-120 / math.log2(math.e) * (1 - 2.0**-40)):
        with pytest.raises(ValueError, match="softmax_scale is too small"):
            run(*inputs, softmax_scale=scale)
    out, lse = run(*inputs, softmax_scale=smallest)
    q_positions, k_positions = inputs[3].cpu(), inputs[4].cpu()
    seen = (k_positions[None, :] <= q_positions[:, None]).double()  # [q_len, k_len], causal
    expected = torch.einsum("ij,jd->id", seen / seen.sum(-1, keepdim=True), inputs[2][0, :, 0].cpu().double())
    torch.testing.assert_close(out[0].cpu().double(), expected[:, None].expand_as(out[0]), rtol=0, atol=1e-5)
    torch.testing.assert_close(lse[0].cpu().double(), seen.sum(-1).log().expand_as(lse[0]), rtol=0, atol=1e-6)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_the_fused_backward_takes_an_infinite_lse(kernel):
    """An LSE beyond float32's range leaves P = exp(s L - LSE) nothing to recompute from: those rows' slices are
    differentiated in float64 (rope.kernels.triton_attention_repair), the hard maximum's gradients: 0 in q and
    k, dO on each row's maximum in v (integer values: exact)."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_backward import launch_backward
    from rope.kernels.triton_attention_decode import launch_decode

    inputs = kernel_case(11, torch.float32)
    run = launch if kernel == "prefill" else partial(launch_decode, splits=3)
    out, lse = run(*inputs, softmax_scale=1e37)
    assert lse.isinf().any()
    d_out = torch.randint(-4, 5, out.shape, generator=torch.Generator().manual_seed(4)).to(out)
    dq, dk, dv = launch_backward(*inputs, out, lse, d_out, softmax_scale=1e37)
    x = rounded_logits(*inputs[:2], *inputs[3:])
    _, weights = hard_maximum(x, inputs[2].cpu())
    expected_dv = torch.einsum("bhij,bihd->bjhd", weights, d_out.cpu().double()).unflatten(2, (1, 2)).sum(dim=3)
    torch.testing.assert_close(dv.cpu().double(), expected_dv, rtol=0, atol=0)
    assert (dq == 0).all() and (dk == 0).all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_the_fused_backward_under_a_huge_scale_never_gives_nan(dtype):
    """softmax_scale = 1e30 with logits of tens: every LSE is finite (about 1e31) but its float32 rounding
    is far beyond 1, so the recomputed exp(s L - LSE) would overflow; the weights are at most 1 and the
    scale multiplies the summed gradients, so they are finite or ±inf, never NaN."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_backward import launch_backward

    inputs = kernel_case(12, dtype)
    inputs[0][:, 0] = -inputs[0][:, 0]  # a first row of logit +2 |k_0|^2: every LSE finite
    out, lse = launch(*inputs, softmax_scale=1e30)
    assert lse.isfinite().all()
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dtype).to(out.device)
    for grad in launch_backward(*inputs, out, lse, grad_out, softmax_scale=1e30):
        assert not grad.isnan().any()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("attention_factor", [1.0, 1.5])
@pytest.mark.parametrize("method", METHODS)
def test_float16_inputs_near_the_largest_value(attention_factor, method):
    """float16 q and k up to 65000 (a rotated pair reaches sqrt(2) a 65000, beyond float16's range; the
    kernels prescale their operands by 2^-c, exact above the subnormal range): the output, lse and gradients
    of the prefill and decoding kernels are finite and within the float16 rounding of the operands (2^-10 of
    the largest product sum, scaled) of the float64 reference."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_backward import launch_backward
    from rope.kernels.triton_attention_decode import launch_decode

    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = kernel_case(13, torch.float64)
    q, k = ((t / t.abs().amax() * 65000).to(torch.float16) for t in (q, k))
    assert q.abs().max() == 65000 and k.abs().max() == 65000
    v = v.to(torch.float16)
    options = dict(window=window, leaky_scale=leaky_scale, softmax_scale=1e-9, attention_factor=attention_factor)
    leaves = [t.double().cpu().requires_grad_() for t in (q, k, v)]
    expected, expected_lse = blockwise_attention(*leaves, q_positions.cpu(), k_positions.cpu(), theta.cpu(),
                                                 **options)
    grad_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)
    # float16 operands: each logit within about 2^-10 of sum |q_i k_i| a^2 (at most 16 65000^2 a^2), times s
    logit_error = 2.0**-10 * 1e-9 * attention_factor**2 * 16 * 65000**2
    for out, lse in (launch(q, k, v, q_positions, k_positions, theta, **options),
                     launch_decode(q, k, v, q_positions, k_positions, theta, splits=3, **options)):
        assert out.isfinite().all() and lse.isfinite().all()
        assert (out.cpu().double() - expected).abs().max() <= 2 * logit_error * 8 + 8 * 2.0**-11
        assert (lse.cpu().double() - expected_lse).abs().max() <= 2 * logit_error
    out, lse = launch(q, k, v, q_positions, k_positions, theta, **options)
    d_out = grad_out.to(torch.float16).to(out.device)
    grads = launch_backward(q, k, v, q_positions, k_positions, theta, out, lse, d_out, **options)
    for got, exact in zip(grads, expected_grads):
        assert got.isfinite().all()
        assert (got.cpu().double() - exact).abs().max() <= 8 * logit_error * exact.abs().max() + 1e-3


# --- logits and sums beyond float32's range in the fused kernels: those rows recomputed in float64 ------------------

ULP_AT_ONE = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}


def overflow_case(seed, dtype, route):
    """(inputs, huge, options): two batch rows of kernel_case's shapes (queries at 0, 11, 26, 39 against 40 keys,
    heads 2 / 1, head_dim 16 with six pairs and a tail of four), integer v; the rows ``huge`` [batch, q_len,
    heads_q] (batch row 0: query 1 of head 0 and query 3 of head 1) have logits beyond float32's range, every
    other row's stay far within it. Routes:

    * "tail": k's first tail coordinate (unrotated) is 2^63 (1 + m_j / 128), m_j in 0..3, the huge queries'
      2^65, the others' 0: logits 2^128 (1 + m_j / 128) plus ordinary ones, and softmax_scale 2^-120 (log2(e) s
      just above the kernels' least), so the scaled logits differ by about 2.9 m_j in log2: a softmax far from
      its hard maximum. float32 and bfloat16 only (float16 holds no 2^63).
    * "factor": attention_factor 2^62 with softmax_scale 2^-120: the rotary logits times a^2 = 2^124, the huge
      queries 8 N(0, 1), the others N(0, 1) / 8. Every dtype (float16: operands prescaled by 2^-63).
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 2, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 40, 1, 16, generator=gen, dtype=torch.float64)
    v = torch.randint(-8, 9, (2, 40, 1, 16), generator=gen).double()
    huge = torch.zeros(2, 4, 2, dtype=torch.bool)
    huge[0, 1, 0] = huge[0, 3, 1] = True
    if route == "tail":
        k[..., 12] = 2.0**63 * (1 + torch.randint(0, 4, (2, 40, 1), generator=gen) / 128)
        q[..., 12] = torch.where(huge, 2.0**65, 0.0)
        options = dict(softmax_scale=2.0**-120)
    else:
        q = q * torch.where(huge, 8.0, 1 / 8)[..., None]
        options = dict(softmax_scale=2.0**-120, attention_factor=2.0**62)
    theta = rope.inv_freq({"rope_theta": 100.0}, 12)[0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = [q.to(dtype), k.to(dtype), v.to(dtype), torch.tensor([0, 11, 26, 39]), torch.arange(40), theta]
    return [t.to(device) for t in tensors], huge, options


def exact_attention(inputs, options, d_out, d_lse):
    """(out, lse, grads, x): :func:`dense` of ``inputs`` in float64 from the formula, the gradients of
    out . dO + lse . dL in q, k and v (float64 autograd), and the unscaled logits a^2 L_rot + L_tail
    [batch, heads_q, q_len, k_len] (-inf where masked)."""
    q, k, v, q_positions, k_positions, theta = (t.cpu() for t in inputs)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    formula = dict(window=options.get("window"), leaky_scale=options.get("leaky_scale"),
                   attention_factor=options.get("attention_factor", 1.0))
    out, lse = dense(*leaves, q_positions, k_positions, theta, softmax_scale=options["softmax_scale"],
                     logn_length=options.get("logn_length"), **formula)
    ((out * d_out.cpu().double()).sum() + (lse * d_lse.cpu().double()).sum()).backward()
    a, rotary = formula.pop("attention_factor"), torch.arange(q.shape[3]) < 2 * theta.numel()
    q2, k2 = (torch.where(rotary, a * t.double(), t.double()) for t in (q, k))
    x = masked(logits(q2, k2, q_positions, k_positions, theta, **formula), q_positions, k_positions)
    return out.detach(), lse.detach(), [t.grad for t in leaves], x


OVERFLOW_CASES = [(torch.float32, "tail", "rope", None), (torch.bfloat16, "tail", "leaky", 8),
                  (torch.float16, "factor", "rerope", None), (torch.bfloat16, "factor", "rope", 8),
                  (torch.float32, "factor", "leaky", None)]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("kernel", ["prefill", "decode", "blockwise"])
@pytest.mark.parametrize(("dtype", "route", "method", "logn_length"), OVERFLOW_CASES,
                         ids=[f"{str(d)[6:]}-{r}-{m}-logn{n}" for d, r, m, n in OVERFLOW_CASES])
def test_logits_beyond_float32s_range_are_recomputed(dtype, route, method, logn_length, kernel):
    """Rows whose logits are beyond float32's range (which made the kernels' row maximum +inf and the row NaN):
    their output and lse are the float64 reference's rounded once (within an ulp of the formula's), and the
    gradients of their slice (the whole batch row 0) too; every other row and slice is what the kernels give
    where nothing overflows, bit for bit. "blockwise": rope.attention.blockwise on the same inputs (its float32
    path, which scales the queries by s first, or its float64 path), within float32's rounding of the scaled
    logits."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_backward import launch_backward
    from rope.kernels.triton_attention_decode import launch_decode

    window, leaky_scale = METHODS[method]
    inputs, huge, options = overflow_case(14, dtype, route)
    options.update(window=window, leaky_scale=leaky_scale, logn_length=logn_length)
    device = inputs[0].device
    d_out = torch.randint(-4, 5, (2, 4, 2, 16), generator=torch.Generator().manual_seed(15)).to(dtype).to(device)
    d_lse = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(16)).to(device)
    expected, expected_lse, expected_grads, x = exact_attention(inputs, options, d_out, d_lse)
    top = x.abs().masked_fill(x == -math.inf, 0).amax(dim=-1).transpose(1, 2)  # [batch, q_len, heads_q]
    assert (top[huge] > 2.0**128).all() and (top[~huge] < 2.0**126).all()
    tol = ULP_AT_ONE[dtype]

    def assert_within_an_ulp(got, exact):
        torch.testing.assert_close(got.cpu().double(), exact.to(dtype).double(), rtol=tol,
                                   atol=tol * exact.abs().max().item())

    if kernel == "blockwise":
        leaves = [t.detach().requires_grad_() for t in inputs[:3]]
        out, lse = blockwise_attention(*leaves, *inputs[3:], block_size=16, **options)
        ((out * d_out.to(out.dtype)).sum() + (lse * d_lse).sum()).backward()
        # its float32 path: scaled logits of about 2^8 (S_i), within about (d + 6) 2^-24 S_i each
        torch.testing.assert_close(out.cpu().double(), expected, rtol=0, atol=2.0**-8 * 8)
        for leaf, exact in zip(leaves, expected_grads):
            assert not leaf.grad.isnan().any()
            torch.testing.assert_close(leaf.grad.cpu().double(), exact, rtol=0, atol=2.0**-8 * exact.abs().max().item())
        return
    run = launch if kernel == "prefill" else partial(launch_decode, splits=3)
    out, lse = run(*inputs, **options)
    assert not out.isnan().any() and not lse.isnan().any()
    rows = huge.to(device)
    torch.testing.assert_close(out[rows].cpu().double(), expected[huge].to(dtype).double(), rtol=tol, atol=tol * 8)
    torch.testing.assert_close(lse.transpose(1, 2)[rows].cpu().double(),
                               expected_lse.transpose(1, 2)[huge].float().double(), rtol=2.0**-23, atol=0)
    calm = inputs[0].clone()
    calm[rows] = 0  # the other rows, where no logit overflows: the kernels alone (rows are independent)
    calm_out, calm_lse = run(calm, *inputs[1:], **options)
    assert torch.equal(out[~rows], calm_out[~rows])
    assert torch.equal(lse.transpose(1, 2)[~rows], calm_lse.transpose(1, 2)[~rows])

    grads = launch_backward(*inputs, out, lse, d_out, d_lse, **options)
    for got, exact in zip(grads, expected_grads):  # batch row 0 holds the huge rows: its slice recomputed
        assert_within_an_ulp(got[0], exact[0])
    ordinary = [t[1:] for t in inputs[:3]] + inputs[3:]  # batch row 1 alone: nothing overflows, the kernels' own
    alone = launch_backward(*ordinary, out[1:], lse[1:], d_out[1:], d_lse[1:].contiguous(), **options)
    for got, kernels in zip(grads, alone):
        assert torch.equal(got[1:], kernels)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_values_near_float32s_largest_are_recomputed(dtype, kernel):
    """v up to 255 2^120 (just below 2^128): the kernels' unnormalised sums P V pass float32's range (inf, or NaN
    after rescaling), where the exact output, a convex combination of v, is within it: those rows are the float64
    reference's, rounded once, and so are the gradients (dO . v beyond float32's range too: ±inf where the exact
    gradient is)."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_backward import launch_backward
    from rope.kernels.triton_attention_decode import launch_decode

    inputs = kernel_case(17, dtype)
    inputs[2] = (torch.randint(-255, 256, inputs[2].shape, generator=torch.Generator().manual_seed(17)).double()
                 * 2.0**120).to(dtype).to(inputs[2].device)
    run = launch if kernel == "prefill" else partial(launch_decode, splits=3)
    options = dict(softmax_scale=0.25)
    out, lse = run(*inputs, **options)
    leaves = [t.detach().double().cpu().requires_grad_() for t in inputs[:3]]
    expected, expected_lse = dense(*leaves, *(t.cpu() for t in inputs[3:]), **options)
    tol = ULP_AT_ONE[dtype]
    largest = inputs[2].abs().max().item()
    assert out.isfinite().all()
    torch.testing.assert_close(out.cpu().double(), expected.detach().to(dtype).double(), rtol=tol, atol=tol * largest)
    # v leaves the lse alone: the kernels' own (float32 logits of operands rounded to q's dtype)
    logit_tol = 2.0**-20 if dtype == torch.float32 else 2.0**-6
    torch.testing.assert_close(lse.cpu().double(), expected_lse.detach(), rtol=logit_tol, atol=0)
    d_out = torch.randint(-4, 5, out.shape, generator=torch.Generator().manual_seed(18)).to(out)
    (expected * d_out.cpu().double()).sum().backward()
    for got, leaf in zip(launch_backward(*inputs, out, lse, d_out, **options), leaves):
        exact = leaf.grad.to(dtype).double()
        assert not got.isnan().any() and torch.equal(got.isinf().cpu(), exact.isinf())
        finite = exact.isfinite()
        torch.testing.assert_close(got.cpu().double()[finite], exact[finite], rtol=tol,
                                   atol=tol * exact[finite].abs().max().item())


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_float16_attention_factors_beyond_the_kernels_prescale_are_refused():
    """float16 operands are prescaled by 2^-c, c = ceil(log2(sqrt(2) a)), and the logits multiplied back by 2^2c,
    a float32 constant: from a = 2^62.5 it is beyond float32's range (infinite: NaN even for zero q), refused by
    name before any work, while 2^62 (2^2c = 2^126) is computed."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch

    inputs = kernel_case(19, torch.float16)
    for a in (2.0**63, 2.0**62.5 * (1 + 2.0**-40), 1e30):
        with pytest.raises(ValueError, match="attention_factor = .* too large for float16"):
            launch(*inputs, softmax_scale=2.0**-120, attention_factor=a)
    out, lse = launch(*inputs, softmax_scale=2.0**-120, attention_factor=2.0**62)
    assert out.isfinite().all() and lse.isfinite().all()


# --- the float32 path (rope.attention.blockwise_float32): its range, and the float64 path beyond it -----------------


@pytest.fixture
def float32_calls(monkeypatch):
    """The calls that took the float32 path's forward (a list, one entry per call)."""
    calls, forward = [], blockwise_float32.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(blockwise_float32, "forward", counted)
    return calls


@pytest.mark.parametrize("softmax_scale", [2.0**100, 2.0**110, 1e37, 1e308])
@pytest.mark.parametrize("method", METHODS)
def test_float32_inputs_under_a_huge_scale_give_the_hard_maximum(method, softmax_scale, float32_calls):
    """float32 inputs, the default float32 path: scales whose logits fit its range (d A K <= 2^120: logits of
    about 2^102 and 2^112) run in float32, the others (2^123, 2^1023) in float64, rounded: either way the hard
    maximum bit for bit (integer values) and the LSE s max L (float32's rounding of the logits: a few ulps of
    S_i), ±inf beyond float32's range, never NaN."""
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = negative_first_row(1, dtype=torch.float32)
    x = masked(logits(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale),
               q_positions, k_positions)
    assert_separated(x, 1e-4)  # far beyond float32's rounding of the logits
    out, lse = blockwise_attention(q, k, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                                   softmax_scale=softmax_scale, block_size=3)
    assert out.dtype == lse.dtype == torch.float32
    assert len(float32_calls) == (softmax_scale < 2.0**115)
    torch.testing.assert_close(out.double(), hard_maximum(x, v)[0], rtol=0, atol=0)
    expected_lse = limit_lse(x, [softmax_scale] * x.shape[2]).to(torch.float32)  # ±inf beyond float32's range
    assert not lse.isnan().any() and torch.equal(lse.isinf(), expected_lse.isinf())
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=0)


@pytest.mark.parametrize("magnitude", [1e19, 1e30, 3e38])
def test_float32_inputs_near_the_largest_value_never_give_nan(magnitude, float32_calls):
    """float32 q and k from 1e19 up to float32's largest value (logits beyond 2^120: the float64 path, the hard
    maximum), and values of 1e17, 1e28 (the float32 path) and 3e36, whose sum over the 9 keys could pass 2^120
    (the float64 path: its output rounded once)."""
    q, k, v, q_positions, k_positions, theta = case(9, dtype=torch.float32)
    big_q, big_k = ((t / t.abs().max() * magnitude).to(torch.float32) for t in (q, k))
    out = rotary_attention(big_q, big_k, v, q_positions, k_positions, theta, block_size=4)
    x = masked(logits(big_q, big_k, q_positions, k_positions, theta), q_positions, k_positions)
    assert not float32_calls and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), hard_maximum(x, v)[0], rtol=0, atol=0)
    big_v = (v / v.abs().max() * magnitude * 1e-2).to(torch.float32)
    out = rotary_attention(q, k, big_v, q_positions, k_positions, theta, block_size=4)
    exact = rotary_attention(q, k, big_v, q_positions, k_positions, theta, block_size=4, compute_dtype=torch.float64)
    assert len(float32_calls) == (magnitude < 1e36)
    if float32_calls:  # within float32's rounding
        torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5 * exact.abs().max().item())
    else:
        assert torch.equal(out, exact.to(torch.float32))


def test_the_float32_backward_takes_the_float64_path_beyond_its_range():
    """dO of 1e36 against values of 8: dO . v beyond 2^120, so the float64 backward (of the float64 forward,
    recomputed): the float64 path's gradients for the same incoming gradient, rounded once, no NaN."""
    q, k, v, q_positions, k_positions, theta = case(10, dtype=torch.float32)
    gen = torch.Generator().manual_seed(10)
    grad_out = (torch.randn(2, 7, 2, 3, generator=gen) * 1e36).to(torch.float32)
    results = []
    for compute_dtype in (None, torch.float64):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = rotary_attention(*leaves, q_positions, k_positions, theta, window=3, block_size=3,
                               compute_dtype=compute_dtype)
        results.append(torch.autograd.grad(out, leaves, grad_out.to(out.dtype)))
    for got, expected in zip(*results):
        assert got.dtype == torch.float32 and not got.isnan().any()
        assert torch.equal(got, expected)
