"""rope.cpu: the CPU kernel builds where a C compiler is, computes the numbers of rope.rotation's
torch operations bit for bit, rounds every output once (float16 and bfloat16 included, ties and
subnormals too), and refuses what it cannot read.

References: float64 products written here from the formula (two products and a difference, each
rounded to float64, as the kernel computes them), rounded by exact rational rounding
(helpers.round_exact); the torch operations' path (rope.rotation without the kernel) as a second
implementation.
"""

import os
import shutil
from fractions import Fraction

import pytest
import torch

import rope
import rope.cpu.build
import rope.cpu.rotary
import rope.rotation
from helpers import round_exact

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NARROW = [torch.float16, torch.bfloat16]
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}

needs_kernel = pytest.mark.skipif(not rope.cpu.rotary.available(), reason="no C compiler: the kernel did not build")


def _random_patterns(gen, n: int, dtype) -> torch.Tensor:
    """n finite values of ``dtype`` drawn uniformly over its bit patterns (every exponent)."""
    bits = torch.randint(-(2**15), 2**15, (4 * n,), generator=gen, dtype=torch.int32).to(torch.int16).view(dtype)
    if dtype == torch.float32:
        bits = torch.randint(-(2**31), 2**31, (4 * n,), generator=gen, dtype=torch.int64).to(torch.int32).view(dtype)
    return bits[torch.isfinite(bits)][:n]


def _expected(x_a, x_b, cos, sin, dtype) -> list[float]:
    """(x_a cos - x_b sin, x_b cos + x_a sin) in float64, each rounded exactly once to ``dtype``."""
    x_a, x_b = x_a.to(torch.float64), x_b.to(torch.float64)
    values = torch.cat([x_a * cos - x_b * sin, x_b * cos + x_a * sin]).tolist()
    return [v if v != v else round_exact(Fraction(v) if abs(v) != float("inf") else v, dtype) for v in values]


def _rotate_pairs_of_tokens(x_a, x_b, cos, sin, dtype):
    """One pair per token (half layout, head_dim 2): the kernel's outputs (y_a, y_b), as floats."""
    x = torch.stack([x_a, x_b], dim=-1).to(dtype).view(1, -1, 1, 2)
    out = rope.cpu.rotary.rotate(x, cos.view(1, -1, 1, 1), sin.view(1, -1, 1, 1), "half", 2)
    return torch.cat([out[0, :, 0, 0], out[0, :, 0, 1]]).to(torch.float64).tolist()


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_values_of_every_exponent_are_rounded_once(dtype):
    """Inputs over all bit patterns, tables from 2^-160 to 2^160: normal, subnormal and overflowing
    results, each the float64 value rounded once."""
    gen = torch.Generator().manual_seed(1)
    n = 3000
    x_a, x_b = _random_patterns(gen, n, dtype), _random_patterns(gen, n, dtype)
    scale = torch.exp2(torch.randint(-160, 161, (2, n), generator=gen).to(torch.float64))
    cos, sin = torch.randn(2, n, generator=gen, dtype=torch.float64) * scale
    got = _rotate_pairs_of_tokens(x_a, x_b, cos, sin, dtype)
    expected = _expected(x_a, x_b, cos, sin, dtype)
    assert all(g == e or (g != g and e != e) for g, e in zip(got, expected))


@needs_kernel
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("where", ["normal", "subnormal"])
def test_ties_round_to_even(dtype, where):
    """y_a = x_a + half an ulp of x_a (and one float64 step either side): exact ties, which round
    to the even neighbour, and values just off them, which do not."""
    gen = torch.Generator().manual_seed(2)
    bits, e_min = {torch.float16: (11, -14), torch.bfloat16: (8, -126)}[dtype]
    n = 2000
    exponents = torch.randint(e_min, e_min + 20, (n,), generator=gen) if where == "normal" else torch.full((n,), e_min)
    significands = torch.randint(2 ** (bits - 1) if where == "normal" else 1, 2**bits, (n,), generator=gen)
    x_a = torch.ldexp(significands.to(torch.float64), exponents - bits + 1)
    x_a = x_a * torch.where(torch.rand(n, generator=gen) < 0.5, 1.0, -1.0)
    half_ulp = torch.ldexp(torch.ones(n, dtype=torch.float64), exponents - bits)
    nudge = torch.randint(-1, 2, (n,), generator=gen).to(torch.float64) * half_ulp * 2.0**-40
    x_b = torch.ones(n, dtype=torch.float64)
    cos, sin = torch.ones(n, dtype=torch.float64), -(half_ulp + nudge)
    got = _rotate_pairs_of_tokens(x_a.to(dtype), x_b.to(dtype), cos, sin, dtype)
    assert got == _expected(x_a.to(dtype), x_b.to(dtype), cos, sin, dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_value_and_non_finite_input_passes_as_float64_does(dtype):
    """Every float16 and bfloat16 bit pattern (a sample of float32's), infinities and NaN among
    them, through cos = 1, sin = 0: each finite value unchanged bit for bit; where the float64
    formula gives inf or NaN (inf * 0), the output is that inf or a NaN."""
    if dtype == torch.float32:
        patterns = torch.randint(-(2**31), 2**31, (1 << 16,), generator=torch.Generator().manual_seed(3),
                                 dtype=torch.int64).to(torch.int32)
    else:
        patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = patterns.view(dtype)
    zeros = torch.zeros_like(values)
    x = torch.stack([values, zeros], dim=-1).view(1, 1, -1, 2)
    ones = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    out = rope.cpu.rotary.rotate(x, ones, ones * 0, "half", 2).view(-1, 2)
    finite = torch.isfinite(values)
    assert torch.equal(out[finite, 0].view(BITS[dtype]), patterns[finite])
    assert torch.equal(out[:, 0].isnan(), values.isnan())
    assert torch.equal(out[values.isinf(), 0], values[values.isinf()])
    y_b = values.to(torch.float64) * 0  # x_b cos + x_a sin: NaN where x_a is infinite
    assert torch.equal(out[:, 1].isnan(), y_b.isnan()) and (out[~y_b.isnan(), 1] == 0).all()


def _kernel_and_torch_operations(monkeypatch, *args):
    with_kernel = rope.rotation.rotate_pairs(*args)
    with monkeypatch.context() as off:
        off.setattr(rope.cpu.rotary, "available", lambda: False)
        without = rope.rotation.rotate_pairs(*args)
    return with_kernel, without


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [12, 8])
@pytest.mark.parametrize("strides", ["contiguous", "transposed", "every other", "expanded heads"])
@pytest.mark.parametrize("tables", ["[1, s, 1, p]", "[b, s, 1, p]", "[b, s, h, p] strided"])
def test_kernel_equals_the_torch_operations_bit_for_bit(monkeypatch, dtype, layout, rotary_dim, strides, tables):
    """Any strides of x, any broadcast of the tables, partial rotary: the same bits as the torch
    operations, and those within the torch path's promise (tests/test_rotation_blocks.py)."""
    gen = torch.Generator().manual_seed(4)
    batch, seq, heads, head_dim = 2, 5, 3, 12
    base = torch.randn(batch, seq, heads, 2 * head_dim, generator=gen, dtype=torch.float64).to(dtype)
    x = {"contiguous": base[..., :head_dim].contiguous(),
         "transposed": base[..., :head_dim].transpose(1, 2).contiguous().transpose(1, 2),
         "every other": base[..., ::2],
         "expanded heads": base[:, :, :1, :head_dim].expand(batch, seq, heads, head_dim)}[strides]
    pairs = rotary_dim // 2
    angles = torch.rand(batch, seq, heads, 2 * pairs, generator=gen, dtype=torch.float64) * 100
    angles = {"[1, s, 1, p]": angles[:1, :, :1, :pairs], "[b, s, 1, p]": angles[:, :, :1, :pairs],
              "[b, s, h, p] strided": angles[..., ::2]}[tables]
    got, reference = _kernel_and_torch_operations(monkeypatch, x, angles.cos(), angles.sin(), layout, rotary_dim)
    assert got.is_contiguous() and got.shape == x.shape and got.dtype == dtype
    assert torch.equal(got.view(BITS[dtype]), reference.view(BITS[dtype]))


@needs_kernel
@pytest.mark.parametrize("threads", [2, 3])
def test_threads_split_the_rows_exactly(monkeypatch, threads):
    """A call split across threads (rows not a multiple of their number) equals one thread's."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 5, 16, generator=gen).to(torch.bfloat16)
    angles = torch.rand(1, 7, 1, 8, generator=gen, dtype=torch.float64) * 10
    one = rope.cpu.rotary.rotate(x, angles.cos(), angles.sin(), "half", 16)
    monkeypatch.setattr(rope.cpu.rotary, "THREADED_FROM", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        split = rope.cpu.rotary.rotate(x, angles.cos(), angles.sin(), "half", 16)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(split.view(torch.int16), one.view(torch.int16))


@needs_kernel
def test_empty_tensors_give_empty_outputs():
    for shape in [(0, 3, 2, 8), (2, 0, 2, 8), (2, 3, 0, 8)]:
        x = torch.randn(shape)
        tables = torch.ones(1, shape[1], 1, 4, dtype=torch.float64)
        out = rope.cpu.rotary.rotate(x, tables, tables, "half", 8)
        assert out.shape == shape and out.dtype == x.dtype


@needs_kernel
def test_bad_arguments_are_refused_by_name():
    x = torch.randn(2, 3, 4, 8)
    cos = sin = torch.ones(1, 3, 1, 4, dtype=torch.float64)
    bad = [
        (dict(x=x.double()), TypeError, "x must"),
        (dict(x=x.to("meta")), TypeError, "x must"),
        (dict(x=x[0]), TypeError, "x must"),
        (dict(x=x.tolist()), TypeError, "x must"),
        (dict(cos=cos.float()), TypeError, "cos must"),
        (dict(sin=sin.to("meta")), TypeError, "sin must"),
        (dict(cos=torch.ones(1, 3, 4, dtype=torch.float64)), ValueError, "cos must broadcast"),
        (dict(sin=torch.ones(1, 2, 1, 4, dtype=torch.float64)), ValueError, "sin must broadcast"),
        (dict(cos=torch.ones(1, 3, 1, 3, dtype=torch.float64)), ValueError, "cos must broadcast"),
        (dict(layout="halves"), ValueError, "layout must"),
        (dict(rotary_dim=7), ValueError, "rotary_dim must"),
        (dict(rotary_dim=0), ValueError, "rotary_dim must"),
        (dict(rotary_dim=10), ValueError, "rotary_dim must"),
        (dict(rotary_dim=8.0), ValueError, "rotary_dim must"),
        (dict(rotary_dim=True), ValueError, "rotary_dim must"),
    ]
    for change, error, message in bad:
        args = dict(x=x, cos=cos, sin=sin, layout="half", rotary_dim=8) | change
        with pytest.raises(error, match=message):
            rope.cpu.rotary.rotate(**args)


def test_builds_where_a_compiler_is():
    """Where ``cc`` (or ``CC``) exists and nothing switches the kernel off, it builds: the tests
    above then check the kernel, not only the fallback."""
    if os.environ.get("ROPE_CPU_KERNEL") == "0" or not shutil.which(os.environ.get("CC") or "cc"):
        pytest.skip("no compiler here, or the kernel is switched off")
    assert rope.cpu.rotary.available(), rope.cpu.build.unavailable_reason()


@pytest.mark.parametrize("setting", ["switched off", "no compiler", "failing compiler"])
def test_no_kernel_says_why(monkeypatch, tmp_path, setting):
    monkeypatch.setenv("ROPE_CACHE_DIR", str(tmp_path))
    if setting == "switched off":
        monkeypatch.setenv("ROPE_CPU_KERNEL", "0")
    else:
        monkeypatch.setenv("CC", str(tmp_path / "missing-cc") if setting == "no compiler" else "false")
    library, reason = rope.cpu.build.load()
    assert library is None
    assert {"switched off": "ROPE_CPU_KERNEL=0", "no compiler": "no C compiler",
            "failing compiler": "did not build"}[setting] in reason
    assert not list(tmp_path.glob("*.so"))  # nothing half-written is left


def test_a_fresh_cache_builds_once(monkeypatch, tmp_path):
    """An empty cache folder gets one library, which the next load reuses as it is."""
    if not shutil.which(os.environ.get("CC") or "cc"):
        pytest.skip("no C compiler")
    monkeypatch.setenv("ROPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ROPE_CPU_KERNEL", raising=False)
    library, reason = rope.cpu.build.load()
    assert library is not None, reason
    (built,) = tmp_path.joinpath("cache").glob("rotary-*.so")
    stamp = built.stat().st_mtime_ns
    again, _ = rope.cpu.build.load()
    assert again is not None and built.stat().st_mtime_ns == stamp
    assert list(tmp_path.joinpath("cache").iterdir()) == [built]


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grad", [False, True])
def test_decoding_step_keeps_the_promise_at_every_frequency(dtype, grad):
    """rope.apply_rotary's decoding call (its angles computed by the kernel's C library cos and sin)
    at positions up to 2^29 - 1 and frequencies over float32's range: within half an ulp plus 2^-50
    of the pair of the mpmath rotation, forward and (with ``grad``) backward."""
    from helpers import assert_correctly_rounded, exact_rotation

    gen = torch.Generator().manual_seed(6)
    theta = torch.exp2(torch.empty(64).uniform_(-40, 20, generator=gen)).to(torch.float32)
    for position in [0, 1, 4099, 2**20 + 3, 2**29 - 1, -(2**29) + 1]:
        positions = torch.tensor([position])
        q = torch.randn(1, 1, 4, 128, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(grad)
        k = torch.randn(1, 1, 2, 128, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(grad)
        q_out, k_out = rope.apply_rotary(q, k, positions, theta, attention_factor=1.5, backend="torch")
        assert_correctly_rounded(q_out, exact_rotation(q.detach(), positions, theta, attention_factor=1.5))
        assert_correctly_rounded(k_out, exact_rotation(k.detach(), positions, theta, attention_factor=1.5))
        if grad:
            dq = torch.randn(q.shape, generator=gen, dtype=torch.float64).to(dtype)
            (q_out * dq).sum().backward()  # dk: none, as k_out is unused
            assert k.grad is None
            assert_correctly_rounded(q.grad, exact_rotation(dq, positions, theta, attention_factor=1.5, conjugate=True))


@needs_kernel
def test_kernel_threads_are_torchs_own():
    """The kernel is linked against the OpenMP runtime torch loaded: no second runtime (a second
    pool of threads, competing with torch's for the cores) is mapped into the process."""
    runtime = rope.cpu.build.openmp_runtime()
    if runtime is None:
        pytest.skip("torch has no OpenMP runtime here: the kernel runs on the calling thread")
    import re
    from pathlib import Path

    mapped = {line.split(maxsplit=5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()
              if re.search(r"/lib(gomp|iomp5|omp)\b[^/]*\.so", line)}
    assert {os.path.realpath(path) for path in mapped} == {os.path.realpath(runtime)}


@needs_kernel
def test_rotate_few_refuses_what_it_cannot_read():
    """rotate_few reads raw memory: every argument outside its contract is refused by name first."""
    q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 2, 8)
    theta = torch.rand(4)
    good = dict(q=q, k=k, positions=[0, 1, 2], position_rows=1, inv_freq=theta, layout="half", rotary_dim=8,
                cos_factor=1.0, sin_factor=-1.0)
    bad = [
        (dict(q=q.double()), TypeError, "q must"),
        (dict(k=k.to("meta")), TypeError, "k must"),
        (dict(k=k.half()), ValueError, "must agree"),
        (dict(k=torch.randn(2, 4, 2, 8)), ValueError, "must agree"),
        (dict(layout="pairs"), ValueError, "layout must"),
        (dict(rotary_dim=10), ValueError, "rotary_dim must"),
        (dict(inv_freq=theta.double()), TypeError, "inv_freq must"),
        (dict(inv_freq=torch.rand(3)), TypeError, "inv_freq must"),
        (dict(position_rows=3), ValueError, "position_rows must"),
        (dict(positions=[0, 1]), ValueError, "positions must"),
        (dict(positions=[0, 1, 2**29]), ValueError, "positions must"),
        (dict(positions=[0, 1, 2.0]), ValueError, "positions must"),
        (dict(positions=torch.arange(3)), ValueError, "positions must"),
        (dict(cos_factor=float("nan")), ValueError, "cos_factor must"),
        (dict(sin_factor=2.0**600), ValueError, "sin_factor must"),
        (dict(inv_freq=torch.tensor([0.5, float("inf"), 0.1, 0.2])), ValueError, "inv_freq must hold finite"),
    ]
    rope.cpu.rotary.rotate_few(**good)
    for change, error, message in bad:
        with pytest.raises(error, match=message):
            rope.cpu.rotary.rotate_few(**(good | change))


def test_an_unwritable_cache_says_where_to_build(monkeypatch, tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("ROPE_CACHE_DIR", str(blocker / "cache"))  # a folder under a file: cannot exist
    monkeypatch.delenv("ROPE_CPU_KERNEL", raising=False)
    if not shutil.which(os.environ.get("CC") or "cc"):
        pytest.skip("no C compiler")
    library, reason = rope.cpu.build.load()
    assert library is None and "ROPE_CACHE_DIR" in reason and str(blocker) in reason
