"""``rotated="last"``: the last rotary_dim coordinates of each head rotated, the first passed
through (DeepSeek-V4, rope.layouts), on every path: the torch operations, the CPU kernel
(rope.cpu), the decoding step, the Triton kernel (in Triton's interpreter without a GPU) and
``torch.ops.rope.rotary``.

References: the formula written here, in float64 on the exact angles (helpers.exact_cos_sin):
the block [head_dim - d, head_dim) paired (i, i + d/2) or (2i, 2i + 1) from its start; gradients
against float64 autograd of that formula. Paths against each other bit for bit where they share
their arithmetic (the CPU kernel and the torch operations), and every path against itself with the
block moved first (the same numbers in other places).
"""

import pytest
import torch

import rope
import rope.cpu.rotary
from helpers import assert_correctly_rounded, exact_cos_sin

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton kernel: a GPU, else the interpreter
HEAD_DIM, ROTARY_DIM = 12, 6
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
        torch.float64: torch.int64}
THETA = torch.tensor([1.0, 0.1, 0.01], dtype=torch.float32)


def formula(x, positions, layout, *, conjugate=False, attention_factor=1.0):
    """float64 s R x on coordinates [head_dim - d, head_dim) of each head, the rest unchanged."""
    x = x.to(torch.float64)
    start, half = x.shape[-1] - ROTARY_DIM, ROTARY_DIM // 2
    cos, sin = exact_cos_sin(positions, THETA)  # [seq, pairs]
    cos, sin = cos[None, :, None] * attention_factor, sin[None, :, None] * attention_factor * (-1 if conjugate else 1)
    block = torch.arange(start, x.shape[-1])
    a, b = (block[:half], block[half:]) if layout == "half" else (block[0::2], block[1::2])
    out = x.clone()
    out[..., a] = x[..., a] * cos - x[..., b] * sin
    out[..., b] = x[..., b] * cos + x[..., a] * sin
    return out


def _qk(dtype, seq, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seq, 3, HEAD_DIM, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, seq, 1, HEAD_DIM, generator=gen, dtype=torch.float64).to(dtype)
    return q, k


@pytest.fixture(params=["kernel", "torch operations"])
def cpu_path(request, monkeypatch):
    """The CPU kernel, or rope.rotation's torch operations (where no compiler is)."""
    if request.param == "kernel" and not rope.cpu.rotary.available():
        pytest.skip(f"no CPU kernel: {rope.cpu.build.unavailable_reason()}")
    if request.param != "kernel":
        monkeypatch.setattr(rope.cpu.rotary, "available", lambda: False)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq", [1, 9])  # a decoding step (one call, rope.cpu.rotate_few) and a prefill
def test_torch_path_keeps_the_promise_and_the_first_coordinates(cpu_path, dtype, layout, seq):
    q, k = _qk(dtype, seq)
    positions = torch.arange(seq) * 1000 + 3
    q_out, k_out = rope.apply_rotary(q, k, positions, THETA, layout=layout, rotated="last", backend="torch",
                                     conjugate=seq == 1, attention_factor=1.25)
    for x, out in ((q, q_out), (k, k_out)):
        assert out.dtype == dtype and out.shape == x.shape
        assert_correctly_rounded(out, formula(x, positions, layout, conjugate=seq == 1, attention_factor=1.25))
        start = HEAD_DIM - ROTARY_DIM
        assert torch.equal(out[..., :start].view(BITS[dtype]), x[..., :start].view(BITS[dtype]))


def _rolled(x, shift):
    return torch.roll(x, shift, dims=-1).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_cpu_kernel_equals_the_torch_operations_and_the_block_moved_first(monkeypatch, dtype, layout):
    """rope.cpu.rotary.rotate with the block last: the torch operations' bits, which are those of
    the block rotated first in the head rolled by rotary_dim (strided input too)."""
    if not rope.cpu.rotary.available():
        pytest.skip("no CPU kernel")
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(2, 5, 3, 2 * HEAD_DIM, generator=gen, dtype=torch.float64).to(dtype)
    angles = torch.rand(2, 5, 1, ROTARY_DIM // 2, generator=gen, dtype=torch.float64) * 100
    cos, sin = angles.cos(), angles.sin()
    for x in (wide[..., :HEAD_DIM].contiguous(), wide[..., ::2]):
        kernel = rope.cpu.rotary.rotate(x, cos, sin, layout, ROTARY_DIM, "last")
        with monkeypatch.context() as off:
            off.setattr(rope.cpu.rotary, "available", lambda: False)
            torch_ops = rope.rotation.rotate_pairs(x, cos, sin, layout, ROTARY_DIM, rotated="last")
        first = _rolled(rope.cpu.rotary.rotate(_rolled(x, ROTARY_DIM), cos, sin, layout, ROTARY_DIM), -ROTARY_DIM)
        assert torch.equal(kernel.view(BITS[dtype]), torch_ops.view(BITS[dtype]))
        assert torch.equal(kernel.view(BITS[dtype]), first.view(BITS[dtype]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_triton_kernel_keeps_its_promise_and_moves_only_the_block(dtype, layout):
    """The kernel with the block last: the bits of the kernel on the rolled head with the block
    first, out of place and in place (torch.ops.rope.rotary_), and its accuracy promise."""
    pytest.importorskip("triton")
    import rope.kernels.operators  # noqa: F401  (registers torch.ops.rope.rotary)
    from test_triton_rotary import assert_close_to

    q, k = (x.to(DEVICE) for x in _qk(dtype, 5, seed=1))
    positions = torch.arange(5, device=DEVICE) + 70000
    args = (positions, THETA.to(DEVICE), layout == "interleaved", ROTARY_DIM, 1.0, False)
    q_out, k_out = torch.ops.rope.rotary(q, k, *args, None, "last")
    q_first, k_first = torch.ops.rope.rotary(_rolled(q, ROTARY_DIM), _rolled(k, ROTARY_DIM), *args)
    q_in, k_in = q.clone(), k.clone()
    torch.ops.rope.rotary_(q_in, k_in, *args, rotated="last")
    for x, out, first, in_place in ((q, q_out, q_first, q_in), (k, k_out, k_first, k_in)):
        assert torch.equal(out.view(BITS[dtype]), _rolled(first, -ROTARY_DIM).view(BITS[dtype]))
        assert torch.equal(in_place.view(BITS[dtype]), out.view(BITS[dtype]))
        assert_close_to(out, formula(x.cpu(), positions.cpu(), layout), x)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("seq", [1, 4])
def test_gradients_are_the_transposed_rotation_of_the_last_block(backend, dtype, seq):
    """dq, dk against float64 autograd of the formula (output gradients of the dtype, as rope's
    rotation receives them): within half an ulp (float-float and float32 math of the kernel: their
    promise) in every dtype."""
    if backend == "triton":
        pytest.importorskip("triton")
    device = DEVICE if backend == "triton" else "cpu"
    q, k = (x.to(device).requires_grad_(True) for x in _qk(dtype, seq, seed=2))
    positions = torch.arange(seq) + 11
    gen = torch.Generator().manual_seed(7)
    wq, wk = (torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dtype).double() for x in (q, k))
    q_out, k_out = rope.apply_rotary(q, k, positions.to(device), THETA.to(device), layout="interleaved",
                                     rotated="last", backend=backend)
    ((q_out.cpu().double() * wq).sum() + (k_out.cpu().double() * wk).sum()).backward()
    for x, w in ((q, wq), (k, wk)):
        x64 = x.detach().cpu().double().requires_grad_(True)
        (formula(x64, positions, "interleaved") * w).sum().backward()
        if backend == "torch" or dtype == torch.float64:
            assert_correctly_rounded(x.grad.cpu(), x64.grad)
        else:
            from test_triton_rotary import assert_close_to

            assert_close_to(x.grad.cpu(), x64.grad, w.to(dtype))  # the backward rotates w


def test_mrope_takes_the_last_block_too():
    """apply_mrope with rotated="last" and the three rows of position ids equal: apply_rotary's bits."""
    q, k = _qk(torch.bfloat16, 4, seed=5)
    positions = torch.arange(4) + 2
    axes = torch.tensor([0, 1, 2])
    got = rope.apply_mrope(q, k, positions.expand(3, 4), THETA, axes, rotated="last", backend="torch")
    want = rope.apply_rotary(q, k, positions, THETA, rotated="last", backend="torch")
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))


@pytest.mark.parametrize("bad", ["Last", "end", "", None, 1, True])
def test_bad_rotated_is_refused_by_name(bad):
    q, k = _qk(torch.float32, 2)
    positions = torch.arange(2)
    calls = [
        lambda: rope.apply_rotary(q, k, positions, THETA, rotated=bad, backend="torch"),
        lambda: rope.apply_mrope(q, k, positions.expand(3, 2), THETA, torch.zeros(3, dtype=torch.int64),
                                 rotated=bad, backend="torch"),
        lambda: rope.cpu.rotary.rotate(q, torch.ones(1, 2, 1, 3, dtype=torch.float64),
                                       torch.zeros(1, 2, 1, 3, dtype=torch.float64), "half", ROTARY_DIM, bad),
        lambda: rope.cpu.rotary.rotate_few(q, k, [0, 1], 1, THETA, "half", ROTARY_DIM, 1.0, 1.0, bad),
    ]
    try:
        import rope.kernels.operators

        calls.append(lambda: rope.apply_rotary(q, k, positions, THETA, rotated=bad, backend="triton"))
        if isinstance(bad, str):  # the schema refuses a non-str itself (a RuntimeError naming it)
            calls.append(lambda: torch.ops.rope.rotary(q, k, positions, THETA, False, ROTARY_DIM, 1.0, False,
                                                       None, bad))
    except ImportError:
        pass
    for call in calls:
        with pytest.raises(ValueError, match="rotated"):
            call()
