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
"""

import math

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
          attention_factor=1.0):
    """softmax(s L + mask) V and its LSE, the whole matrix in float64 (differentiable): the reference for
    inputs whose logits fit float64."""
    rotary = torch.arange(q.shape[3]) < 2 * theta.numel()
    q2, k2 = (torch.where(rotary, attention_factor * t, t) for t in (q, k))
    x = masked(softmax_scale * logits(q2, k2, q_positions, k_positions, theta, window=window,
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
    """The kernels hold log2(e) softmax_scale in float32: below float32's smallest normal number it would be 0
    (0 times a masked logit's -inf: NaN), so such a scale is refused by name before any work; the smallest one
    accepted gives the softmax's limit at s -> 0, the mean of v over each row's unmasked keys."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_decode import launch_decode

    run = launch if kernel == "prefill" else launch_decode
    inputs = kernel_case(12, torch.float32)
    smallest = 2.0**-126 / math.log2(math.e) * (1 + 2.0**-40)  # log2(e) s >= 2^-126 after its float64 rounding
    for scale in (5e-324, 1e-300, 2.0**-126 / math.log2(math.e) * (1 - 2.0**-40)):
        with pytest.raises(ValueError, match="softmax_scale is too small"):
            run(*inputs, softmax_scale=scale)
    out, lse = run(*inputs, softmax_scale=smallest)
    q_positions, k_positions = inputs[3].cpu(), inputs[4].cpu()
    seen = (k_positions[None, :] <= q_positions[:, None]).double()  # [q_len, k_len], causal
    expected = torch.einsum("ij,jd->id", seen / seen.sum(-1, keepdim=True), inputs[2][0, :, 0].cpu().double())
    torch.testing.assert_close(out[0].cpu().double(), expected[:, None].expand_as(out[0]), rtol=0, atol=1e-5)
    torch.testing.assert_close(lse[0].cpu().double(), seen.sum(-1).log().expand_as(lse[0]), rtol=0, atol=1e-6)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
def test_the_fused_backward_refuses_an_infinite_lse_by_name():
    """An LSE beyond float32's range leaves P = exp(s L - LSE) nothing to recompute from: refused, naming lse."""
    pytest.importorskip("triton")
    from rope.kernels.triton_attention import launch
    from rope.kernels.triton_attention_backward import launch_backward

    inputs = kernel_case(11, torch.float32)
    out, lse = launch(*inputs, softmax_scale=1e37)
    assert lse.isinf().any()
    with pytest.raises(ValueError, match="lse must hold no infinite value"):
        launch_backward(*inputs, out, lse, torch.ones_like(out), softmax_scale=1e37)


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
