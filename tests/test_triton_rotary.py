"""The fused Triton kernel against float64 references with exactly reduced angles.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (tests/conftest.py), so
shapes stay small; with one, the same tests run on CUDA.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

import triton
import triton.language as tl

import rope
import rope.kernels.operators  # registers torch.ops.rope.rotary and torch.ops.rope.rotary_
from helpers import (
    FLOAT_DTYPES,
    assert_device_assertion,
    exact_cos_sin,
    exact_rotation,
    rotate_float64,
    ulp,
    value_checks_assert_on,
)
from rope.kernels.triton_rotary import cos_sin_of_int32_turns, needs_fma_by_parts
from strategies import layouts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def assert_close_to(out, ref, x, attention_factor=1.0):
    """Within the kernel's promise (rope/kernels/triton_rotary.py): the rounding of a value within
    Delta of the exact one, so within half an ulp of the output dtype plus 2 Delta, Delta =
    6 2^-24 |pair| (float32 math: float32), 2^-43 |pair| (float-float math: float16, bfloat16) or
    2^-51 |pair| (float64 math: float64), |pair| <= s sqrt(2) max |x| over the head; plus the
    float64 reference's own error, below 2^-50 |pair|."""
    pair = attention_factor * 2**0.5 * x.to("cpu", torch.float64).abs().amax(-1, keepdim=True)
    if x.dtype == torch.float64:  # float64 math
        delta = 2.0**-51 * pair + 2.0**-1070 * attention_factor
    elif x.dtype != torch.float32:  # float-float math
        delta = 2.0**-43 * pair + 2.0**-145 * max(1.0, attention_factor)
    else:
        delta = 6 * 2.0**-24 * pair + 2.0**-148 * max(1.0, attention_factor)
    reference_error = 2.0**-50 * pair
    bound = 0.5 * ulp(ref.abs() + reference_error, x.dtype) + 2 * delta + reference_error
    err = (out.to("cpu", torch.float64) - ref).abs()
    assert torch.all(err <= bound), f"{x.dtype}: worst error {(err / bound).max().item():.3g} x the bound"


@triton.jit
def _cos_sin_probe(TURNS, COS, SIN, N: tl.constexpr, FMA_BY_PARTS: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    cos, sin = cos_sin_of_int32_turns(tl.load(TURNS + i), FMA_BY_PARTS)
    tl.store(COS + i, cos)
    tl.store(SIN + i, sin)


# The largest errors of a sweep over every remainder t in [-2^29, 2^29) (1.2199 to 1.2131 2^-24;
# cos_sin_errors on consecutive chunks of 2^25, about 4 minutes in the interpreter), and their negatives.
WORST_TURNS = [532753066, 536073756, 523799157, 532414201, 528728448]


def cos_sin_errors(turns: torch.Tensor) -> torch.Tensor:
    """max(|cos error|, |sin error|) of the kernel's cos/sin of 2 pi t / 2^32 against float64, in 2^-24."""
    turns = turns.to(DEVICE)
    cos, sin = torch.empty(turns.shape, device=DEVICE), torch.empty(turns.shape, device=DEVICE)
    _cos_sin_probe[(turns.numel() // 1024,)](turns, cos, sin, N=1024, FMA_BY_PARTS=needs_fma_by_parts())
    angle = turns.cpu().double() * (2 * torch.pi / 2**32)
    err = torch.maximum((cos.cpu().double() - angle.cos()).abs(), (sin.cpu().double() - angle.sin()).abs())
    return err / 2.0**-24


def test_cos_sin_of_turns_within_its_bound():
    """The kernel's cos/sin of 2 pi t / 2^32 (quadrant from the integer t, Taylor polynomials on
    [-pi/4, pi/4]) within 1.22 2^-24 of the functions: the bound of rope/kernels/triton_rotary.py, found by
    the sweep above (the quadrant only swaps and negates, so the remainders are all there is).
    Here: the sweep's worst points in every quadrant, every multiple of pi/4 (where the quadrant
    changes) and its neighbours, the ends of the int32 range, and random t."""
    gen = torch.Generator().manual_seed(11)
    worst = [sign * t + quarter * 2**30 for t in WORST_TURNS for sign in (1, -1) for quarter in (-1, 0, 1)]
    edges = [k * 2**29 + d for k in range(-4, 5) for d in range(-3, 4)]
    edges = [t for t in worst + edges if -2**31 <= t < 2**31]
    turns = torch.cat([torch.tensor(edges), torch.randint(-2**31, 2**31, (4096 - len(edges),), generator=gen)])
    err = cos_sin_errors(turns)
    assert err.max() <= 1.22, f"worst error {err.max().item():.4f} 2^-24 at t = {turns[err.argmax()].item()}"
    assert err[:len(worst)].min() > 1.21  # the bound is reached: it is not loose


@st.composite
def problems(draw):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, seq = draw(st.integers(1, 2)), draw(st.integers(1, 6))
    heads_q, heads_k = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    head_dim = 2 * draw(st.integers(1, 20))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    # q and k as views into one packed [batch, seq, heads_q + 2 heads_k, head_dim] projection, or separate.
    if draw(st.booleans()):
        qkv = torch.randn(batch, seq, heads_q + 2 * heads_k, head_dim, generator=gen).to(dtype)
        q, k = qkv[:, :, :heads_q], qkv[:, :, heads_q:heads_q + heads_k]
    else:
        q = torch.randn(batch, seq, heads_q, head_dim, generator=gen).to(dtype)
        k = torch.randn(batch, seq, heads_k, head_dim, generator=gen).to(dtype)
    high = draw(st.sampled_from([64, 2**20, 2**31 - 1]))
    shape = (seq,) if draw(st.booleans()) else (batch, seq)
    positions = torch.randint(-high if draw(st.booleans()) else 0, high, shape, generator=gen)
    theta, _ = rope.inv_freq({"rope_theta": draw(st.floats(10.0, 1e6))}, rotary_dim)
    return q.to(DEVICE), k.to(DEVICE), positions.to(DEVICE), theta.to(DEVICE)


@settings(max_examples=settings.default.max_examples // 2)  # half the profile's: the kernel is interpreted
@given(problems(), layouts, st.sampled_from([1.0, 1.2345]), st.booleans())
def test_kernel_matches_float64_reference(problem, layout, attention_factor, conjugate):
    q, k, positions, theta = problem
    q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, attention_factor=attention_factor,
                                     conjugate=conjugate, backend="triton")
    rotary_dim = 2 * theta.numel()
    for x, out in ((q, q_out), (k, k_out)):
        assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
        ref = exact_rotation(x, positions, theta, layout=layout, attention_factor=attention_factor,
                             conjugate=conjugate)
        assert_close_to(out, ref, x, attention_factor)
        assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])


def _small(dtype=torch.float32, seed=0, heads=(3, 2), head_dim=12):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 5, heads[0], head_dim, generator=gen, dtype=torch.float64).to(DEVICE, dtype)
    k = torch.randn(2, 5, heads[1], head_dim, generator=gen, dtype=torch.float64).to(DEVICE, dtype)
    positions = torch.randint(0, 2**31 - 1, (2, 5), generator=gen).to(DEVICE)
    theta, _ = rope.inv_freq({"rope_theta": 5e5}, 8)
    return q, k, positions, theta.to(DEVICE)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_in_place_rotation_equals_out_of_place_and_keeps_the_tail(layout):
    q, k, positions, theta = _small()
    expected = rope.apply_rotary(q, k, positions, theta, layout=layout, attention_factor=0.9, backend="triton")
    q_in, k_in = q.clone(), k.clone()
    torch.ops.rope.rotary_(q_in, k_in, positions, theta, layout == "interleaved", 8, 0.9, False)
    assert torch.equal(q_in, expected[0]) and torch.equal(k_in, expected[1])
    assert torch.equal(q_in[..., 8:], q[..., 8:])


def test_backward_is_the_conjugate_rotation_and_leaves_the_gradient_alone():
    q, k, positions, theta = _small(torch.float64)
    q.requires_grad_(), k.requires_grad_()
    small = (q[:1, :2, :2].detach().requires_grad_(), k[:1, :2, :1].detach().requires_grad_())
    assert torch.autograd.gradcheck(
        lambda a, b: rope.apply_rotary(a, b, positions[:1, :2], theta, attention_factor=1.3, backend="triton"), small,
        fast_mode=True,  # random projections: a few kernel calls instead of two per input entry (interpreted)
    )
    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    saved = grad_q.clone()
    q_out, k_out = rope.apply_rotary(q, k, positions, theta, attention_factor=1.3, backend="triton")
    got_q, got_k = torch.autograd.grad((q_out, k_out), (q, k), (grad_q, grad_k))
    assert torch.equal(grad_q, saved)
    for got, grad in ((got_q, grad_q), (got_k, grad_k)):
        expected = exact_rotation(grad, positions, theta, layout="half", attention_factor=1.3, conjugate=True)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_never_writes_into_the_incoming_gradient(layout):
    """Autograd hands one gradient tensor to both inputs of an addition: here w reaches the
    rotation's backward and the backward of y = 2 x, which runs after it. A rotation in place
    of w would give x the gradient 2 R^T w; the backward writes new tensors, so x gets 2 w."""
    q, k, positions, theta = _small(torch.float64, seed=3)
    q.requires_grad_(), k.requires_grad_()
    x = torch.randn_like(q).requires_grad_()
    w = torch.randn_like(q)
    q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, attention_factor=1.3, backend="triton")
    y = 2 * x
    grad_x, grad_q = torch.autograd.grad(((q_out + y) * w).sum() + k_out.sum(), (x, q))
    torch.testing.assert_close(grad_x, 2 * w, rtol=0, atol=0)
    expected = exact_rotation(w, positions, theta, layout=layout, attention_factor=1.3, conjugate=True)
    torch.testing.assert_close(grad_q.cpu(), expected, rtol=0, atol=1e-12)


def test_no_gradient_is_silently_missing():
    """inv_freq that requires grad is refused while autograd records (the angles are exact
    integer turns: no gradient with respect to theta), and taken under no_grad; rotary_ refuses
    q or k that require grad (autograd cannot record an in-place custom operator)."""
    q, k, positions, theta = _small(torch.float64, seed=5)
    learned = theta.clone().requires_grad_()
    with pytest.raises(ValueError, match="inv_freq requires grad"):
        torch.ops.rope.rotary(q.clone().requires_grad_(), k, positions, learned, False, 8, 1.0, False)
    with pytest.raises(ValueError, match="inv_freq requires grad"):
        rope.apply_rotary(q, k, positions, learned, backend="triton")
    with torch.no_grad():
        got = rope.apply_rotary(q, k, positions, learned, backend="triton")
    for out, ref in zip(got, rope.apply_rotary(q, k, positions, theta, backend="triton")):
        assert torch.equal(out, ref)
    for name, tensors in (("q", (q.clone().requires_grad_(), k.clone())),
                          ("k", (q.clone(), k.clone().requires_grad_()))):
        before = [t.detach().clone() for t in tensors]
        with pytest.raises(ValueError, match=f"{name} requires grad"):
            torch.ops.rope.rotary_(*tensors, positions, theta, False, 8, 1.0, False)
        assert all(torch.equal(t.detach(), b) for t, b in zip(tensors, before))  # nothing was rotated


def test_the_kernel_path_checks_the_tensors_once(monkeypatch):
    """apply_rotary on the kernel path leaves shapes, dtypes and devices to torch.ops.rope.rotary,
    which is public and checks them itself: rope.apply.check_inputs does not run there, the
    operator's checks run once per call, and a malformed call gets the operator's message."""
    q, k, positions, theta = _small(seed=8)
    expected = rope.apply_rotary(q, k, positions, theta, layout="interleaved", backend="triton")
    calls = []
    operator_checks = rope.kernels.operators._check_arguments

    def counted(*args, **kwargs):
        calls.append(args)
        return operator_checks(*args, **kwargs)

    def not_on_the_kernel_path(*args, **kwargs):
        raise AssertionError("rope.apply.check_inputs ran on the kernel path")

    monkeypatch.setattr(rope.kernels.operators, "_check_arguments", counted)
    monkeypatch.setattr(rope.apply, "check_inputs", not_on_the_kernel_path)
    got = rope.apply_rotary(q, k, positions, theta, layout="interleaved", backend="triton")
    assert len(calls) == 1
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    with pytest.raises(ValueError, match=r"^k must agree with q in batch, seq and head_dim"):
        rope.apply_rotary(q, k[:, :3], positions, theta, backend="triton")


_EDGE = [2**31 - 1, -(2**31) + 1, 0, 7, 2**30]  # float32 math's largest positions on either side


def _rotate_float32_at(dtype_name: str, position: int):
    """float32 q and k rotated at the positions _EDGE with ``position`` at index 3 (of int32 or int64)."""
    q, k, _, theta = _small(torch.float32, seed=6)
    positions = torch.tensor(_EDGE, dtype=getattr(torch, dtype_name), device=DEVICE)
    positions[3] = position
    return rope.apply_rotary(q, k, positions, theta, backend="triton")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_float32_math_takes_positions_below_two_to_the_31(dtype):
    """float32 q and k (float32 math) hold the accuracy bound for |m| < 2^31 only: the largest
    positions on either side are rotated within it, the next ones refused by name (a ValueError,
    on CUDA a device assertion); float-float and float64 math take any int64 position."""
    q, k, _, theta = _small(torch.float32, seed=6)
    edge = torch.tensor(_EDGE, dtype=dtype, device=DEVICE)
    q_out, k_out = _rotate_float32_at(str(dtype).removeprefix("torch."), _EDGE[3])
    for x, out in ((q, q_out), (k, k_out)):
        assert_close_to(out, exact_rotation(x, edge, theta, layout="half"), x)
    for outside in (2**31, -(2**31), -(2**63), 2**62):
        if torch.iinfo(dtype).min <= outside <= torch.iinfo(dtype).max:
            arguments = f"{str(dtype).removeprefix('torch.')!r}, {outside}"
            if value_checks_assert_on(DEVICE):
                assert_device_assertion(f"import test_triton_rotary as t; t._rotate_float32_at({arguments})")
            else:
                with pytest.raises(ValueError, match=r"positions must hold values in \(-2\^31, 2\^31\)"):
                    _rotate_float32_at(str(dtype).removeprefix("torch."), outside)
    far = torch.tensor([2**62, -(2**63), 2**40 + 3, 5, -7], device=DEVICE)
    q64, k64 = q.double(), k.double()
    q_out, _ = rope.apply_rotary(q64, k64, far, theta, backend="triton")
    assert_close_to(q_out, exact_rotation(q64, far, theta, layout="half"), q64)


@pytest.mark.skipif(DEVICE != "cpu", reason="the refusal of CPU tensors without the interpreter")
def test_cpu_tensors_without_the_interpreter_are_refused_by_name(monkeypatch):
    q, k, positions, theta = _small(seed=7)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="q is on cpu: the Triton kernels need CUDA tensors"):
        rope.apply_rotary(q, k, positions, theta, backend="triton")
    with pytest.raises(ValueError, match="q is on cpu"):
        torch.ops.rope.rotary_(q.clone(), k.clone(), positions, theta, False, 8, 1.0, False)


def test_opcheck():
    q, k, positions, theta = _small()
    torch.library.opcheck(torch.ops.rope.rotary.default, (q, k, positions, theta, False, 8, 1.1, False))
    leaf = (q.clone().requires_grad_(), k.clone().requires_grad_())
    torch.library.opcheck(torch.ops.rope.rotary.default, (*leaf, positions, theta, True, 8, 1.0, True))
    torch.library.opcheck(torch.ops.rope.rotary_.default, (q.clone(), k.clone(), positions, theta, True, 8, 1.0, True))


def test_torch_compile_traces_the_kernel_in_one_graph():
    q, k, positions, theta = _small()

    def scores(q, k):
        q, k = rope.apply_rotary(q, k, positions, theta, layout="interleaved", backend="triton")
        return torch.einsum("bshd,bthd->bhst", q, k.repeat_interleave(2, dim=2)[:, :, :3])

    compiled = torch.compile(scores, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k), scores(q, k), rtol=0, atol=0)

    def loss(q, k):  # the backward traced too
        q, k = rope.apply_rotary(q, k, positions, theta, backend="triton")
        return (q * q.detach()).sum() + (k * k.detach()).sum()

    leaves = (q.detach().requires_grad_(), k.detach().requires_grad_())
    expected = torch.autograd.grad(loss(*leaves), leaves)
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend="aot_eager")(*leaves), leaves)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_kernel_errors_are_named():
    q, k, positions, theta = _small()
    with pytest.raises(ValueError, match="head_dim up to 1024"):
        big = torch.randn(1, 1, 1, 1026, device=DEVICE)
        rope.apply_rotary(big, big, positions[0, :1], theta, backend="triton")
    with pytest.raises(ValueError, match="positions is on meta"):
        rope.apply_rotary(q, k, positions.to("meta"), theta, backend="triton")
    with pytest.raises(TypeError, match="q must be float16"):
        rope.apply_rotary(q.int(), k.int(), positions, theta, backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        rope.apply_rotary(q, k, positions, theta, backend="cuda")
    with pytest.raises(ValueError, match="in-place rotation needs q with a contiguous last dimension"):
        every_other = torch.cat((q, q), dim=-1)[..., ::2]  # q's shape, last-dimension stride 2
        torch.ops.rope.rotary_(every_other, k, positions, theta, False, 8, 1.0, False)


@pytest.mark.parametrize("shared_positions", [False, True])
@pytest.mark.parametrize("block_s", [None, 4])
def test_decode_batches_one_token_per_sequence(shared_positions, block_s):
    """seq = 1 reads the batch as the token axis: several sequences per program, each at its own
    position (or all at one shared position), in place and out of place, the tail copied."""
    from rope.kernels import operators as fused
    from rope.kernels import triton_rotary

    gen = torch.Generator().manual_seed(7)
    q = torch.randn(7, 1, 4, 10, generator=gen).to(DEVICE, torch.bfloat16)
    k = torch.randn(7, 1, 2, 10, generator=gen).to(DEVICE, torch.bfloat16)
    shape = (1,) if shared_positions else (7, 1)
    positions = torch.randint(0, 2**31 - 1, shape, generator=gen).to(DEVICE)
    theta, _ = rope.inv_freq({"rope_theta": 1e4}, 8)
    theta = theta.to(DEVICE)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    triton_rotary.launch(q, k, q_out, k_out, positions, theta, interleaved=False, rotary_dim=8, scale=1.0,
                         conjugate=False, block_s=block_s)
    for x, out in ((q, q_out), (k, k_out)):
        assert_close_to(out, exact_rotation(x, positions, theta, layout="half"), x)
        assert torch.equal(out[..., 8:], x[..., 8:])
    q_in, k_in = q.clone(), k.clone()
    fused.rotary_(q_in, k_in, positions, theta, False, 8, 1.0, False)
    assert torch.equal(q_in, q_out) and torch.equal(k_in, k_out)


@pytest.mark.slow
@pytest.mark.parametrize("block_s, block_h, group", [(2, 2, 3), (1, 2, 2), (4, 4, 1), (1, 4, 1)])
def test_every_launch_shape_gives_the_same_result(block_s, block_h, group):
    """The results do not depend on (BLOCK_S, BLOCK_H, GROUP): the interpreter's defaults (all
    tokens and heads of a batch row in one program) against programs of other layouts, forced."""
    from rope.kernels import triton_rotary

    q, k, positions, theta = _small(torch.bfloat16)
    expected = rope.apply_rotary(q, k, positions, theta, layout="interleaved", backend="triton")
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    triton_rotary.launch(q, k, q_out, k_out, positions, theta, interleaved=True, rotary_dim=8, scale=1.0,
                         conjugate=False, block_s=block_s, block_h=block_h, group=group)
    assert torch.equal(q_out, expected[0]) and torch.equal(k_out, expected[1])


# ----- M-RoPE: a position per pair -----------------------------------------------------------------


def mrope_reference(x, position_ids, theta, axes, *, layout, attention_factor=1.0, conjugate=False):
    """float64 rotation with pair i turned by the exact angle of row axes[i] of the [3, ...]
    position ids."""
    per_axis = exact_cos_sin(position_ids, theta)  # [3, ..., pairs]
    cos, sin = (torch.stack([t[int(a), ..., i] for i, a in enumerate(axes.tolist())], dim=-1) for t in per_axis)
    return rotate_float64(x, cos, sin, layout=layout, attention_factor=attention_factor, conjugate=conjugate)


@st.composite
def mrope_problems(draw):
    """A problem of :func:`problems` with [3, seq] or [3, batch, seq] positions and any axis per pair."""
    q, k, positions, theta = draw(problems())
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    high = draw(st.sampled_from([64, 2**20, 2**31 - 1]))
    batch, seq = q.shape[:2]
    shape = (3, seq) if draw(st.booleans()) else (3, batch, seq)
    position_ids = torch.randint(0, high, shape, generator=gen).to(DEVICE)
    axes = torch.randint(0, 3, (theta.numel(),), generator=gen)
    return q, k, position_ids, theta, axes


@pytest.mark.slow
@settings(max_examples=settings.default.max_examples // 2)  # half the profile's: the kernel is interpreted
@given(mrope_problems(), layouts, st.sampled_from([1.0, 0.875]), st.booleans())
def test_mrope_kernel_matches_float64_reference(problem, layout, attention_factor, conjugate):
    from rope.mrope import apply_mrope

    q, k, position_ids, theta, axes = problem
    q_out, k_out = apply_mrope(q, k, position_ids, theta, axes, layout=layout, attention_factor=attention_factor,
                               conjugate=conjugate, backend="triton")
    rotary_dim = 2 * theta.numel()
    for x, out in ((q, q_out), (k, k_out)):
        assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
        ref = mrope_reference(x, position_ids, theta, axes, layout=layout, attention_factor=attention_factor,
                              conjugate=conjugate)
        assert_close_to(out, ref, x, attention_factor)
        assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])


def test_mrope_kernel_on_text_is_the_1d_kernel_bit_for_bit():
    from rope.mrope import apply_mrope, section_axes

    q, k, positions, theta = _small(torch.bfloat16, seed=5)
    axes = section_axes([2, 1, 1], 4)
    ours = apply_mrope(q, k, positions.expand(3, -1, -1), theta, axes, backend="triton")
    plain = rope.apply_rotary(q, k, positions, theta, backend="triton")
    assert torch.equal(ours[0], plain[0]) and torch.equal(ours[1], plain[1])


def _small_mrope(dtype=torch.float32, seed=0):
    q, k, _, theta = _small(dtype, seed)
    gen = torch.Generator().manual_seed(seed + 100)
    position_ids = torch.randint(0, 2**31 - 1, (3, 2, 5), generator=gen).to(DEVICE)
    axes = torch.tensor([0, 1, 2, 1]).to(DEVICE)
    return q, k, position_ids, theta, axes


@pytest.mark.slow
def test_mrope_backward_is_the_conjugate_rotation():
    from rope.mrope import apply_mrope

    q, k, position_ids, theta, axes = _small_mrope(torch.float64, seed=2)
    small = (q[:1, :2, :2].detach().requires_grad_(), k[:1, :2, :1].detach().requires_grad_())
    assert torch.autograd.gradcheck(
        lambda a, b: apply_mrope(a, b, position_ids[:, :1, :2], theta, axes, attention_factor=1.3, backend="triton"),
        small, fast_mode=True,  # random projections: a few kernel calls instead of two per input entry
    )
    q.requires_grad_(), k.requires_grad_()
    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    expected = [mrope_reference(g, position_ids, theta, axes, layout="interleaved", attention_factor=1.3,
                                conjugate=True) for g in (grad_q, grad_k)]
    outs = apply_mrope(q, k, position_ids, theta, axes, layout="interleaved", attention_factor=1.3,
                       backend="triton")
    got = torch.autograd.grad(outs, (q, k), (grad_q, grad_k))
    for g, ref in zip(got, expected):
        torch.testing.assert_close(g.cpu(), ref, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_mrope_opcheck_and_in_place():
    q, k, position_ids, theta, axes = _small_mrope()
    torch.library.opcheck(torch.ops.rope.rotary.default,
                          (q, k, position_ids, theta, False, 8, 1.1, False, axes))
    leaf = (q.clone().requires_grad_(), k.clone().requires_grad_())
    torch.library.opcheck(torch.ops.rope.rotary.default, (*leaf, position_ids, theta, True, 8, 1.0, True, axes))
    torch.library.opcheck(torch.ops.rope.rotary_.default,
                          (q.clone(), k.clone(), position_ids, theta, True, 8, 1.0, True, axes))
    expected = torch.ops.rope.rotary(q, k, position_ids, theta, True, 8, 0.9, False, axes)
    q_in, k_in = q.clone(), k.clone()
    torch.ops.rope.rotary_(q_in, k_in, position_ids, theta, True, 8, 0.9, False, axes)
    assert torch.equal(q_in, expected[0]) and torch.equal(k_in, expected[1])


@pytest.mark.parametrize("shared_positions", [False, True])
def test_mrope_decode_batches_one_token_per_sequence(shared_positions):
    from rope.mrope import apply_mrope

    gen = torch.Generator().manual_seed(9)
    q = torch.randn(7, 1, 4, 10, generator=gen).to(DEVICE, torch.bfloat16)
    k = torch.randn(7, 1, 2, 10, generator=gen).to(DEVICE, torch.bfloat16)
    shape = (3, 1) if shared_positions else (3, 7, 1)
    position_ids = torch.randint(0, 2**31 - 1, shape, generator=gen).to(DEVICE)
    theta, _ = rope.inv_freq({"rope_theta": 1e4}, 8)
    theta, axes = theta.to(DEVICE), torch.tensor([2, 0, 1, 0]).to(DEVICE)
    q_out, k_out = apply_mrope(q, k, position_ids, theta, axes, backend="triton")
    for x, out in ((q, q_out), (k, k_out)):
        assert_close_to(out, mrope_reference(x, position_ids, theta, axes, layout="half"), x)
        assert torch.equal(out[..., 8:], x[..., 8:])


def _mrope_loss(position_ids, theta):
    """The loss of test_mrope_traces_in_one_graph_and_still_checks_the_axes: q and k rotated by
    apply_mrope at ``position_ids`` with the axes given, summed against themselves."""
    from rope.mrope import apply_mrope

    def loss(q, k, axes):
        q, k = apply_mrope(q, k, position_ids, theta, axes, backend="triton")
        return (q * q.detach()).sum() + (k * k.detach()).sum()
    return loss


def _compiled_mrope_loss_with_axis_3():
    """The compiled loss run with an axis out of range (refused when the graph runs the operator)."""
    q, k, position_ids, theta, _ = _small_mrope(seed=4)
    compiled = torch.compile(_mrope_loss(position_ids, theta), fullgraph=True, backend="aot_eager")
    return compiled(q, k, torch.tensor([0, 1, 3, 1]).to(DEVICE))


def test_mrope_traces_in_one_graph_and_still_checks_the_axes():
    """torch.compile(fullgraph=True) through apply_mrope, forward and backward; the axis values,
    which a graph cannot branch on, are checked by the operator when the graph runs it (eagerly
    off CUDA, by an asynchronous device assertion on CUDA)."""
    q, k, position_ids, theta, axes = _small_mrope(seed=4)
    loss = _mrope_loss(position_ids, theta)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    leaves = (q.detach().requires_grad_(), k.detach().requires_grad_())
    expected = torch.autograd.grad(loss(*leaves, axes), leaves)
    got = torch.autograd.grad(compiled(*leaves, axes), leaves)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    if value_checks_assert_on(DEVICE):
        assert_device_assertion("import test_triton_rotary as t; t._compiled_mrope_loss_with_axis_3()")
    else:
        with pytest.raises(ValueError, match=r"axes must hold values in \{0, 1, 2\}"):
            _compiled_mrope_loss_with_axis_3()
