"""rope.attention.blockwise_float32, the float32 path of the blockwise attention, against its exact float64 path.

The float64 path (``compute_dtype=torch.float64``) is the reference: tests/test_blockwise_attention.py holds
it to the whole matrix. Here the float32 path's output and LSE are held to the accuracy bound stated in
its module docstring, written again from the formula below, on fresh random inputs; its gradients to
float64 autograd in every input dtype.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import LargestTensor
from rope.attention import blockwise_float32
from rope.attention.blockwise import blockwise_attention, rotary_attention
from rope.attention.logn import logn_scale
from strategies import layouts, seeds

U = 2.0**-24
METHODS = {"rope": (None, None), "rerope": (5, None), "leaky16": (5, 16.0), "leaky0.5": (5, 0.5)}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]  # float64: compute_dtype=torch.float32


def case(seed, *, spread=1.0, q_len=40, k_len=50, heads_q=4, heads_k=2, head_dim=16, pairs=6, v_dim=5,
         dtype=torch.float32, offset=0):
    """Random q, k (entries of standard deviation ``spread``: logits of about spread^2), v, the queries at the
    last q_len of k_len contiguous positions from ``offset``, float32 frequencies (partial rotary: a tail of
    head_dim - 2 pairs coordinates)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, n, heads, dim, generator=gen, dtype=torch.float64) for n, heads, dim in
               ((q_len, heads_q, head_dim), (k_len, heads_k, head_dim), (k_len, heads_k, v_dim)))
    q, k = (spread * t for t in (q, k))
    k_positions = torch.arange(k_len) + offset
    theta = rope.inv_freq({"rope_theta": 100.0}, 2 * pairs)[0]
    return q.to(dtype), k.to(dtype), v.to(dtype), k_positions[-q_len:], k_positions, theta


def bounds(q, k, v, q_positions, theta, *, block_size=128, softmax_scale=None, logn_length=None, attention_factor=1.0,
           **_):
    """The module docstring's bounds, from the formula: (relative, absolute) for the output (``|o^ - o| <=
    relative sum p |v| + absolute``, relative ``[batch, q_len, heads_q, 1]``) and (E, constant) for the LSE
    (``|LSE^ - LSE| <= E + constant + 2 u |LSE|``, E ``[batch, heads_q, q_len]``)."""
    q, k, v = (t.double() for t in (q, k, v))
    d, rotary, k_len = q.shape[3], 2 * theta.numel(), k.shape[1]
    s = softmax_scale or 1 / math.sqrt(d)
    c = logn_scale(q_positions, logn_length) if logn_length else torch.ones(q.shape[1], dtype=torch.float64)
    a2 = attention_factor**2
    q_norm = (a2**2 * q[..., :rotary].pow(2).sum(-1) + q[..., rotary:].pow(2).sum(-1)).sqrt()  # ||q~_i||
    k_norm = k.norm(dim=-1).amax(dim=1).repeat_interleave(q.shape[2] // k.shape[2], dim=1)  # max_j ||k_j||, per head
    s_i = s * c[None, :, None] * q_norm * k_norm[:, None, :]
    big_a = math.sqrt(2) * q.abs().max().item() * s * c.max().item() * max(a2, 1.0)
    big_k = math.sqrt(2) * k.abs().max().item()
    e = (d + 6) * U * s_i + d * 2.0**-147 * (big_a + big_k)  # [batch, q_len, heads_q]
    b, t = min(block_size, k_len), -(-k_len // block_size)
    relative = torch.expm1(2 * e + 2 * (b + 4 * t + 8) * U)[..., None]
    absolute = k_len * 2.0**-146 * v.abs().max().item()
    return (relative, absolute), (e.transpose(1, 2), (b + 4 * t + 10 + math.log2(k_len)) * U)


def exact(q, k, v, q_positions, k_positions, theta, **options):
    """(out, lse, sum_j p_ij |v_j|) of the float64 path on the inputs' values."""
    out, lse = blockwise_attention(q, k, v, q_positions, k_positions, theta, compute_dtype=torch.float64, **options)
    weighted, _ = blockwise_attention(q, k, v.abs(), q_positions, k_positions, theta, compute_dtype=torch.float64,
                                      **options)
    return out, lse, weighted


def assert_within_the_bound(inputs, **options):
    """The float32 path (the default, or compute_dtype=torch.float32 for float64 inputs) within the bounds;
    returns the exact output and the bound on each coordinate's error."""
    compute = dict(compute_dtype=torch.float32) if inputs[0].dtype == torch.float64 else {}
    out, lse = blockwise_attention(*inputs, **options, **compute)
    assert out.dtype == lse.dtype == torch.float32
    expected, expected_lse, weighted = exact(*inputs, **options)
    (relative, absolute), (e, constant) = bounds(*inputs[:4], inputs[5], **options)
    error, bound = (out.double() - expected).abs(), relative * weighted + absolute
    assert (error <= bound).all(), (error - bound).max().item()
    lse_error = (lse.double() - expected_lse).abs()
    assert (lse_error <= e + constant + 2 * U * expected_lse.abs()).all()
    assert error.max() > 0  # computed in float32: not the float64 path rounded
    return expected, bound


@pytest.mark.parametrize("spread", [1.0, 4.0, 16.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_the_accuracy_bound_holds(method, dtype, spread):
    """Output and LSE within the docstring's bound of the exact result, causal and not, one tile and many,
    logits of about 1, 16 and 256; the bound is tight enough that a bfloat16 result would break it."""
    window, leaky_scale = METHODS[method]
    inputs = case(100 * list(METHODS).index(method) + 10 * DTYPES.index(dtype) + int(spread), spread=spread,
                  dtype=dtype)
    for causal, block_size, layout in ((True, 8, "half"), (False, 64, "interleaved")):
        expected, bound = assert_within_the_bound(inputs, window=window, leaky_scale=leaky_scale, causal=causal,
                                                  block_size=block_size, layout=layout)
        if spread == 1.0:  # about 1e-5 of sum p |v|: the exact result rounded to bfloat16 breaks it
            assert ((expected.to(torch.bfloat16).double() - expected).abs() > bound).any()


@pytest.mark.parametrize("offset", [2**40, 2**60, -(2**62)])
@pytest.mark.parametrize("method", METHODS)
def test_positions_far_from_zero_keep_the_bound(method, offset):
    """Exactly reduced angles: the same tokens at positions shifted by up to 2^62 keep the bound against the
    exact result of the unshifted ones (float32 angles m theta would be off by radians at 2^40)."""
    window, leaky_scale = METHODS[method]
    near = case(3, spread=2.0)
    far = case(3, spread=2.0, offset=offset)
    out = rotary_attention(*far, window=window, leaky_scale=leaky_scale, block_size=16)
    expected, _, weighted = exact(*near, window=window, leaky_scale=leaky_scale, block_size=16)
    (relative, absolute), _ = bounds(*near[:4], near[5], block_size=16)
    assert ((out.double() - expected).abs() <= relative * weighted + absolute).all()


@pytest.mark.parametrize("method", METHODS)
def test_the_bound_with_the_options(method):
    """Log-n scaling (positions past L), an attention factor, a softmax scale, GQA 6 / 2 and MQA, both layouts."""
    window, leaky_scale = METHODS[method]
    for heads_k, options in ((2, dict(logn_length=8)), (1, dict(attention_factor=1.7, layout="interleaved")),
                             (2, dict(softmax_scale=0.9, attention_factor=0.6, logn_length=20))):
        inputs = case(11 + heads_k, spread=2.0, heads_q=6, heads_k=heads_k, k_len=45, q_len=45)
        assert_within_the_bound(inputs, window=window, leaky_scale=leaky_scale, block_size=16, **options)


@given(seeds, st.sampled_from(list(METHODS)), layouts, st.booleans(), st.integers(1, 20), st.integers(1, 24),
       st.integers(0, 12), st.sampled_from([(2, 1), (2, 2), (3, 1)]), st.floats(0.1, 8.0))
def test_random_cases_hold_the_bound(seed, method, layout, causal, block_size, k_len, extra, heads, spread):
    window, leaky_scale = METHODS[method]
    inputs = case(seed, spread=spread, q_len=min(k_len, 1 + extra), k_len=k_len, heads_q=heads[0],
                  heads_k=heads[1], head_dim=6, pairs=2, v_dim=3)
    options = dict(window=window, leaky_scale=leaky_scale, causal=causal, block_size=block_size, layout=layout)
    out, lse = blockwise_attention(*inputs, **options)
    expected, expected_lse, weighted = exact(*inputs, **options)
    (relative, absolute), (e, constant) = bounds(*inputs[:4], inputs[5], block_size=block_size)
    assert ((out.double() - expected).abs() <= relative * weighted + absolute).all()
    assert ((lse.double() - expected_lse).abs() <= e + constant + 2 * U * expected_lse.abs()).all()


def test_the_default_compute_dtype_follows_the_inputs():
    """float16, bfloat16, float32: float32; any float64 input: float64; the argument overrides both ways."""
    q, k, v, q_positions, k_positions, theta = case(20, q_len=5, k_len=6)
    for dtypes, expected in (((torch.float16,) * 3, torch.float32), ((torch.bfloat16,) * 3, torch.float32),
                             ((torch.float32, torch.float32, torch.float64), torch.float64),
                             ((torch.float64,) * 3, torch.float64), ((torch.float16, torch.float32, torch.bfloat16),
                                                                     torch.float32)):
        args = [t.to(dtype) for t, dtype in zip((q, k, v), dtypes)] + [q_positions, k_positions, theta]
        out, lse = blockwise_attention(*args)
        assert out.dtype == lse.dtype == expected
        for compute_dtype in (torch.float32, torch.float64):
            assert rotary_attention(*args, compute_dtype=compute_dtype).dtype == compute_dtype


def gradients(inputs, grad_out, grad_lse, **options):
    """d(out . dO + lse . dLSE)/d(q, k, v) by autograd through blockwise_attention."""
    leaves = [t.detach().requires_grad_() for t in inputs[:3]]
    out, lse = blockwise_attention(*leaves, *inputs[3:], **options)
    total = (out * grad_out.to(out.dtype)).sum() + (lse * grad_lse.to(lse.dtype)).sum()
    return torch.autograd.grad(total, leaves)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_gradients_match_float64_autograd(method, dtype, layout):
    """dq, dk, dv of the output and the LSE in the inputs' dtype, within a multiple of the forward's error
    (E + (B + 4 T) u, relative to the largest gradient) plus one rounding to the dtype, of float64 autograd
    through the exact path on the same values, with the float32 incoming gradients."""
    window, leaky_scale = METHODS[method]
    inputs = case(30 + DTYPES.index(dtype), spread=2.0, dtype=dtype)
    gen = torch.Generator().manual_seed(31)
    grad_out = torch.randn(2, 40, 4, 5, generator=gen).double()
    grad_lse = torch.randn(2, 4, 40, generator=gen).double()
    compute = dict(compute_dtype=torch.float32) if dtype == torch.float64 else {}
    options = dict(window=window, leaky_scale=leaky_scale, block_size=8, layout=layout)
    got = gradients(inputs, grad_out, grad_lse, **options, **compute)
    exact_inputs = [t.double() for t in inputs[:3]] + list(inputs[3:])
    expected = gradients(exact_inputs, grad_out, grad_lse, **options)
    _, (e, constant) = bounds(*inputs[:4], inputs[5], block_size=8)
    forward_error = e.max().item() + constant
    eps = torch.finfo(dtype).eps if dtype != torch.float64 else 0.0
    for name, g, want, t in zip("qkv", got, expected, inputs):
        assert g.dtype == t.dtype and g.shape == t.shape
        error = (g.double() - want).abs()
        assert (error <= 8 * forward_error * want.abs().max() + eps * want.abs()).all(), name


def test_gradcheck_of_the_float32_path_in_float64_inputs():
    """compute_dtype=torch.float32 on float64 leaves: the backward is the derivative of the forward that ran, to
    float32's resolution (gradcheck's own tolerances widened to float32's)."""
    q, k, v, q_positions, k_positions, theta = case(40, q_len=3, k_len=5, heads_q=2, heads_k=1, head_dim=4, pairs=2,
                                                    v_dim=2, dtype=torch.float64)

    def function(q, k, v):
        return blockwise_attention(q, k, v, q_positions, k_positions, theta, window=2, leaky_scale=2.0, block_size=2,
                                   compute_dtype=torch.float32)

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(function, leaves, eps=1e-3, atol=2e-3, rtol=2e-3)


def test_never_forms_the_q_len_by_k_len_matrix():
    """Forward and backward: no tensor larger than the inputs (a tile: 2 x 16 x 16; the matrix: 2 x 128^2)."""
    q, k, v, q_positions, k_positions, theta = case(41, q_len=128, k_len=128, heads_q=1, heads_k=1, head_dim=4,
                                                    pairs=2, v_dim=1)
    for window in (None, 8):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with LargestTensor() as mode:
            out = rotary_attention(*leaves, q_positions, k_positions, theta, window=window, block_size=16)
        assert mode.inside == 1 and 0 < mode.largest <= 2 * 128 * 4
        with LargestTensor() as mode:
            torch.autograd.grad(out, leaves, torch.ones_like(out))
        assert mode.inside == 1 and 0 < mode.largest <= 2 * 128 * 4


def test_positions_per_batch_row_empty_queries_and_values_of_width_zero():
    """[batch, seq] positions: each row as computed alone (bit for bit); q_len = 0: an empty float32 output
    and zero gradients; v_dim = 0: an empty output and every row's LSE."""
    q, k, v, q_positions, k_positions, theta = case(42, q_len=9, k_len=12)
    rows = torch.stack([q_positions, q_positions.flip(0)])
    out = rotary_attention(q, k, v, rows, k_positions, theta, window=3, block_size=4)
    for b in range(2):
        alone = rotary_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], rows[b], k_positions, theta, window=3,
                                 block_size=4)
        assert torch.equal(out[b:b + 1], alone)
    leaves = [t.detach().requires_grad_() for t in (q[:, :0], k, v)]
    empty = rotary_attention(*leaves, q_positions[:0], k_positions, theta)
    assert empty.shape == (2, 0, 4, 5) and empty.dtype == torch.float32
    assert all((g == 0).all() for g in torch.autograd.grad(empty, leaves, torch.ones_like(empty)))
    out, lse = blockwise_attention(q, k, v[..., :0], q_positions, k_positions, theta)
    _, expected_lse = blockwise_attention(q, k, v[..., :0], q_positions, k_positions, theta,
                                          compute_dtype=torch.float64)
    assert out.shape == (2, 9, 4, 0)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-5, atol=1e-5)


def test_the_plan_reads_the_range_from_the_inputs():
    """blockwise_float32.Plan: the range of the module docstring, at its boundary (d A K = 2^120)."""
    from rope.attention.blockwise import check_arguments

    q, k, v, q_positions, k_positions, theta = case(43, q_len=3, k_len=4, head_dim=8, pairs=2)
    q, k = q / q.abs().max(), k / k.abs().max()  # max |q| = max |k| = 1: log2 A = log2 K = 1/2 at s = 1
    q_positions = k_positions[-3:]

    def fits(q=q, k=k, v=v, **options):
        options = check_arguments(q, k, v, q_positions, k_positions, theta, "half", True, None, None,
                                  options.get("softmax_scale", 1.0), 128, None, options.get("attention_factor", 1.0))
        return blockwise_float32.Plan(q, k, v, options, None).fits

    # d A K = 8 2^1 s: 2^120 at s = 2^116
    assert fits(softmax_scale=2.0**116) and not fits(softmax_scale=2.0**116 * (1 + 2**-20))
    assert fits(softmax_scale=2.0**-900) and not fits(softmax_scale=2.0**-1010)  # s a normal float64 factor
    assert fits(attention_factor=2.0**58) and not fits(attention_factor=2.0**58.5)  # a^2 = 2^116, 2^117
    v_edge = 2.0**120 / 4  # k_len V <= 2^120
    assert fits(v=v / v.abs().max() * v_edge) and not fits(v=v / v.abs().max() * v_edge * 2)
    assert not fits(k=k * math.inf)  # not finite: the float64 path decides


def test_the_cpu_benchmark_runs_every_contender_and_they_agree():
    """benchmarks/bench_blockwise_cpu.py --check: SDPA, the float32 and the float64 path once at a tiny size,
    within 1e-5 of the float64 path."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_blockwise_cpu.py"
    spec = importlib.util.spec_from_file_location("bench_blockwise_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0
