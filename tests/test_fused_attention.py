"""The RoPE-inside-attention Triton kernel against float64 references.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (tests/conftest.py), at small
sizes. Two references, both float64 and built from the library's exactly reduced rotations:

* :func:`same_roundings`: the whole matrix of logits from the rotated q and k *rounded to their
  dtype* (the kernel's dot operands, which a separate rotary pass would have written), the
  softmax and P V in float64. The kernel differs from it only by float32 cos/sin (which may move a
  rotated value to the neighbouring number of its dtype when it lies near a tie), P rounded to
  v's dtype (at most u relative per weight, so u max|v| on the output) and float32 accumulation:
  :data:`SLACK` u max |v| holds that with room, u the unit roundoff of the dtype.
* :func:`rope.attention.blockwise.blockwise_attention` with ``compute_dtype=torch.float64``, the exact
  result (tested against the whole matrix in tests/test_blockwise_attention.py): float32 inputs are
  held to it too.
"""

import math

import pytest
import torch

pytest.importorskip("triton")

import rope
from helpers import assert_device_assertion, random_qk, value_checks_assert_on
from rope.attention.blockwise import blockwise_attention, rotary_attention
from rope.attention.logn import logn_scale
from rope.attention.rerope import bent_frame, rotate_exactly
from rope.kernels import attention_operators, triton_attention, triton_attention_backward
from rope.kernels.attention_operators import fused_attention, fused_rotary_attention
from rope.kernels.triton_attention import launch
from rope.kernels.triton_attention_backward import launch_backward
from rope.kernels.triton_attention_decode import DECODE_ROWS, launch_decode, split_count

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
METHODS = {"rope": (None, None), "rerope": (5, None), "leaky16": (5, 16.0), "leaky0.5": (5, 0.5)}


def case(seed, *, q_len=20, k_len=37, heads_q=4, heads_k=2, head_dim=32, pairs=16, v_dim=None, dtype=torch.float32,
         q_positions=None, k_positions=None, base=1e4, batch=1):
    """Random q, k, v of ``dtype`` (drawn in float64, rounded), queries the last q_len of the keys'
    contiguous positions unless given, float32 frequencies base^(-2i/rotary_dim). One batch row
    unless asked (the interpreter's time grows with the programs; the batch tests take 2)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = random_qk(gen, batch, q_len, heads_q, heads_k, head_dim, k_seq=k_len, dtype=dtype)
    v = torch.randn(batch, k_len, heads_k, v_dim or head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k_positions = torch.arange(k_len) + 3 if k_positions is None else k_positions
    q_positions = k_positions[-1] - q_len + 1 + torch.arange(q_len) if q_positions is None else q_positions
    theta = rope.inv_freq({"rope_theta": base}, 2 * pairs)[0]
    return [t.to(DEVICE) for t in (q, k, v, q_positions, k_positions, theta)]


def same_roundings(q, k, v, q_positions, k_positions, theta, *, layout="half", causal=True, window=None,
                   leaky_scale=None, softmax_scale=None, logn_length=None, attention_factor=1.0):
    """(out, lse) in float64 from the rotated q and k rounded to their dtype (module docstring); the
    second pass in the frame of rope.attention.rerope.bent_frame."""
    group = q.shape[2] // k.shape[2]

    rotary = torch.arange(q.shape[3]) < 2 * theta.numel()

    def turned(x, positions, inv_freq):  # a R x on the rotated coordinates, rounded to x's dtype
        return torch.where(rotary, attention_factor * rotate_exactly(x, positions, inv_freq, layout), x.double())

    def logits(frame):
        q_rot = turned(q, *frame(q_positions, True)).to(q.dtype).double()
        k_rot = turned(k, *frame(k_positions, False)).to(k.dtype).double()
        return torch.einsum("bihd,bjhd->bhij", q_rot, k_rot.repeat_interleave(group, dim=2))

    x = logits(lambda positions, query: (positions, theta))
    if window is not None:
        bent = logits(lambda positions, query: bent_frame(positions, theta, window, leaky_scale, query))
        x = torch.where((q_positions[:, None] - k_positions[None, :]) < window, x, bent)
    x = x * (softmax_scale or 1 / math.sqrt(q.shape[3]))
    if logn_length is not None:
        x = x * logn_scale(q_positions, logn_length)[:, None]
    if causal:
        x = x.masked_fill(k_positions[None, :] > q_positions[:, None], -math.inf)
    values = v.double().repeat_interleave(group, dim=2)
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(x, dim=-1), values), torch.logsumexp(x, dim=-1)


SLACK = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 16}
"""The tolerance in units of u max|v| (module docstring)."""


def tolerance(q, k, v, softmax_scale=None, factor=1.0):
    """SLACK u max|v|, plus max|v| times one float32 rounding of the largest possible logit
    s f max||q|| max||k|| (the float32 accumulation, which matters for large logits; f the largest
    log-n factor)."""
    scale = (softmax_scale or 1 / math.sqrt(q.shape[3])) * factor
    largest = scale * q.double().norm(dim=-1).max().item() * k.double().norm(dim=-1).max().item()
    return v.double().abs().max().item() * (SLACK[v.dtype] * UNIT[v.dtype] + 2.0**-24 * largest)


def check(inputs, launcher=launch, **options):
    """Run the kernel (``launcher``: the prefill or the decoding one); assert its output and lse
    within :func:`tolerance` of :func:`same_roundings` (float32: also of the exact blockwise result)."""
    q, k, v = inputs[:3]
    out, lse = launcher(*inputs, **options)
    reference = {name: value for name, value in options.items() if not name.startswith(("block_", "num_", "splits"))}
    cpu = [t.cpu() for t in inputs]
    expected, expected_lse = same_roundings(*cpu, **reference)
    assert out.dtype == q.dtype and out.shape == expected.shape and lse.dtype == torch.float32
    factor = 1.0 if options.get("logn_length") is None else logn_scale(cpu[3], options["logn_length"]).max().item()
    factor *= options.get("attention_factor", 1.0) ** 2
    err = (out.cpu().double() - expected).abs().max().item()
    bound = tolerance(*cpu[:3], options.get("softmax_scale"), factor)
    assert err <= bound, f"output error {err:.3g} > {bound:.3g}"
    lse_err = ((lse.cpu().double() - expected_lse).abs() / (1 + expected_lse.abs())).max().item()
    assert lse_err <= SLACK[q.dtype] * UNIT[q.dtype], f"lse error {lse_err:.3g}"
    if q.dtype == torch.float32:
        exact, exact_lse = blockwise_attention(*cpu, **reference, compute_dtype=torch.float64)
        assert (out.cpu().double() - exact).abs().max().item() <= 4 * bound
        assert ((lse.cpu().double() - exact_lse).abs() / (1 + exact_lse.abs())).max().item() <= 64 * UNIT[q.dtype]
    return out, expected


def test_the_tolerance_is_below_what_a_wrong_angle_costs():
    """A kernel that rotated keys one position off, bent at the wrong window or not at all would fail check()."""
    q, k, v, q_positions, k_positions, theta = case(0)
    exact = dict(compute_dtype=torch.float64)
    right = blockwise_attention(q, k, v, q_positions, k_positions, theta, window=5, **exact)[0]
    for wrong in (blockwise_attention(q, k, v, q_positions, k_positions + 1, theta, window=5, **exact)[0],
                  blockwise_attention(q, k, v, q_positions, k_positions, theta, window=6, **exact)[0],
                  blockwise_attention(q, k, v, q_positions, k_positions, theta, **exact)[0]):
        for dtype in UNIT:
            assert (wrong - right).abs().max().item() > 10 * tolerance(q.to(dtype), k.to(dtype), v.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [True, False])
def test_matches_the_reference(dtype, method, causal):
    window, leaky_scale = METHODS[method]
    check(case(1, dtype=dtype), causal=causal, window=window, leaky_scale=leaky_scale)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_interleaved_layout(method, dtype):
    window, leaky_scale = METHODS[method]
    check(case(2, dtype=dtype), layout="interleaved", window=window, leaky_scale=leaky_scale)


@pytest.mark.slow
@pytest.mark.parametrize("heads_q, heads_k", [(4, 2), (4, 1), (3, 3)])
@pytest.mark.parametrize("method", ["rope", "leaky16"])
def test_gqa_mqa_partial_rotary_and_value_width(heads_q, heads_k, method):
    window, leaky_scale = METHODS[method]
    inputs = case(3, heads_q=heads_q, heads_k=heads_k, head_dim=40, pairs=4, v_dim=24, dtype=torch.bfloat16, batch=2)
    out, _ = check(inputs, layout="interleaved", window=window, leaky_scale=leaky_scale)
    assert out.shape == (2, 20, heads_q, 24)


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("method", METHODS)
def test_head_dims_64_and_128(head_dim, method):
    window, leaky_scale = METHODS[method]
    inputs = case(4, q_len=20, k_len=33, head_dim=head_dim, pairs=head_dim // 2, dtype=torch.float16)
    check(inputs, window=window, leaky_scale=leaky_scale)


@pytest.mark.slow
def test_query_head_h_reads_key_head_h_over_group():
    q, k, v, q_positions, k_positions, theta = case(5, heads_q=6, heads_k=2, dtype=torch.float32, batch=2)
    out, _ = launch(q, k, v, q_positions, k_positions, theta)
    for h in range(6):
        alone, _ = launch(q[:, :, h:h + 1], k[:, :, h // 3:h // 3 + 1], v[:, :, h // 3:h // 3 + 1], q_positions,
                          k_positions, theta)
        torch.testing.assert_close(out[:, :, h:h + 1], alone, rtol=0, atol=0)


POSITIONS = ["offset", "ragged", "unsorted", "reversed", "decode", "decode_ahead", "negative", "near_2^31"]


POSITION_CASES = [(positions, method) for positions in POSITIONS for method in ("rope", "leaky16")] + [
    (positions, method) for positions in ("unsorted", "reversed", "decode_ahead") for method in ("rerope", "leaky0.5")]


@pytest.mark.slow
@pytest.mark.parametrize("positions, method", POSITION_CASES)
def test_positions_with_offsets_gaps_and_other_lengths(positions, method):
    window, leaky_scale = METHODS[method]
    gen = torch.Generator().manual_seed(6)
    offset = 10**6
    k_len = 25
    k_positions = {
        "offset": torch.arange(k_len) + offset,
        "ragged": torch.cumsum(torch.randint(1, 5, (k_len,), generator=gen), 0) + offset,
        "unsorted": torch.randperm(90, generator=gen)[:k_len] + offset,
        "negative": torch.arange(k_len) - 60,
        "reversed": torch.arange(k_len).flip(0) + offset,  # causal: early queries see nothing of the first block
        "near_2^31": torch.arange(k_len) + 2**31 - k_len,
    }.get(positions, torch.arange(k_len) + offset)
    q_len = 1 if positions.startswith("decode") else 23
    q_positions = {
        "ragged": k_positions[-q_len:] + torch.randint(0, 3, (q_len,), generator=gen),
        "unsorted": k_positions[torch.randperm(k_len, generator=gen)[:q_len]],
        "decode": k_positions[-1:],
        "decode_ahead": k_positions[-1:] + 7,
    }.get(positions, k_positions[-q_len:])
    if positions == "near_2^31":
        q_positions = q_positions.clamp(max=2**31 - 1)
    inputs = case(7, q_len=q_len, k_len=k_len, q_positions=q_positions, k_positions=k_positions,
                  dtype=torch.float16)
    check(inputs, causal=True, window=window, leaky_scale=leaky_scale)
    if positions in ("unsorted", "decode_ahead", "near_2^31"):
        check(inputs, causal=False, window=window, leaky_scale=leaky_scale)


def test_every_tile_kind_occurs_and_matches():
    """Contiguous positions, window 20, 16 x 16 tiles: plain, bent, both and skipped tiles in one call."""
    inputs = case(8, q_len=64, k_len=64, dtype=torch.float32)
    _, stats = rotary_attention(*inputs, window=20, block_size=16, return_stats=True)
    assert min(stats.tiles_plain, stats.tiles_bent, stats.tiles_both, stats.tiles_skipped) > 0, stats
    for leaky_scale in (None, 16.0):
        check(inputs, window=20, leaky_scale=leaky_scale, block_m=16, block_n=16)
        check(inputs, window=20, leaky_scale=leaky_scale, block_m=32, block_n=16)


@pytest.mark.slow
@pytest.mark.skipif(not triton_attention.interpreting(), reason="counts the calls the interpreter makes")
@pytest.mark.parametrize("leaky_scale", [None, 16.0])
def test_each_tile_forms_its_logits_once_per_frame_it_takes(leaky_scale, monkeypatch):
    """Forward and backward form a tile's logits once on plain and bent tiles and twice only on
    the tiles the boundary crosses (counted by the blockwise reference on the same 16 x 16 tiles):
    the forward once per query head, the backward twice (its dk/dv and dq kernels); the gradients
    stay within tolerance."""
    inputs = case(8, q_len=64, k_len=64, dtype=torch.float32)
    _, stats = rotary_attention(*inputs, window=20, block_size=16, return_stats=True)
    assert min(stats.tiles_plain, stats.tiles_bent, stats.tiles_both) > 0, stats
    calls = {triton_attention: 0, triton_attention_backward: 0}
    for module in calls:
        def counted(*args, module=module, original=module.tile_logits):
            calls[module] += 1
            return original(*args)

        monkeypatch.setattr(module, "tile_logits", counted)
    assert_gradients_match(inputs, window=20, leaky_scale=leaky_scale)  # 16 x 16 tiles in the interpreter
    products = inputs[0].shape[2] * (stats.tiles_plain + stats.tiles_bent + 2 * stats.tiles_both)
    assert calls == {triton_attention: products, triton_attention_backward: 2 * products}


@pytest.mark.parametrize("leaky_scale", [None, 4.0])
def test_window_one_and_a_window_beyond_every_distance(leaky_scale):
    inputs = case(9, q_len=20, k_len=30, dtype=torch.float32)
    check(inputs, window=1, leaky_scale=leaky_scale)
    plain, _ = launch(*inputs)
    wide, _ = launch(*inputs, window=100, leaky_scale=leaky_scale)
    torch.testing.assert_close(wide, plain, rtol=0, atol=0)  # every tile plain: the same operations


def test_large_logits_and_softmax_scale():
    """The online softmax at logits of a few thousand (exp would overflow without the running max)."""
    q, k, v, q_positions, k_positions, theta = case(10, dtype=torch.float32)
    check([q * 30, k * 30, v, q_positions, k_positions, theta], window=5, softmax_scale=0.5)
    check([q, k, v, q_positions, k_positions, theta], softmax_scale=3.0)


def test_a_row_masked_in_its_first_tiles():
    """Reversed key positions: a query's first key blocks are all in its future."""
    k_positions = torch.arange(48).flip(0)
    inputs = case(11, q_len=20, k_len=48, q_positions=torch.arange(20), k_positions=k_positions,
                  dtype=torch.float32)
    check(inputs, window=3)


def test_strided_views_of_a_packed_projection():
    """q, k, v as slices of one [batch, seq, heads, 3 d] tensor: only the last dimension is contiguous."""
    q, k, v, q_positions, k_positions, theta = case(12, q_len=37, heads_q=2, heads_k=2, dtype=torch.float16, batch=2)
    packed = torch.cat([q, k, v], dim=3)
    views = [packed[..., :32], packed[..., 32:64], packed[..., 64:]]
    assert not views[0].is_contiguous()
    out, lse = launch(*views, q_positions, k_positions, theta, window=5)
    expected, expected_lse = launch(q, k, v, q_positions, k_positions, theta, window=5)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def test_empty_queries_and_empty_batch():
    q, k, v, q_positions, k_positions, theta = case(13, batch=2)
    out, lse = launch(q[:, :0], k, v, q_positions[:0], k_positions, theta)
    assert out.shape == (2, 0, 4, 32) and lse.shape == (2, 4, 0)
    out, lse = launch(q[:0], k[:0], v[:0], q_positions, k_positions, theta)
    assert out.shape == (0, 20, 4, 32) and lse.shape == (0, 4, 20)


@pytest.mark.parametrize("empty", ["batch", "q_len", "heads_q", "q_len and k_len"])
def test_decoding_shapes_with_a_dimension_of_size_zero_give_empty_outputs(empty, monkeypatch):
    """One query per sequence (the decoding kernel's shapes) with a dimension of size 0: the
    decoding kernel, the operators (which take it) and the prefill kernel all return the float64
    reference's empty out, in q's dtype, and its lse, float32; the gradients are zeros of the
    inputs' shapes."""
    calls = []
    original = attention_operators.launch_decode
    monkeypatch.setattr(attention_operators, "launch_decode", lambda *a, **o: calls.append(1) or original(*a, **o))
    q, k, v, q_positions, k_positions, theta = case(60, q_len=1, k_len=37, batch=2, dtype=torch.bfloat16)
    if empty == "batch":
        q, k, v = q[:0], k[:0], v[:0]
    elif empty == "heads_q":
        q = q[:, :, :0]
    else:
        q, q_positions = q[:, :0], q_positions[:0]
        if empty == "q_len and k_len":
            k, v, k_positions = k[:, :0], v[:, :0], k_positions[:0]
    inputs = (q, k, v, q_positions, k_positions, theta)
    expected, expected_lse = blockwise_attention(*[t.cpu() for t in inputs], window=5, compute_dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    results = [launch(*inputs, window=5), launch_decode(*inputs, window=5), launch_decode(*inputs, splits=1),
               fused_attention(*leaves, q_positions, k_positions, theta, "half", True, 5)]
    assert calls == [1]
    assert split_count(0, k.shape[1], 16, q.device) == split_count(1, k.shape[1], 16, q.device)  # no row: as one
    for out, lse in results:
        assert out.shape == expected.shape and out.dtype == q.dtype
        assert lse.shape == expected_lse.shape and lse.dtype == torch.float32
    out, lse = results[-1]
    grads = torch.autograd.grad((out.float().sum(), lse.sum()), leaves)
    for g, leaf in zip(grads, leaves):
        assert g.shape == leaf.shape and g.dtype == leaf.dtype and not g.any()


@pytest.mark.slow
def test_launch_sizes_do_not_change_the_result_beyond_rounding():
    inputs = case(14, q_len=50, k_len=50, dtype=torch.bfloat16)
    for block_m, block_n in ((16, 32), (32, 16), (64, 64)):
        check(inputs, window=5, leaky_scale=2.0, block_m=block_m, block_n=block_n)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's max over the NaN row
def test_non_finite_values_stay_in_their_rows():
    """A NaN in one query makes that query's output NaN and no other (keys and values are shared)."""
    q, k, v, q_positions, k_positions, theta = case(15, dtype=torch.float32)
    q = q.clone()
    q[0, 7, 1, 3] = math.nan
    out, _ = launch(q, k, v, q_positions, k_positions, theta, window=5)
    nan = out.isnan().any(dim=-1)
    assert nan[0, 7, 1] and nan.sum() == 1


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize("tensor", ["k", "v"])
def test_a_non_finite_key_or_value_reaches_the_rows_that_attend_to_it(tensor):
    """Causal, contiguous positions, 16 x 16 tiles, a NaN at key 40 (key block 32..47): the rows
    that attend to it (m >= 40) are NaN, their lse too for a NaN key; the query blocks that never
    load its key block (m < 32) stay finite. A NaN key's masked logits are dropped, so with k the
    rows 32..39 stay finite too; a NaN value meets their zero weights in the tile's product
    (0 NaN = NaN), so with v they may not."""
    inputs = list(case(23, q_len=64, k_len=64, dtype=torch.float32))
    index = "kv".index(tensor) + 1
    inputs[index] = inputs[index].clone()
    inputs[index][0, 40, 1, 5] = math.nan
    out, lse = launch(*inputs, window=20, block_m=16, block_n=16)
    nan = out.isnan().any(dim=-1)[0]  # [q_len, heads_q]
    heads = torch.arange(inputs[0].shape[2]) // 2 == 1  # the query heads of key head 1
    assert nan[40:][:, heads].all() and not nan[:, ~heads].any() and not nan[:32].any()
    if tensor == "k":  # its logits: the rows' normalisers too
        assert not nan[:40].any() and lse[0, heads][:, 40:].isnan().all() and not lse[0, :, :40].isnan().any()
    else:
        assert not lse.isnan().any()


def _bad(**changes):
    q, k, v, q_positions, k_positions, theta = case(16, q_len=11, k_len=13)
    arguments = dict(q=q, k=k, v=v, q_positions=q_positions, k_positions=k_positions, inv_freq=theta, window=2)
    arguments.update({name: change(arguments[name]) if callable(change) else change
                      for name, change in changes.items()})
    return arguments


BAD = [
    (dict(q=lambda q: q.double(), k=lambda k: k.double(), v=lambda v: v.double()), TypeError, "float64: rope"),
    (dict(k=lambda k: k.half()), TypeError, "k must have q's dtype"),
    (dict(v=lambda v: v.bfloat16()), TypeError, "v must have q's dtype"),
    (dict(q=lambda q: q[0]), ValueError, "q must have shape"),
    (dict(q=lambda q: q[:, :, :3]), ValueError, "multiple of heads_k"),
    (dict(v=lambda v: v[:, :-1]), ValueError, "v .* must match k"),
    (dict(q_positions=lambda p: p.double()), TypeError, "q_positions"),
    (dict(k_positions=lambda p: p[:-1]), ValueError, "k_positions"),
    (dict(logn_length=1), ValueError, "logn_length"),
    (dict(q_positions=lambda p: p.expand(2, -1)), ValueError, "q_positions must have shape"),
    (dict(k_positions=lambda p: p[None, None]), ValueError, "k_positions must have shape"),
    (dict(k_positions=lambda p: p.float()), TypeError, "k_positions"),
    (dict(attention_factor=-1.0), ValueError, "attention_factor"),
    (dict(attention_factor=None), TypeError, "attention_factor"),
    (dict(attention_factor=2.0, rotate=False), ValueError, "rotate=False takes 1"),
    (dict(window=3, rotate=False), ValueError, "rotate=False takes window=None"),
    (dict(leaky_scale=2.0, window=3, rotate=False), ValueError, "rotate=False takes window=None"),
    (dict(logn_length=8.0), TypeError, "logn_length"),
    (dict(logn_length=True), TypeError, "logn_length"),
    (dict(k=lambda k: k[:, :0], v=lambda v: v[:, :0], k_positions=lambda p: p[:0], causal=False), ValueError,
     "k_positions is empty"),
    (dict(inv_freq=lambda t: t.double()), TypeError, "inv_freq"),
    (dict(q=lambda q: q.transpose(1, 3).contiguous().transpose(1, 3)), ValueError, "q must have a contiguous last"),
    (dict(layout="gptj"), ValueError, "layout"),
    (dict(causal=1), TypeError, "causal"),
    (dict(window=0), ValueError, "window"),
    (dict(window=2.0), TypeError, "window"),
    (dict(window=None, leaky_scale=4.0), ValueError, "leaky_scale .* needs a window"),
    (dict(leaky_scale=-1.0), ValueError, "leaky_scale"),
    (dict(softmax_scale=math.nan), ValueError, "softmax_scale"),
    (dict(softmax_scale=1e39), ValueError, "softmax_scale is too large"),  # log2(e) s: infinite in float32
    (dict(softmax_scale=1e37, logn_length=2), ValueError, "softmax_scale is too large"),  # log-n factors up to 31
    (dict(attention_factor=1e25), ValueError, "attention_factor is too large"),
    (dict(window=2**64), ValueError, "window must be <="),
    (dict(logn_length=2**64), ValueError, "logn_length must be <="),
    (dict(block_m=8), ValueError, "block_m"),
    (dict(block_n=48), ValueError, "block_n must be a power of two"),
    (dict(block_m=True), TypeError, "block_m"),
    (dict(block_m=0), ValueError, "block_m"),
    (dict(block_n=32.0), TypeError, "block_n"),
    (dict(num_warps=0), ValueError, "num_warps"),
    (dict(num_warps=3), ValueError, "num_warps must be a power of two"),
    (dict(num_warps=True), TypeError, "num_warps"),
    (dict(num_stages=0), ValueError, "num_stages"),
]


@pytest.mark.parametrize("changes, error, message", BAD, ids=[f"{next(iter(c))}-{m}" for c, _, m in BAD])
def test_bad_arguments_are_named(changes, error, message):
    with pytest.raises(error, match=message):
        launch(**_bad(**changes))
    if "block_m" not in changes:  # the decoding kernel checks the same arguments first
        with pytest.raises(error, match=message):
            launch_decode(**_bad(**changes))


BAD_VALUES = [
    # (changes, message): values refused by rope._checks.assert_values (eagerly off CUDA, by a
    # device assertion on CUDA)
    (dict(q_positions=lambda p: p + 2**31), "q_positions must hold values in"),
    (dict(k_positions=lambda p: p - 2**31 - 20), "k_positions must hold values in"),
    (dict(k_positions=lambda p: torch.cat([p.new_tensor([-2**63]), p[1:]])),  # abs(-2^63) = -2^63
     "k_positions must hold values in"),
    (dict(k_positions=lambda p: torch.cat([p.new_tensor([-2**31]), p[1:]]).to(torch.int32)),
     "k_positions must hold values in"),
    (dict(q_positions=lambda p: p - 100), "q_positions must hold no position before every key .* precedes"),
    (dict(q_positions=lambda p: p - 100, k_positions=lambda p: p - 100, logn_length=8),
     "q_positions must hold no negative position"),
    (dict(inv_freq=lambda t: t * 2.0**20), "inv_freq must hold values below 2"),
    (dict(inv_freq=lambda t: t * 2.0**13, leaky_scale=0.01), r"inv_freq must hold values with \|theta\| / leaky_scale"),
    (dict(inv_freq=torch.tensor([1.0, math.inf] * 8, device=DEVICE)), "inv_freq must hold finite values"),
]


@pytest.mark.parametrize("launcher", ["launch", "launch_decode"])  # the decoding kernel checks the same values
@pytest.mark.parametrize("index", range(len(BAD_VALUES)), ids=[f"{next(iter(c))}-{m}" for c, m in BAD_VALUES])
def test_bad_values_are_refused_as_on_their_device(index, launcher):
    """A ValueError naming the argument off CUDA; on CUDA the documented device assertion (in a
    fresh process: it leaves the CUDA context unusable)."""
    changes, message = BAD_VALUES[index]
    if value_checks_assert_on(DEVICE):
        assert_device_assertion(f"import test_fused_attention as t; t.{launcher}(**t._bad(**t.BAD_VALUES[{index}][0]))")
    else:
        with pytest.raises(ValueError, match=message):
            {"launch": launch, "launch_decode": launch_decode}[launcher](**_bad(**changes))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8, torch.int64])
def test_positions_of_every_integer_dtype(dtype):
    """The domain (-2^31, 2^31) is checked in int64, so that 2^31 does not wrap in an int32 comparison:
    narrow positions give the int64 positions' result, which matches the float64 reference; int32
    positions at the top of the domain too."""
    inputs = case(48, q_len=5, k_len=9, heads_q=2, heads_k=1, head_dim=16, pairs=8, dtype=torch.float32)
    tops = [False, True] if dtype == torch.int32 else [False]
    for top in tops:
        if top:
            inputs[4] = torch.arange(9, device=DEVICE) + 2**31 - 9
            inputs[3] = inputs[4][-5:]
        narrow = [*inputs[:3], inputs[3].to(dtype), inputs[4].to(dtype), inputs[5]]
        out, lse = launch(*narrow, window=3)
        expected, expected_lse = launch(*inputs, window=3)
        assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
        exact = rotary_attention(*[t.cpu() for t in inputs], window=3, compute_dtype=torch.float64)
        assert (out.cpu().double() - exact).abs().max().item() <= 4 * tolerance(*inputs[:3])


def test_values_of_width_zero_give_every_rows_lse_and_its_gradients():
    """v_dim = 0: an empty output, but each row's lse (the values are masked, the logits are not) in
    the prefill and decoding kernels, and the gradients of lse through the backward kernels."""
    q, k, v, q_positions, k_positions, theta = case(49, q_len=20, k_len=20, heads_q=2, heads_k=1, head_dim=16,
                                                    pairs=8, dtype=torch.float32)
    v = v[..., :0]
    leaves64 = [t.cpu().double().requires_grad_() for t in (q, k, v)]
    _, exact_lse = blockwise_attention(*leaves64, q_positions.cpu(), k_positions.cpu(), theta.cpu(), window=5)
    expected = torch.autograd.grad(exact_lse.sum(), leaves64[:2])

    def assert_lse(lse, exact):
        assert ((lse.cpu().double() - exact).abs() / (1 + exact.abs())).max().item() <= 64 * UNIT[torch.float32]

    out, lse = launch(q, k, v, q_positions, k_positions, theta, window=5)
    assert out.shape == (1, 20, 2, 0)
    assert_lse(lse, exact_lse.detach())
    out, lse = launch_decode(q[:, -1:], k, v, q_positions[-1:], k_positions, theta, window=5)
    assert out.shape == (1, 1, 2, 0)
    assert_lse(lse, exact_lse.detach()[..., -1:])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _, lse = fused_attention(*leaves, q_positions, k_positions, theta, "half", True, 5)
    dq, dk, dv = torch.autograd.grad(lse.sum(), leaves)
    assert dv.shape == v.shape
    for g, e in zip((dq, dk), expected):
        assert (g.cpu().double() - e).abs().max() <= 32 * UNIT[torch.float32] * e.abs().max()


def test_the_logit_scale_must_stay_within_float32():
    """log2(e) softmax_scale attention_factor^2 (times the largest log-n factor, 31 for L = 2) is a
    float32 factor of the kernels' logits: beyond float32's range it is refused from the options."""
    arguments = case(52, q_len=3, k_len=3, heads_q=1, heads_k=1, head_dim=16, pairs=8)

    def metadata(softmax_scale=None, logn_length=None, attention_factor=1.0):
        return triton_attention.check_metadata(*arguments, "half", True, None, None, softmax_scale, logn_length,
                                               attention_factor)

    metadata(softmax_scale=2e38)  # log2(e) 2e38 = 2.9e38
    metadata(attention_factor=1e19)  # 1e38 / sqrt(16) log2(e) = 3.6e37
    metadata(softmax_scale=1e37, logn_length=2**40)  # no log-n factor above 1 below 2^31
    for options, name in [(dict(softmax_scale=2.5e38), "softmax_scale"), (dict(attention_factor=4e19),
                          "attention_factor"), (dict(softmax_scale=1e37, logn_length=2), "softmax_scale"),
                          (dict(softmax_scale=1e-30, attention_factor=1e39), "softmax_scale . attention_factor"),
                          (dict(softmax_scale=1e-300, attention_factor=1e160), "softmax_scale . attention_factor")]:
        with pytest.raises(ValueError, match=f"{name}.* is too large for the kernel's float32 logits"):
            metadata(**options)
        with pytest.raises(ValueError, match=f"{name}.* is too large"):
            fused_rotary_attention(*arguments, **options)


def test_options_beyond_int64_are_named_before_dispatch():
    """The operators take int64 scalars: fused_rotary_attention checks its options before dispatch,
    which would raise a bare OverflowError for window = 2^64, and passes the checked floats (an int
    softmax_scale of 2^64 is a number like any other)."""
    arguments = case(53, q_len=3, k_len=3, heads_q=1, heads_k=1, head_dim=16, pairs=8)
    for options, name in [(dict(window=2**64), "window"), (dict(logn_length=2**64), "logn_length"),
                          (dict(window=4, leaky_scale=2**1100), "leaky_scale"),
                          (dict(attention_factor=2**1100), "attention_factor")]:
        with pytest.raises(ValueError, match=name):
            fused_rotary_attention(*arguments, **options)
    torch.testing.assert_close(fused_rotary_attention(*arguments, softmax_scale=2**64, window=2**63 - 1),
                               fused_rotary_attention(*arguments, softmax_scale=float(2**64)), rtol=0, atol=0)


def test_cpu_tensors_without_the_interpreter_are_refused_before_any_launch(monkeypatch):
    """Without TRITON_INTERPRET, Triton has no driver for CPU tensors ("0 active drivers"): every
    launcher says so first, naming q's device."""
    q, k, v, q_positions, k_positions, theta = (t.cpu() for t in case(51, q_len=4, k_len=4, heads_q=1, heads_k=1,
                                                                       head_dim=16, pairs=8))
    saved = dict(out=torch.zeros_like(v), lse=torch.zeros(1, 1, 4), grad_out=torch.zeros_like(v))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    message = "q is on cpu: the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1"
    for call in (launch, launch_decode, fused_rotary_attention, fused_attention):
        with pytest.raises(ValueError, match=message):
            call(q, k, v, q_positions, k_positions, theta)
    with pytest.raises(ValueError, match=message):
        launch_backward(q, k, v, q_positions, k_positions, theta, **saved)


def test_the_leaky_frequencies_hold_theta_over_k_to_48_bits():
    theta = rope.inv_freq({"rope_theta": 5e5}, 128)[0]
    for scale in (16.0, 0.5, 3.0, 1 / 3):
        hi, lo = triton_attention.leaky_frequencies(theta, scale).double()
        exact = theta.double() / scale
        assert torch.all((hi + lo - exact).abs() <= 2.0**-48 * exact)
        assert torch.equal(hi.float().double(), hi) and torch.equal(lo.float().double(), lo)



# --- the backward kernels and the operators -------------------------------------------------------------------------

GRADIENT_SLACK = {torch.float16: 4, torch.bfloat16: 4, torch.float32: 32}
"""Gradients within GRADIENT_SLACK u max|g| of float64 autograd of the exact function: the kernels
round the rotated operands, P and dL to the inputs' dtype (measured: up to 2 u for float16 and
bfloat16, up to 9 u for float32, whose float32 accumulation dominates)."""


def float64_gradients(inputs, grad_out, **options):
    """(out, dq, dk, dv): float64 autograd through the blockwise reference, q, k, v as given (rounded)."""
    q, k, v, *rest = [t.cpu() for t in inputs]
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out = rotary_attention(*leaves, *rest, **options)
    return out, *torch.autograd.grad(out, leaves, grad_out.cpu().double())


def kernel_gradients(inputs, grad_out, **options):
    leaves = [t.detach().clone().requires_grad_() for t in inputs[:3]]
    out = fused_rotary_attention(*leaves, *inputs[3:], **options)
    return out, *torch.autograd.grad(out, leaves, grad_out)


def assert_gradients_match(inputs, seed=0, **options):
    q = inputs[0]
    batch, q_len, heads_q = q.shape[:3]
    gen = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(batch, q_len, heads_q, inputs[2].shape[3], generator=gen, dtype=torch.float64)
    grad_out = grad_out.to(q.dtype).to(q.device)
    _, *grads = kernel_gradients(inputs, grad_out, **options)
    _, *expected = float64_gradients(inputs, grad_out, **options)
    for name, g, e, t in zip("qkv", grads, expected, inputs[:3]):
        assert g.dtype == t.dtype and g.shape == t.shape
        bound = GRADIENT_SLACK[q.dtype] * UNIT[q.dtype] * e.abs().max().item()
        err = (g.cpu().double() - e).abs().max().item()
        assert err <= bound, f"d{name}: error {err:.3g} > {bound:.3g}"
    return grads, expected


GRADIENT_CASES = [(torch.float32, method) for method in METHODS] + [
    (torch.bfloat16, "rerope"), (torch.bfloat16, "leaky16"), (torch.float16, "rope"), (torch.float16, "leaky0.5")]


@pytest.mark.parametrize("dtype, method", GRADIENT_CASES)
def test_gradients_match_float64_autograd(dtype, method):
    window, leaky_scale = METHODS[method]
    causal = method in ("rope", "leaky16")
    inputs = case(20, q_len=16, k_len=27, dtype=dtype)
    assert_gradients_match(inputs, causal=causal, window=window, leaky_scale=leaky_scale)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_gradients_with_gqa_partial_rotary_value_width_and_unsorted_positions(method):
    window, leaky_scale = METHODS[method]
    gen = torch.Generator().manual_seed(21)
    k_positions = torch.randperm(60, generator=gen)[:25]
    q_positions = k_positions[torch.randperm(25, generator=gen)[:14]]
    inputs = case(21, q_len=14, k_len=25, heads_q=3, heads_k=1, head_dim=40, pairs=12, v_dim=24, batch=2,
                  q_positions=q_positions, k_positions=k_positions, dtype=torch.bfloat16)
    assert_gradients_match(inputs, layout="interleaved", window=window, leaky_scale=leaky_scale)


def test_gradient_tolerance_is_below_what_a_wrong_frame_costs():
    """Gradients of ReRoPE and of plain RoPE differ by far more than the tolerance."""
    inputs = case(22, dtype=torch.float32)
    grad_out = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    _, *bent = float64_gradients(inputs, grad_out, window=5)
    _, *plain = float64_gradients(inputs, grad_out)
    for b, p in zip(bent[:2], plain[:2]):
        assert (b - p).abs().max() > 10 * GRADIENT_SLACK[torch.bfloat16] * UNIT[torch.bfloat16] * b.abs().max()


def test_the_gradient_of_lse_is_the_softmax_weighted_key():
    """Through torch.ops.rope.fused_attention's lse output: d(sum lse)/dq against float64."""
    q, k, v, q_positions, k_positions, theta = case(23, dtype=torch.float32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _, lse = fused_attention(*leaves, q_positions, k_positions, theta, "half", True, 5, None, None)
    grads = torch.autograd.grad(lse.sum(), leaves[:2])
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    _, lse64 = blockwise_attention(*leaves64, q_positions, k_positions, theta, window=5)
    expected = torch.autograd.grad(lse64.sum(), leaves64[:2])
    for g, e in zip(grads, expected):
        assert (g.double() - e).abs().max() <= 32 * UNIT[torch.float32] * e.abs().max()


def test_empty_queries_give_zero_gradients():
    q, k, v, q_positions, k_positions, theta = case(24, batch=2)
    leaves = [t.clone().requires_grad_() for t in (q[:, :0], k, v)]
    out = fused_rotary_attention(*leaves, q_positions[:0], k_positions, theta, window=2)
    dq, dk, dv = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert dq.shape == (2, 0, 4, 32) and dk.abs().max() == dv.abs().max() == 0


def test_opcheck_the_operators():
    window, leaky_scale = METHODS["leaky16"]
    q, k, v, q_positions, k_positions, theta = case(25, q_len=9, k_len=17, heads_q=2, heads_k=1, dtype=torch.float16)
    arguments = (q, k, v, q_positions, k_positions, theta, "interleaved", False, window, leaky_scale, 0.3)
    torch.library.opcheck(torch.ops.rope.fused_attention.default, arguments)
    out, lse = fused_attention(*arguments)
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse)
    torch.library.opcheck(torch.ops.rope.fused_attention_backward.default,
                          (*arguments[:6], out, lse, grad_out, grad_lse, *arguments[6:]))


def test_opcheck_permuted_inputs_the_real_strides_are_the_fakes():
    """q, k, v as [batch, seq, heads, d] views of [batch, heads, seq, d] buffers (q = x.transpose(1, 2)):
    the real backward's gradients are contiguous like the fake's, as torch.compile's graph expects."""
    q, k, v, q_positions, k_positions, theta = case(50, q_len=9, k_len=9, heads_q=2, heads_k=2, head_dim=16, pairs=8)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not q.is_contiguous()
    arguments = (q, k, v, q_positions, k_positions, theta)
    torch.library.opcheck(torch.ops.rope.fused_attention.default, arguments, test_utils=("test_faketensor",))
    out, lse = fused_attention(*arguments)
    saved = (out, lse, torch.randn_like(out), torch.randn_like(lse))
    torch.library.opcheck(torch.ops.rope.fused_attention_backward.default, (*arguments, *saved),
                          test_utils=("test_faketensor",))
    assert all(g.is_contiguous() for g in launch_backward(*arguments, *saved))


def test_torch_compile_fullgraph_gives_the_eager_output_and_gradients():
    q, k, v, q_positions, k_positions, theta = case(26, q_len=9, k_len=17, heads_q=2, heads_k=1, dtype=torch.float32)

    def attention(q, k, v):
        return fused_rotary_attention(q, k, v, q_positions, k_positions, theta, window=5, leaky_scale=2.0)

    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    compiled = torch.compile(attention, fullgraph=True, backend="aot_eager")
    results = []
    for function in (attention, compiled):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = function(*leaves)
        results.append([out, *torch.autograd.grad(out, leaves, grad_out)])
    for eager, traced in zip(*results):
        torch.testing.assert_close(traced, eager, rtol=0, atol=0)


SAVED_BAD = [
    (dict(out=lambda t: t.double()), TypeError, "out"),
    (dict(out=lambda t: t[:, :-1]), ValueError, "out must have shape"),
    (dict(lse=lambda t: t.double()), TypeError, "lse"),
    (dict(lse=lambda t: t[0]), ValueError, "lse must have shape"),
    (dict(grad_out=lambda t: t.half()), TypeError, "grad_out"),
    (dict(grad_out=lambda t: t.transpose(1, 3).contiguous().transpose(1, 3)), ValueError, "grad_out must have a"),
    (dict(grad_lse=lambda t: t[..., :-1]), ValueError, "grad_lse must have shape"),
]


@pytest.mark.parametrize("changes, error, message", SAVED_BAD, ids=[m for _, _, m in SAVED_BAD])
def test_the_backward_refuses_bad_saved_tensors(changes, error, message):
    q, k, v, q_positions, k_positions, theta = case(27, q_len=9, k_len=17)
    out, lse = launch(q, k, v, q_positions, k_positions, theta)
    saved = dict(out=out, lse=lse, grad_out=torch.randn_like(out), grad_lse=torch.randn_like(lse))
    saved.update({name: change(saved[name]) for name, change in changes.items()})
    with pytest.raises(error, match=message):
        launch_backward(q, k, v, q_positions, k_positions, theta, **saved)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_rotation_it_is_attention_on_q_and_k_as_given(dtype):
    """rotate=False (the benchmark's baseline): the logits of unrotated q and k, i.e. theta = 0,
    in the forward and the backward. A window would change nothing then (both frames are the
    identity): refused by name, as the attention factor is, rather than ignored."""
    q, k, v, q_positions, k_positions, theta = case(28, q_len=9, k_len=17, heads_q=2, heads_k=1, dtype=dtype)
    zero = torch.zeros_like(theta)
    out, lse = launch(q, k, v, q_positions, k_positions, theta, rotate=False)
    expected, expected_lse = launch(q, k, v, q_positions, k_positions, zero)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    grad_out = torch.randn_like(out)
    grads = launch_backward(q, k, v, q_positions, k_positions, theta, out, lse, grad_out, rotate=False)
    for g, e in zip(grads, launch_backward(q, k, v, q_positions, k_positions, zero, out, lse, grad_out)):
        assert torch.equal(g, e)
    for run in (lambda **o: launch(q, k, v, q_positions, k_positions, theta, **o),
                lambda **o: launch_backward(q, k, v, q_positions, k_positions, theta, out, lse, grad_out, **o)):
        with pytest.raises(ValueError, match="rotate=False takes window=None"):
            run(window=5, rotate=False)
    with pytest.raises(TypeError, match="rotate"):
        launch(q, k, v, q_positions, k_positions, theta, rotate=0)


@pytest.mark.slow
def test_the_attention_benchmark_runs_every_method_and_they_agree():
    """benchmarks/bench_attention.py --check: each method forward and backward at a tiny size."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0


DECODE_CONFIGS = {
    # the base moves at every step beyond max_position_embeddings
    "dynamic_ntk": ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0, "max_position_embeddings": 16},
                    range(30, 40)),
    # the per-pair factors switch from short to long once the sequence exceeds 32 tokens (t = 32)
    "longrope": ({"rope_type": "longrope", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 32,
                  "short_factor": [1.0 + 0.1 * i for i in range(16)],
                  "long_factor": [1.0 + 2.0 * i for i in range(16)]},
                 range(28, 38)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODE_CONFIGS)
def test_decoding_from_an_unrotated_cache_follows_the_frequencies_of_each_step(name):
    """The kernel rotates keys on load, so a cache of unrotated keys decodes with each step's own
    frequencies (dynamic NTK's base, LongRoPE's factors, with LongRoPE's attention factor): every
    step equals the no-cache reference at that length. Keys rotated once at insertion, each with
    its own step's frequencies (transformers issue #25104's bug), would not."""
    config, steps = DECODE_CONFIGS[name]
    q, k, v, *_ = case(29, q_len=40, k_len=40, dtype=torch.float32)
    first = steps[0]
    stale_keys, stale_gap = [], 0.0
    for t in steps:
        theta, factor = rope.inv_freq(config, 32, seq_len=t + 1)
        theta = theta.to(DEVICE)
        positions = torch.arange(t + 1, device=DEVICE)
        step = q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], positions[-1:], positions, theta
        out, _ = launch(*step, attention_factor=factor)
        expected = rotary_attention(*step, attention_factor=factor, compute_dtype=torch.float64)
        assert (out.double() - expected).abs().max() <= tolerance(q, k, v, factor=factor**2)
        # the same step from keys rotated when they were cached (attention factor 1 on both sides)
        stale_keys.append(rope.apply_rotary(k[:, t:t + 1], k[:, t:t + 1], positions[-1:], theta, backend="torch")[0])
        if t > first:
            cached = torch.cat(stale_keys, dim=1)
            q_rot = rope.apply_rotary(q[:, t:t + 1], q[:, t:t + 1], positions[-1:], theta, backend="torch")[0]
            stale = rotary_attention(q_rot, cached, v[:, first:t + 1], torch.zeros(1, dtype=torch.int64, device=DEVICE),
                                     torch.zeros(t + 1 - first, dtype=torch.int64, device=DEVICE),
                                     torch.zeros_like(theta), causal=False, compute_dtype=torch.float64)
            fresh = rotary_attention(q[:, t:t + 1], k[:, first:t + 1], v[:, first:t + 1], positions[-1:],
                                     positions[first:], theta, compute_dtype=torch.float64)
            stale_gap = max(stale_gap, (stale - fresh).abs().max().item())
    assert stale_gap > 100 * tolerance(q, k, v)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, method", [(torch.float32, "rope"), (torch.bfloat16, "leaky16"),
                                           (torch.float16, "rerope")])
def test_log_n_scaling_forward_and_backward(dtype, method):
    """logn_length L: each query's logits times max(1, ln(m + 1) / ln L), as rope.attention.logn defines it
    (positions up to 2^5 above L, so the factors reach about 1.2 and differ row by row)."""
    window, leaky_scale = METHODS[method]
    inputs = case(30, q_len=16, k_len=40, dtype=dtype)
    assert logn_scale(inputs[3].cpu(), 16).max() > 1.2
    check(inputs, window=window, leaky_scale=leaky_scale, logn_length=16)
    assert_gradients_match(inputs, window=window, leaky_scale=leaky_scale, logn_length=16)
    plain, _ = launch(*inputs, window=window, leaky_scale=leaky_scale)
    scaled, _ = launch(*inputs, window=window, leaky_scale=leaky_scale, logn_length=16)
    assert (scaled.double() - plain.double()).abs().max() > 10 * tolerance(*inputs[:3])


@pytest.mark.slow
@pytest.mark.parametrize("dtype, method", [(torch.float32, "rope"), (torch.bfloat16, "rerope"),
                                           (torch.float16, "leaky16")])
def test_the_attention_factor_scales_the_rotated_coordinates(dtype, method):
    """attention_factor a (YaRN's): the rotated coordinates of q and k times a, the tail not (partial
    rotary here), as rope.attention.blockwise.rotary_attention defines it; forward and backward."""
    window, leaky_scale = METHODS[method]
    inputs = case(31, q_len=16, k_len=27, head_dim=40, pairs=12, dtype=dtype)
    check(inputs, window=window, leaky_scale=leaky_scale, attention_factor=1.25)
    assert_gradients_match(inputs, window=window, leaky_scale=leaky_scale, attention_factor=1.25)
    plain, _ = launch(*inputs, window=window, leaky_scale=leaky_scale)
    scaled, _ = launch(*inputs, window=window, leaky_scale=leaky_scale, attention_factor=1.25)
    assert (scaled.double() - plain.double()).abs().max() > 10 * tolerance(*inputs[:3])


@pytest.mark.slow
@pytest.mark.parametrize("shapes", ["both", "queries", "keys"])
@pytest.mark.parametrize("method", ["rope", "rerope", "leaky16"])
def test_positions_per_batch_row(shapes, method):
    """[batch, seq] positions (one row per sequence: ragged offsets, unsorted) for the queries, the keys
    or both, against the 1-D reference run row by row; forward, backward and log-n factors per row."""
    window, leaky_scale = METHODS[method]
    q, k, v, _, _, theta = case(33, q_len=12, k_len=30, batch=3)
    gen = torch.Generator().manual_seed(33)
    k_rows = torch.stack([torch.randperm(60, generator=gen)[:30] + 7 * b for b in range(3)])
    q_rows = torch.stack([k_rows[b][torch.randperm(30, generator=gen)[:12]] for b in range(3)])
    q_positions = q_rows if shapes != "keys" else torch.randperm(40, generator=gen)[:12] + 60  # after most keys
    k_positions = k_rows if shapes != "queries" else k_rows[0]
    if shapes == "queries":
        q_positions = torch.stack([k_rows[0][torch.randperm(30, generator=gen)[:12]] for _ in range(3)])
    q_positions, k_positions = q_positions.to(DEVICE), k_positions.to(DEVICE)
    options = dict(window=window, leaky_scale=leaky_scale, logn_length=16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fused_rotary_attention(*leaves, q_positions, k_positions, theta, **options)
    grad_out = torch.randn(out.shape, generator=gen).to(DEVICE)
    grads = torch.autograd.grad(out, leaves, grad_out)
    for b in range(3):
        rows = [t[b:b + 1].detach().double().requires_grad_() for t in (q, k, v)]
        m = q_positions[b] if q_positions.dim() == 2 else q_positions
        n = k_positions[b] if k_positions.dim() == 2 else k_positions
        expected = rotary_attention(*rows, m, n, theta, **options)
        expected_grads = torch.autograd.grad(expected, rows, grad_out[b:b + 1].double())
        assert (out[b:b + 1].double() - expected).abs().max() <= 4 * tolerance(q, k, v, factor=2.0)
        for g, e in zip(grads, expected_grads):
            assert (g[b:b + 1].double() - e).abs().max() <= GRADIENT_SLACK[q.dtype] * UNIT[q.dtype] * e.abs().max()


# --- the decoding kernel --------------------------------------------------------------------------------------------

DECODE_CASES = [
    # (q_len, heads_q, heads_k, method, dtype, positions): one token and a few, MHA to a group of 8
    (1, 4, 2, "rope", torch.float32, "contiguous"),
    (1, 8, 1, "rerope", torch.bfloat16, "contiguous"),
    (2, 4, 1, "leaky16", torch.float16, "contiguous"),
    (4, 4, 4, "leaky0.5", torch.float32, "ahead"),
    (1, 4, 2, "rerope", torch.float16, "unsorted"),
    (2, 4, 2, "leaky16", torch.float32, "early"),  # causal: the later chunks hold no key these rows see
]


def _decode_inputs(seed, q_len, heads_q, heads_k, dtype, positions, k_len=75, **options):
    gen = torch.Generator().manual_seed(seed)
    k_positions = {"unsorted": torch.randperm(200, generator=gen)[:k_len]}.get(positions)
    q_positions = None
    if positions == "ahead":  # queries beyond the last key (speculative tokens, or a gap)
        q_positions = torch.arange(q_len) + k_len + 10
    elif positions == "early":  # queries among the first keys (case()'s keys start at position 3)
        q_positions = torch.arange(q_len) * 7 + 13
    elif positions == "unsorted":
        q_positions = k_positions[torch.randperm(k_len, generator=gen)[:q_len]]
    return case(seed, q_len=q_len, k_len=k_len, heads_q=heads_q, heads_k=heads_k, dtype=dtype,
                q_positions=q_positions, k_positions=k_positions, **options)


@pytest.mark.slow
@pytest.mark.parametrize("q_len, heads_q, heads_k, method, dtype, positions", DECODE_CASES)
def test_decoding_kernel_matches_the_reference_for_every_split(q_len, heads_q, heads_k, method, dtype, positions):
    """Every split count from one to one chunk per key block: within the prefill kernel's tolerance
    of the references, and with one chunk bit-identical to the prefill kernel (the same tiles in the
    same order, the rows packed differently)."""
    window, leaky_scale = METHODS[method]
    inputs = _decode_inputs(40, q_len, heads_q, heads_k, dtype, positions)
    blocks = math.ceil(inputs[1].shape[1] / 16)
    for splits in (1, 2, 3, blocks):
        check(inputs, window=window, leaky_scale=leaky_scale, splits=splits, launcher=launch_decode)
    one, one_lse = launch_decode(*inputs, window=window, leaky_scale=leaky_scale, splits=1)
    prefill, prefill_lse = launch(*inputs, window=window, leaky_scale=leaky_scale)
    assert torch.equal(one, prefill) and torch.equal(one_lse, prefill_lse)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rope", "leaky16"])
def test_decoding_kernel_with_every_option(method):
    """Per-sequence positions, interleaved pairs (shared positions: the reference's interleaved
    tables take one row), an unrotated tail, a value width of its own, log-n scaling and the
    attention factor, causal or not, a strided view of a packed cache."""
    window, leaky_scale = METHODS[method]
    gen = torch.Generator().manual_seed(41)
    k_positions = torch.stack([torch.randperm(90, generator=gen)[:50] for _ in range(2)])
    q_positions = k_positions[:, :1] + 3
    q, k, v, _, _, theta = case(41, q_len=1, k_len=50, heads_q=4, heads_k=2, head_dim=40, pairs=12, v_dim=24,
                                batch=2, dtype=torch.bfloat16)
    k_view = torch.cat([k, k], dim=-1)[..., :40]  # a view into a packed cache: strided, last dimension contiguous
    options = dict(window=window, leaky_scale=leaky_scale, logn_length=16, attention_factor=1.25)
    factor = 1.25**2 * logn_scale(q_positions.flatten(), 16).max().item()
    for causal in (True, False):
        check([q, k_view, v, q_positions[0], k_positions[0], theta], layout="interleaved", causal=causal, splits=3,
              launcher=launch_decode, **options)
        # one row of positions per sequence: against the prefill kernel (tested so)
        rows = [q, k_view, v, q_positions, k_positions, theta]
        decoded, _ = launch_decode(*rows, causal=causal, splits=3, **options)
        prefilled, _ = launch(*rows, causal=causal, **options)
        assert (decoded.double() - prefilled.double()).abs().max() <= tolerance(q, k, v, factor=factor)


@pytest.mark.slow
def test_the_operators_decode_with_the_decoding_kernel(monkeypatch):
    """fused_rotary_attention takes the decoding kernel for at most DECODE_ROWS rows per key head,
    the prefill kernel above; gradients through it match float64 autograd."""
    calls = []
    original = attention_operators.launch_decode
    monkeypatch.setattr(attention_operators, "launch_decode", lambda *a, **o: calls.append(1) or original(*a, **o))
    decode = _decode_inputs(42, 2, 8, 2, torch.float32, "contiguous")  # 2 x 4 = 8 rows
    assert_gradients_match(decode, window=5)
    assert calls == [1]
    prefill = _decode_inputs(43, DECODE_ROWS + 1, 2, 2, torch.float32, "contiguous")  # 17 rows
    fused_rotary_attention(*prefill)
    assert calls == [1]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, method", [(torch.bfloat16, "rerope"), (torch.float16, "leaky16"),
                                           (torch.float32, "leaky0.5")])
def test_gradients_through_the_decoding_kernel_match_float64_autograd(dtype, method):
    """The operators' decoding path (one token, a group of 4) in every dtype: its out and lse feed
    the prefill backward, whose gradients match float64 autograd."""
    window, leaky_scale = METHODS[method]
    inputs = _decode_inputs(46, 1, 8, 2, dtype, "contiguous")
    assert_gradients_match(inputs, window=window, leaky_scale=leaky_scale)


def test_decoding_kernel_near_the_largest_positions():
    """Keys and queries just below 2^31 (int64 differences, exactly reduced angles), every mode."""
    k_positions = torch.arange(75) + 2**31 - 100
    for window, leaky_scale in METHODS.values():
        inputs = case(47, q_len=1, k_len=75, heads_q=4, heads_k=1, dtype=torch.float32,
                      q_positions=k_positions[-1:], k_positions=k_positions)
        check(inputs, window=window, leaky_scale=leaky_scale, splits=3, launcher=launch_decode)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
def test_decoding_kernel_keeps_a_nan_key_in_its_rows():
    inputs = list(_decode_inputs(44, 1, 4, 2, torch.float32, "contiguous"))
    inputs[1] = inputs[1].clone()
    inputs[1][0, 40, 1, 5] = math.nan  # key head 1: query heads 2 and 3
    out, lse = launch_decode(*inputs, splits=3)
    assert out[0, 0, 2:].isnan().all() and lse[0, 2:].isnan().all()
    assert not out[0, 0, :2].isnan().any() and not lse[0, :2].isnan().any()


@pytest.mark.parametrize("changes, error, message", [
    (dict(splits=0), ValueError, "splits"),
    (dict(splits=6), ValueError, "splits"),  # more chunks than the 5 key blocks
    (dict(splits=2.0), TypeError, "splits"),
    (dict(splits=True), TypeError, "splits"),
    (dict(q=lambda q: q.repeat(1, 9, 1, 1), q_positions=lambda p: p.repeat(9)), ValueError, "at most 16 rows"),
])
def test_the_decoding_kernel_names_bad_arguments(changes, error, message):
    arguments = dict(zip(("q", "k", "v", "q_positions", "k_positions", "inv_freq"),
                         _decode_inputs(45, 1, 4, 2, torch.float32, "contiguous")))
    arguments["k"], arguments["v"], arguments["k_positions"] = (arguments["k"][:, :70], arguments["v"][:, :70],
                                                                arguments["k_positions"][:70])
    arguments.update({name: change(arguments[name]) if callable(change) else change
                      for name, change in changes.items()})
    with pytest.raises(error, match=message):
        launch_decode(**arguments)



def test_each_backward_kernel_takes_its_own_gpu_sizes_unless_given(monkeypatch):
    """On a GPU the dk/dv and dq kernels launch with DKDV_LAUNCH and DQ_LAUNCH (sizes that do not
    spill registers), except for the sizes the caller gives; in the interpreter both take the
    forward's (prepare_launch's)."""
    from types import SimpleNamespace

    run = SimpleNamespace(sizes=dict(BLOCK_M=64, BLOCK_N=32), launch_options=dict(num_warps=2))
    names = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
    monkeypatch.setattr(triton_attention_backward, "interpreting", lambda: False)
    for default in (triton_attention_backward.DKDV_LAUNCH, triton_attention_backward.DQ_LAUNCH):
        chosen = triton_attention_backward._kernel_launch(run, default, None, None, None, None)
        assert chosen == dict(zip(names, default))
        chosen = triton_attention_backward._kernel_launch(run, default, 64, None, 2, None)  # run holds the given
        assert chosen == dict(zip(names, (64, default[1], 2, default[3])))
    monkeypatch.setattr(triton_attention_backward, "interpreting", lambda: True)
    default = triton_attention_backward.DKDV_LAUNCH
    assert triton_attention_backward._kernel_launch(run, default, None, None, None, None) == dict(
        BLOCK_M=64, BLOCK_N=32, num_warps=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotated_last_matches_the_reference_and_its_gradients(dtype):
    """DeepSeek-V4's heads (the last rotary_dim coordinates turned, pairs interleaved): the output
    within the kernels' tolerance of the float64 blockwise reference, which
    test_blockwise_attention.py checks against the formula, and the gradients of float64 autograd."""
    inputs = case(24, q_len=12, k_len=17, head_dim=40, pairs=8, dtype=dtype)
    options = dict(layout="interleaved", rotated="last")
    out = fused_rotary_attention(*inputs, **options)
    expected = rotary_attention(*[t.cpu() for t in inputs], compute_dtype=torch.float64, **options)
    assert out.dtype == dtype
    assert (out.cpu().double() - expected).abs().max().item() <= tolerance(*[t.cpu() for t in inputs[:3]])
    assert_gradients_match(inputs, **options)
    with pytest.raises(ValueError, match="rotated"):
        fused_rotary_attention(*inputs, rotated="both")
