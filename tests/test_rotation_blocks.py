"""The CPU's fast torch path (rope.rotation's block path and the CPU kernel that replaces it
where it builds, rope.angles' exact float64 products) keeps the torch path's promise: every
output within half an ulp plus 2^-50 of the pair's magnitude of the exact rotation, ties rounded
once, in blocks of any size, one tensor or q and k together, with gradients, from several threads
at once. Every test runs twice: with the CPU kernel (rope.cpu) and with torch operations only.

References: the exact angles' cos and sin in mpmath (helpers.exact_cos_sin), the products in
float64 (helpers.rotate_float64); constructed ties against exact rational rounding
(helpers.round_exact); the other paths (the same arithmetic where values are never read on the
host, rope._checks.reads_are_free) as a second implementation.
"""

import threading
from fractions import Fraction

import mpmath
import pytest
import torch

import rope
import rope.angles
import rope.cpu.build
import rope.cpu.rotary
import rope.rotation
from helpers import assert_correctly_rounded, exact_rotation, random_qk, round_exact, ulp

NARROW = [torch.float16, torch.bfloat16]
FAST = [torch.float32, *NARROW]


@pytest.fixture(autouse=True, params=["kernel", "torch operations"])
def cpu_path(request, monkeypatch):
    """The rotation by the CPU kernel, or by rope.rotation's torch operations (where no compiler is)."""
    if request.param == "kernel":
        if not rope.cpu.rotary.available():
            pytest.skip(f"no CPU kernel: {rope.cpu.build.unavailable_reason()}")
    else:
        monkeypatch.setattr(rope.cpu.rotary, "available", lambda: False)
    return request.param


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 96 rotated coordinates (not a multiple of a head: blocks cut rows of tokens), and
    every block's buffers held rather than fresh."""
    monkeypatch.setattr(rope.rotation, "BLOCK_ELEMENTS", 96)
    monkeypatch.setattr(rope.rotation, "_FRESH_BELOW", 0)


def _reference_outputs(q, k, positions, theta, **options):
    return (exact_rotation(q, positions, theta, **options), exact_rotation(k, positions, theta, **options))


@pytest.mark.parametrize("dtype", FAST)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 10])
def test_many_blocks_keep_the_promise(small_blocks, dtype, layout, rotary_dim):
    """Per-batch positions, partial rotary, a factor and the conjugate, over dozens of blocks."""
    gen = torch.Generator().manual_seed(11)
    q, k = random_qk(gen, 3, 7, 3, 2, 20, dtype=dtype)
    positions = torch.randint(-(2**28), 2**28, (3, 7), generator=gen)
    theta, _ = rope.inv_freq({}, rotary_dim)
    options = dict(layout=layout, attention_factor=1.25, conjugate=True)
    got = rope.apply_rotary(q, k, positions, theta, rotary_dim=rotary_dim, backend="torch", **options)
    for out, reference in zip(got, _reference_outputs(q, k, positions, theta, **options)):
        assert out.dtype == dtype and out.shape == reference.shape and out.is_contiguous()
        assert_correctly_rounded(out, reference)


@pytest.mark.parametrize("dtype", FAST)
def test_one_block_for_q_and_k_together_takes_strided_views(dtype):
    """Decoding's path: q and k share one block; inputs are transposed views (transformers' layout)
    and the result is what the path without host reads gives, within the promise."""
    gen = torch.Generator().manual_seed(12)
    q = torch.randn(2, 4, 1, 24, generator=gen).to(dtype).transpose(1, 2)  # [batch, 1, 4 heads, 24] view
    k = torch.randn(2, 2, 1, 24, generator=gen).to(dtype).transpose(1, 2)
    positions = torch.tensor([[5], [2**28 + 3]])
    theta, _ = rope.inv_freq({}, 16)
    got = rope.apply_rotary(q, k, positions, theta, rotary_dim=16, backend="torch")
    for out, reference in zip(got, _reference_outputs(q, k, positions, theta)):
        assert_correctly_rounded(out, reference)
        assert torch.equal(out[..., 16:], reference[..., 16:].to(dtype))


def _tie_case(dtype: torch.dtype, exponent: int):
    """x = 2^exponent (exact in dtype) and a factor s = 1 + u/2 + 2^-40 (u dtype's relative spacing at
    x): s x lies just above the tie between x and its upper neighbour, and its float32 rounding is
    that tie; rounding twice gives x (ties to even), once gives the neighbour."""
    bits, min_normal = {torch.float16: (11, -14), torch.bfloat16: (8, -126)}[dtype]
    spacing = Fraction(2) ** (max(exponent, min_normal) - bits + 1)
    factor = 1 + float(spacing / 2 / Fraction(2) ** exponent) + 2.0**-40
    return 2.0**exponent, factor


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("exponent", ["normal", "subnormal"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("blocks", ["one block", "many blocks"])
def test_ties_of_the_float32_step_are_rounded_once(dtype, exponent, layout, blocks, monkeypatch):
    """At position 0 (cos 1, sin 0) with the factor of :func:`_tie_case`, every rotated coordinate
    of value 2^e lands on a float32 tie of dtype: the block path marks its rows and redoes them."""
    if blocks == "many blocks":
        monkeypatch.setattr(rope.rotation, "BLOCK_ELEMENTS", 40)
    e = {"normal": 0, "subnormal": -20 if dtype == torch.float16 else -130}[exponent]
    value, factor = _tie_case(dtype, e)
    gen = torch.Generator().manual_seed(13)
    q, k = random_qk(gen, 2, 3, 2, 1, 16, dtype=dtype)
    q[0, 1, 1, 3] = q[1, 2, 0, 12] = k[1, 0, 0, 7] = value  # one tie in a few rows, in q and in k
    theta, _ = rope.inv_freq({}, 16)
    positions = torch.zeros(2, 3, dtype=torch.int64)
    q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, attention_factor=factor,
                                     backend="torch")
    expected = round_exact(Fraction(value) * Fraction(factor), dtype)
    assert expected > value  # once: the upper neighbour
    for out, x in ((q_out, q), (k_out, k)):
        hits = x == value
        assert hits.any() and torch.equal(out[hits], torch.full_like(out[hits], expected))
        assert_correctly_rounded(out, x.to(torch.float64) * factor)


def test_cos_sin_takes_exact_float64_products_below_2_to_the_29(monkeypatch):
    """Below 2^29 the angles are m theta_i in float64 (exact) and torch's cos and sin: within 2^-52
    of mpmath's for float32 theta_i across the whole float32 range; the 126-bit turns are not used."""
    gen = torch.Generator().manual_seed(14)
    exponents = torch.randint(-149, 128, (48,), generator=gen).to(torch.float64)
    theta = (torch.rand(48, generator=gen, dtype=torch.float64) + 1).ldexp(exponents - 1).to(torch.float32)
    theta = theta[torch.isfinite(theta)]
    positions = torch.cat([torch.tensor([0, 1, -1, 2**29 - 1, -(2**29) + 1]),
                           torch.randint(-(2**29) + 1, 2**29, (11,), generator=gen)])

    def not_here(*args):
        raise AssertionError("the 126-bit turns ran below 2^29")

    monkeypatch.setattr(rope.angles, "turns", not_here)
    cos, sin = rope.angles.cos_sin(positions, theta)
    monkeypatch.undo()
    with mpmath.workprec(2200):  # theta up to 2^128 times m up to 2^29: the angle's turns to 2^-60
        for (j, m), (i, t) in ((a, b) for a in enumerate(positions.tolist()) for b in enumerate(theta.tolist())):
            angle = mpmath.mpf(m) * mpmath.mpf(t)
            assert abs(cos[j, i].item() - mpmath.cos(angle)) <= 2.0**-52
            assert abs(sin[j, i].item() - mpmath.sin(angle)) <= 2.0**-52


def test_positions_from_2_to_the_29_take_the_126_bit_turns(monkeypatch):
    calls = []
    turns = rope.angles.turns
    monkeypatch.setattr(rope.angles, "turns", lambda *args: calls.append(1) or turns(*args))
    theta, _ = rope.inv_freq({}, 8)
    for position in (2**29, -(2**29), 2**62):
        rope.angles.cos_sin(torch.tensor([3, position]), theta)
    assert len(calls) == 3


@pytest.mark.parametrize("dtype", FAST)
def test_gradient_of_one_output_alone(dtype):
    """Only q_out reaches the loss: k gets no gradient, q's is the transposed rotation."""
    gen = torch.Generator().manual_seed(15)
    q, k = (t.requires_grad_() for t in random_qk(gen, 1, 3, 2, 1, 8, dtype=dtype))
    theta, _ = rope.inv_freq({}, 8)
    positions = torch.tensor([0, 7, 2**20])
    q_out, _ = rope.apply_rotary(q, k, positions, theta, backend="torch")
    grad = torch.randn(q_out.shape, generator=gen).to(dtype)
    q_out.backward(grad)
    assert k.grad is None
    assert_correctly_rounded(q.grad, exact_rotation(grad, positions, theta, conjugate=True))


def test_threads_have_their_own_buffers(small_blocks):
    """Calls from several threads at once (each block path holds per-thread buffers) give what one
    thread gives."""
    gen = torch.Generator().manual_seed(16)
    theta, _ = rope.inv_freq({}, 16)
    inputs = [(*random_qk(gen, 2, 9, 3, 1, 16, dtype=torch.bfloat16), torch.randint(0, 2**20, (9,), generator=gen))
              for _ in range(4)]
    expected = [rope.apply_rotary(q, k, m, theta, backend="torch") for q, k, m in inputs]
    results = [None] * len(inputs)

    def run(i):
        q, k, m = inputs[i]
        for _ in range(20):
            results[i] = rope.apply_rotary(q, k, m, theta, backend="torch")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got, want in zip(results, expected):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("dtype", FAST)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_block_path_equals_the_path_without_host_reads(dtype, layout, monkeypatch):
    """A tensor of several default-size blocks: the block path and the path the other devices take
    (reads_are_free off) are two implementations of one promise; both within it, and equal except
    where a float64 rounding of the products differs (a few last bits, never more than one ulp)."""
    gen = torch.Generator().manual_seed(17)
    q, k = random_qk(gen, 1, 700, 3, 1, 128, dtype=dtype)  # q: 268,800 rotated coordinates, 3 blocks
    theta, _ = rope.inv_freq({}, 128)
    positions = torch.arange(700) + 12345
    fast = rope.apply_rotary(q, k, positions, theta, layout=layout, backend="torch")
    monkeypatch.setattr(rope._checks, "reads_are_free", lambda device: False)
    slow = rope.apply_rotary(q, k, positions, theta, layout=layout, backend="torch")
    for a, b in zip(fast, slow):
        gap = (a.to(torch.float64) - b.to(torch.float64)).abs()
        assert (gap > 0).double().mean() < 1e-4
        assert torch.all(gap <= ulp(b, dtype))


@pytest.mark.parametrize("grad", [False, True])
def test_decoding_outputs_are_independent_and_writable(grad):
    """One token: q_out and k_out may share one result (without autograd); each is contiguous, a
    write to one leaves the other as it was, and in-place changes work with autograd too."""
    gen = torch.Generator().manual_seed(18)
    q, k = random_qk(gen, 1, 1, 4, 2, 16, dtype=torch.bfloat16)
    theta, _ = rope.inv_freq({}, 16)
    q.requires_grad_(grad), k.requires_grad_(grad)
    q_out, k_out = rope.apply_rotary(q, k, torch.tensor([77]), theta, backend="torch")
    assert q_out.is_contiguous() and k_out.is_contiguous()
    k_before = k_out.detach().clone()
    q_out.mul_(3)  # refused by autograd for views of one result: they are not views there
    assert torch.equal(k_out.detach(), k_before)
    if grad:
        (q_out.float().sum() + k_out.float().sum()).backward()
        assert q.grad is not None and k.grad is not None
