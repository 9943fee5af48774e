"""rope.attention.blockwise.rotary_attention against softmax(s L + mask) V formed whole in float64."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import LargestTensor, random_qk
from rope.attention import rerope
from rope.attention.blockwise import TileStats, rotary_attention
from rope.attention.logn import logn_scale
from strategies import layouts, seeds

METHODS = {"rope": (None, None), "rerope": (3, None), "leaky16": (3, 16.0), "leaky0.5": (3, 0.5)}
POSITIONS = ["offset", "ragged", "unsorted", "reversed", "decode", "decode_ahead", "negative"]


def case(seed, *, q_len=11, k_len=13, heads_q=4, heads_k=2, head_dim=10, pairs=5, v_dim=None, dtype=torch.float64,
         q_positions=None, k_positions=None):
    """Random q, k, v (v drawn in float64 and rounded like q and k), contiguous positions ending together
    (queries are the last q_len tokens of the keys') unless given, and float32 frequencies."""
    gen = torch.Generator().manual_seed(seed)
    q, k = random_qk(gen, 2, q_len, heads_q, heads_k, head_dim, k_seq=k_len, dtype=dtype)
    v = torch.randn(2, k_len, heads_k, v_dim or head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k_positions = torch.arange(k_len) + 5 if k_positions is None else k_positions
    q_positions = k_positions[-1] - q_len + 1 + torch.arange(q_len) if q_positions is None else q_positions
    theta = rope.inv_freq({"rope_theta": 100.0}, 2 * pairs)[0]
    return q, k, v, q_positions, k_positions, theta


def reference(q, k, v, q_positions, k_positions, theta, *, layout="half", causal=True, window=None, leaky_scale=None,
              softmax_scale=None, logn_length=None, attention_factor=1.0):
    """The whole [batch, heads_q, q_len, k_len] matrix: training-form logits, scale, mask, softmax, @ V;
    the attention factor scales the rotated coordinates of q and k (the first rotary_dim)."""
    if attention_factor != 1.0:
        rotary = torch.arange(q.shape[3]) < 2 * theta.numel()
        q, k = (torch.where(rotary, attention_factor * t.double(), t.double()) for t in (q, k))
    if window is None:
        logits = rerope.rotary_scores(q, k, q_positions, k_positions, theta, layout=layout)
    else:
        logits = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                                      layout=layout)
    x = logits * (softmax_scale or 1 / math.sqrt(q.shape[3]))
    if logn_length is not None:
        x = x * logn_scale(q_positions, logn_length)[:, None]
    if causal:
        x = x.masked_fill(k_positions[None, :] > q_positions[:, None], -math.inf)
    values = v.to(torch.float64).repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(x, dim=-1), values)


def assert_matches(out, expected):
    assert out.dtype == torch.float64 and out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12 * expected.abs().max().item())


def check(inputs, block_size, **options):
    out = rotary_attention(*inputs, block_size=block_size, **options)
    assert_matches(out, reference(*inputs, **options))
    return out


@pytest.mark.parametrize("block_size", [1, 3, 7, 64])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_matches_the_whole_matrix(layout, causal, method, block_size):
    window, leaky_scale = METHODS[method]
    check(case(block_size), block_size, layout=layout, causal=causal, window=window, leaky_scale=leaky_scale)


@pytest.mark.parametrize("heads_q, heads_k", [(4, 2), (4, 1), (3, 3)])
@pytest.mark.parametrize("method", METHODS)
def test_gqa_mqa_partial_rotary_and_value_width(heads_q, heads_k, method):
    window, leaky_scale = METHODS[method]
    inputs = case(1, heads_q=heads_q, heads_k=heads_k, head_dim=12, pairs=4, v_dim=5)
    out = check(inputs, 4, window=window, leaky_scale=leaky_scale, layout="interleaved")
    assert out.shape == (2, 11, heads_q, 5)


def test_query_head_h_reads_key_head_h_over_group():
    q, k, v, q_positions, k_positions, theta = case(2, heads_q=6, heads_k=2)
    out = rotary_attention(q, k, v, q_positions, k_positions, theta, window=2, block_size=4)
    for h in range(6):
        alone = rotary_attention(q[:, :, h : h + 1], k[:, :, h // 3 : h // 3 + 1], v[:, :, h // 3 : h // 3 + 1],
                                 q_positions, k_positions, theta, window=2, block_size=4)
        torch.testing.assert_close(out[:, :, h : h + 1], alone, rtol=0, atol=0)


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [True, False])
def test_positions_with_offsets_gaps_and_other_lengths(positions, method, causal):
    window, leaky_scale = METHODS[method]
    gen = torch.Generator().manual_seed(3)
    offset = 2**50  # far from 0: every angle is reduced exactly, so only m - n matters
    k_positions = {
        "offset": torch.arange(13) + offset,
        "ragged": torch.cumsum(torch.randint(1, 5, (13,), generator=gen), 0) + offset,
        "unsorted": torch.randperm(40, generator=gen)[:13] + offset,
        "negative": torch.arange(13) - 20,
        "reversed": torch.arange(13).flip(0) + offset,  # causal: early queries see nothing of the first key block
    }.get(positions, torch.arange(13) + offset)
    q_len = 1 if positions.startswith("decode") else 11
    q_positions = {
        "ragged": k_positions[-11:] + torch.randint(0, 3, (11,), generator=gen),
        "unsorted": k_positions[torch.randperm(13, generator=gen)[:11]],
        "decode": k_positions[-1:],
        "decode_ahead": k_positions[-1:] + 7,
    }.get(positions, k_positions[-11:])
    inputs = case(4, q_len=q_len, q_positions=q_positions, k_positions=k_positions)
    for block_size in (1, 3, 7, 64):
        check(inputs, block_size, causal=causal, window=window, leaky_scale=leaky_scale)


@pytest.mark.parametrize("leaky_scale", [None, 16.0, 0.5])
def test_window_one_and_a_window_beyond_every_distance(leaky_scale):
    inputs = case(5, q_len=9, k_len=15)
    check(inputs, 4, window=1, leaky_scale=leaky_scale)
    plain = check(inputs, 4)
    for causal in (True, False):  # keys after their query keep r' = r, so this holds without the mask too
        wide = rotary_attention(*inputs, window=30, leaky_scale=leaky_scale, causal=causal, block_size=4)
        assert_matches(wide, reference(*inputs, causal=causal))
    assert_matches(rotary_attention(*inputs, window=30, leaky_scale=leaky_scale, block_size=4), plain)


@pytest.mark.parametrize("shift", [2**40, 2**60, -(2**62)])
@pytest.mark.parametrize("method", METHODS)
def test_shifting_every_position_leaves_the_output_and_gradients_unchanged(method, shift):
    # Leaky ReRoPE's bent frame used to turn queries by a float64 product (m + w (k - 1)) theta / k:
    # off by 7e-6 at 2^40 and by 0.25 rad at 2^60, where the logits depend on m - n only.
    window, leaky_scale = METHODS[method]
    inputs = case(8, q_len=9, k_len=12)
    q, k, v, q_positions, k_positions, theta = inputs
    shifted = (q, k, v, q_positions + shift, k_positions + shift, theta)
    options = dict(window=window, leaky_scale=leaky_scale)
    assert_matches(rotary_attention(*shifted, block_size=4, **options), reference(*inputs, **options))
    grad_out = torch.randn(2, 9, 4, 10, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    got = gradients(rotary_attention, shifted, grad_out, block_size=4, **options)
    for g, e in zip(got, gradients(reference, inputs, grad_out, **options)):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10 * e.abs().max().item())


@pytest.mark.parametrize("leaky_scale", [None, 2.0])
@pytest.mark.parametrize("causal", [True, False])
def test_the_window_test_is_exact_at_extreme_positions(causal, leaky_scale):
    # int64 m - n wraps around at 2^63: the key at -2^62 of the query at 2^62 (r = 2^63 >= w) read as
    # r = -2^63 < w and took pass 1, in a tile whose extreme positions (Python ints) said "both".
    k_positions = torch.tensor([-(2**63), -(2**62), -5, 0, 2**62 - 4, 2**62, 2**63 - 1])
    q_positions = torch.tensor([2**62, 2**62 + 1, 2**63 - 1])
    inputs = case(10, q_len=3, k_len=7, q_positions=q_positions, k_positions=k_positions)
    q, k, v, _, _, theta = inputs
    m, n = q_positions.tolist(), k_positions.tolist()
    for window in (3, 2**62, 2**63 - 1):
        logits = rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta, window=window,
                                               leaky_scale=leaky_scale)  # exact: tests/test_rerope.py
        x = logits / math.sqrt(q.shape[3])
        if causal:
            x = x.masked_fill(torch.tensor([[b > a for b in n] for a in m]), -math.inf)
        values = v.double().repeat_interleave(2, dim=2)
        expected = torch.einsum("bhij,bjhd->bihd", torch.softmax(x, dim=-1), values)
        for block_size in (1, 2, 7):
            out = rotary_attention(*inputs, causal=causal, window=window, leaky_scale=leaky_scale,
                                   block_size=block_size)
            assert_matches(out, expected)
    wrapped = (q_positions[:, None] - k_positions[None, :]) >= 3  # int64 differences wrap around
    assert (wrapped != torch.tensor([[a - b >= 3 for b in n] for a in m])).any()  # so the case crosses 2^63


def test_window_bends_distant_pairs_only():
    inputs = case(6, k_len=30, q_len=30)
    plain = rotary_attention(*inputs, block_size=8)
    bent = rotary_attention(*inputs, window=4, block_size=8)
    torch.testing.assert_close(bent[:, :4], plain[:, :4], rtol=1e-12, atol=1e-12)  # rows with every r < 4
    assert (bent[:, 4:] - plain[:, 4:]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("method", METHODS)
def test_low_precision_inputs_give_a_float64_output_of_those_inputs(dtype, method):
    """compute_dtype=torch.float64: the exact path for any inputs (their default is the float32 path)."""
    window, leaky_scale = METHODS[method]
    inputs = case(7, dtype=dtype)
    out = rotary_attention(*inputs, block_size=5, window=window, leaky_scale=leaky_scale, compute_dtype=torch.float64)
    assert_matches(out, reference(*inputs, window=window, leaky_scale=leaky_scale))
    exact = tuple(t.to(torch.float64) if t.is_floating_point() and t.dim() == 4 else t for t in inputs)
    assert_matches(out, rotary_attention(*exact, block_size=5, window=window, leaky_scale=leaky_scale))


@given(seeds, layouts, st.booleans(), st.one_of(st.none(), st.integers(1, 20)),
       st.one_of(st.none(), st.floats(0.25, 64.0)), st.integers(1, 16), st.integers(1, 12), st.integers(1, 12),
       st.sampled_from([(2, 1), (2, 2), (4, 2)]))
def test_random_cases_match_the_whole_matrix(seed, layout, causal, window, leaky_scale, block_size, q_len, k_len,
                                             heads):
    gen = torch.Generator().manual_seed(seed)
    k_positions = torch.randint(0, 60, (k_len,), generator=gen)
    q_positions = torch.randint(0, 60, (q_len,), generator=gen).clamp(min=k_positions.min())  # a key for each row
    inputs = case(seed, q_len=q_len, k_len=k_len, heads_q=heads[0], heads_k=heads[1], head_dim=7, pairs=3, v_dim=2,
                  q_positions=q_positions, k_positions=k_positions)
    leaky_scale = leaky_scale if window is not None else None
    check(inputs, block_size, layout=layout, causal=causal, window=window, leaky_scale=leaky_scale)


def test_a_row_masked_in_its_first_tiles():
    """The online softmax starts a row whose first key blocks are all in its future (m = -inf) without NaN."""
    k_positions = torch.tensor([10, 11, 12, 13, 0, 1, 2, 3])
    inputs = case(15, q_len=2, k_len=8, q_positions=torch.tensor([3, 11]), k_positions=k_positions)
    for block_size in (2, 4):
        check(inputs, block_size)
        check(inputs, block_size, window=2)


def test_softmax_scale():
    inputs = case(8)
    check(inputs, 3, softmax_scale=0.05, window=2)
    check(inputs, 3, softmax_scale=3.0)


def brute_force_kind(m_block, n_block, causal, window):
    """A tile's kind from every pair it holds (no min/max shortcut)."""
    r = m_block[:, None] - n_block[None, :]
    if causal and bool((r < 0).all()):
        return "skipped"
    if window is None or bool((r < window).all()):
        return "plain"
    if bool((r >= window).all()):
        return "bent"
    return "both"


@pytest.mark.parametrize("layout", ["contiguous", "unsorted"])
@pytest.mark.parametrize("window", [None, 1, 5, 17])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block_size", [2, 5])
def test_tile_statistics_match_a_brute_force_over_each_tile(layout, window, causal, block_size):
    gen = torch.Generator().manual_seed(9)
    if layout == "contiguous":
        positions = torch.arange(27)
        q_positions, k_positions = positions[7:], positions
    else:
        q_positions = torch.randperm(40, generator=gen)[:20] + 20
        k_positions = torch.randperm(40, generator=gen)[:27]
    q, k, v, *_, theta = case(10, q_len=len(q_positions), k_len=len(k_positions))
    out, stats = rotary_attention(q, k, v, q_positions, k_positions, theta, causal=causal, window=window,
                                  block_size=block_size, return_stats=True)
    expected = TileStats()
    for i in range(0, len(q_positions), block_size):
        for j in range(0, len(k_positions), block_size):
            kind = brute_force_kind(q_positions[i : i + block_size], k_positions[j : j + block_size], causal, window)
            setattr(expected, f"tiles_{kind}", getattr(expected, f"tiles_{kind}") + 1)
            r = q_positions[i : i + block_size, None] - k_positions[None, j : j + block_size]
            if kind == "both" and layout == "contiguous":  # the boundary runs through the tile
                assert bool((r == window - 1).any()) and bool((r == window).any())
    assert stats == expected
    assert_matches(out, reference(q, k, v, q_positions, k_positions, theta, causal=causal, window=window))
    if layout == "contiguous" and window is not None:
        # both passes only on the tiles that the line m - n = window crosses: a band of O(1) tiles per block row
        blocks = -(-len(q_positions) // block_size)
        assert 0 < stats.tiles_both <= 2 * blocks
        assert stats.tiles_bent > 0 and (stats.tiles_skipped > 0) == causal


def test_no_window_computes_plain_tiles_only_and_causal_skips_the_future():
    inputs = case(11, q_len=32, k_len=32)
    _, stats = rotary_attention(*inputs, block_size=8, return_stats=True)
    assert stats == TileStats(tiles_plain=10, tiles_skipped=6)
    _, stats = rotary_attention(*inputs, block_size=8, causal=False, return_stats=True)
    assert stats == TileStats(tiles_plain=16)


def test_the_largest_tensor_mode_sees_inside_the_operators():
    """The dense reference forms the 2 x 128^2 matrix, and the mode sees it also inside an operator."""
    q, k, v, q_positions, k_positions, theta = case(12, q_len=128, k_len=128, heads_q=1, heads_k=1, head_dim=4,
                                                    pairs=2, v_dim=1)
    with LargestTensor() as mode:
        reference(q, k, v, q_positions, k_positions, theta, window=8)
    assert mode.largest >= 2 * 128**2

    @torch.library.custom_op("rope_tests::dense", mutates_args=())
    def dense(x: torch.Tensor) -> torch.Tensor:
        return (x[:, None] * x[None, :]).sum(dim=1)

    with LargestTensor() as mode:
        dense(torch.ones(128))
    assert mode.largest == 128**2


@pytest.mark.parametrize("window", [None, 8])
def test_never_forms_the_q_len_by_k_len_matrix(window):
    q, k, v, q_positions, k_positions, theta = case(12, q_len=128, k_len=128, heads_q=1, heads_k=1, head_dim=4,
                                                    pairs=2, v_dim=1)
    with LargestTensor() as mode:
        out = rotary_attention(q, k, v, q_positions, k_positions, theta, window=window, block_size=16)
    # the inputs' size: a tile holds 2 x 16 x 16 logits, the matrix 2 x 128^2
    assert mode.inside == 1 and mode.largest <= 2 * 128 * 4
    assert_matches(out, reference(q, k, v, q_positions, k_positions, theta, window=window))


def test_empty_queries_give_an_empty_output():
    q, k, v, q_positions, k_positions, theta = case(13, v_dim=3)
    out, stats = rotary_attention(q[:, :0], k, v, q_positions[:0], k_positions, theta, window=2, return_stats=True)
    assert out.shape == (2, 0, 4, 3) and out.dtype == torch.float64 and stats == TileStats()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = rotary_attention(leaves[0][:, :0], *leaves[1:], q_positions[:0], k_positions, theta, window=2)
    dq, dk, dv = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert dq.abs().max() == dk.abs().max() == dv.abs().max() == 0


def test_a_query_without_a_key_is_refused():
    q, k, v, q_positions, k_positions, theta = case(14)
    with pytest.raises(ValueError, match="q_positions 0 precedes every key"):
        rotary_attention(q, k, v, torch.arange(11), k_positions, theta)
    out = rotary_attention(q, k, v, torch.arange(11), k_positions, theta, causal=False)  # without the mask: fine
    assert_matches(out, reference(q, k, v, torch.arange(11), k_positions, theta, causal=False))
    with pytest.raises(ValueError, match="k_positions is empty"):
        rotary_attention(q, k[:, :0], v[:, :0], q_positions, k_positions[:0], theta, causal=False)


def _bad(**changes):
    """A call of rotary_attention on a valid case with some arguments replaced."""
    q, k, v, q_positions, k_positions, theta = case(0)
    arguments = dict(q=q, k=k, v=v, q_positions=q_positions, k_positions=k_positions, inv_freq=theta, window=2)
    arguments.update({name: change(arguments[name]) if callable(change) else change
                      for name, change in changes.items()})
    return arguments


BAD = [
    (dict(q=lambda q: q[0]), ValueError, "q must have shape"),
    (dict(q=lambda q: q.to(torch.int32)), TypeError, "q must be"),
    (dict(k=lambda k: k[:, :, :, :8]), ValueError, "head_dim"),
    (dict(q=lambda q: q[:, :, :3]), ValueError, "multiple of heads_k"),
    (dict(v=lambda v: v.numpy()), TypeError, "v must be a torch.Tensor"),
    (dict(v=lambda v: v.to(torch.int64)), TypeError, "v must be"),
    (dict(v=lambda v: v[0]), ValueError, "v must have shape"),
    (dict(v=lambda v: v[:1]), ValueError, "v .* must match k"),
    (dict(v=lambda v: v[:, :-1]), ValueError, "v .* must match k"),
    (dict(v=lambda v: v[:, :, :1]), ValueError, "v .* must match k"),
    (dict(q_positions=lambda p: p.double()), TypeError, "q_positions"),
    (dict(q_positions=lambda p: p[:-1]), ValueError, "q_positions"),
    (dict(k_positions=lambda p: p[:-1]), ValueError, "k_positions"),
    (dict(k_positions=lambda p: p[None]), ValueError, "k_positions"),
    (dict(inv_freq=torch.ones(6)), ValueError, "rotary_dim"),
    (dict(inv_freq=lambda t: t.half()), TypeError, "inv_freq"),
    (dict(inv_freq=torch.tensor([1.0, math.nan])), ValueError, "inv_freq"),
    (dict(layout="gptj"), ValueError, "layout"),
    (dict(causal=1), TypeError, "causal"),
    (dict(causal="False"), TypeError, "causal"),
    (dict(return_stats=None), TypeError, "return_stats"),
    (dict(window=0), ValueError, "window"),
    (dict(window=2.0), TypeError, "window"),
    (dict(window=True), TypeError, "window"),
    (dict(window=2**64), ValueError, "window must be <= 9223372036854775807"),  # not the dispatcher's OverflowError
    (dict(logn_length=2**64), ValueError, "logn_length must be <="),
    (dict(block_size=2**63), ValueError, "block_size must be <="),
    (dict(leaky_scale=0.0), ValueError, "leaky_scale"),
    (dict(leaky_scale=-1.0), ValueError, "leaky_scale"),
    (dict(leaky_scale=math.inf), ValueError, "leaky_scale"),
    (dict(leaky_scale=math.nan), ValueError, "leaky_scale"),
    (dict(leaky_scale=True), TypeError, "leaky_scale"),
    (dict(window=None, leaky_scale=4.0), ValueError, "leaky_scale .* needs a window"),
    (dict(softmax_scale=0.0), ValueError, "softmax_scale"),
    (dict(softmax_scale=-0.5), ValueError, "softmax_scale"),
    (dict(softmax_scale=math.inf), ValueError, "softmax_scale"),
    (dict(softmax_scale=math.nan), ValueError, "softmax_scale"),
    (dict(softmax_scale="0.1"), TypeError, "softmax_scale"),
    (dict(block_size=0), ValueError, "block_size"),
    (dict(block_size=-3), ValueError, "block_size"),
    (dict(block_size=4.0), TypeError, "block_size"),
    (dict(block_size=True), TypeError, "block_size"),
    (dict(block_size=None), TypeError, "block_size"),
    (dict(logn_length=1), ValueError, "logn_length"),
    (dict(q_positions=lambda p: p.expand(3, -1)), ValueError, "q_positions must have shape"),
    (dict(k_positions=lambda p: p[None, None]), ValueError, "k_positions must have shape"),
    (dict(attention_factor=0.0), ValueError, "attention_factor"),
    (dict(attention_factor=math.nan), ValueError, "attention_factor"),
    (dict(attention_factor="2"), TypeError, "attention_factor"),
    (dict(attention_factor=True), TypeError, "attention_factor"),
    (dict(compute_dtype="float32"), TypeError, "compute_dtype must be a torch.dtype"),
    (dict(compute_dtype=True), TypeError, "compute_dtype must be a torch.dtype"),
    (dict(compute_dtype=torch.float16), ValueError, "compute_dtype must be one of float32, float64"),
    (dict(compute_dtype=torch.int64), ValueError, "compute_dtype must be one of"),
    (dict(logn_length=16.0), TypeError, "logn_length"),
    (dict(logn_length=False), TypeError, "logn_length"),
    (dict(q_positions=lambda p: p - 30, k_positions=lambda p: p - 30, logn_length=8), ValueError,
     "q_positions must hold no negative position"),
]


@pytest.mark.parametrize("changes, error, message", BAD, ids=[f"{next(iter(c))}-{m}" for c, _, m in BAD])
def test_bad_arguments_are_named(changes, error, message):
    with pytest.raises(error, match=message):
        rotary_attention(**_bad(**changes))


# --- the FlashAttention-2 style backward ---------------------------------------------------------------------------


def gradients(function, inputs, grad_out, dtype=None, **options):
    """(dq, dk, dv) of (function(q, k, v, ...) * grad_out).sum(), q, k, v taken as leaves (cast to dtype if given)."""
    q, k, v, *rest = inputs
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
    out = function(*leaves, *rest, **options)
    return torch.autograd.grad(out, leaves, grad_out)


def assert_gradients_match(inputs, block_size, rtol=1e-10, **options):
    gen = torch.Generator().manual_seed(block_size)
    q, k, v = inputs[:3]
    grad_out = torch.randn(q.shape[0], q.shape[1], q.shape[2], v.shape[3], generator=gen, dtype=torch.float64)
    got = gradients(rotary_attention, inputs, grad_out, block_size=block_size, **options)
    expected = gradients(reference, inputs, grad_out, dtype=torch.float64, **options)
    for name, g, e, t in zip("qkv", got, expected, (q, k, v)):
        assert g.dtype == t.dtype and g.shape == t.shape, name
        torch.testing.assert_close(g, e, rtol=rtol, atol=rtol * e.abs().max().item(), msg=lambda m: f"d{name}: {m}")


# Block sizes 1 and 64 (one key per tile, one tile for all) run in `make test`; 3 in `make check` too.
@pytest.mark.parametrize("block_size", [pytest.param(1, marks=pytest.mark.slow), 3,
                                        pytest.param(64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_gradients_match_autograd_of_the_whole_matrix(layout, causal, method, block_size):
    window, leaky_scale = METHODS[method]
    assert_gradients_match(case(block_size), block_size, layout=layout, causal=causal, window=window,
                           leaky_scale=leaky_scale)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_with_gqa_partial_rotary_value_width_and_unsorted_positions(method, causal):
    window, leaky_scale = METHODS[method]
    gen = torch.Generator().manual_seed(16)
    k_positions = torch.randperm(30, generator=gen)[:13] + 4
    q_positions = k_positions[torch.randperm(13, generator=gen)[:11]]
    inputs = case(16, heads_q=4, heads_k=2, head_dim=12, pairs=4, v_dim=5, q_positions=q_positions,
                  k_positions=k_positions)
    for block_size in (1, 3, 64):
        assert_gradients_match(inputs, block_size, causal=causal, window=window, leaky_scale=leaky_scale,
                               layout="interleaved")


# The leaky frame (plain, bent and both tiles) in `make check`; all three in `make test`.
SLOW_METHODS = [pytest.param("rope", marks=pytest.mark.slow), pytest.param("rerope", marks=pytest.mark.slow), "leaky16"]


@pytest.mark.parametrize("method", SLOW_METHODS)
def test_gradcheck(method):
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = case(17, q_len=3, k_len=4, heads_q=2, heads_k=1, head_dim=4, pairs=2)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    window = 1 if window is not None else None  # bend within 4 keys: plain, bent and both tiles

    def function(q, k, v):
        return rotary_attention(q, k, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                                block_size=2)

    assert torch.autograd.gradcheck(function, leaves)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("method", METHODS)
def test_low_precision_inputs_get_the_float64_gradient_rounded_once(dtype, method):
    window, leaky_scale = METHODS[method]
    inputs = case(18, dtype=dtype)
    grad_out = torch.randn(2, 11, 4, 10, generator=torch.Generator().manual_seed(18), dtype=torch.float64)
    options = dict(window=window, leaky_scale=leaky_scale)
    got = gradients(rotary_attention, inputs, grad_out, block_size=5, compute_dtype=torch.float64, **options)
    expected = gradients(reference, inputs, grad_out, dtype=torch.float64, **options)
    eps = torch.finfo(dtype).eps
    for g, e in zip(got, expected):
        assert g.dtype == dtype
        # one rounding of the float64 gradient: equal to e.to(dtype) but where e sits within ~1e-10 of a tie
        torch.testing.assert_close(g, e.to(dtype), rtol=eps, atol=0)
        assert (g == e.to(dtype)).float().mean() > 0.99


@pytest.mark.parametrize("window", [None, 8])
def test_backward_never_forms_the_q_len_by_k_len_matrix(window):
    q, k, v, q_positions, k_positions, theta = case(12, q_len=128, k_len=128, heads_q=1, heads_k=1, head_dim=4,
                                                    pairs=2, v_dim=1)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = rotary_attention(*leaves, q_positions, k_positions, theta, window=window, block_size=16)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    with LargestTensor() as mode:
        got = torch.autograd.grad(out, leaves, grad_out)
    assert mode.inside == 1 and 0 < mode.largest <= 2 * 128 * 4  # the inputs' size; the matrix: 2 x 128^2
    expected = gradients(reference, (q, k, v, q_positions, k_positions, theta), grad_out, window=window)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10 * e.abs().max().item())


def test_return_stats_keeps_the_output_differentiable():
    q, k, v, q_positions, k_positions, theta = case(19)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, stats = rotary_attention(*leaves, q_positions, k_positions, theta, window=3, block_size=4, return_stats=True)
    assert out.requires_grad and stats.tiles_both > 0
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(19), dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, grad_out)
    expected = gradients(reference, (q, k, v, q_positions, k_positions, theta), grad_out, window=3)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10 * e.abs().max().item())


# --- the operators torch.ops.rope.blockwise_attention and blockwise_attention_backward ----------------------------


@pytest.mark.parametrize("compute_dtype", [None, torch.float64])
@pytest.mark.parametrize("method", SLOW_METHODS)
def test_opcheck_the_forward_operator(method, compute_dtype):
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = case(20, q_len=5, k_len=6, heads_q=2, heads_k=1, head_dim=4, pairs=2,
                                                    dtype=torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    options = dict(layout="interleaved", causal=True, window=None if window is None else 2, leaky_scale=leaky_scale,
                   softmax_scale=None, block_size=2, compute_dtype=compute_dtype)
    torch.library.opcheck(torch.ops.rope.blockwise_attention.default, (q, k, v, q_positions, k_positions, theta),
                          options)


@pytest.mark.parametrize("compute_dtype", [None, torch.float64])
def test_opcheck_the_backward_operator(compute_dtype):
    q, k, v, q_positions, k_positions, theta = case(21, q_len=5, k_len=6, heads_q=2, heads_k=1, head_dim=4, pairs=2,
                                                    dtype=torch.float32)
    options = dict(layout="half", causal=False, window=2, leaky_scale=None, softmax_scale=0.3, block_size=2,
                   compute_dtype=compute_dtype)
    out, lse = torch.ops.rope.blockwise_attention(q, k, v, q_positions, k_positions, theta, **options)
    assert out.dtype == lse.dtype == (compute_dtype or torch.float32)
    gen = torch.Generator().manual_seed(21)
    grad_out, grad_lse = (torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in (out, lse))
    torch.library.opcheck(torch.ops.rope.blockwise_attention_backward.default,
                          (q, k, v, q_positions, k_positions, theta, out, lse, grad_out, grad_lse), options)


def test_the_gradient_of_lse_is_the_softmax():
    q, k, v, q_positions, k_positions, theta = case(22, q_len=3, k_len=4, heads_q=2, heads_k=1, head_dim=4, pairs=2)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def function(q, k, v):  # lse alone (out: test_gradcheck): d lse_i / d x_ij = P_ij enters the backward's D_i
        return torch.ops.rope.blockwise_attention(q, k, v, q_positions, k_positions, theta, window=1,
                                                  block_size=2)[1]

    assert torch.autograd.gradcheck(function, leaves)


def test_the_operator_refuses_what_rotary_attention_refuses():
    q, k, v, q_positions, k_positions, theta = case(23)
    op = torch.ops.rope.blockwise_attention
    for options, error, message in [(dict(causal=1), TypeError, "causal"), (dict(window=2.0), TypeError, "window"),
                                    (dict(window=True), TypeError, "window"), (dict(block_size=0), ValueError,
                                                                               "block_size"),
                                    (dict(leaky_scale=4.0), ValueError, "needs a window"),
                                    (dict(compute_dtype=torch.bfloat16), ValueError, "compute_dtype")]:
        with pytest.raises(error, match=message):
            op(q, k, v, q_positions, k_positions, theta, **options)
    with pytest.raises(ValueError, match="precedes every key"):  # a value: the real implementation only
        op(q, k, v, torch.arange(11), k_positions, theta)
    fake = torch._subclasses.fake_tensor.FakeTensorMode()
    with fake, pytest.raises(TypeError, match="causal"):  # metadata: the fake implementation too
        op(*(fake.from_tensor(t) for t in (q, k, v, q_positions, k_positions, theta)), causal=0)


@pytest.mark.parametrize("compute_dtype", [None, torch.float64])
@pytest.mark.parametrize("method", ["rope", "rerope", "leaky16"])
def test_torch_compile_fullgraph_gives_the_eager_output_and_gradients(method, compute_dtype):
    window, leaky_scale = METHODS[method]
    inputs = case(24, q_len=7, k_len=9, dtype=torch.float32)
    q_positions, k_positions, theta = inputs[3:]

    def function(q, k, v):
        out = rotary_attention(q, k, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                               block_size=4, compute_dtype=compute_dtype)
        return out, out.sum()

    torch._dynamo.reset()
    compiled = torch.compile(function, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    results = []
    for f in (function, compiled):
        leaves = [t.detach().requires_grad_() for t in inputs[:3]]
        out, total = f(*leaves)
        results.append((out, *torch.autograd.grad(total, leaves)))
    assert results[0][0].dtype == (compute_dtype or torch.float32)
    for got, expected in zip(*results):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_log_n_scaling_multiplies_each_query_row(method):
    """logn_length L: the logits of the query at m times max(1, ln(m + 1) / ln L) (rope.attention.logn),
    in the output and the gradients; positions past L so that the factors differ from 1 and by row."""
    window, leaky_scale = METHODS[method]
    inputs = case(31, q_len=9, k_len=20)
    assert logn_scale(inputs[3], 8).min() > 1
    check(inputs, 4, window=window, leaky_scale=leaky_scale, logn_length=8)
    assert_gradients_match(inputs, 4, window=window, leaky_scale=leaky_scale, logn_length=8)


@pytest.mark.parametrize("method", METHODS)
def test_the_attention_factor_scales_the_rotated_coordinates(method):
    """attention_factor a: the rotated coordinates of q and k times a (transformers' cos and sin carry
    it), the unrotated tail not; output and gradients, with partial rotary so that the tail is there."""
    window, leaky_scale = METHODS[method]
    inputs = case(32, head_dim=12, pairs=4)
    check(inputs, 4, window=window, leaky_scale=leaky_scale, attention_factor=1.25)
    assert_gradients_match(inputs, 4, window=window, leaky_scale=leaky_scale, attention_factor=1.25)
    plain = rotary_attention(*inputs, window=window, leaky_scale=leaky_scale)
    assert (rotary_attention(*inputs, window=window, leaky_scale=leaky_scale, attention_factor=1.25)
            - plain).abs().max() > 1e-3


@pytest.mark.parametrize("shapes", ["both", "queries", "keys"])
@pytest.mark.parametrize("method", ["rope", "leaky16"])
def test_positions_per_batch_row_equal_each_row_alone(shapes, method):
    """[batch, seq] positions: each batch row's output, gradients and tiles are those of that row
    computed alone with its own 1-D positions."""
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = case(33)  # batch 2
    gen = torch.Generator().manual_seed(33)
    k_rows = torch.stack([k_positions, torch.randperm(40, generator=gen)[:13]])
    q_rows = torch.stack([q_positions, k_rows[1][torch.randperm(13, generator=gen)[:11]] + 2])
    m = q_rows if shapes != "keys" else q_positions + 40
    n = k_rows if shapes != "queries" else k_positions
    if shapes == "queries":
        m = torch.stack([q_positions, q_positions.flip(0)])
    options = dict(window=window, leaky_scale=leaky_scale, block_size=4, logn_length=8)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, stats = rotary_attention(*leaves, m, n, theta, return_stats=True, **options)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, grad_out)
    total = TileStats()
    for b in range(2):
        rows = [t[b:b + 1].detach().requires_grad_() for t in (q, k, v)]
        m_b, n_b = (m[b] if m.dim() == 2 else m), (n[b] if n.dim() == 2 else n)
        alone, row_stats = rotary_attention(*rows, m_b, n_b, theta, return_stats=True, **options)
        assert torch.equal(out[b:b + 1], alone)
        for g, e in zip(grads, torch.autograd.grad(alone, rows, grad_out[b:b + 1])):
            assert torch.equal(g[b:b + 1], e)
        for field in ("tiles_plain", "tiles_bent", "tiles_both", "tiles_skipped"):
            setattr(total, field, getattr(total, field) + getattr(row_stats, field))
    assert stats == total


def last_block_reference(q, k, v, q_positions, k_positions, theta, *, layout, causal=True):
    """Plain RoPE attention with the last rotary_dim coordinates of each head turned, from the formula:
    pair i (its coordinates a_i, b_i counted from head_dim - rotary_dim) by the angle m theta_i."""
    d, start = 2 * theta.numel(), q.shape[-1] - 2 * theta.numel()
    a, b = rope.layouts.pair_indices(d, layout)

    def turned(x, positions):
        x = x.double().clone()
        angle = positions.double()[:, None] * theta.double()  # [len, pairs]
        cos, sin = torch.cos(angle)[None, :, None], torch.sin(angle)[None, :, None]
        xa, xb = x[..., start + a], x[..., start + b]
        x[..., start + a], x[..., start + b] = xa * cos - xb * sin, xb * cos + xa * sin
        return x

    group = q.shape[2] // k.shape[2]
    logits = torch.einsum("bihd,bjhd->bhij", turned(q, q_positions),
                          turned(k, k_positions).repeat_interleave(group, dim=2)) / math.sqrt(q.shape[3])
    if causal:
        logits = logits.masked_fill(k_positions[None, :] > q_positions[:, None], -math.inf)
    values = v.double().repeat_interleave(group, dim=2)
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(logits, dim=-1), values)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("causal", [True, False])
def test_rotated_last_turns_the_last_block_of_each_head(layout, causal):
    """DeepSeek-V4's heads ("nope" then "rope"): output and gradients are the formula's."""
    inputs = case(21, head_dim=12, pairs=2, v_dim=5)
    leaves = [t.detach().requires_grad_() for t in inputs[:3]]
    out = rotary_attention(*leaves, *inputs[3:], layout=layout, causal=causal, rotated="last", block_size=4)
    expected_leaves = [t.detach().requires_grad_() for t in inputs[:3]]
    expected = last_block_reference(*expected_leaves, *inputs[3:], layout=layout, causal=causal)
    assert_matches(out, expected)
    grad_out = torch.randn_like(expected)
    got = torch.autograd.grad(out, leaves, grad_out)
    wanted = torch.autograd.grad(expected, expected_leaves, grad_out)
    for g, e in zip(got, wanted):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10 * e.abs().max().item())
    first = rotary_attention(*inputs, layout=layout, causal=causal, block_size=4)
    assert (first - out).abs().max() > 1e-3  # the first block turned is another model


@pytest.mark.parametrize("method", ["rerope", "leaky16"])
def test_rotated_last_with_a_window_is_the_first_block_moved(method):
    """A permutation applied to the coordinates of both q and k leaves every logit, bent or not."""
    window, leaky_scale = METHODS[method]
    q, k, v, q_positions, k_positions, theta = case(22, head_dim=12, pairs=2)
    out = rotary_attention(q, k, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                           rotated="last", block_size=4)
    moved = [torch.cat((x[..., -4:], x[..., :-4]), dim=-1) for x in (q, k)]
    assert_matches(out, reference(*moved, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale))


def test_rotated_last_at_extreme_positions_depends_on_relative_ones_only():
    """Every position moved by 2^50 (exactly reduced angles): the same output, to float64 rounding."""
    q, k, v, q_positions, k_positions, theta = case(24, head_dim=12, pairs=2)
    near = rotary_attention(q, k, v, q_positions, k_positions, theta, rotated="last", block_size=4)
    far = rotary_attention(q, k, v, q_positions + 2**50, k_positions + 2**50, theta, rotated="last", block_size=4)
    assert_matches(far, near)


def test_rotated_must_be_first_or_last():
    with pytest.raises(ValueError, match="rotated"):
        rotary_attention(*case(23), rotated="middle")
