"""rope.fope (FoPE, Hua et al. 2024, as vLLM's FourierRotaryEmbedding runs it) against vLLM's formula
written here in float64 from angles computed by mpmath, over inputs drawn afresh by hypothesis: the
retained frequencies, the outputs in every dtype (each rounded once), the gradients to q, k and
the coefficients in every dtype against float64 autograd, and refused arguments and config keys."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import FLOAT_DTYPES, exact_cos_sin, exact_rotation, names, ulp
from rope.fope import apply_fope, fope_inv_freq
from strategies import dtypes, seeds


def retained(base: float, dim: int, num_inv_freq, length) -> torch.Tensor:
    """vLLM's _compute_inv_freq: 1 / base^(arange(0, d, 2) / d) (here in float64, rounded once to
    float32), the first num_inv_freq, or (num_inv_freq None) those > 2 pi / L compared in float32."""
    theta = torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64).to(torch.float32)
    if num_inv_freq is not None:
        return theta[:num_inv_freq]
    return theta[theta > torch.tensor(2.0 * math.pi / length, dtype=torch.float32)]


def rotate_neox(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def fope_formula(x, positions, theta, cos_coef, sin_coef, sep_head, heads_k):
    """vLLM's FourierRotaryEmbedding in float64: sin = einsum("htD, hDd -> thd", sin(t theta),
    sin_coef) (sin_coef[0] for every head without fope_sep_head), cos likewise, padded to
    head_size // 2 with 0 (sin) and 1 (cos), cat((t, t)); query head q reads kv head q // group;
    x * cos + rotate_neox(x) * sin. Also each coordinate's scale for the error bound,
    |x_j| A_j + |x_{j + h}| B_j (A, B the sums of |coefficients| over D)."""
    x = x.to(torch.float64)
    rows = positions.reshape(-1, positions.shape[-1])
    cos, sin = exact_cos_sin(rows, theta)  # [batch or 1, seq, R], mpmath
    cos_c, sin_c = cos_coef.to(torch.float64), sin_coef.to(torch.float64)
    if not sep_head:
        cos_c, sin_c = cos_c[:1].expand(heads_k, -1, -1), sin_c[:1].expand(heads_k, -1, -1)
    half, pairs = x.shape[-1] // 2, theta.shape[0]
    tables = []
    for trig, coef, pad in ((cos, cos_c, 1.0), (sin, sin_c, 0.0), (None, cos_c.abs(), 0.0), (None, sin_c.abs(), 0.0)):
        t = torch.einsum("btD,hDd->bthd", trig, coef) if trig is not None else coef.sum(1)[None, None].expand(
            cos.shape[0], cos.shape[1], -1, -1)
        t = torch.cat((t, torch.full((*t.shape[:-1], half - pairs), pad, dtype=torch.float64)), dim=-1)
        tables.append(torch.cat((t, t), dim=-1).repeat_interleave(x.shape[2] // heads_k, dim=2))
    c, s, a, b = tables
    size = x.abs() * a + rotate_neox(x).abs() * b
    return x * c + rotate_neox(x) * s, size


def assert_within(out, reference, size, pairs):
    """``|out - reference|`` <= half an ulp of out's dtype + 2 (R + 4) 2^-53 size (rope's bound and the
    reference's own)."""
    err = (out.to(torch.float64) - reference).abs()
    bound = 0.5 * ulp(reference, out.dtype) * (1 + 1e-6) + 2 * (pairs + 4) * 2.0**-53 * size + 1e-300
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{out.dtype}: error reaches {worst:.3f} x the bound"


@st.composite
def cases(draw):
    """A random FoPE call: q, k, positions (to 2^40), R retained frequencies, coefficients."""
    gen = torch.Generator().manual_seed(draw(seeds))
    heads_k, group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([2, 4, 8, 16]))
    dim = draw(st.sampled_from([d for d in (2, 4, 8, 16) if d <= head_dim]))  # vLLM's rotary_dim
    theta = fope_inv_freq(draw(st.floats(10.0, 1e6)), dim, num_inv_freq=draw(st.integers(1, dim // 2)))
    dtype, coef_dtype = draw(dtypes), draw(dtypes)
    sep_head = draw(st.booleans())
    heads_c = heads_k if sep_head else draw(st.integers(1, 3))
    batch, seq = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    q = torch.randn(batch, seq, heads_k * group, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(batch, seq, heads_k, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    shape = (seq,) if draw(st.booleans()) else (batch, seq)
    positions = torch.randint(-(2**40), 2**40, shape, generator=gen)
    pairs = theta.shape[0]
    cos_coef, sin_coef = (torch.randn(heads_c, pairs, pairs, generator=gen, dtype=torch.float64).to(coef_dtype)
                          for _ in range(2))
    return q, k, positions, theta, cos_coef, sin_coef, sep_head


@given(cases())
def test_matches_vllms_formula_rounded_once(case):
    """Every output within half an ulp of the float64 formula of exact angles (plus the float64
    bound of the module docstring); the coordinates past the R retained pairs pass through exactly."""
    q, k, positions, theta, cos_coef, sin_coef, sep_head = case
    q_out, k_out = apply_fope(q, k, positions, theta, cos_coef=cos_coef, sin_coef=sin_coef, sep_head=sep_head)
    pairs, half = theta.shape[0], q.shape[-1] // 2
    for x, out in ((q, q_out), (k, k_out)):
        assert out.dtype == x.dtype and out.shape == x.shape
        reference, size = fope_formula(x, positions, theta, cos_coef, sin_coef, sep_head, k.shape[2])
        assert_within(out, reference, size, pairs)
        for start in (pairs, half + pairs):  # C = 1, S = 0: unrotated
            assert torch.equal(out[..., start:start + half - pairs], x[..., start:start + half - pairs])


@given(seeds, st.sampled_from([torch.float32, torch.bfloat16]), st.integers(1, 4))
def test_identity_coefficients_are_rope_on_the_retained_pairs(seed, dtype, pairs):
    """cos_coef = sin_coef = I: RoPE in the half layout over the whole head, theta_j for the R
    retained pairs and 0 beyond (vLLM's test of FoPE's padding says the same)."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = 16
    theta = fope_inv_freq(1e4, head_dim, num_inv_freq=pairs)
    q = torch.randn(2, 3, 4, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 3, 2, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    positions = torch.randint(-(2**40), 2**40, (2, 3), generator=gen)
    eye = torch.eye(pairs).expand(2, -1, -1)
    q_out, k_out = apply_fope(q, k, positions, theta, cos_coef=eye, sin_coef=eye)
    padded = torch.cat((theta, torch.zeros(head_dim // 2 - pairs)))
    for x, out in ((q, q_out), (k, k_out)):
        reference = exact_rotation(x, positions, padded)
        assert_within(out, reference, x.double().abs() + rotate_neox(x.double()).abs(), pairs)


def test_shared_coefficients_read_the_first_head():
    """sep_head=False (vLLM's fope_sep_head False): every head reads cos_coef[0], sin_coef[0], the
    other entries unread; the same numbers as one table per key head, each that first one."""
    q, k = torch.randn(1, 4, 6, 8), torch.randn(1, 4, 3, 8)
    theta, positions = fope_inv_freq(500.0, 8, max_position_embeddings=64), torch.arange(4) * 1000
    pairs = theta.shape[0]
    cos_coef, sin_coef = torch.randn(3, pairs, pairs), torch.randn(3, pairs, pairs)
    shared = apply_fope(q, k, positions, theta, cos_coef=cos_coef, sin_coef=sin_coef, sep_head=False)
    first = {"cos_coef": cos_coef[:1].expand(3, -1, -1), "sin_coef": sin_coef[:1].expand(3, -1, -1)}
    each = apply_fope(q, k, positions, theta, **first)
    assert all(torch.equal(a, b) for a, b in zip(shared, each))
    separate = apply_fope(q, k, positions, theta, cos_coef=cos_coef, sin_coef=sin_coef)
    assert not torch.equal(separate[1][:, :, 1:], shared[1][:, :, 1:])  # heads 1, 2 read their own


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("sep_head", [True, False])
def test_gradients_against_float64_autograd(dtype, sep_head):
    """dq, dk, d cos_coef and d sin_coef in their dtypes, each within half an ulp (plus the float64
    sums' bound) of float64 autograd through the formula written above; unread coefficient heads
    (sep_head=False) get exactly 0."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    heads_k, group, head_dim, batch, seq = 2, 2, 12, 2, 3
    theta = fope_inv_freq(1e4, 8, num_inv_freq=3)  # rotary_dim 8 < head_dim, R = 3 < head_dim / 2
    pairs = theta.shape[0]

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()

    q, k = leaf(batch, seq, heads_k * group, head_dim), leaf(batch, seq, heads_k, head_dim)
    cos_coef, sin_coef = leaf(heads_k, pairs, pairs), leaf(heads_k, pairs, pairs)
    positions = torch.randint(-(2**35), 2**35, (batch, seq), generator=gen)
    weights = [torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dtype) for x in (q, k)]
    outs = apply_fope(q, k, positions, theta, cos_coef=cos_coef, sin_coef=sin_coef, sep_head=sep_head)
    sum((out * w).sum() for out, w in zip(outs, weights)).backward()

    leaves = [x.detach().double().requires_grad_() for x in (q, k, cos_coef, sin_coef)]
    total = 0
    for x, w in zip(leaves[:2], weights):
        y, _ = fope_formula(x, positions, theta, leaves[2], leaves[3], sep_head, heads_k)
        total = total + (y * w.double()).sum()
    total.backward()
    for ours, reference, w in zip((q, k), leaves[:2], weights):
        _, size = fope_formula(w.double(), positions, theta, cos_coef.detach(), sin_coef.detach(), sep_head,
                               heads_k)  # dx = the transposed tables on dy = w: the same scale, on w
        assert ours.grad.dtype == dtype
        assert_within(ours.grad, reference.grad, size, pairs)
    # a coefficient's gradient sums cos or sin (<= 1) times w x over the tokens and heads that read it:
    # each such sum is at most the total of |w x|, and float64 sums n terms within 2 n 2^-53 of it
    total_size = sum((w.double() * x.detach().double()).abs().sum() for w, x in zip(weights, (q, k)))
    count = 2 * batch * seq * (q.shape[2] + k.shape[2]) + 8
    for ours, reference in zip((cos_coef, sin_coef), leaves[2:]):
        assert ours.grad.dtype == dtype
        err = (ours.grad.double() - reference.grad).abs()
        bound = 0.5 * ulp(reference.grad, dtype) * (1 + 1e-6) + 4 * count * 2.0**-53 * total_size
        assert bool((err <= bound).all()), (err / bound).max()
        if not sep_head:
            assert bool((ours.grad[1:] == 0).all())


def test_fope_inv_freq_is_vllms_selection():
    """The first num_inv_freq frequencies, or those turning at least once over L (float32
    comparison); num_inv_freq decides where both are given, as in vLLM."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    for _ in range(20):
        base = float(10 ** (1 + 6 * torch.rand((), generator=gen)))
        dim = 2 * int(torch.randint(1, 65, (), generator=gen))
        length = int(torch.randint(7, 2**20, (), generator=gen))
        count = int(torch.randint(1, dim // 2 + 1, (), generator=gen))
        for num_inv_freq, L in ((count, None), (None, length), (count, length)):
            ours = fope_inv_freq(base, dim, num_inv_freq=num_inv_freq, max_position_embeddings=L)
            expected = retained(base, dim, num_inv_freq, L)
            assert ours.dtype == torch.float32 and ours.shape == expected.shape
            assert torch.allclose(ours.double(), expected.double(), rtol=2.0**-23, atol=0)
    assert fope_inv_freq(1e4, 8, max_position_embeddings=7).shape == (1,)  # theta_0 = 1 > 2 pi / 7


def test_bad_arguments_are_refused_by_name():
    q, k = torch.randn(1, 3, 4, 8), torch.randn(1, 3, 2, 8)
    positions, theta = torch.arange(3), fope_inv_freq(1e4, 8, num_inv_freq=3)
    coef = torch.randn(2, 3, 3)
    good = {"q": q, "k": k, "positions": positions, "inv_freq": theta, "cos_coef": coef, "sin_coef": coef}
    nan = coef.clone()
    nan[1, 2, 0] = math.nan
    cases = [
        (ValueError, "cos_coef", {"cos_coef": torch.randn(3, 3)}),
        (ValueError, "cos_coef", {"cos_coef": torch.randn(2, 3, 2)}),
        (ValueError, "cos_coef", {"cos_coef": torch.randn(1, 3, 3)}),  # one table, but sep_head
        (ValueError, "sin_coef", {"sin_coef": torch.randn(3, 3, 3)}),
        (TypeError, "cos_coef", {"cos_coef": torch.ones(2, 3, 3, dtype=torch.int64)}),
        (TypeError, "cos_coef", {"cos_coef": coef.tolist()}),
        (TypeError, "cos_coef", {"cos_coef": coef.double()}),  # the two dtypes differ
        (ValueError, "sin_coef", {"sin_coef": nan}),
        (ValueError, "cos_coef", {"cos_coef": coef * math.inf}),
        (ValueError, "heads_q", {"q": torch.randn(1, 3, 3, 8)}),
        (ValueError, "head_dim", {"q": torch.randn(1, 3, 4, 7), "k": torch.randn(1, 3, 2, 7)}),
        (ValueError, "inv_freq", {"q": torch.randn(1, 3, 4, 4), "k": torch.randn(1, 3, 2, 4)}),  # R = 3 > 2
        (ValueError, "inv_freq", {"inv_freq": theta[:0], "cos_coef": coef[:, :0, :0], "sin_coef": coef[:, :0, :0]}),
        (TypeError, "inv_freq", {"inv_freq": theta.half()}),
        (ValueError, "inv_freq", {"inv_freq": theta * math.nan}),
        (ValueError, "inv_freq", {"inv_freq": theta.clone().requires_grad_()}),
        (TypeError, "positions", {"positions": positions.float()}),
        (ValueError, "positions", {"positions": torch.arange(4)}),
        (TypeError, "q", {"q": q.double()}),
        (TypeError, "sep_head", {"sep_head": 1}),
    ]
    for error, name, change in cases:
        arguments = {**good, **change}
        with pytest.raises((TypeError, ValueError)) as caught:
            apply_fope(arguments.pop("q"), arguments.pop("k"), arguments.pop("positions"), arguments.pop("inv_freq"),
                       **arguments)
        assert caught.type is error, (name, caught.value)
        assert names(str(caught.value), name), (name, str(caught.value))
    for error, name, call in [
        (ValueError, "num_inv_freq", lambda: fope_inv_freq(1e4, 8)),
        (ValueError, "num_inv_freq", lambda: fope_inv_freq(1e4, 8, num_inv_freq=5)),
        (ValueError, "num_inv_freq", lambda: fope_inv_freq(1e4, 8, num_inv_freq=0)),
        (ValueError, "max_position_embeddings", lambda: fope_inv_freq(1e4, 8, max_position_embeddings=6)),
        (ValueError, "rotary_dim", lambda: fope_inv_freq(1e4, 7, num_inv_freq=1)),
        (ValueError, "rope_theta", lambda: fope_inv_freq(1.0, 8, num_inv_freq=1)),
    ]:
        with pytest.raises(error) as caught:
            call()
        assert names(str(caught.value), name), (name, str(caught.value))


@pytest.mark.parametrize("key, value", [("use_fope", True), ("num_inv_freq", 8), ("fope_sep_head", False),
                                        ("fope_init_factor", 0.5)])
def test_fope_keys_are_refused_by_inv_freq_and_rope_config(key, value):
    """A FoPE config is no frequency table: its keys are refused by name, pointing to apply_fope."""
    with pytest.raises(ValueError, match=f"'{key}' is not rope's: .*rope.apply_fope"):
        rope.inv_freq({"rope_type": "default", "rope_theta": 5e6, key: value}, 128)
    with pytest.raises(ValueError, match=f"'{key}' is not rope's: .*rope.apply_fope"):
        rope.RopeConfig(extra={key: value})
