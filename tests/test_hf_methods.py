"""rope.hf.methods: rope's versions of the rotations transformers models do inside a method of
their attention class (RoFormer's static method, the conformers' _apply_rotary_embedding) or in a
function of their own signature (V-JEPA 2's rotate_queries_or_keys), and patch/unpatch of such a
class attribute.

* each replacement is transformers' formula, written here in float64 from the modeling source,
  rounded once to the dtype torch returns (float32, bfloat16, float16 inputs and tables);
* V-JEPA 2's is its formula on the exact cos and sin of m theta_i (theta_i rope's float32
  frequencies, here cos and sin in float64 of the float64 product m theta_i, exact for m < 2^29),
  rounded once;
* from the untouched stack of rope's StackedRotaryTable the conformer method rotates by the
  exact cos and sin (here: float64 cos and sin of m theta_i, m < 64), in bfloat16 too, and by the
  stack as given once it is edited;
* both agree with transformers' own methods on float32 inputs to float32 noise;
* bad inputs are refused by name; NaN and infinities go through the formula as transformers'
  would take them;
* gradients in float32, bfloat16 and float16 are those of float64 autograd on the formula,
  rounded;
* patching one model of a class replaces the class attribute shared by all its models (a
  staticmethod stays one); it is restored, the very object, when the last patched model of the
  class is unpatched, and not while another remains; an attribute someone replaced since is not
  overwritten.
"""

import types

import pytest
import torch

import rope
from helpers import assert_correctly_rounded
from rope.hf import methods
from rope.hf.self_rotating import StackedRotaryTable

transformers = pytest.importorskip("transformers")
from transformers.models.roformer import modeling_roformer  # noqa: E402
from transformers.models.vjepa2 import modeling_vjepa2  # noqa: E402
from transformers.models.wav2vec2_conformer import modeling_wav2vec2_conformer  # noqa: E402

from rope.hf import coverage  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
THEIR_ROFORMER = modeling_roformer.RoFormerSelfAttention.apply_rotary_position_embeddings
THEIR_CONFORMER = modeling_wav2vec2_conformer.Wav2Vec2ConformerSelfAttention._apply_rotary_embedding
THEIR_VJEPA2 = modeling_vjepa2.rotate_queries_or_keys


def sinusoidal_table(positions: torch.Tensor, d: int) -> torch.Tensor:
    """RoFormer's table, float64: [sin | cos] of m 10000^(-2i/d), i < d/2 (create_weight)."""
    theta = 10000.0 ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[:, None] * theta
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def roformer_formula(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """RoFormer's rotation in float64: pair (2i, 2i+1) turned by the angle whose sin and cos are
    table[..., i] and table[..., d/2 + i] (written from apply_rotary_position_embeddings)."""
    table, x = table.double(), x.double()
    half = table.shape[-1] // 2
    sin, cos = table[..., :half], table[..., half:]
    out = torch.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return out


def conformer_formula(stack: torch.Tensor, hidden: torch.Tensor, heads: int) -> torch.Tensor:
    """The conformers' rotation in float64: each head's halves (x1, x2) become (x1 c - x2 s, x2 c +
    x1 s) with c, s the stack's cos and sin of the token's position (written from
    _apply_rotary_embedding)."""
    batch, n, width = hidden.shape
    x = hidden.double().view(batch, n, heads, width // heads)
    half = x.shape[-1] // 2
    cos, sin = (stack[row, :n, 0, 0].double()[None, :, None, :] for row in (0, 1))  # [1, n, 1, size]
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.cat((x1 * cos[..., :half] - x2 * sin[..., :half], x2 * cos[..., half:] + x1 * sin[..., half:]), -1)
    return out.view(batch, n, width)


def attention(heads=4, size=16):
    return types.SimpleNamespace(num_heads=heads, head_size=size)


def stack_of(n: int, size: int, base=10000.0) -> torch.Tensor:
    """A conformer stack [2, n, 1, 1, size], float64: cos then sin of m base^(-2i/size), both halves."""
    theta = base ** (-2 * torch.arange(size // 2, dtype=torch.float64) / size)
    angles = (torch.arange(n, dtype=torch.float64)[:, None] * theta).repeat(1, 2)
    return torch.stack((angles.cos(), angles.sin()))[:, :, None, None, :]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_values", [False, True])
def test_roformer_method_is_the_formula_rounded_once(dtype, with_values):
    gen = torch.Generator().manual_seed(int(with_values) + 10 * DTYPES.index(dtype))
    seq, d = 7, 16
    positions = torch.randint(0, 2**16, (seq,), generator=gen)
    table = sinusoidal_table(positions, d).to(dtype)[None, None]
    xs = [(torch.randn(2, 3, seq, d, generator=gen) * 4).to(dtype) for _ in range(3 if with_values else 2)]
    out = methods.apply_rotary_position_embeddings(table, *xs)
    assert len(out) == len(xs)
    for got, x in zip(out, xs):
        assert got.dtype == dtype and got.shape == x.shape
        assert_correctly_rounded(got, roformer_formula(table, x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_conformer_method_is_the_formula_rounded_once(dtype):
    gen = torch.Generator().manual_seed(3 + DTYPES.index(dtype))
    n, heads, size = 5, 4, 16
    stack = stack_of(n + 3, size).to(dtype)  # a stack longer than the sequence: its first n rows
    hidden = (torch.randn(2, n, heads * size, generator=gen) * 4).to(dtype)
    got = methods.apply_rotary_embedding_stacked(attention(heads, size), hidden, stack)
    assert got.dtype == dtype and got.shape == hidden.shape
    assert_correctly_rounded(got, conformer_formula(stack, hidden, heads))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_untouched_stack_of_rope_rotates_by_exact_cos_and_sin(dtype):
    n, heads, size = 40, 2, 8
    table = StackedRotaryTable(10000.0, size)
    hidden = (torch.randn(1, n, heads * size, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    stack = table(hidden)
    theta = table.inv_freq.double()  # rope's float32 frequencies, exactly
    angles = (torch.arange(n, dtype=torch.float64)[:, None] * theta).repeat(1, 2)
    exact = torch.stack((angles.cos(), angles.sin()))[:, :, None, None, :]
    got = methods.apply_rotary_embedding_stacked(attention(heads, size), hidden, stack)
    assert_correctly_rounded(got, conformer_formula(exact, hidden, heads))
    stack[1, 3] = 0.5  # edited in place: the stack is used as given
    edited = methods.apply_rotary_embedding_stacked(attention(heads, size), hidden, stack)
    assert_correctly_rounded(edited, conformer_formula(stack, hidden, heads))
    if dtype != torch.float32:  # the exact cos and sin, not their rounding, turned the first forward
        assert not torch.equal(got, methods.apply_rotary_embedding_stacked(attention(heads, size), hidden,
                                                                          stack.clone()))


def test_the_methods_compute_what_transformers_methods_do():
    gen = torch.Generator().manual_seed(7)
    table = sinusoidal_table(torch.randint(0, 512, (6,), generator=gen), 16).float()[None, None]
    q, k, v = (torch.randn(2, 4, 6, 16, generator=gen) for _ in range(3))
    for got, expected in zip(methods.apply_rotary_position_embeddings(table, q, k, v), THEIR_ROFORMER(table, q, k, v)):
        torch.testing.assert_close(got, expected, rtol=0, atol=4e-6)
    stack, hidden = stack_of(9, 16).float(), torch.randn(2, 9, 64, generator=gen)
    torch.testing.assert_close(methods.apply_rotary_embedding_stacked(attention(), hidden, stack),
                               THEIR_CONFORMER(attention(), hidden, stack), rtol=0, atol=4e-6)


def test_a_wider_table_promotes_as_torch_does():
    table = sinusoidal_table(torch.arange(4), 8).float()[None, None]
    q = torch.randn(1, 1, 4, 8).bfloat16()
    assert methods.apply_rotary_position_embeddings(table, q, q)[0].dtype == torch.float32
    assert THEIR_ROFORMER(table, q, q)[0].dtype == torch.float32


@pytest.mark.parametrize("bad, error, message", [
    (dict(table=torch.zeros(1, 1, 4, 8, dtype=torch.int64)), TypeError, "sinusoidal_pos must be"),
    (dict(q=torch.zeros(1, 1, 4, 8, dtype=torch.int32)), TypeError, "query_layer must be"),
    (dict(k=[[0.0]]), TypeError, "key_layer must be a torch.Tensor"),
    (dict(v=torch.zeros(1, 1, 4, 8, dtype=torch.complex64)), TypeError, "value_layer must be"),
    (dict(table=torch.zeros(1, 1, 4, 6)), ValueError, "sinusoidal_pos has width 6, expected the head_dim of query"),
    (dict(table=torch.zeros(1, 1, 4, 7)), ValueError, "sinusoidal_pos .* must have an even"),
    (dict(table=torch.zeros(())), ValueError, "sinusoidal_pos .* must have an even"),
    (dict(table=torch.zeros(1, 1, 5, 8)), ValueError, r"sinusoidal_pos \(1, 1, 5, 8\) does not broadcast"),
    (dict(k=torch.zeros(1, 1, 3, 8)), ValueError, "does not broadcast to key_layer"),
])
def test_bad_roformer_arguments_are_refused_by_name(bad, error, message):
    args = dict(table=torch.zeros(1, 1, 4, 8), q=torch.zeros(1, 2, 4, 8), k=torch.zeros(1, 2, 4, 8), v=None)
    args.update(bad)
    with pytest.raises(error, match=message):
        methods.apply_rotary_position_embeddings(args["table"], args["q"], args["k"], args["v"])


@pytest.mark.parametrize("bad, error, message", [
    (dict(attention=types.SimpleNamespace(head_size=8)), TypeError, "attention.num_heads must be an int"),
    (dict(attention=attention(2, 3)), ValueError, "even head_size"),
    (dict(hidden=torch.zeros(2, 16)), ValueError, "hidden_states must be 3-D"),
    (dict(hidden=torch.zeros(1, 4, 16, dtype=torch.int64)), TypeError, "hidden_states must be"),
    (dict(hidden=torch.zeros(1, 4, 12)), ValueError, r"must be \[batch, n, num_heads \* head_size\]"),
    (dict(stack=torch.zeros(2, 4, 1, 8)), ValueError, "relative_position_embeddings must be 5-D"),
    (dict(stack=torch.zeros(2, 3, 1, 1, 8)), ValueError, "n' >= n = 4"),
    (dict(stack=torch.zeros(3, 4, 1, 1, 8)), ValueError, "the stack \\[2, n', 1, 1, head_size\\]"),
    (dict(stack=torch.zeros(2, 4, 1, 1, 8, dtype=torch.int32)), TypeError, "relative_position_embeddings must be"),
])
def test_bad_conformer_arguments_are_refused_by_name(bad, error, message):
    args = dict(attention=attention(2, 8), hidden=torch.zeros(1, 4, 16), stack=torch.zeros(2, 4, 1, 1, 8))
    args.update(bad)
    with pytest.raises(error, match=message):
        methods.apply_rotary_embedding_stacked(args["attention"], args["hidden"], args["stack"])


def test_non_finite_values_go_through_the_formula_as_in_transformers():
    table = sinusoidal_table(torch.arange(3), 8).float()[None, None]
    q = torch.randn(1, 1, 3, 8)
    q[0, 0, 1, 2], q[0, 0, 2, 5] = float("nan"), float("inf")
    ours, theirs = methods.apply_rotary_position_embeddings(table, q, q)[0], THEIR_ROFORMER(table, q, q)[0]
    assert torch.equal(ours.isnan(), theirs.isnan()) and torch.equal(ours.isinf(), theirs.isinf())
    finite = ours.isfinite()
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=0, atol=4e-6)
    stack, hidden = stack_of(3, 8).float(), torch.randn(1, 3, 16)
    hidden[0, 1, 3] = float("nan")
    ours = methods.apply_rotary_embedding_stacked(attention(2, 8), hidden, stack)
    assert torch.equal(ours.isnan(), THEIR_CONFORMER(attention(2, 8), hidden, stack).isnan())


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_are_float64_autograd_rounded(dtype):
    gen = torch.Generator().manual_seed(11)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    table = sinusoidal_table(torch.randint(0, 4096, (5,), generator=gen), 8)[None, None]
    q64, k64 = (torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    weights = torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64)
    q, k = (x.to(dtype).requires_grad_(True) for x in (q64, k64))
    out_q, out_k = methods.apply_rotary_position_embeddings(table.to(dtype), q, k)
    ((out_q.double() + 2 * out_k.double()) * weights).sum().backward()
    r64, s64 = (x.to(dtype).double().requires_grad_(True) for x in (q64, k64))
    ((roformer_formula(table.to(dtype), r64) + 2 * roformer_formula(table.to(dtype), s64)) * weights).sum().backward()
    for got, expected in ((q.grad, r64.grad), (k.grad, s64.grad)):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance)
    stack, hidden64 = stack_of(5, 8), torch.randn(1, 5, 16, generator=gen, dtype=torch.float64)
    hidden = hidden64.to(dtype).requires_grad_(True)
    out = methods.apply_rotary_embedding_stacked(attention(2, 8), hidden, stack.to(dtype))
    (out.double() * weights.reshape(1, 5, 16)).sum().backward()
    reference = hidden64.to(dtype).double().requires_grad_(True)
    (conformer_formula(stack.to(dtype), reference, 2) * weights.reshape(1, 5, 16)).sum().backward()
    assert hidden.grad.dtype == dtype
    torch.testing.assert_close(hidden.grad.double(), reference.grad, rtol=tolerance, atol=tolerance)


def test_resolve_get_and_put_keep_a_staticmethod_one():
    cls = modeling_roformer.RoFormerSelfAttention
    name = "*.apply_rotary_position_embeddings"
    assert methods.resolve(modeling_roformer, name) == (cls, "apply_rotary_position_embeddings")
    assert methods.resolve(modeling_roformer, "*.no_such_method") is None
    assert methods.get(modeling_roformer, "*.no_such_method", "absent") == "absent"
    original = methods.get(modeling_roformer, name)
    assert isinstance(original, staticmethod) and original is vars(cls)["apply_rotary_position_embeddings"]
    try:
        methods.put(modeling_roformer, name, methods.apply_rotary_position_embeddings)  # wrapped: still static
        assert isinstance(vars(cls)["apply_rotary_position_embeddings"], staticmethod)
    finally:
        methods.put(modeling_roformer, name, original)
    assert vars(cls)["apply_rotary_position_embeddings"] is original
    with pytest.raises(ValueError, match="defines no one class with no_such_method"):
        methods.put(modeling_roformer, "*.no_such_method", len)


def roformer_pair():
    return coverage.tiny_model("roformer", seed=0), coverage.tiny_model("roformer", seed=1)


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


def test_two_models_of_one_class_share_the_patched_method():
    cls, attribute = modeling_roformer.RoFormerSelfAttention, "apply_rotary_position_embeddings"
    original = vars(cls)[attribute]
    first, second = roformer_pair()
    tokens = coverage.sample_tokens(seed=2)
    expected = [logits(model, tokens) for model in (first, second)]
    rope.hf.patch(first)
    try:
        ours = vars(cls)[attribute]
        assert ours is rope.hf.FAMILIES["roformer"].functions[0][1] and isinstance(ours, staticmethod)
        # the second model, not patched, runs rope's method too: the class is shared
        torch.testing.assert_close(logits(second, tokens), expected[1], **coverage.LOGITS_TOLERANCE)
        rope.hf.patch(second)
        rope.hf.unpatch(first)
        assert vars(cls)[attribute] is ours  # the second is still patched
        rope.hf.unpatch(second)
        assert vars(cls)[attribute] is original
    finally:
        for model in (first, second):
            try:
                rope.hf.unpatch(model)
            except ValueError:  # unpatched above
                pass
    assert all(torch.equal(logits(model, tokens), e) for model, e in zip((first, second), expected))


def test_a_method_replaced_since_is_not_overwritten():
    cls, attribute = modeling_roformer.RoFormerSelfAttention, "apply_rotary_position_embeddings"
    original = vars(cls)[attribute]
    model = coverage.tiny_model("roformer")
    rope.hf.patch(model)
    someone = staticmethod(lambda *args: THEIR_ROFORMER(*args))
    setattr(cls, attribute, someone)
    try:
        with pytest.raises(ValueError, match=r"\*\.apply_rotary_position_embeddings is no longer rope's function"):
            rope.hf.unpatch(model)
        other = coverage.tiny_model("roformer", seed=1)
        with pytest.raises(ValueError, match="is no longer rope's function"):
            rope.hf.patch(other)
    finally:
        setattr(cls, attribute, rope.hf.FAMILIES["roformer"].functions[0][1])
        rope.hf.unpatch(model)
    assert vars(cls)[attribute] is original


def test_patching_a_conformer_swaps_its_table_and_method():
    model = coverage.tiny_model("wav2vec2-conformer")
    cls = modeling_wav2vec2_conformer.Wav2Vec2ConformerSelfAttention
    original, table = vars(cls)["_apply_rotary_embedding"], model.encoder.embed_positions
    record = rope.hf.patch(model)
    try:
        assert [r.name for r in record.rotary_modules] == ["encoder.embed_positions"]
        assert isinstance(model.encoder.embed_positions, StackedRotaryTable)
        assert vars(cls)["_apply_rotary_embedding"] is methods.apply_rotary_embedding_stacked
    finally:
        rope.hf.unpatch(model)
    assert vars(cls)["_apply_rotary_embedding"] is original and model.encoder.embed_positions is table


def vjepa2_formula(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """V-JEPA 2's rotation in float64 (written from rotate_queries_or_keys): coordinate j turns by
    m theta_(j mod D/2), theta_i the float32 rounding of 10000^(-2i/D), with y = (-x_1, x_0, -x_3,
    x_2, ..)."""
    width = x.shape[-1]
    theta = (10000.0 ** (-2 * torch.arange(width // 2, dtype=torch.float64) / width)).float().double()
    angles = pos.double()[..., None] * theta.repeat(2)  # exact: m < 2^29, theta of 24 bits
    if pos.dim() == 1:
        angles = angles[None, None]
    x = x.double()
    y = torch.empty_like(x)
    y[..., 0::2], y[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    return x * angles.cos() + y * angles.sin()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [False, True])
def test_vjepa2_function_is_the_formula_rounded_once(dtype, masked):
    gen = torch.Generator().manual_seed(20 + DTYPES.index(dtype) + 5 * masked)
    x = (torch.randn(2, 3, 6, 10, generator=gen) * 4).to(dtype)
    pos = torch.randint(0, 2**20, (2, 3, 6) if masked else (6,), generator=gen)
    got = methods.rotate_queries_or_keys(x, pos=pos)
    assert got.dtype == dtype and got.shape == x.shape
    assert_correctly_rounded(got, vjepa2_formula(x, pos))


def test_vjepa2_function_computes_what_transformers_does_and_fixes_its_bfloat16_angles():
    gen = torch.Generator().manual_seed(21)
    x, pos = torch.randn(1, 2, 8, 12, generator=gen), torch.randint(0, 32, (8,), generator=gen)
    torch.testing.assert_close(methods.rotate_queries_or_keys(x, pos), THEIR_VJEPA2(x, pos), rtol=0, atol=4e-6)
    exact = vjepa2_formula(x.bfloat16(), pos)
    ours = methods.rotate_queries_or_keys(x.bfloat16(), pos).double()
    theirs = THEIR_VJEPA2(x.bfloat16(), pos).double()  # its frequencies and angles in bfloat16
    assert (ours - exact).abs().max() < (theirs - exact).abs().max()


@pytest.mark.parametrize("bad, error, message", [
    (dict(x=torch.zeros(2, 5, 8)), ValueError, "x must be 4-D"),
    (dict(x=torch.zeros(1, 1, 5, 8, dtype=torch.int64)), TypeError, "x must be"),
    (dict(x=torch.zeros(1, 1, 5, 7)), ValueError, "even last dimension"),
    (dict(pos=torch.arange(5.0)), TypeError, "pos must be an integer tensor"),
    (dict(pos=torch.arange(4)), ValueError, "one position per token"),
    (dict(pos=torch.arange(5)[None]), ValueError, r"pos \(1, 5\) must be \[n\] or \[batch, heads, n\]"),
    (dict(pos=torch.zeros(3, 1, 5, dtype=torch.int64)), ValueError, "does not broadcast to x"),
])
def test_bad_vjepa2_arguments_are_refused_by_name(bad, error, message):
    args = dict(x=torch.zeros(1, 2, 5, 8), pos=torch.arange(5))
    args.update(bad)
    with pytest.raises(error, match=message):
        methods.rotate_queries_or_keys(args["x"], args["pos"])


def test_vjepa2_edge_cases_go_through_as_in_transformers():
    x = torch.randn(1, 1, 3, 0)  # a head too narrow for a third: nothing to rotate
    assert methods.rotate_queries_or_keys(x, torch.arange(3)).shape == x.shape
    x = torch.randn(1, 1, 3, 4)
    x[0, 0, 1, 2] = float("nan")
    ours, theirs = methods.rotate_queries_or_keys(x, torch.arange(3)), THEIR_VJEPA2(x, torch.arange(3))
    assert torch.equal(ours.isnan(), theirs.isnan())


@pytest.mark.parametrize("dtype", DTYPES)
def test_vjepa2_gradients_are_float64_autograd_rounded(dtype):
    gen = torch.Generator().manual_seed(22)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    x64, pos = torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64), torch.randint(0, 64, (5,), generator=gen)
    weights = torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64)
    x = x64.to(dtype).requires_grad_(True)
    (methods.rotate_queries_or_keys(x, pos).double() * weights).sum().backward()
    reference = x64.to(dtype).double().requires_grad_(True)
    (vjepa2_formula(reference, pos) * weights).sum().backward()
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.double(), reference.grad, rtol=tolerance, atol=tolerance)


def test_patching_vjepa2_replaces_its_function_alone():
    model = coverage.tiny_model("vjepa2")
    original = modeling_vjepa2.rotate_queries_or_keys
    record = rope.hf.patch(model)
    try:
        assert record.rotary_modules == () and record.module is modeling_vjepa2
        assert modeling_vjepa2.rotate_queries_or_keys is methods.rotate_queries_or_keys
    finally:
        rope.hf.unpatch(model)
    assert modeling_vjepa2.rotate_queries_or_keys is original


def test_a_patched_conformer_cast_to_bfloat16_rotates_by_the_exact_stack():
    """The cast keeps rope's float32 frequencies, and every layer's method rotates by the float64
    stack behind the bfloat16 one it is handed."""
    model = coverage.tiny_model("wav2vec2-conformer")
    rope.hf.patch(model)
    found = []
    exact_stack = methods._exact_stack
    try:
        model.to(torch.bfloat16)
        assert model.encoder.embed_positions.inv_freq.dtype == torch.float32
        methods._exact_stack = lambda stack: found.append(exact_stack(stack)) or found[-1]
        with torch.no_grad():
            out = model(torch.randn(2, 3840, generator=torch.Generator().manual_seed(4)).bfloat16()).last_hidden_state
    finally:
        methods._exact_stack = exact_stack
        rope.hf.unpatch(model)
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    assert found and all(stack is not None and stack.dtype == torch.float64 for stack in found)
