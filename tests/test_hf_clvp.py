"""rope.hf.clvp: rope's angle module and rotation function for CLVP (its rotary module returns the
angles of its tokens 0 .. n - 1, its attention takes their cos and sin and calls
apply_rotary_pos_emb(q, k, v, cos, sin, position_ids)). Checked: the angles against mpmath past
2^16 (float64 while rope's function is in place, else rounded once to the hidden states' dtype),
the function against a float64 formula written here and against exact rotations at positions past
2^16, hostile inputs, gradients in float32, bfloat16 and float16 against float64 autograd, and on
a tiny CLVP encoder: install's probe and refusals, patch (no float64 reaches the attention's
matmuls, in float32 and bfloat16) and unpatch bit for bit. The model itself runs only at the
positions of its sequence (tests/test_hf_coverage.py exempts it from the 2^16 shift)."""

import math
import sys
import types

import mpmath
import pytest
import torch

import rope
from rope.hf import clvp
from rope.hf.clvp import RotaryAngleTable, apply_rotary_pos_emb_values

transformers = pytest.importorskip("transformers")
from rope.hf import coverage  # noqa: E402

modeling_clvp = pytest.importorskip("transformers.models.clvp.modeling_clvp")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def half_ulp(x: float, dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype`` at ``x``, subnormals included (round to nearest is within it)."""
    info = torch.finfo(dtype)
    bits = 1 - round(math.log2(info.eps))
    return 2.0 ** (max(math.frexp(x)[1], math.frexp(info.tiny)[1]) - bits - 1)


def exact_reduced(m: int, theta: float) -> mpmath.mpf:
    """m theta (theta a float32 value, exactly) reduced to [-pi, pi), in mpmath."""
    angle = mpmath.mpf(m) * mpmath.mpf(theta)
    two_pi = 2 * mpmath.pi
    return angle - two_pi * mpmath.floor(angle / two_pi + mpmath.mpf(0.5))


def formula(q, k, v, cos, sin, position_ids, unsqueeze_dim=1):
    """CLVP's rotation written out in float64: x c + rotate_half(x) s on the rows position_ids."""
    c = cos.double()[position_ids].unsqueeze(unsqueeze_dim)
    s = sin.double()[position_ids].unsqueeze(unsqueeze_dim)
    out = []
    for x in (q, k, v):
        x = x.double()
        half = x.shape[-1] // 2
        out.append(x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s)
    return out


@pytest.fixture
def ropes_module(monkeypatch):
    """The name of a stand-in modeling module holding rope's function (as patch leaves CLVP's)."""
    module = types.ModuleType("stand_in_modeling_clvp")
    module.apply_rotary_pos_emb = apply_rotary_pos_emb_values
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_the_angles_are_exactly_reduced_float64_while_ropes_function_rotates(ropes_module):
    width = 2 * int(torch.randint(8, 33, ()))
    table = RotaryAngleTable(width, ropes_module)
    assert table.exact()
    n = 2**16 + int(torch.randint(2, 300, ()))
    angles = table(torch.zeros(1, n, 3, dtype=torch.bfloat16))  # the hidden states' dtype does not matter here
    assert angles.shape == (1, n, width) and angles.dtype == torch.float64
    theta = [float(t) for t in table.inv_freq]
    assert table.inv_freq.dtype == torch.float32
    assert theta == pytest.approx([10000.0 ** (-2 * i / width) for i in range(width // 2)], rel=1e-6)
    with mpmath.workprec(200):
        for m in [0, 1, n - 1, *torch.randint(2**16, n, (4,)).tolist()]:
            for i in torch.randint(0, width // 2, (4,)).tolist():
                exact = exact_reduced(m, theta[i])
                for column in (i, i + width // 2):  # each pair's angle in both halves
                    got = float(angles[0, m, column])
                    assert -math.pi <= got <= math.pi and abs(got - float(exact)) <= 2.0**-50, (m, i)
                    assert abs(math.cos(got) - float(mpmath.cos(exact))) <= 2.0**-49


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_angles_are_rounded_once_to_the_hidden_dtype_under_transformers_function(dtype):
    table = RotaryAngleTable(32, modeling_clvp.__name__)  # transformers' function in place
    assert not table.exact()
    n = 2**16 + int(torch.randint(2, 300, ()))
    angles = table(torch.zeros(2, n, 5, dtype=dtype))
    assert angles.shape == (1, n, 32) and angles.dtype == dtype
    theta = [float(t) for t in table.inv_freq]
    with mpmath.workprec(200):
        for m in [1, n - 1, *torch.randint(2**16, n, (4,)).tolist()]:
            for i in torch.randint(0, 16, (3,)).tolist():
                exact = float(exact_reduced(m, theta[i]))
                got = float(angles[0, m, i])
                assert abs(got - exact) <= half_ulp(exact, dtype) * (1 + 2**-20), (m, i)


def test_the_module_keeps_float32_frequencies_through_casts_and_refuses_bad_input(ropes_module):
    table = RotaryAngleTable(32, ropes_module)
    before = table.inv_freq.clone()
    table.to(torch.bfloat16).half()
    assert table.inv_freq.dtype == torch.float32 and torch.equal(table.inv_freq, before)
    for bad in (None, torch.zeros(3)):
        with pytest.raises(TypeError, match="hidden_states must be a tensor"):
            table(bad)


def tables(n: int, width: int, dtype=torch.float32):
    angles = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(width // 2) / (width // 2))
    angles = angles.repeat(1, 2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_the_function_is_the_formula_rounded_once(unsqueeze_dim):
    n, width = 9, 2 * int(torch.randint(1, 17, ()))
    cos, sin = tables(n, width)
    shape = (2, 3, 7, width) if unsqueeze_dim == 1 else (2, 7, 3, width)
    q, k, v = (torch.randn(shape) * 10 for _ in range(3))
    ids = torch.randint(0, n, (2, 7))
    got = apply_rotary_pos_emb_values(q, k, v, cos, sin, ids, unsqueeze_dim)
    expected = formula(q, k, v, cos, sin, ids, unsqueeze_dim)
    for a, b in zip(got, expected):
        assert a.dtype == torch.float32 and torch.equal(a, b.float())  # float64 -> float32: one rounding
    theirs = modeling_clvp.apply_rotary_pos_emb(q, k, v, cos, sin, ids, unsqueeze_dim)
    for a, b in zip(got, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)  # transformers' float32 arithmetic


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_round_once_to_their_dtype_from_float64_tables(dtype):
    n, width = 11, 16
    cos, sin = tables(n, width, torch.float64)
    q, k, v = (torch.randn(2, 2, 5, width).to(dtype) for _ in range(3))
    ids = torch.randint(0, n, (2, 5))
    got = apply_rotary_pos_emb_values(q, k, v, cos, sin, ids)
    for a, b in zip(got, formula(q, k, v, cos, sin, ids)):
        assert a.dtype == dtype
        gap = (a.double() - b).abs()
        bound = torch.tensor([half_ulp(float(x), dtype) for x in b.flatten()], dtype=torch.float64).view(b.shape)
        assert bool((gap <= bound).all())
    # transformers' tables (float32): the dtype torch gives x * cos
    assert apply_rotary_pos_emb_values(q, k, v, cos.float(), sin.float(), ids)[0].dtype == torch.float32


def test_rotations_past_2_16_are_exact_with_ropes_angles(ropes_module):
    """The tables the attention takes from rope's float64 angles, at positions past 2^16: each
    output entry within half a unit of float32 (plus 2^-40 of its size) of the exact rotation."""
    width = 32
    n = 2**16 + 64
    angles = RotaryAngleTable(width, ropes_module)(torch.zeros(1, n, 1))
    cos, sin = angles.cos().squeeze(0), angles.sin().squeeze(0)  # as CLVP's attention does
    q, k, v = (torch.randn(1, 2, 4, width) for _ in range(3))
    ids = torch.randint(2**16, n, (1, 4))
    got = apply_rotary_pos_emb_values(q, k, v, cos, sin, ids)
    theta = [float(t) for t in RotaryAngleTable(width, ropes_module).inv_freq]
    with mpmath.workprec(200):
        for x, out in zip((q, k, v), got):
            assert out.dtype == torch.float32
            for head in range(2):
                for t in range(4):
                    m = int(ids[0, t])
                    for i in torch.randint(0, width // 2, (3,)).tolist():
                        a = exact_reduced(m, theta[i])
                        x1, x2 = (mpmath.mpf(float(x[0, head, t, j])) for j in (i, i + width // 2))
                        exact = (x1 * mpmath.cos(a) - x2 * mpmath.sin(a), x2 * mpmath.cos(a) + x1 * mpmath.sin(a))
                        for j, e in zip((i, i + width // 2), exact):
                            e = float(e)
                            assert abs(float(out[0, head, t, j]) - e) <= half_ulp(e, torch.float32) + 2**-40 * (
                                abs(float(x1)) + abs(float(x2))), (m, i, j)


def test_hostile_inputs_are_refused_naming_the_argument():
    cos, sin = tables(6, 8)
    q = torch.randn(1, 2, 3, 8)
    ids = torch.tensor([[0, 1, 5]])
    with pytest.raises(TypeError, match="q must be"):
        apply_rotary_pos_emb_values(q.long(), q, q, cos, sin, ids)
    with pytest.raises(TypeError, match="v must be"):
        apply_rotary_pos_emb_values(q, q, None, cos, sin, ids)
    with pytest.raises(TypeError, match="cos must be"):
        apply_rotary_pos_emb_values(q, q, q, cos.long(), sin, ids)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        apply_rotary_pos_emb_values(q, q, q, cos, sin, ids.float())
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        apply_rotary_pos_emb_values(q, q, q, cos, sin, ids > 0)
    with pytest.raises(ValueError, match="cos must be 2-D"):
        apply_rotary_pos_emb_values(q, q, q, cos[None], sin[None], ids)
    with pytest.raises(ValueError, match="sin .* must have the shape and dtype of cos"):
        apply_rotary_pos_emb_values(q, q, q, cos, sin[:5], ids)
    with pytest.raises(ValueError, match="sin .* must have the shape and dtype of cos"):
        apply_rotary_pos_emb_values(q, q, q, cos, sin.double(), ids)
    with pytest.raises(ValueError, match="even, non-zero d"):
        apply_rotary_pos_emb_values(q[..., :7], q[..., :7], q[..., :7], cos[:, :7], sin[:, :7], ids)
    with pytest.raises(ValueError, match="k .* must have the tables' width d = 8"):
        apply_rotary_pos_emb_values(q, q[..., :6], q, cos, sin, ids)
    for bad in ([[0, 1, 6]], [[-1, 0, 1]]):  # past the table, and negative (transformers would wrap around)
        with pytest.raises(ValueError, match="position_ids.*0 .. 5"):
            apply_rotary_pos_emb_values(q, q, q, cos, sin, torch.tensor(bad))
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        apply_rotary_pos_emb_values(q, q, q, cos, sin, ids, 4)
    with pytest.raises(TypeError, match="unsqueeze_dim"):
        apply_rotary_pos_emb_values(q, q, q, cos, sin, ids, 1.0)
    with pytest.raises(ValueError, match=r"does not broadcast to q"):
        apply_rotary_pos_emb_values(q, q, q, cos, sin, torch.tensor([[0, 1, 2, 3]]))


def test_non_finite_inputs_stay_where_they_are():
    cos, sin = tables(6, 8)
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    q[0, 1, 2, 3] = float("nan")
    k[0, 0, 1, 0] = float("inf")
    ids = torch.tensor([[1, 2, 3]])
    out_q, out_k, out_v = apply_rotary_pos_emb_values(q, k, v, cos, sin, ids)
    assert out_q[0, 1, 2].isnan().any() and out_q[0, 1, :2].isfinite().all() and out_q[0, 0].isfinite().all()
    assert not out_k[0, 0, 1].isfinite().all() and out_k[0, 0, [0, 2]].isfinite().all() and out_v.isfinite().all()
    expected = formula(q, k, v, cos, sin, ids)
    for a, b in zip((out_q, out_k, out_v), expected):
        finite = b.isfinite()
        assert torch.equal(a[finite], b[finite].float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_match_float64_autograd(dtype):
    n, width = 10, 16
    cos, sin = tables(n, width, torch.float64 if dtype != torch.float32 else torch.float32)
    cos.requires_grad_(dtype == torch.float32)
    xs64 = [torch.randn(2, 2, 6, width, dtype=torch.float64) for _ in range(3)]
    xs = [x.to(dtype).requires_grad_() for x in xs64]
    ids = torch.randint(0, n, (2, 6))
    weights = [torch.randn(2, 2, 6, width, dtype=torch.float64) for _ in range(3)]
    out = apply_rotary_pos_emb_values(*xs, cos, sin, ids)
    sum((o.double() * w).sum() for o, w in zip(out, weights)).backward()
    leaves = [x.detach().double().requires_grad_() for x in xs]
    cos64 = cos.detach().double().requires_grad_()
    reference = formula(*leaves, cos64, sin.detach(), ids)
    sum((o * w).sum() for o, w in zip(reference, weights)).backward()
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    for x, leaf in zip(xs, leaves):
        assert x.grad.dtype == dtype
        torch.testing.assert_close(x.grad.double(), leaf.grad, rtol=tolerance, atol=tolerance * 4)
    if dtype == torch.float32:  # the table's gradient too (rows gathered by position_ids, summed)
        torch.testing.assert_close(cos.grad.double(), cos64.grad, rtol=1e-5, atol=1e-5)


def test_methods_input_convention_check_tells_clvp_apart():
    """coverage's convention check: CLVP's module computes rope's function, Llama's does not."""
    from rope.hf import methods
    convention = rope.hf.families.CONVENTIONS["clvp"]
    assert methods.computes(modeling_clvp, convention)
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    assert not methods.computes(llama, convention)


def encoder():
    return coverage.tiny_model("clvp_encoder")


def run(model, tokens, position_ids=None):
    with torch.no_grad():
        return model(input_ids=tokens, position_ids=position_ids).last_hidden_state


def test_install_reproduces_transformers_module_and_refuses_a_cast_one():
    model = encoder()
    stock = model.rotary_pos_emb
    assert clvp.returns_angles(stock)
    (replacement,) = rope.hf.rotary_replacements(model)
    assert isinstance(replacement.new, RotaryAngleTable) and replacement.attribute == "rotary_pos_emb"
    for n in (1, 5, 64):
        theirs, ours = stock(torch.zeros(1, n, 3)), replacement.new(torch.zeros(1, n, 3))
        assert theirs.shape == ours.shape == (1, n, 32) and ours.dtype == torch.float32
        assert (theirs.cos() - ours.cos()).abs().max() < 1e-5 and (theirs.sin() - ours.sin()).abs().max() < 1e-5
    cast = encoder().to(torch.bfloat16)  # its inv_freq rounded to bfloat16: other angles
    with pytest.raises(ValueError, match=r"rotary_pos_emb \(ClvpRotaryPositionalEmbedding\) is not reproduced by "
                                         r"rope's RotaryAngleTable of base 10000 on 16 pairs"):
        rope.hf.install(cast)
    assert type(cast.rotary_pos_emb).__name__ == "ClvpRotaryPositionalEmbedding"


def test_install_alone_keeps_the_model_dtype():
    """Installed without patch (transformers' function in place), the angles come in the hidden
    states' dtype: the attention stays in the model's dtype, in float32 and after a bfloat16 cast."""
    model = encoder()
    tokens = coverage.sample_tokens(seed=5)
    before = run(model, tokens)
    assert rope.hf.install(model) == 1 and rope.hf.install(model) == 0
    torch.testing.assert_close(run(model, tokens), before, **coverage.LOGITS_TOLERANCE)
    model.to(torch.bfloat16)
    assert run(model, tokens).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch_rotates_in_float64_without_leaking_it_and_unpatch_restores(dtype):
    model = encoder()
    tokens = coverage.sample_tokens(seed=7)
    stock = model.rotary_pos_emb
    before = run(model, tokens)
    record = rope.hf.patch(model)
    try:
        assert record.convention is rope.hf.FAMILIES["clvp_encoder"] and model.rotary_pos_emb is not stock
        assert modeling_clvp.apply_rotary_pos_emb is apply_rotary_pos_emb_values
        assert model.rotary_pos_emb(torch.zeros(1, 4, 1, dtype=dtype)).dtype == torch.float64
        torch.testing.assert_close(run(model, tokens), before, **coverage.LOGITS_TOLERANCE)
        model.to(dtype)
        seen = []
        hooks = [layer.self_attn.register_forward_hook(lambda m, a, out: seen.extend(o.dtype for o in out))
                 for layer in model.layers]
        out = run(model, tokens)
        for hook in hooks:
            hook.remove()
        assert out.dtype == dtype and seen and set(seen) == {dtype}  # attention output and weights
        with pytest.raises(ValueError, match="position_ids"):  # transformers: IndexError; past the sequence
            run(model, tokens, torch.arange(tokens.shape[1])[None] + 2**16)
    finally:
        rope.hf.unpatch(model)
    assert model.rotary_pos_emb is stock and modeling_clvp.apply_rotary_pos_emb is not apply_rotary_pos_emb_values
    if dtype == torch.float32:
        assert torch.equal(run(model, tokens), before)
