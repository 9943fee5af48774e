"""rope.hf under hostile use: tables changed after rope made them (negated, sliced, scaled, edited
in place, converted, mixed between calls) are used as given, with the model's formula (transformers'
own functions in float64 are the references); untouched tables rotate from exact angles (mpmath
references); tables are rounded once; frequencies survive casting a model; install names a cast
model and the fix it prints works; every bad argument is refused with its name."""

import copy
import math
import re
from fractions import Fraction

import mpmath
import pytest
import torch

import rope
from rope.hf import provenance

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: E402
from transformers.models.gemma4 import modeling_gemma4  # noqa: E402
from transformers.models.glm import modeling_glm  # noqa: E402
from transformers.models.glm4v import modeling_glm4v  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.muse_glimmer_assistant import modeling_muse_glimmer_assistant  # noqa: E402
from transformers.models.nanochat import modeling_nanochat  # noqa: E402
from transformers.models.openai_privacy_filter import modeling_openai_privacy_filter  # noqa: E402
from transformers.models.qwen4_exp import modeling_qwen4_exp  # noqa: E402

HEAD_DIM = 16
YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64}
FAR = 2**24 + 1  # not a float32 number: float32 tables and exact angles part there


def llama4_reference(xq, xk, freqs_cis, heads_dim=2):
    """Llama 4's apply_rotary_emb in complex128 (transformers' own computes in complex64); with
    ``heads_dim`` 1, DeepSeek-V2's (q and k ``[batch, heads, seq, head_dim]``)."""
    def rotate(x):
        pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(pairs * freqs_cis.unsqueeze(heads_dim).to(torch.complex128)).flatten(3)
    return rotate(xq), rotate(xk)


def deepseek_v2_reference(xq, xk, freqs_cis):
    return llama4_reference(xq, xk, freqs_cis, heads_dim=1)


def deepseek_v4_reference(x, cos, sin):
    """DeepSeek-V4's apply_rotary_pos_emb in float64 (transformers' own rounds x to float32): the
    last 2 cos.shape[-1] coordinates x cos' + rotate_every_two(x) sin', the tables repeated twice
    in a row and unsqueezed at 1."""
    cos, sin = (t.repeat_interleave(2, dim=-1).unsqueeze(1) for t in (cos, sin))
    width = cos.shape[-1]
    head, tail = x[..., :-width], x[..., -width:]
    return torch.cat((head, tail * cos + modeling_gptj.rotate_every_two(tail) * sin), dim=-1)


# name: (rope's function, rope's table form, partial_rotary_factor, transformers' function, heads dim of q)
CONVENTIONS = {
    "llama": (rope.hf.apply_rotary_pos_emb, "rotate_half", 1.0, modeling_llama.apply_rotary_pos_emb, 1),
    "glm": (rope.hf.apply_rotary_pos_emb_interleaved, "rotate_half", 0.5, modeling_glm.apply_rotary_pos_emb, 1),
    "glm4v": (rope.hf.apply_rotary_pos_emb_interleaved_tables, "interleaved", 0.5,
              modeling_glm4v.apply_rotary_pos_emb, 1),
    "gpt_oss": (rope.hf.apply_rotary_pos_emb_pair_tables, "pairs", 1.0, modeling_gpt_oss.apply_rotary_pos_emb, 1),
    "deepseek": (rope.hf.apply_rotary_pos_emb_interleave, "rotate_half", 1.0,
                 modeling_deepseek_v3.apply_rotary_pos_emb_interleave, 1),
    "gemma4": (rope.hf.apply_rotary_pos_emb_single, "rotate_half", 1.0, modeling_gemma4.apply_rotary_pos_emb, 1),
    "llama4": (rope.hf.apply_rotary_emb_complex, "complex", 1.0, llama4_reference, 2),
    "nanochat": (rope.hf.apply_rotary_pos_emb_conjugate, "rotate_half", 1.0, modeling_nanochat.apply_rotary_pos_emb, 1),
    "privacy_filter": (rope.hf.apply_rotary_pos_emb_pair_tables_interleaved, "pairs", 1.0,
                       modeling_openai_privacy_filter.apply_rotary_pos_emb, 1),
    "deepseek_v4": (rope.hf.apply_rotary_pos_emb_trailing, "pairs", 0.5, deepseek_v4_reference, 1),
    "gptj": (rope.hf.apply_rotary_pos_emb_every_two, "pairs", 1.0, modeling_gptj.apply_rotary_pos_emb, 2),
    "deepseek_v2": (rope.hf.apply_rotary_emb_complex_heads_first, "complex", 1.0, deepseek_v2_reference, 1),
    "qwen4_exp": (rope.hf.apply_rotary_pos_emb_keys_optional, "rotate_half", 0.5,
                  modeling_qwen4_exp.apply_rotary_pos_emb, 1),
    "muse_glimmer_assistant": (rope.hf.apply_rotary_pos_emb_last_queries, "rotate_half", 1.0,
                               modeling_muse_glimmer_assistant.apply_rotary_pos_emb, 1),
}
ONE_TENSOR = (rope.hf.apply_rotary_pos_emb_single, modeling_gemma4.apply_rotary_pos_emb,
              rope.hf.apply_rotary_pos_emb_trailing, deepseek_v4_reference)
"""Functions of (x, cos, sin): Gemma 4's and DeepSeek-V4's."""
SIN_FIRST = (rope.hf.apply_rotary_pos_emb_every_two, modeling_gptj.apply_rotary_pos_emb)
"""Functions of (tensor, sin, cos): GPT-J's and CodeGen's."""


def call(function, q, k, tables):
    """A convention's function on (q, k) and ``tables`` ((cos, sin) or (freqs_cis,)), as a tuple
    of outputs (Gemma 4's, DeepSeek-V4's and GPT-J's take one tensor: q)."""
    if function in ONE_TENSOR:
        return (function(q, *tables),)
    if function in SIN_FIRST:
        return (function(q, tables[1], tables[0]),)
    return tuple(function(q, k, *tables))


def reference(name, q, k, tables):
    """transformers' function of the convention, in float64, on ``tables``."""
    function = CONVENTIONS[name][3]
    tables = tuple(t.to(torch.complex128 if t.is_complex() else torch.float64) for t in tables)
    return call(function, q.double(), k.double(), tables)


def embedding(name, mrope=False):
    params = dict(YARN, partial_rotary_factor=CONVENTIONS[name][2])
    if mrope:
        params["mrope_section"] = [1, 2, 1] if CONVENTIONS[name][2] < 1 else [2, 3, 3]
    return rope.hf.RotaryEmbedding(rope_parameters=params, head_dim=HEAD_DIM, tables=CONVENTIONS[name][1])


def as_tuple(tables):
    return tables if isinstance(tables, tuple) else (tables,)


def inputs(name, gen, batch=2, seq=4):
    """float64 q (3 heads) and k (1 head) laid out as the convention's model lays them out."""
    def shape(heads):
        return (batch, seq, heads, HEAD_DIM) if CONVENTIONS[name][4] == 2 else (batch, heads, seq, HEAD_DIM)

    return (torch.randn(*shape(3), generator=gen, dtype=torch.float64),
            torch.randn(*shape(1), generator=gen, dtype=torch.float64))


def far_positions(gen, batch=2, seq=4):
    positions = torch.randint(FAR - 40, FAR + 40, (batch, seq), generator=gen)
    positions[0, 0] = FAR
    return positions


def exact_tables(module, position_ids):
    """The module's tables from exact angles: cos and sin of p * theta_i (p the pair's position,
    theta_i the float32 frequency) times the attention factor, in mpmath, as float64, laid out in
    the module's form."""
    theta = module.inv_freq.tolist()
    attention = mpmath.mpf(module.attention_scaling)
    if module.mrope_axes is None:
        rows = [position_ids] * len(theta)
    else:
        grid = position_ids.expand(3, *position_ids.shape[-2:])
        rows = [grid[axis] for axis in module.mrope_axes.tolist()]
    with mpmath.workdps(40):
        angles = [[mpmath.mpf(m) * mpmath.mpf(t) for m in row.reshape(-1).tolist()] for row, t in zip(rows, theta)]
        cos, sin = (torch.tensor([[float(f(a) * attention) for a in pair] for pair in angles], dtype=torch.float64)
                    for f in (mpmath.cos, mpmath.sin))
    shape = tuple(position_ids.shape[-2:]) + (len(theta),)
    cos, sin = cos.T.reshape(shape), sin.T.reshape(shape)
    if module.tables == "complex":
        return (torch.complex(cos, sin),)
    if module.tables == "rotate_half":
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    if module.tables == "interleaved":
        return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    return cos, sin


def assert_all_close(got, expected, atol=1e-12):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b, rtol=0, atol=atol)


def largest_gap(a, b):
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


# ----- untouched tables: exact angles --------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONVENTIONS))
def test_untouched_tables_rotate_from_exact_angles(name):
    """At positions around 2^24 + 1, float32 tables differ from the exact ones by ~1e-8: the
    untouched pair gives the model's formula on exact tables (1e-12), not on the tables given."""
    gen = torch.Generator().manual_seed(len(name))
    q, k = inputs(name, gen)
    module = embedding(name)
    positions = far_positions(gen)
    tables = as_tuple(module(torch.zeros(1), positions))  # float32 tables
    assert provenance.untouched_source(*tables) is not None
    got = call(CONVENTIONS[name][0], q, k, tables)
    exact = reference(name, q, k, exact_tables(module, positions))
    assert_all_close(got, exact)
    assert largest_gap(reference(name, q, k, tables), exact) > 1e-9  # the tables given would not do


@pytest.mark.parametrize("name", ["llama", "glm4v"])
def test_untouched_mrope_tables_rotate_from_exact_angles(name):
    gen = torch.Generator().manual_seed(7)
    q, k = inputs(name, gen)
    module = embedding(name, mrope=True)
    positions = torch.stack([far_positions(gen) for _ in range(3)])
    tables = module(torch.zeros(1), positions)
    assert_all_close(call(CONVENTIONS[name][0], q, k, tables), reference(name, q, k, exact_tables(module, positions)))
    assert_all_close(call(CONVENTIONS[name][0], q, k, (tables[0], -tables[1])),
                     reference(name, q, k, (tables[0], -tables[1])))


def test_one_row_of_positions_serves_the_whole_batch():
    gen = torch.Generator().manual_seed(3)
    q, k = inputs("llama", gen, batch=3)
    module = embedding("llama")
    positions = far_positions(gen, batch=1)
    got = rope.hf.apply_rotary_pos_emb(q, k, *module(torch.zeros(1), positions))
    assert_all_close(got, reference("llama", q, k, exact_tables(module, positions)))


@pytest.mark.parametrize("unsqueeze_dim", [2, -2, -3])
def test_other_head_layouts_rotate_from_exact_angles_too(unsqueeze_dim):
    """unsqueeze_dim 2 (and -2) for q ``[batch, seq, heads, dim]``; -3 is 1 for q ``[batch, heads, seq, dim]``."""
    gen = torch.Generator().manual_seed(8)
    q, k = inputs("llama", gen)
    if unsqueeze_dim in (2, -2):
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    module = embedding("llama")
    positions = far_positions(gen)
    got = rope.hf.apply_rotary_pos_emb(q, k, *module(torch.zeros(1), positions), unsqueeze_dim=unsqueeze_dim)
    exact = exact_tables(module, positions)
    assert_all_close(got, modeling_llama.apply_rotary_pos_emb(q, k, *exact, unsqueeze_dim=unsqueeze_dim))


def test_tables_of_one_position_broadcast_over_a_longer_seq_are_used_as_given():
    """Untouched tables of positions [batch, 1] broadcast over q's four tokens: transformers' formula
    turns every token by the same angles, and so does rope (the positions do not fit q's seq)."""
    gen = torch.Generator().manual_seed(9)
    q, k = inputs("llama", gen)
    tables = embedding("llama")(torch.zeros(1), far_positions(gen, seq=1))
    assert_all_close(rope.hf.apply_rotary_pos_emb(q, k, *tables), reference("llama", q, k, tables))


def test_q_and_k_of_different_dtypes_each_rotate_from_exact_angles():
    gen = torch.Generator().manual_seed(4)
    q, k = inputs("llama", gen)
    module = embedding("llama")
    positions = far_positions(gen)
    cos, sin = module(torch.zeros(1), positions)
    q_out, k_out = rope.hf.apply_rotary_pos_emb(q, k.float(), cos, sin)
    exact_q, exact_k = reference("llama", q, k.float(), exact_tables(module, positions))
    assert q_out.dtype == torch.float64 and k_out.dtype == torch.float32
    torch.testing.assert_close(q_out, exact_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(k_out.double(), exact_k, rtol=0, atol=4 * 2.0**-24 * float(exact_k.abs().max()))


def test_later_edits_of_positions_or_frequencies_do_not_reach_the_tables_source():
    gen = torch.Generator().manual_seed(5)
    q, k = inputs("llama", gen)
    module = embedding("llama")
    positions = far_positions(gen)
    exact = reference("llama", q, k, exact_tables(module, positions))
    cos, sin = module(torch.zeros(1), positions)
    positions.add_(1000)
    module.inv_freq.mul_(2)
    assert_all_close(rope.hf.apply_rotary_pos_emb(q, k, cos, sin), exact)


def test_tables_made_in_inference_mode_are_tracked_too():
    gen = torch.Generator().manual_seed(6)
    q, k = inputs("llama", gen)
    module = embedding("llama")
    positions = far_positions(gen)
    with torch.inference_mode():
        cos, sin = module(torch.zeros(1), positions)
        assert_all_close(rope.hf.apply_rotary_pos_emb(q, k, cos, sin),
                         reference("llama", q, k, exact_tables(module, positions)))
        cos[0, 0, 0] = 0.5  # an edit inside inference mode is still seen
        assert_all_close(rope.hf.apply_rotary_pos_emb(q, k, cos, sin), reference("llama", q, k, (cos, sin)))


# ----- changed tables: the formula on the tables given -------------------------------------------


def negate_sin(tables, other):
    return (tables[0].conj(),) if len(tables) == 1 else (tables[0], -tables[1])


def slice_batch(tables, other):  # batch row 0 for both rows: broadcast, not the positions of row 1
    return tuple(t[:1] for t in tables)


def scale(tables, other):
    return tuple(2 * t for t in tables)


def edit_cos_in_place(tables, other):
    tables[0][..., 1] *= -0.5
    return tables


def edit_sin_in_place(tables, other):
    tables[-1].neg_()
    return tables


def convert(tables, other):
    return tuple(t.to(torch.complex128 if t.is_complex() else torch.float64) for t in tables)


def sin_of_other_positions(tables, other):
    return tables[0], other[1]


def cos_and_sin_of_two_calls(tables, other):  # the same positions, the same values: not the same pair
    return tables[0], other[1]


CHANGES = [negate_sin, slice_batch, scale, edit_cos_in_place, edit_sin_in_place, convert]
PAIR_CHANGES = [sin_of_other_positions, cos_and_sin_of_two_calls]  # freqs_cis is one tensor: no pair to mix


@pytest.mark.parametrize("name, change", [(name, change) for name in CONVENTIONS
                                          for change in CHANGES + (PAIR_CHANGES if CONVENTIONS[name][1] != "complex"
                                                                   else [])],
                         ids=lambda value: getattr(value, "__name__", value))
def test_changed_tables_are_used_as_given(name, change):
    gen = torch.Generator().manual_seed(11)
    q, k = inputs(name, gen)
    module = embedding(name)
    positions = far_positions(gen)
    other_positions = positions if change is cos_and_sin_of_two_calls else positions + 123
    tables = change(as_tuple(module(torch.zeros(1), positions)), as_tuple(module(torch.zeros(1), other_positions)))
    got = call(CONVENTIONS[name][0], q, k, tables)
    expected = reference(name, q, k, tables)
    assert_all_close(got, expected)
    assert largest_gap(expected, reference(name, q, k, exact_tables(module, positions))) > 1e-9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_changed_tables_in_lower_precision_are_rounded_once_from_float32_or_better(dtype):
    """q in float32, bfloat16, float16 with float32 tables: within one rounding (and float32's
    arithmetic) of the float64 formula; non-contiguous and stride-0 inputs alike."""
    gen = torch.Generator().manual_seed(12)
    q, k = inputs("llama", gen)
    q = q.to(dtype).transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous
    k = k.to(dtype).expand(2, 4, 4, HEAD_DIM)  # stride 0 over heads
    cos, sin = embedding("llama")(torch.zeros(1), far_positions(gen))
    got = rope.hf.apply_rotary_pos_emb(q, k, cos, -sin)
    expected = reference("llama", q, k, (cos, -sin))
    for x, a, b in zip((q, k), got, expected):
        assert a.dtype == dtype
        half_ulp = 0.5 * torch.finfo(dtype).eps * b.abs()  # one rounding to dtype
        arithmetic = 4 * 2.0**-24 * 2 * float(x.abs().max()) * float(cos.abs().max())  # float32 products and sum
        assert ((a.double() - b).abs() <= half_ulp + arithmetic).all()


def test_gradients_flow_through_the_table_formula():
    gen = torch.Generator().manual_seed(13)
    q, k = inputs("llama", gen)
    cos, sin = embedding("llama")(torch.zeros(1), far_positions(gen))
    q.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: rope.hf.apply_rotary_pos_emb(x, k, cos.double(), -sin.double())[0],
                                     (q,))
    half = q.detach().bfloat16().requires_grad_(True)
    out = rope.hf.apply_rotary_pos_emb(half, k.bfloat16(), cos.double(), sin.double())[0]
    out.float().sum().backward()
    assert half.grad is not None and half.grad.abs().sum() > 0


def test_the_interleave_function_rotates_queries_alone_where_k_is_none():
    """Mistral Large 4's layers that share another layer's keys pass k=None: q alone is rotated,
    from exact angles as with keys, and None comes back."""
    gen = torch.Generator().manual_seed(14)
    q, k = inputs("deepseek", gen)
    module = embedding("deepseek")
    positions = far_positions(gen)
    q_out, none = rope.hf.apply_rotary_pos_emb_interleave(q, None, *module(torch.zeros(1), positions))
    assert none is None
    assert_all_close((q_out,), reference("deepseek", q, k, exact_tables(module, positions))[:1])


def test_keys_optional_rotates_queries_alone_where_k_is_none():
    """Qwen4-Exp's indexer passes k=None and gets q alone back: from exact angles where the
    tables are untouched, and with the model's formula on sliced tables ([seq, width], its pooled
    keys' call), against transformers' function in float64."""
    gen = torch.Generator().manual_seed(15)
    q, k = inputs("qwen4_exp", gen)
    module = embedding("qwen4_exp")
    positions = far_positions(gen)
    tables = module(torch.zeros(1), positions)
    q_out = rope.hf.apply_rotary_pos_emb_keys_optional(q, cos=tables[0], sin=tables[1])
    assert isinstance(q_out, torch.Tensor)
    assert_all_close((q_out,), reference("qwen4_exp", q, k, exact_tables(module, positions))[:1])
    keys = torch.randn(3, 1, HEAD_DIM, generator=gen, dtype=torch.float64)  # pooled keys: [blocks, 1, head_dim]
    cos, sin = (t[0, :3] for t in tables)  # rows of the tables: [blocks, width]
    got = rope.hf.apply_rotary_pos_emb_keys_optional(keys, cos=cos, sin=sin)
    expected = modeling_qwen4_exp.apply_rotary_pos_emb(keys, cos=cos.double(), sin=sin.double())
    assert_all_close((got,), (expected,))
    with pytest.raises(TypeError, match="cos and sin are required"):
        rope.hf.apply_rotary_pos_emb_keys_optional(q, k)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_last_queries_take_the_last_rows_of_the_tables(unsqueeze_dim):
    """Muse Glimmer's assistant rotates keys over the whole tables and its shorter queries by the
    last rows (unsqueezed at 1; at 2 the model slices the size-1 heads dimension, every row):
    transformers' function in float64 is the reference."""
    gen = torch.Generator().manual_seed(16 + unsqueeze_dim)
    seq, short = 6, 2 if unsqueeze_dim == 1 else 6
    shape = (lambda heads, n: (2, heads, n, HEAD_DIM)) if unsqueeze_dim == 1 else (
        lambda heads, n: (2, n, heads, HEAD_DIM))
    q, k = (torch.randn(*shape(heads, n), generator=gen, dtype=torch.float64) for heads, n in ((3, short), (1, seq)))
    tables = embedding("muse_glimmer_assistant")(torch.zeros(1), far_positions(gen, seq=seq))
    cos, sin = (t * 1 for t in tables)  # changed tables: the formula, as the model's (untouched: tested above)
    got = rope.hf.apply_rotary_pos_emb_last_queries(q, k, cos, sin, unsqueeze_dim)
    expected = modeling_muse_glimmer_assistant.apply_rotary_pos_emb(q, k, cos.double(), sin.double(), unsqueeze_dim)
    assert_all_close(got, expected)
    if unsqueeze_dim == 1:  # the first rows would not do
        first = (t[:, :short].double() for t in (cos, sin))
        wrong = modeling_llama.apply_rotary_pos_emb(q, k[:, :, :short], *first)
        assert largest_gap(got[:1], wrong[:1]) > 1e-3


def test_every_two_keeps_torchs_promotion_of_a_wider_table():
    """CodeGen's table stays float32 in a half-precision model: its formula promotes the keys to
    float32, and rope's function returns that dtype too (the same values, within float32)."""
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(2, 4, 3, HEAD_DIM, generator=gen).half()
    cos, sin = (t * 1 for t in embedding("gptj")(torch.zeros(1), far_positions(gen)))
    got = rope.hf.apply_rotary_pos_emb_every_two(x, sin, cos)
    expected = modeling_gptj.apply_rotary_pos_emb(x, sin, cos)
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=4e-7)


def test_empty_inputs_give_empty_outputs():
    cos, sin = embedding("llama")(torch.zeros(1), torch.zeros(1, 0, dtype=torch.long))
    q = torch.randn(1, 2, 0, HEAD_DIM)
    for out in rope.hf.apply_rotary_pos_emb(q, q, cos, sin):
        assert out.shape == q.shape


# ----- tables rounded once -----------------------------------------------------------------------


def nearest(value: Fraction, dtype: torch.dtype) -> float:
    """The ``dtype`` number nearest to ``value``, ties to even, by exact rational comparison."""
    guess = torch.tensor(float(value), dtype=torch.float64).to(dtype)
    candidates = [guess, torch.nextafter(guess, torch.tensor(math.inf, dtype=dtype)),
                  torch.nextafter(guess, torch.tensor(-math.inf, dtype=dtype))]
    key = lambda c: (abs(Fraction(float(c)) - value), int(c.view(torch.int16)) & 1)  # noqa: E731
    return float(min(candidates, key=key))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tables_are_rounded_once(dtype):
    """Positions where converting the float64 cos through float32 lands one ulp off (double
    rounding): rope's tables still hold the nearest number to the exact cos(m theta_i) s."""
    module = rope.hf.RotaryEmbedding(rope_parameters=YARN, head_dim=HEAD_DIM)
    theta = module.inv_freq.double()
    m = torch.arange(2**17, dtype=torch.float64)[:, None]
    values = torch.cos(m * theta) * module.attention_scaling
    twice = values.to(dtype)
    once = rope.rotation.round_once(values, dtype)
    rows = torch.nonzero((twice != once).any(-1)).flatten()[:6]
    assert len(rows) >= 3  # double rounding happens at these positions
    positions = rows[None]
    cos, sin = module(torch.zeros(1, dtype=dtype), positions)
    assert cos.dtype == dtype
    with mpmath.workdps(40):
        for j, position in enumerate(rows.tolist()):
            for i, t in enumerate(module.inv_freq.tolist()):
                angle = mpmath.mpf(position) * mpmath.mpf(t)
                for table, function in ((cos, mpmath.cos), (sin, mpmath.sin)):
                    exact = Fraction(str(function(angle) * mpmath.mpf(module.attention_scaling)))
                    assert float(table[0, j, i]) == nearest(exact, dtype) == float(table[0, j, i + HEAD_DIM // 2])


# ----- casting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cast", [lambda m: m.half(), lambda m: m.to(torch.bfloat16), lambda m: m.double(),
                                  lambda m: m.to(torch.float16)])
def test_frequencies_stay_float32_through_casts(cast):
    gemma3 = {"sliding_attention": {"rope_theta": 1e4}, "full_attention": {"rope_type": "linear", "factor": 8.0}}
    for module in (rope.hf.RotaryEmbedding(rope_parameters=YARN, head_dim=HEAD_DIM),
                   rope.hf.LayerTypeRotaryEmbedding(rope_parameters=gemma3, head_dim=HEAD_DIM)):
        before = [m.inv_freq.clone() for m in module.modules() if "inv_freq" in m._buffers]
        cast(module)
        after = [m.inv_freq for m in module.modules() if "inv_freq" in m._buffers]
        assert len(after) == len(before) > 0
        assert all(a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(after, before))


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, max_position_embeddings=64,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4}, initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def test_a_cast_model_with_rope_installed_keeps_exact_frequencies():
    model = tiny_llama()
    theta = rope.inv_freq({"rope_theta": 1e4}, HEAD_DIM)[0]
    assert rope.hf.install(model) == 1
    model.to(torch.bfloat16)
    assert torch.equal(model.model.rotary_emb.inv_freq, theta)
    positions = torch.randint(0, 2**20, (1, 6), generator=torch.Generator().manual_seed(1))
    x = torch.zeros(1, dtype=torch.bfloat16)
    cast_tables = model.model.rotary_emb(x, positions)
    fresh = rope.hf.RotaryEmbedding(model.config)(x, positions)
    assert all(torch.equal(a, b) for a, b in zip(cast_tables, fresh))
    rounded = rope.hf.RotaryEmbedding(model.config)
    rounded.inv_freq = theta.bfloat16().float()  # what casting the buffer would have done
    assert not torch.equal(rounded(x, positions)[0], cast_tables[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_install_names_a_cast_model_and_the_printed_fix_works(dtype):
    """transformers' module of a cast model holds rounded frequencies (issue #29496): install
    refuses it by name, with two fixes; both give the model the same logits as a model whose
    rope was installed before the cast."""
    tokens = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    installed_first = tiny_llama()
    rope.hf.install(installed_first)
    installed_first.to(dtype)
    model = tiny_llama().to(dtype)
    original = model.model.rotary_emb
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ValueError, match=rf"model.rotary_emb \(LlamaRotaryEmbedding\) holds its frequencies inv_freq "
                                         rf"in {name}.*#29496.*install\(model\) before casting") as error:
        rope.hf.install(model)
    assert model.model.rotary_emb is original
    fix = str(error.value).split("first rebuild the module in float32: ")[1]
    exec(fix, {"model": model})
    assert rope.hf.install(model) == 1
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, installed_first(tokens).logits, rtol=0, atol=0)


def test_install_names_frequencies_rounded_by_a_cast_and_back():
    model = tiny_llama().to(torch.bfloat16).float()
    with pytest.raises(ValueError, match=r"inv_freq rounded to bfloat16 \(stored in float32\).*#29496"):
        rope.hf.install(model)


def test_install_without_rotary_module_raises_and_twice_returns_zero():
    with pytest.raises(ValueError, match="Linear has no submodule named rotary_emb"):
        rope.hf.install(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        rope.hf.install("model")
    model = tiny_llama()
    assert rope.hf.install(model) == 1
    assert rope.hf.install(model) == 0
    bare = torch.nn.Module()
    bare.rotary_emb = tiny_llama().model.rotary_emb
    del bare.rotary_emb.config
    with pytest.raises(ValueError, match="rotary_emb has no config, and neither has the model"):
        rope.hf.install(bare)


# ----- install's probe: every length threshold ----------------------------------------------


def llama_of(rope_parameters, max_positions, head_dim=HEAD_DIM, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                         max_position_embeddings=max_positions, rope_parameters=dict(rope_parameters),
                         initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def tables_gap(old, new, positions):
    """The largest difference of two rotary modules' tables at ``positions``, the old module called
    on a copy (transformers' dynamic module changes state when called)."""
    x = torch.zeros(1)
    return max(float((a - b).abs().max()) for a, b in zip(copy.deepcopy(old)(x, positions), new(x, positions)))


def switch_late(module):  # dynamic: the module grows its base from 128 on, its config says 32
    module.original_max_seq_len = module.max_seq_len_cached = 128


def never_switch(module):  # longrope: the module keeps the short factors past the original length
    module.long_inv_freq = module.original_inv_freq.clone()


LATE_SWITCHES = {
    "dynamic": ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}, switch_late),
    "longrope": ({"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 16, "factor": 2.0,
                  "short_factor": [1.0] * (HEAD_DIM // 2), "long_factor": [1.0 + i for i in range(HEAD_DIM // 2)]},
                 never_switch),
}


@pytest.mark.parametrize("name", list(LATE_SWITCHES))
def test_install_probes_both_sides_of_every_length_threshold(name):
    """A rotary module that switches at another length than its config says agrees with rope's at
    positions 0..7, yet not at length 40: install probes lengths across each of the config's
    thresholds (T - 1, T, T + 1, 2 T) and refuses it, the model untouched."""
    parameters, change = LATE_SWITCHES[name]
    model = llama_of(parameters, 32)
    old = model.model.rotary_emb
    change(old)
    new = rope.hf.RotaryEmbedding(model.config)
    assert tables_gap(old, new, torch.arange(8)[None]) <= rope.hf.PROBE_TOLERANCE
    assert tables_gap(old, new, torch.arange(40)[None]) > 0.1
    with pytest.raises(ValueError, match=r"model.rotary_emb \(LlamaRotaryEmbedding\) is not reproduced"):
        rope.hf.install(model)
    assert model.model.rotary_emb is old


LONG_CONTEXTS = {  # (rope_parameters, max_position_embeddings), at the sizes of released models
    "llama3": ({"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 131072),
    "yarn": ({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
             131072),
    "longrope": ({"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 4096,
                  "short_factor": [1.0 + 0.01 * i for i in range(32)],
                  "long_factor": [1.0 + 0.5 * i for i in range(32)]}, 131072),
    "dynamic": ({"rope_type": "dynamic", "rope_theta": 5e5, "factor": 8.0}, 2**22),
}


@pytest.mark.parametrize("name", list(LONG_CONTEXTS))
def test_install_accepts_long_contexts_within_float32_error(name):
    """At 2 x max_position_embeddings transformers' float32 angles are off by more than
    PROBE_TOLERANCE (up to 0.3 at 2^23), which the probe allows for (2^-20 m theta_i): install
    accepts transformers' own module, and leaves it as it was."""
    parameters, length = LONG_CONTEXTS[name]
    model = llama_of(parameters, length, head_dim=64)
    old = model.model.rotary_emb
    buffers = {key: value.clone() for key, value in old.named_buffers()}
    assert rope.hf.install(model) == 1
    assert tables_gap(old, model.model.rotary_emb, torch.tensor([[0, 2 * length - 1]])) > rope.hf.PROBE_TOLERANCE
    assert all(torch.equal(buffer, buffers[key]) for key, buffer in old.named_buffers())


# ----- bad arguments ----------------------------------------------------------------------------


def rope_tables(form="rotate_half", x=None, width=None):
    """rope's tables of ``form`` at positions 0-3, rotating ``width`` coordinates (default the head)."""
    head_dim = max(width or HEAD_DIM, HEAD_DIM)
    params = {"rope_theta": 1e4, "partial_rotary_factor": (width or HEAD_DIM) / head_dim}
    module = rope.hf.RotaryEmbedding(rope_parameters=params, head_dim=head_dim, tables=form)
    return module(torch.zeros(1) if x is None else x, torch.arange(4)[None])


Q = torch.randn(1, 2, 4, HEAD_DIM)
COS, SIN = rope_tables()
BAD_CALLS = [
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN, unsqueeze_dim=1.0), TypeError,
     "unsqueeze_dim must be an int"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN, unsqueeze_dim=True), TypeError, "unsqueeze_dim"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN, unsqueeze_dim="1"), TypeError, "unsqueeze_dim"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN, unsqueeze_dim=5), ValueError, "unsqueeze_dim must be <= 3"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN, unsqueeze_dim=3), ValueError, "does not broadcast to q"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS.tolist(), SIN), TypeError, "cos must be a torch.Tensor"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS.long(), SIN), TypeError, "cos must be .*float32"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN.bool()), TypeError, "sin must be .*float32"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS.to(torch.complex64), SIN), TypeError, "cos must be .*float32"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q.long(), Q, COS, SIN), TypeError, "q must be .*float32"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q.to(torch.complex64), COS, SIN), TypeError, "k must be .*float32"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN[..., :8]), ValueError, "sin .* must have the shape of cos"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS[..., :7], SIN[..., :7]), ValueError, "cos has width 7"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS[..., :0], SIN[..., :0]), ValueError, "cos has width 0"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q[..., :8], Q, COS, SIN), ValueError, "head_dim of q"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q[:, :, :3], Q, COS, SIN), ValueError, "does not broadcast to q"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS[0, 0, 0], SIN[0, 0, 0]), ValueError, "cos must have at least one"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS.to("meta"), SIN), ValueError, "cos is on meta"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q.to("meta"), COS, SIN), ValueError, "k is on meta"),
    (lambda: rope.hf.apply_rotary_pos_emb(Q, Q, COS, SIN, torch.arange(4)), ValueError, "position_ids must be None"),
    (lambda: rope.hf.apply_rotary_pos_emb_interleave(Q, Q, COS, SIN, torch.arange(4)), ValueError, "position_ids"),
    (lambda: rope.hf.apply_rotary_pos_emb_single(Q.int(), COS, SIN), TypeError, "x must be .*float32"),
    (lambda: rope.hf.apply_rotary_pos_emb_pair_tables(Q, Q, COS[..., :4].clone(), SIN[..., :4].clone()), ValueError,
     "expected half the head_dim of q"),
    (lambda: rope.hf.apply_rotary_emb_complex(Q, Q, COS), TypeError, "freqs_cis must be a complex tensor"),
    (lambda: rope.hf.apply_rotary_emb_complex(Q, Q, [1j]), TypeError, "freqs_cis must be a torch.Tensor"),
    (lambda: rope.hf.apply_rotary_emb_complex(Q[0], Q, rope_tables("complex")), ValueError, "xq must have shape"),
    (lambda: rope.hf.apply_rotary_emb_complex(Q, Q, rope_tables("complex")[0]), ValueError,
     "freqs_cis must have shape"),
    (lambda: rope.hf.apply_rotary_emb_complex(Q, Q, rope_tables("complex")[..., :4]), ValueError,
     "freqs_cis has 4 entries per token"),
    (lambda: rope.hf.apply_rotary_emb_complex(Q.transpose(1, 2)[:, :3], Q.transpose(1, 2)[:, :3],
                                              rope_tables("complex")), ValueError, "does not broadcast"),
    (lambda: rope.hf.apply_rotary_emb_complex_heads_first(Q.transpose(1, 2), Q.transpose(1, 2),
                                                          rope_tables("complex")), ValueError,
     r"does not broadcast to the batch and seq of xq \(1, 4, 2, 16\) \(laid out \[batch, heads, seq, head_dim\]\)"),
    (lambda: rope.hf.apply_rotary_emb_complex_heads_first(Q[0], Q, rope_tables("complex")), ValueError,
     r"xq must have shape \[batch, heads, seq, head_dim\]"),
    (lambda: rope.hf.apply_rotary_pos_emb_trailing(Q, *rope_tables("pairs", width=32)), ValueError,
     "cos has width 16, expected an even width"),
    (lambda: rope.hf.apply_rotary_pos_emb_trailing(Q.int(), *rope_tables("pairs")), TypeError, "x must be .*float32"),
    (lambda: rope.hf.apply_rotary_pos_emb_every_two(Q.transpose(1, 2), *rope_tables("pairs", width=4)[::-1]),
     ValueError, "expected half the head_dim of tensor"),
    (lambda: rope.hf.apply_rotary_pos_emb_every_two(Q, *rope_tables("pairs")[::-1]), ValueError,
     "unsqueeze_dim=2 does not broadcast to tensor"),
    (lambda: rope.hf.apply_rotary_pos_emb_pair_tables_interleaved(Q, Q, *rope_tables("pairs", width=4)), ValueError,
     "expected half the head_dim of q"),
    (lambda: rope.hf.apply_rotary_pos_emb_interleave(Q, None, COS, SIN, torch.arange(4)), ValueError, "position_ids"),
]


@pytest.mark.parametrize("bad, error, message", BAD_CALLS)
def test_bad_arguments_of_the_functions_are_refused_by_name(bad, error, message):
    with pytest.raises(error, match=message):
        bad()


FORM_READERS = {  # rope's table form: (the function named for it, functions that refuse it)
    "rotate_half": ("apply_rotary_pos_emb (or", [rope.hf.apply_rotary_pos_emb_interleaved_tables,
                                                 rope.hf.apply_rotary_pos_emb_pair_tables,
                                                 rope.hf.apply_rotary_pos_emb_pair_tables_interleaved,
                                                 rope.hf.apply_rotary_pos_emb_trailing,
                                                 rope.hf.apply_rotary_pos_emb_every_two]),
    "interleaved": ("apply_rotary_pos_emb_interleaved_tables", [
        rope.hf.apply_rotary_pos_emb, rope.hf.apply_rotary_pos_emb_interleaved,
        rope.hf.apply_rotary_pos_emb_pair_tables, rope.hf.apply_rotary_pos_emb_interleave,
        rope.hf.apply_rotary_pos_emb_single, rope.hf.apply_rotary_pos_emb_conjugate]),
    "pairs": ("apply_rotary_pos_emb_pair_tables (or, where the model pairs (2i, 2i + 1), "
              "rope.hf.apply_rotary_pos_emb_pair_tables_interleaved, rope.hf.apply_rotary_pos_emb_trailing", [
                  rope.hf.apply_rotary_pos_emb, rope.hf.apply_rotary_pos_emb_interleaved,
                  rope.hf.apply_rotary_pos_emb_interleaved_tables, rope.hf.apply_rotary_pos_emb_conjugate]),
}


@pytest.mark.parametrize("form", list(FORM_READERS))
def test_rope_tables_of_another_form_name_the_function_that_reads_them(form):
    right, wrong = FORM_READERS[form]
    cos, sin = rope_tables(form)
    for function in wrong:
        message = f"which rope.hf.{function.__name__} does not read: use rope.hf.{right}"
        with pytest.raises(ValueError, match=re.escape(message)):
            call(function, Q, Q, (cos, sin))
    cos.mul_(1)  # edited, the tables are still of that form
    with pytest.raises(ValueError, match="does not read"):
        call(wrong[0], Q, Q, (cos, sin))


GEMMA3 = {"sliding_attention": {"rope_theta": 1e4}, "full_attention": {"rope_type": "linear", "factor": 8.0}}
BAD_MODULES = [
    (lambda: rope.hf.RotaryEmbedding(rope_parameters={}, head_dim=16, tables="bogus"), ValueError,
     "tables must be one"),
    (lambda: rope.hf.RotaryEmbedding(rope_parameters={}, head_dim=16, tables=1), ValueError, "tables must be one"),
    (lambda: rope.hf.RotaryEmbedding(rope_parameters={}, head_dim=16.0), TypeError, "head_dim must be an int"),
    (lambda: rope.hf.RotaryEmbedding(rope_parameters={}, head_dim=True), TypeError, "head_dim must be an int"),
    (lambda: rope.hf.RotaryEmbedding(rope_parameters={}, head_dim=0), ValueError, "head_dim must be >= 1"),
    (lambda: rope.hf.RotaryEmbedding(rope_parameters="default", head_dim=16), TypeError,
     "rope_parameters must be a mapping"),
    (lambda: rope.hf.RotaryEmbedding(tiny_llama().config, rope_parameters={}), ValueError, "not both"),
    (lambda: rope.hf.RotaryEmbedding(types_namespace(head_dim=16.5)), TypeError, "config.head_dim must be an int"),
    (lambda: rope.hf.RotaryEmbedding(types_namespace(hidden_size=64, num_attention_heads=0)), ValueError,
     "config.num_attention_heads must be >= 1"),
    (lambda: rope.hf.RotaryEmbedding(types_namespace(rope_parameters=[1], head_dim=16)), TypeError,
     "config.rope_parameters must be a mapping"),
    (lambda: rope.hf.RotaryEmbedding(rope_parameters=GEMMA3, head_dim=16), ValueError,
     r"nested by layer type \(\['full_attention', 'sliding_attention'\]\): use rope.hf.LayerTypeRotaryEmbedding"),
    (lambda: rope.hf.LayerTypeRotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=16), ValueError,
     "not nested by layer type: use rope.hf.RotaryEmbedding"),
    (lambda: rope.hf.LayerTypeRotaryEmbedding(rope_parameters=GEMMA3), ValueError,
     "LayerTypeRotaryEmbedding needs a config, or both rope_parameters and head_dim"),
    (lambda: rope.hf.LayerTypeRotaryEmbedding(rope_parameters=GEMMA3, head_dim=16, tables="bogus"), ValueError,
     "tables must be one"),
    (lambda: rope.hf.LayerTypeRotaryEmbedding(tiny_llama().config, rope_parameters=GEMMA3), ValueError,
     "LayerTypeRotaryEmbedding takes a config or rope_parameters, not both"),
    (lambda: rope.hf.LayerTypeRotaryEmbedding(rope_parameters=[GEMMA3], head_dim=16), TypeError,
     "rope_parameters must be a mapping"),
]


def types_namespace(**attributes):
    import types

    return types.SimpleNamespace(**attributes)


@pytest.mark.parametrize("bad, error, message", BAD_MODULES)
def test_bad_module_arguments_are_refused_by_name(bad, error, message):
    with pytest.raises(error, match=message):
        bad()


def test_bad_forward_arguments_are_refused_by_name():
    module = rope.hf.RotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=HEAD_DIM)
    dynamic = rope.hf.RotaryEmbedding(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                       "max_position_embeddings": 8}, head_dim=HEAD_DIM)
    nested = rope.hf.LayerTypeRotaryEmbedding(rope_parameters=GEMMA3, head_dim=HEAD_DIM)
    x, positions = torch.zeros(1), torch.arange(4)[None]
    cases = [
        (lambda: module(x.long(), positions), TypeError, "x must be .*float32"),
        (lambda: module([0.0], positions), TypeError, "x must be a torch.Tensor"),
        (lambda: module(x, positions.float()), TypeError, "position_ids must be an integer tensor"),
        (lambda: module(x, positions.bool()), TypeError, "position_ids must be an integer tensor"),
        (lambda: module(x, positions[0]), ValueError, r"position_ids must have shape \[batch, seq\]"),
        (lambda: module(x, positions.to("meta")), ValueError, "position_ids is on meta"),
        (lambda: module(x, positions[None].expand(3, 1, 4)), ValueError, "look like M-RoPE's"),
        (lambda: dynamic(x, positions[:, :0]), ValueError, "position_ids is empty"),
        (lambda: dynamic(x, -positions - 2), ValueError, "position_ids must hold a position >= 0"),
        (lambda: nested(x, positions, 3), ValueError, "layer_type must be one of"),
        (lambda: rope.hf.rotate_half_tables(positions.float(), module.inv_freq, 1.0, torch.float32), TypeError,
         "positions must be an integer tensor"),
        (lambda: rope.hf.rotate_half_tables(positions, module.inv_freq.double(), 1.0, torch.float32), TypeError,
         "inv_freq must be .*float32"),
        (lambda: rope.hf.rotate_half_tables(positions, module.inv_freq, 0.0, torch.float32), ValueError,
         "attention_factor must be > 0"),
        (lambda: rope.hf.rotate_half_tables(positions, module.inv_freq, 1.0, "bfloat16"), TypeError, "dtype must be"),
    ]
    for bad, error, message in cases:
        with pytest.raises(error, match=message):
            bad()


def test_install_refuses_a_module_it_cannot_copy_for_the_probe():
    """The probe calls a copy of the model's module (a call could change its state); a module
    that cannot be copied is refused, untouched and never called."""
    model = tiny_llama()
    module = model.model.rotary_emb
    calls = []

    class Uncopyable(type(module)):
        def __deepcopy__(self, memo):
            raise TypeError("this module holds a handle")

        def forward(self, x, position_ids):
            calls.append(position_ids)
            return super().forward(x, position_ids)

    module.__class__ = Uncopyable
    with pytest.raises(ValueError, match=r"install: model.rotary_emb \(Uncopyable\) could not be copied for the probe "
                                         r"\(TypeError: this module holds a handle\)"):
        rope.hf.install(model)
    assert model.model.rotary_emb is module and not calls
