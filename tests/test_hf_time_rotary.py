"""rope.hf.time_rotary: MusicFlamingo's apply_rotary_time_emb and rotary time module, against a
float64 formula written here (mpmath where the exact angle's cos and sin matter), transformers'
own code, hostile inputs, gradients, and rope.hf.patch / unpatch on a tiny model."""

import math

import pytest
import torch

import rope
from rope.hf import time_rotary

mpmath = pytest.importorskip("mpmath")
transformers = pytest.importorskip("transformers")
from transformers.models.musicflamingo import modeling_musicflamingo as stock  # noqa: E402

from rope.hf import coverage  # noqa: E402

LOW = (torch.float32, torch.bfloat16, torch.float16)


def formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotation in float64, written from modeling_musicflamingo.py: pairs (2i, 2i + 1) of the
    first cos.shape[-1] coordinates become (x0 c0 - x1 s0, x1 c1 + x0 s1), the rest pass."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    r = cos.shape[-1]
    out = x.clone()
    out[..., 0:r:2] = x[..., 0:r:2] * cos[..., 0::2] - x[..., 1:r:2] * sin[..., 0::2]
    out[..., 1:r:2] = x[..., 1:r:2] * cos[..., 1::2] + x[..., 0:r:2] * sin[..., 1::2]
    return out


def tables(gen, shape):
    """Random tables (not of one angle per pair: the function reads each entry as given)."""
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


@pytest.mark.parametrize("dtype", [*LOW, torch.float64])
@pytest.mark.parametrize("table_shape", [(3, 5, 8), (5, 8), (1, 5, 12)])
def test_function_is_the_formula_rounded_once(dtype, table_shape):
    gen = torch.Generator().manual_seed(len(table_shape) + table_shape[-1])
    x = torch.randn(3, 5, 12, generator=gen).to(dtype)
    cos, sin = tables(gen, table_shape)
    out = rope.hf.apply_rotary_time_emb(x, cos, sin)
    exact = formula(x, cos, sin)
    assert out.dtype == dtype and out.shape == x.shape
    error = (out.double() - exact).abs()
    torch_rounding = (exact.to(dtype).double() - exact).abs()  # a correct rounding is at least as close
    assert bool((error <= torch_rounding).all())
    if dtype in (torch.float32, torch.float64):  # transformers' float64 formula, cast once: the same numbers
        assert torch.equal(out, stock.apply_rotary_time_emb(x, cos, sin))
    torch.testing.assert_close(out[..., table_shape[-1]:], x[..., table_shape[-1]:], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW)
def test_function_gradients_are_float64_autograds_of_the_formula(dtype):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 6, 10, generator=gen).to(dtype)
    cos, sin = (t.to(dtype) for t in tables(gen, (6, 8)))
    weights = torch.randn(2, 6, 10, generator=gen, dtype=torch.float64).to(dtype)
    ours = [t.clone().requires_grad_(True) for t in (x, cos, sin)]
    rope.hf.apply_rotary_time_emb(*ours).backward(weights)
    exact = [t.double().requires_grad_(True) for t in (x, cos, sin)]
    (formula(*exact) * weights.double()).sum().backward()
    eps = torch.finfo(dtype).eps
    for got, want in zip(ours, exact):
        assert got.grad.dtype == dtype
        atol = eps * 1e-3 * float(want.grad.abs().max())
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=eps, atol=atol)


X = torch.randn(2, 5, 12)
COS, SIN = torch.randn(5, 8), torch.randn(5, 8)
BAD_CALLS = [
    (lambda: rope.hf.apply_rotary_time_emb(X.int(), COS, SIN), TypeError, "hidden_states must be"),
    (lambda: rope.hf.apply_rotary_time_emb(X, COS.long(), SIN), TypeError, "cos must be"),
    (lambda: rope.hf.apply_rotary_time_emb(X, COS, SIN.to(torch.complex64)), TypeError, "sin must be"),
    (lambda: rope.hf.apply_rotary_time_emb(X.tolist(), COS, SIN), TypeError, "hidden_states must be a torch.Tensor"),
    (lambda: rope.hf.apply_rotary_time_emb(X, COS, SIN[:, :6]), ValueError, "sin .* must have the shape of cos"),
    (lambda: rope.hf.apply_rotary_time_emb(X, COS[:, :7], SIN[:, :7]), ValueError, "must be even"),
    (lambda: rope.hf.apply_rotary_time_emb(X[..., :6], COS, SIN), ValueError, "at most the features' 6"),
    (lambda: rope.hf.apply_rotary_time_emb(X, COS[:4], SIN[:4]), ValueError, "must broadcast to hidden_states"),
    (lambda: rope.hf.apply_rotary_time_emb(X, COS.expand(3, 2, 5, 8), SIN.expand(3, 2, 5, 8)), ValueError,
     "must broadcast to hidden_states"),
    (lambda: rope.hf.apply_rotary_time_emb(X, COS[0, 0], SIN[0, 0]), ValueError, "must have a last dimension"),
]


@pytest.mark.parametrize("call, error, message", BAD_CALLS)
def test_function_refuses_bad_inputs_by_name(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_function_passes_non_finite_values_through_the_formula():
    x = X.clone()
    x[0, 0, 0] = float("nan")
    out = rope.hf.apply_rotary_time_emb(x, COS, SIN)
    assert torch.isnan(out[0, 0, :2]).all() and torch.isfinite(out[0, 0, 2:]).all() and torch.isfinite(out[1]).all()


def stock_module(head_dim: int = 64, theta: float = 1200.0, rope_type: str = "default"):
    """transformers' MusicFlamingoRotaryEmbedding of a config (M = rope_theta, as its config sets)."""
    config = transformers.MusicFlamingoConfig()
    config.head_dim = head_dim
    config.rope_parameters = {"rope_type": rope_type, "rope_theta": theta, "partial_rotary_factor": 0.2,
                              **({"factor": 2.0} if rope_type == "linear" else {})}
    config.max_position_embeddings = theta
    return stock.MusicFlamingoRotaryEmbedding(config)


def exact_tables(module, timestamps: torch.Tensor, seq_len: int):
    """float64 angles of transformers' formula, written here (each operation in float64, in its
    order), their cos and sin by mpmath from the exact float64 values: [windows, seq_len, 4n]."""
    theta = module.inv_freq.double()
    m, step = module.max_positions, module.frame_step
    ts = timestamps.double()
    window = (torch.round(ts[:, 0] / (step * 4 * seq_len)) / m)[:, None, None] * theta
    time = (torch.arange(seq_len, dtype=torch.float64) / m * (2 * math.pi))[:, None] * theta
    turn = (-ts * 2 * math.pi)[..., None]
    angles = torch.cat(((window * turn).repeat_interleave(2, -1), (time[None] * turn).repeat_interleave(2, -1)), -1)
    with mpmath.workprec(200):
        cos = [float(mpmath.cos(mpmath.mpf(float(a)))) for a in angles.flatten()]
        sin = [float(mpmath.sin(mpmath.mpf(float(a)))) for a in angles.flatten()]
    return (torch.tensor(cos, dtype=torch.float64).reshape(angles.shape),
            torch.tensor(sin, dtype=torch.float64).reshape(angles.shape), angles)


def assert_rounded_once(got: torch.Tensor, exact: torch.Tensor):
    """Every float32 entry within half an ulp of the exact value (plus 2^-50 for the reduction)."""
    assert got.dtype == torch.float32
    half_ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(exact.float())[1].int() - 25)
    assert bool(((got.double() - exact).abs() <= half_ulp + 2.0**-50).all())


@pytest.mark.parametrize("scale", [1.0, 3600.0, 2.0**20, 2.0**30])
def test_module_tables_are_exact_at_large_fractional_timestamps(scale):
    """Windows of fractional timestamps up to an hour, 2^20 s and 2^30 s: angles up to 10^3, 10^5
    and 10^8 rad (past 2^22, the turns' reduction), where transformers' float32 angles are off by
    10^-4 rad and more."""
    ours = time_rotary.reproduce("pos_emb", stock_module())
    gen = torch.Generator().manual_seed(int(scale) % 1000)
    seq_len = 6
    stamps = (torch.rand(3, seq_len, generator=gen, dtype=torch.float64) * scale).sort(dim=1).values
    cos, sin = ours(stamps, seq_len)
    exact_cos, exact_sin, angles = exact_tables(ours, stamps, seq_len)
    assert cos.shape == (3, seq_len, 4 * ours.inv_freq.numel())
    assert float(angles.abs().max()) > scale / 20  # 4 pi^2 s theta_0 / M t: large angles, exactly reduced
    assert_rounded_once(cos, exact_cos)
    assert_rounded_once(sin, exact_sin)
    if scale >= 3600:  # the float32 formula is far off there: the test has teeth
        theirs = stock_module()(stamps.float(), seq_len)
        assert float((theirs[0].double() - exact_cos).abs().max()) > 1e-3


def test_module_matches_transformers_near_zero_and_restores_its_layout():
    module = stock_module()
    ours = time_rotary.reproduce("pos_emb", module)
    stamps = time_rotary.probe_timestamps(4, 9, 0.04)
    theirs = module(stamps, 9)
    got = ours(stamps, 9)
    largest = float(torch.cat(ours.angles(stamps, 9)).abs().max())
    for a, b in zip(got, theirs):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
        assert float((a - b).abs().max()) <= 2.0**-20 * largest + 1e-6
    exact_cos, _, _ = exact_tables(ours, stamps, 9)
    assert_rounded_once(got[0], exact_cos)


def test_module_reads_position_ids_as_both_axes_at_integer_angles():
    ours = time_rotary.reproduce("pos_emb", stock_module())
    positions = torch.tensor([[0, 1, 7, 2**20 + 3]])
    cos, sin = ours(torch.zeros(1), positions)
    theta = ours.inv_freq.double()
    with mpmath.workprec(200):
        exact = torch.tensor([[[float(mpmath.cos(int(p) * mpmath.mpf(float(t)))) for t in theta]
                               for p in positions[0]]], dtype=torch.float64)
    assert_rounded_once(cos, exact.repeat_interleave(2, -1).repeat(1, 1, 2))
    assert sin.shape == cos.shape == (1, 4, 4 * theta.numel())


BAD_MODULE_CALLS = [
    (lambda m: m(torch.zeros(2, 5), 5.0), TypeError, "seq_len must be"),
    (lambda m: m(torch.zeros(2, 5), True), TypeError, "seq_len must be"),
    (lambda m: m(torch.zeros(2, 1300), 1300), ValueError, "seq_len must be <= 1200"),
    (lambda m: m(torch.zeros(2, 4), 5), ValueError, r"timestamps must be \[windows, seq_len\]"),
    (lambda m: m(torch.zeros(5), 5), ValueError, r"timestamps must be \[windows, seq_len\]"),
    (lambda m: m(torch.full((2, 5), float("nan")), 5), ValueError, "timestamps must hold finite values"),
    (lambda m: m(torch.full((2, 5), float("inf")), 5), ValueError, "timestamps must hold finite values"),
    (lambda m: m(torch.full((2, 5), 1e300, dtype=torch.float64), 5), ValueError, "timestamps: angles must be"),
    (lambda m: m(torch.zeros(2, 5, dtype=torch.complex64), 5), TypeError, "timestamps must be a real"),
    (lambda m: m([[0.0] * 5] * 2, 5), TypeError, "timestamps must be a torch.Tensor"),
    (lambda m: m(torch.zeros(1), torch.zeros(1, 3)), TypeError, "position_ids must be"),
]


@pytest.mark.parametrize("call, error, message", BAD_MODULE_CALLS)
def test_module_refuses_bad_inputs_by_name(call, error, message):
    with pytest.raises(error, match=message):
        call(time_rotary.reproduce("pos_emb", stock_module()))


def hard_angles() -> torch.Tensor:
    """float64 angles of every magnitude, both signs, across 2^22 (where the reduction changes),
    and the float64 numbers nearest to multiples of pi (whose rest modulo 2 pi cancels most bits)."""
    gen = torch.Generator().manual_seed(22)
    spread = torch.ldexp(torch.rand(400, generator=gen, dtype=torch.float64) + 0.5,
                         torch.randint(-60, 120, (400,), generator=gen, dtype=torch.int32))
    edge = torch.tensor([2.0**22 * (1 - 2.0**-52), 2.0**22, 2.0**22 * (1 + 2.0**-52), 3 * 2.0**21], dtype=torch.float64)
    near_pi = torch.tensor([k * math.pi for k in (1, 2, 3, 355, 710, 103993, 2**19 + 1, 6381956970095103, 2**40)],
                           dtype=torch.float64)
    angles = torch.cat((spread, edge, near_pi))
    return torch.cat((angles, -angles))


def test_cos_sin_of_angles_are_the_exact_values_of_the_float64_angles():
    angles = hard_angles()
    cos, sin = time_rotary.cos_sin_of_angles(angles)
    with mpmath.workprec(400):  # enough bits of pi for the reduction of 2^120 rad
        exact_cos = torch.tensor([float(mpmath.cos(mpmath.mpf(float(a)))) for a in angles], dtype=torch.float64)
        exact_sin = torch.tensor([float(mpmath.sin(mpmath.mpf(float(a)))) for a in angles], dtype=torch.float64)
    assert float((cos - exact_cos).abs().max()) <= 2.0**-51
    assert float((sin - exact_sin).abs().max()) <= 2.0**-51
    assert float((torch.cos(angles.float()).double() - exact_cos).abs().max()) > 0.1  # float32 angles: far off


def test_cos_sin_of_angles_refuses_what_it_cannot_reduce():
    with pytest.raises(ValueError, match="angles must be finite and below 2\\^127"):
        time_rotary.cos_sin_of_angles(torch.tensor([1.0, 2.0**127], dtype=torch.float64))
    with pytest.raises(ValueError, match="angles must be finite"):
        time_rotary.cos_sin_of_angles(torch.tensor([float("nan")], dtype=torch.float64))
    with pytest.raises(TypeError, match="angles must be float64"):
        time_rotary.cos_sin_of_angles(torch.ones(3))


def test_module_integer_timestamps_and_tiny_angles():
    ours = time_rotary.reproduce("pos_emb", stock_module())
    cos, sin = ours(torch.arange(10).reshape(2, 5), 5)
    exact_cos, exact_sin, _ = exact_tables(ours, torch.arange(10).reshape(2, 5), 5)
    assert_rounded_once(cos, exact_cos)
    tiny_cos, tiny_sin = time_rotary.cos_sin_of_angles(torch.tensor([1e-200, -3e-120, 0.0], dtype=torch.float64))
    assert tiny_cos.tolist() == [1.0, 1.0, 1.0] and tiny_sin.tolist() == [1e-200, -3e-120, 0.0]


def test_reproduce_refuses_what_rope_does_not_reproduce_by_name():
    with pytest.raises(ValueError, match="rope_type is 'linear', not 'default'"):
        time_rotary.reproduce("pos_emb", stock_module(rope_type="linear"))
    with pytest.raises(ValueError, match=r"inv_freq\[1\] = .* an odd rotary width"):
        time_rotary.reproduce("pos_emb", stock_module(head_dim=16))  # int(16 * 0.2) = 3: b^(-2/3)
    with pytest.raises(ValueError, match="its inv_freq is torch.bfloat16"):
        time_rotary.reproduce("pos_emb", stock_module().to(torch.bfloat16))
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        time_rotary.reproduce("pos_emb", object())
    with pytest.raises(ValueError, match="not a transformers rotary time module"):
        time_rotary.reproduce("rotary_emb", torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="frame_step must be > 0"):
        time_rotary.TimeRotaryEmbedding(torch.ones(2), 1200.0, 0.0)


def test_module_keeps_float32_frequencies_through_casts():
    ours = time_rotary.reproduce("pos_emb", stock_module())
    theta = ours.inv_freq.clone()
    ours.to(torch.bfloat16)
    assert torch.equal(ours.inv_freq, theta)
    assert ours(time_rotary.probe_timestamps(), time_rotary.PROBE_FRAMES)[0].dtype == torch.float32


def test_patch_swaps_both_and_unpatch_restores_bit_for_bit():
    model = coverage.tiny_model("musicflamingo")
    tokens = coverage.sample_tokens(seed=3)
    expected = coverage.output(model, tokens)
    module_before = model.pos_emb
    record = rope.hf.patch(model)
    try:
        assert isinstance(model.pos_emb, rope.hf.TimeRotaryEmbedding)
        assert stock.apply_rotary_time_emb is rope.hf.apply_rotary_time_emb
        assert [r.name for r in record.vision_modules] == ["pos_emb"] and not record.vision_left
        torch.testing.assert_close(coverage.output(model, tokens), expected, **coverage.LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model)
    assert model.pos_emb is module_before and stock.apply_rotary_time_emb is not rope.hf.apply_rotary_time_emb
    assert torch.equal(coverage.output(model, tokens), expected)
