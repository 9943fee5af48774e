"""rope.hf.functions_2d: Llama 4's vision rotation and EdgeTAM video's memory-attention rotations.

* Each function on random inputs against its float64 formula written here (complex pairs times
  the table viewed as [1, seq, 1, head_dim / 2]; x cos + rotate_pairwise(x) sin; the keys of the
  cross-attention group by group, temporal and excluded keys passing through): every output
  within half an ulp of its dtype (rounded once), and transformers' function to float32 noise,
  also with keys in groups and object pointers excluded.
* Gradients in float32, bfloat16 and float16 against float64 autograd of the formula.
* Hostile inputs: wrong dtypes, shapes, counts refused by name; non-finite entries give
  non-finite outputs where transformers' formula reads them, as in transformers (no check of
  values: it would wait for the device at every attention call).
* The conventions (rope.hf.families) are found in their modeling modules by rope.hf.coverage, and
  EdgeTAM video's memory attention, with rope's vision table and functions, is transformers' to
  float32 noise.
"""

import importlib

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")
from helpers import assert_correctly_rounded  # noqa: E402
from rope.hf import coverage, families, vision  # noqa: E402

edgetam = importlib.import_module(coverage.module_name("edgetam_video"))
llama4 = importlib.import_module(coverage.module_name("llama4"))

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def interleaved_tables(gen: torch.Generator, rows: int, width: int, dtype=torch.float32):
    """cos, sin ``[rows, width]`` of random angles up to 2000 rad, each angle twice in a row."""
    angles = (torch.rand(rows, width // 2, generator=gen, dtype=torch.float64) * 2000).repeat_interleave(2, dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def complex_table(gen: torch.Generator, seq: int, pairs: int) -> torch.Tensor:
    """Llama 4's form: complex64 ``[seq, 1, pairs]`` of random angles."""
    angles = torch.rand(seq, 1, pairs, generator=gen, dtype=torch.float64) * 2000
    return torch.complex(angles.cos().float(), angles.sin().float())


def pairwise_reference(x, cos, sin):
    """x cos + rotate_pairwise(x) sin in float64, rotate_pairwise (x_2i, x_2i+1) -> (-x_2i+1, x_2i)."""
    x = x.double()
    turned = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos.double() + turned * sin.double()


def complex_reference(x, freqs_ci):
    """Pair i of token s: (a c - b s', a s' + b c), c + i s' = freqs_ci viewed as [1, seq, 1, pairs]."""
    x = x.double()
    table = freqs_ci.reshape(1, x.shape[1], 1, -1)
    c, s = table.real.double(), table.imag.double()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


def cross_reference(k, cos_k, sin_k, excluded: int, groups: int):
    """The keys of EdgeTAM's cross-attention in float64, group by group: the last ``excluded``
    pass, each group's first keys (temporal) pass, its last ``cos_k.shape[-2]`` (spatial) turn
    by the rows of cos_k, sin_k."""
    k = k.double()
    out = k.clone()
    per_group = (k.shape[-2] - excluded) // groups
    spatial = cos_k.shape[-2]
    for group in range(groups):
        start = group * per_group + per_group - spatial
        out[..., start: start + spatial, :] = pairwise_reference(k[..., start: start + spatial, :], cos_k, sin_k)
    return out


def test_complex_vision_rounds_the_exact_product_once():
    gen = torch.Generator().manual_seed(1)
    freqs_ci = complex_table(gen, 10, 8)
    for dtype in DTYPES:
        query, key = (torch.randn(2, 10, heads, 16, generator=gen).to(dtype) for heads in (3, 1))
        got = rope.hf.apply_rotary_emb_complex_vision(query, key, freqs_ci)
        theirs = llama4.vision_apply_rotary_emb(query, key, freqs_ci)
        for x, out, other in zip((query, key), got, theirs):
            assert out.dtype == dtype and out.shape == x.shape
            assert_correctly_rounded(out, complex_reference(x, freqs_ci))
            torch.testing.assert_close(out.float(), other.float(), rtol=1e-5,
                                       atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_complex_vision_takes_the_table_of_any_shape_transformers_views():
    """transformers views freqs_ci as [1, seq, 1, pairs]: rope's tables [1, seq, pairs] give the same."""
    gen = torch.Generator().manual_seed(2)
    freqs_ci = complex_table(gen, 6, 4)
    query = torch.randn(1, 6, 2, 8, generator=gen)
    got = rope.hf.apply_rotary_emb_complex_vision(query, query, freqs_ci)
    flat = rope.hf.apply_rotary_emb_complex_vision(query, query, freqs_ci.reshape(1, 6, 4))
    assert all(torch.equal(a, b) for a, b in zip(got, flat))


def test_self_attn_rounds_the_exact_formula_once():
    gen = torch.Generator().manual_seed(3)
    cos, sin = interleaved_tables(gen, 12, 16)
    for dtype in DTYPES:
        q, k = (torch.randn(2, 3, 12, 16, generator=gen).to(dtype) for _ in range(2))
        got = rope.hf.apply_rotary_pos_emb_2d_self_attn(q, k, cos, sin)
        theirs = edgetam.apply_rotary_pos_emb_2d_self_attn(q, k, cos, sin)
        for x, out, other in zip((q, k), got, theirs):
            assert out.dtype == dtype
            assert_correctly_rounded(out, pairwise_reference(x, cos, sin))
            torch.testing.assert_close(out.float(), other.float(), rtol=1e-5,
                                       atol=1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("excluded, groups, temporal", [(0, 1, 0), (2, 1, 0), (0, 3, 2), (4, 2, 1), (3, 4, 0)])
def test_cross_attn_rotates_the_spatial_keys_of_each_group(excluded, groups, temporal):
    """Keys [batch, heads, groups * (temporal + spatial) + excluded, dim]: each group's spatial keys
    turned by the rows of cos_k, the rest as given; queries by cos, sin."""
    gen = torch.Generator().manual_seed(10 * excluded + groups)
    spatial = 5
    cos, sin = interleaved_tables(gen, 7, 16)
    cos_k, sin_k = interleaved_tables(gen, spatial, 16)
    for dtype in DTYPES:
        q = torch.randn(2, 2, 7, 16, generator=gen).to(dtype)
        k = torch.randn(2, 2, groups * (temporal + spatial) + excluded, 16, generator=gen).to(dtype)
        q_out, k_out = rope.hf.apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos_k, sin_k, excluded, groups)
        assert q_out.dtype == k_out.dtype == dtype and k_out.shape == k.shape
        assert_correctly_rounded(q_out, pairwise_reference(q, cos, sin))
        assert_correctly_rounded(k_out, cross_reference(k, cos_k, sin_k, excluded, groups))
        q_theirs, k_theirs = edgetam.apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos_k, sin_k, excluded, groups)
        atol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(q_out.float(), q_theirs.float(), rtol=1e-5, atol=atol)
        torch.testing.assert_close(k_out.float(), k_theirs.float(), rtol=1e-5, atol=atol)


def test_cross_attn_with_every_key_excluded_returns_the_keys():
    gen = torch.Generator().manual_seed(4)
    cos, sin = interleaved_tables(gen, 7, 16)
    q, k = torch.randn(1, 2, 7, 16, generator=gen), torch.randn(1, 2, 3, 16, generator=gen)
    q_out, k_out = rope.hf.apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos[:4], sin[:4], 3, 1)
    assert torch.equal(k_out, k) and torch.equal(k_out, edgetam.apply_rotary_pos_emb_2d_cross_attn(
        q, k, cos, sin, cos[:4], sin[:4], 3, 1)[1])
    assert_correctly_rounded(q_out, pairwise_reference(q, cos, sin))


def test_cross_attn_takes_tables_per_head_as_transformers_repeats_them():
    """cos_k [heads, spatial, dim]: transformers repeats it to [1, heads, groups * spatial, dim]."""
    gen = torch.Generator().manual_seed(5)
    cos, sin = interleaved_tables(gen, 4, 8)
    angles = torch.rand(3, 2, 4, generator=gen, dtype=torch.float64).repeat_interleave(2, dim=-1) * 100
    cos_k, sin_k = angles.cos().float(), angles.sin().float()
    q, k = torch.randn(2, 3, 4, 8, generator=gen), torch.randn(2, 3, 2 * 3 + 1, 8, generator=gen)
    got = rope.hf.apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos_k, sin_k, 1, 2)
    theirs = edgetam.apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos_k, sin_k, 1, 2)
    for a, b in zip(got, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    expected = k.double().clone()
    for group in range(2):
        start = group * 3 + 1
        expected[..., start: start + 2, :] = pairwise_reference(k[..., start: start + 2, :], cos_k, sin_k)
    assert_correctly_rounded(got[1], expected)


GRADIENT_CASES = {  # rope's function on x, the formula on x, and the shape of x
    "complex_vision": (lambda x, t: rope.hf.apply_rotary_emb_complex_vision(x, x[:, :, :1], t[0])[0],
                       lambda x, t: complex_reference(x, t[0]), (2, 8, 2, 16)),
    "self_attn": (lambda x, t: rope.hf.apply_rotary_pos_emb_2d_self_attn(x, x, t[1], t[2])[1],
                  lambda x, t: pairwise_reference(x, t[1], t[2]), (2, 2, 8, 16)),
    "cross_attn": (lambda x, t: rope.hf.apply_rotary_pos_emb_2d_cross_attn(x, x, t[1], t[2], t[1][:2], t[2][:2],
                                                                           2, 2)[1],
                   lambda x, t: cross_reference(x, t[1][:2], t[2][:2], 2, 2), (2, 2, 8, 16)),
}


@pytest.mark.parametrize("name", list(GRADIENT_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_are_float64_autograds_of_the_formula(name, dtype):
    """The gradient of a random weighting of the output, in the input's dtype, against float64
    autograd of the formula on the same (rounded) input: within an ulp of the dtype."""
    ours, formula, shape = GRADIENT_CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    x = torch.randn(shape, generator=gen).to(dtype)
    cos, sin = interleaved_tables(gen, 8, 16)
    tables = (complex_table(gen, 8, 8), cos, sin)
    weights = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    ours_x = x.clone().requires_grad_(True)
    ours(ours_x, tables).backward(weights)
    exact_x = x.double().requires_grad_(True)
    (formula(exact_x, tables) * weights.double()).sum().backward()
    assert ours_x.grad.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(ours_x.grad.double(), exact_x.grad, rtol=eps, atol=eps * 1e-3)


Q = torch.randn(1, 4, 2, 16)
QS = Q.transpose(1, 2)
K = torch.randn(1, 2, 9, 16)
FREQS = complex_table(torch.Generator().manual_seed(0), 4, 8)
COS, SIN = interleaved_tables(torch.Generator().manual_seed(0), 4, 16)
HALF = rope.hf.RotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=16)(torch.zeros(1), torch.arange(4)[None])
"""rope's rotate_half tables [1, 4, 16], which the pairwise functions do not read."""

BAD_CALLS = [
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q.int(), Q, FREQS), TypeError, "query must be"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q, Q.half().int(), FREQS), TypeError, "key must be"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q[0], Q, FREQS), ValueError, "query must be 4-D"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q, Q, FREQS.real), TypeError, "freqs_ci must be a complex"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q, Q, [1j]), TypeError, "freqs_ci must be a torch.Tensor"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q, Q, FREQS[:3]), ValueError, r"freqs_ci \(3, 1, 8\) must hold"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q, Q, FREQS[..., :4]), ValueError, "head_dim / 2 in its last"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q[..., :15], Q[..., :15], FREQS), ValueError, "even head_dim"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q, Q[:, :3], FREQS), ValueError, "key .* must have the seq"),
    (lambda: rope.hf.apply_rotary_emb_complex_vision(Q, Q.to("meta"), FREQS), ValueError, "key is on meta"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_self_attn(QS.int(), QS, COS, SIN), TypeError, "q must be"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_self_attn(QS, QS, COS, SIN[:, :8]), ValueError, "sin .* the shape"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_self_attn(QS, QS, COS[:, :7], SIN[:, :7]), ValueError, "cos has width 7"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_self_attn(QS, QS, COS[:3], SIN[:3]), ValueError, "not broadcast to q"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K[0], COS, SIN, COS, SIN), ValueError, "k must be 4-D"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS.int(), SIN, COS, SIN), TypeError, "cos must be"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS.int(), SIN), TypeError, "cos_k must be"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN[:3]), ValueError,
     r"sin_k \(3, 16\) must have the shape of cos_k"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS[0], SIN[0]), ValueError,
     r"cos_k must be \[spatial keys, width\]"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN, -1), ValueError,
     "num_k_exclude_rope must be >= 0"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN, 10), ValueError,
     "num_k_exclude_rope must be <= 9"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN, 1.0), TypeError,
     "num_k_exclude_rope must be an int"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN, 1, 0), ValueError,
     "repeat_freqs_k must be >= 1"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN, 1, True), TypeError,
     "repeat_freqs_k must be an int"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN, 0, 2), ValueError,
     "leaves 9, not a multiple of repeat_freqs_k=2"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS, SIN, 1, 4), ValueError,
     r"cos_k \(4, 16\) has 4 rows \(spatial keys\), more than the 2 keys"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS[:, :7], SIN[:, :7], 1), ValueError,
     "cos_k has width 7, expected an even width in"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS[:, :18].repeat(1, 2),
                                                        SIN[:, :18].repeat(1, 2), 1), ValueError, "cos_k has width 32"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS.expand(3, 4, 16), SIN.expand(3, 4, 16), 1),
     ValueError, "does not broadcast to the spatial keys of k"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, COS.to("meta"), SIN.to("meta")), ValueError,
     "cos_k is on meta"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_self_attn(QS, QS, *HALF), ValueError,
     "cos holds rope's rotate_half tables, which rope.hf.apply_rotary_pos_emb_2d_self_attn does not read"),
    (lambda: rope.hf.apply_rotary_pos_emb_2d_cross_attn(QS, K, COS, SIN, *HALF, 1), ValueError,
     "cos_k holds rope's rotate_half tables, which rope.hf.apply_rotary_pos_emb_2d_cross_attn does not read"),
]


@pytest.mark.parametrize("bad, error, message", BAD_CALLS)
def test_bad_arguments_are_refused_by_name(bad, error, message):
    with pytest.raises(error, match=message):
        bad()


def test_non_finite_entries_spread_as_in_transformers():
    """A NaN or infinity in q, k or a table row gives non-finite outputs exactly where transformers'
    function gives them (the pair it sits in, or the rows that read the table row)."""
    gen = torch.Generator().manual_seed(6)
    cos, sin = interleaved_tables(gen, 6, 8)
    q, k = torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 2, 2 * 4 + 1, 8, generator=gen)
    q[0, 1, 2, 3], k[0, 0, 7, 0], k[0, 1, 8, 5] = float("nan"), float("inf"), float("nan")
    cos_k, sin_k = cos[:3].clone(), sin[:3].clone()
    sin_k[1, 4] = float("inf")
    ours = rope.hf.apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos_k, sin_k, 1, 2)
    theirs = edgetam.apply_rotary_pos_emb_2d_cross_attn(q, k, cos, sin, cos_k, sin_k, 1, 2)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.isfinite(), b.isfinite()) and not a.isfinite().all()
    freqs_ci = complex_table(gen, 6, 4)
    query = q.transpose(1, 2).contiguous()
    ours = rope.hf.apply_rotary_emb_complex_vision(query, query, freqs_ci)
    theirs = llama4.vision_apply_rotary_emb(query, query, freqs_ci)
    assert torch.equal(ours[0].isfinite(), theirs[0].isfinite()) and not ours[0].isfinite().all()


def test_the_conventions_are_found_in_their_modeling_modules():
    assert coverage.conventions_of(edgetam) == [families.EDGETAM]
    assert coverage.conventions_of(llama4) == [families.LLAMA4]
    assert families.CONVENTIONS["edgetam_video"] is families.EDGETAM
    for model_type in ("llama4", "llama4_text", "llama4_vision_model"):
        assert rope.hf.FAMILIES[model_type] is families.LLAMA4


def test_a_whole_llama4_model_gets_both_of_rope_s_functions():
    """Patching Llama 4 (text and vision tower) replaces the text's and the tower's apply functions
    alike, so no rotation of the model is left to transformers' complex64 arithmetic; unpatch
    restores both."""
    before = llama4.apply_rotary_emb, llama4.vision_apply_rotary_emb
    model = coverage.tiny_model("llama4")
    record = rope.hf.patch(model)
    try:
        assert llama4.apply_rotary_emb is not before[0] and llama4.vision_apply_rotary_emb is not before[1]
        assert {llama4.apply_rotary_emb.__name__, llama4.vision_apply_rotary_emb.__name__} == {
            "apply_rotary_emb_complex", "apply_rotary_emb_complex_vision"}
        assert record.vision_modules and not record.vision_left  # the tower's complex table is rope's too
    finally:
        rope.hf.unpatch(model)
    assert (llama4.apply_rotary_emb, llama4.vision_apply_rotary_emb) == before


def counted(function, calls: list):
    def call(*args, **kwargs):
        calls.append(function.__name__)
        return function(*args, **kwargs)
    return call


def test_edgetam_memory_attention_with_rope_is_transformers():
    """EdgeTAM video's memory attention (self-attention over a 6 x 4 grid, cross-attention to two
    memory frames of one temporal and 3 x 2 spatial keys each, and two object pointers) with rope's
    vision table and functions: its output is transformers' to float32 noise."""
    config = coverage.tiny_config("edgetam_video")
    config.memory_attention_rope_feat_sizes, config.memory_attention_rope_k_sizes = [6, 4], [3, 2]
    model = coverage.tiny_model("edgetam_video", config=config)
    attention = model.memory_attention
    gen = torch.Generator().manual_seed(7)
    hidden = config.memory_attention_hidden_size
    width = attention.layers[0].cross_attn_image.kv_in_dim
    features, features_pos = (torch.randn(24, 2, hidden, generator=gen) for _ in range(2))
    memory, memory_pos = (torch.randn(2 * (1 + 6) + 2, 2, width, generator=gen) for _ in range(2))

    def run():
        with torch.no_grad():
            return attention(features, memory, features_pos, memory_pos, num_object_pointer_tokens=2,
                             num_spatial_memory_tokens=2)

    expected = run()
    swaps, left = vision.vision_replacements(model)
    assert [s.name for s in swaps] == ["memory_attention.rotary_emb"] and not left
    originals = {name: getattr(edgetam, name) for name, _ in families.EDGETAM.functions}
    calls = []
    vision.swap(model, swaps)
    try:
        for name, ours in families.EDGETAM.functions:
            setattr(edgetam, name, counted(ours, calls))
        got = run()
    finally:
        for name, function in originals.items():
            setattr(edgetam, name, function)
        vision.restore(model, swaps)
    assert sorted(set(calls)) == sorted(name for name, _ in families.EDGETAM.functions)
    assert float(expected.abs().max()) > 0.1
    torch.testing.assert_close(got, expected, **coverage.LOGITS_TOLERANCE)
    assert torch.equal(run(), expected)
