"""rope.attention.encodings against plain-Python float64 / exact-arithmetic references, and its input checks."""

import math
import re
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rope.attention import encodings
from strategies import bases, seeds

even_dims = st.integers(1, 48).map(lambda half: 2 * half)


# ---------------------------------------------------------------- sinusoidal


def sinusoidal_reference(position: float, dim: int, base: float) -> list[float]:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i + 1) = cos(pos / base^(2i/d)), Python floats."""
    row = []
    for i in range(dim // 2):
        omega = math.pow(base, -2 * i / dim)
        row += [math.sin(position * omega), math.cos(position * omega)]
    return row


@given(even_dims, bases)
def test_frequencies_match_the_formula(dim, base):
    omega = encodings.sinusoidal_frequencies(dim, base)
    expected = torch.tensor([math.pow(base, -2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    assert omega.dtype == torch.float64 and omega.shape == (dim // 2,)
    torch.testing.assert_close(omega, expected, rtol=1e-15, atol=0)
    assert omega[0] == 1.0 and bool((omega[1:] < omega[:-1]).all())


@given(seeds, even_dims, bases, st.booleans())
def test_sinusoidal_matches_the_paper_formula(seed, dim, base, integer_positions):
    gen = torch.Generator().manual_seed(seed)
    if integer_positions:
        positions = torch.randint(-10_000, 10_000, (2, 3), generator=gen)
    else:
        positions = (torch.rand(2, 3, generator=gen, dtype=torch.float64) - 0.5) * 2e4
    out = encodings.sinusoidal(positions, dim, base)
    assert out.shape == (2, 3, dim) and out.dtype == torch.float64
    for index in torch.cartesian_prod(torch.arange(2), torch.arange(3)).tolist():
        pos = positions[tuple(index)].item()
        expected = torch.tensor(sinusoidal_reference(pos, dim, base), dtype=torch.float64)
        # the frequencies may differ by an ulp between libm and torch: an angle error of |pos| ulps
        assert (out[tuple(index)] - expected).abs().max() <= 1e-15 * (1 + abs(pos))


@given(seeds, even_dims, st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
def test_sinusoidal_rounds_once_to_the_requested_dtype(seed, dim, dtype):
    positions = torch.randint(0, 4096, (7,), generator=torch.Generator().manual_seed(seed))
    out = encodings.sinusoidal(positions, dim, dtype=dtype)
    assert out.dtype == dtype
    assert torch.equal(out, encodings.sinusoidal(positions, dim).to(dtype))


def shift_matrix(offset: int, dim: int, base: float) -> torch.Tensor:
    """Block diagonal T_k with T_k p_m = p_{m+k}: blocks [[cos k w, sin k w], [-sin k w, cos k w]]
    acting on (sin, cos) pairs, built entry by entry in float64."""
    matrix = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        angle = offset * math.pow(base, -2 * i / dim)
        c, s = math.cos(angle), math.sin(angle)
        matrix[2 * i, 2 * i], matrix[2 * i, 2 * i + 1] = c, s
        matrix[2 * i + 1, 2 * i], matrix[2 * i + 1, 2 * i + 1] = -s, c
    return matrix


@given(seeds, even_dims, bases)
def test_a_shift_is_a_fixed_block_rotation(seed, dim, base):
    gen = torch.Generator().manual_seed(seed)
    m = torch.randint(-1000, 1000, (5,), generator=gen)
    offset = int(torch.randint(-1000, 1000, (), generator=gen))
    transform = shift_matrix(offset, dim, base)
    assert torch.allclose(transform.T @ transform, torch.eye(dim, dtype=torch.float64), atol=1e-13)
    shifted = encodings.sinusoidal(m + offset, dim, base)
    torch.testing.assert_close(encodings.sinusoidal(m, dim, base) @ transform.T, shifted, rtol=0, atol=1e-11)


@given(seeds, even_dims, bases)
def test_dot_products_depend_on_the_offset_only(seed, dim, base):
    gen = torch.Generator().manual_seed(seed)
    m, n = torch.randint(-5000, 5000, (2, 6), generator=gen)
    dots = (encodings.sinusoidal(m, dim, base) * encodings.sinusoidal(n, dim, base)).sum(-1)
    expected = [
        sum(math.cos((a - b) * math.pow(base, -2 * i / dim)) for i in range(dim // 2))
        for a, b in zip(m.tolist(), n.tolist())
    ]
    torch.testing.assert_close(dots, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(dim=7), ValueError),
        (dict(dim=0), ValueError),
        (dict(dim=True), TypeError),
        (dict(dim=8.0), TypeError),
        (dict(base=1.0), ValueError),
        (dict(base=float("nan")), ValueError),
        (dict(base="10000"), TypeError),
        (dict(positions=[0, 1, 2]), TypeError),
        (dict(positions=torch.tensor([True, False])), TypeError),
        (dict(positions=torch.tensor([1j])), TypeError),
        (dict(positions=torch.tensor([0.0, float("inf")])), ValueError),
        (dict(dtype=torch.int64), ValueError),
        (dict(dtype="float64"), TypeError),
    ],
)
def test_sinusoidal_rejects_bad_input(kwargs, error):
    args = dict(positions=torch.arange(3), dim=8, base=10000.0, dtype=torch.float64) | kwargs
    name = "dtype" if "dtype" in kwargs else next(iter(kwargs))
    with pytest.raises(error, match=name):
        encodings.sinusoidal(args.pop("positions"), args.pop("dim"), args.pop("base"), **args)


# ---------------------------------------------------------------- T5 buckets


def t5_bucket_reference(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """The T5 rule for one relative position (key - query), the log floor taken in exact rationals."""
    if bidirectional:
        half = num_buckets // 2
        first, distance = (half if relative_position > 0 else 0), abs(relative_position)
    else:
        half, first, distance = num_buckets, 0, max(-relative_position, 0)
    max_exact = half // 2
    if distance < max_exact:
        return first + distance
    log_buckets = half - max_exact
    # largest j < log_buckets with log_buckets * log(n / e) / log(D / e) >= j, i.e. (n/e)^c >= (D/e)^j
    j = 0
    while j + 1 < log_buckets and Fraction(distance, max_exact) ** log_buckets >= Fraction(
        max_distance, max_exact
    ) ** (j + 1):
        j += 1
    return first + max_exact + j


@st.composite
def t5_settings(draw):
    bidirectional = draw(st.booleans())
    num_buckets = draw(st.integers(4 if bidirectional else 2, 80))
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = draw(st.integers(max_exact + 1, 2000))
    return bidirectional, num_buckets, max_distance


@given(seeds, t5_settings())
def test_t5_buckets_match_the_exact_reference(seed, settings):
    bidirectional, num_buckets, max_distance = settings
    gen = torch.Generator().manual_seed(seed)
    relative = torch.randint(-3 * max_distance, 3 * max_distance + 1, (60,), generator=gen)
    out = encodings.t5_relative_bucket(
        relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    expected = [t5_bucket_reference(r, bidirectional, num_buckets, max_distance) for r in relative.tolist()]
    assert out.dtype == torch.int64 and out.tolist() == expected


@given(seeds, t5_settings())
def test_t5_buckets_match_the_float_formula_away_from_ties(seed, settings):
    """The paper's formula in float64, wherever the log expression is not within 1e-9 of an integer."""
    bidirectional, num_buckets, max_distance = settings
    half = num_buckets // 2 if bidirectional else num_buckets
    max_exact = half // 2
    gen = torch.Generator().manual_seed(seed)
    relative = torch.randint(-3 * max_distance, 3 * max_distance + 1, (60,), generator=gen)
    out = encodings.t5_relative_bucket(
        relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    for r, bucket in zip(relative.tolist(), out.tolist()):
        first = half if (bidirectional and r > 0) else 0
        n = abs(r) if bidirectional else max(-r, 0)
        if n < max_exact:
            assert bucket == first + n
            continue
        value = math.log(n / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
        if abs(value - round(value)) > 1e-9:
            assert bucket == first + min(max_exact + int(value), half - 1)


@given(t5_settings())
def test_t5_buckets_are_monotone_in_distance_and_split_by_direction(settings):
    bidirectional, num_buckets, max_distance = settings
    distance = torch.arange(0, 4 * max_distance)
    before = encodings.t5_relative_bucket(-distance, bidirectional=bidirectional, num_buckets=num_buckets,
                                          max_distance=max_distance)
    after = encodings.t5_relative_bucket(distance, bidirectional=bidirectional, num_buckets=num_buckets,
                                         max_distance=max_distance)
    assert bool((before[1:] >= before[:-1]).all()) and int(before.min()) == 0 and int(before.max()) < num_buckets
    if bidirectional:
        half = num_buckets // 2
        assert bool((after[1:] >= half).all()) and torch.equal(after[1:] - half, before[1:])
    else:
        assert bool((after == 0).all())


def test_t5_buckets_match_transformers_for_real_t5_settings():
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-20_000, 20_001)
    for bidirectional in (True, False):
        for num_buckets, max_distance in ((32, 128), (64, 256), (16, 64)):
            ours = encodings.t5_relative_bucket(relative, bidirectional=bidirectional,
                                                num_buckets=num_buckets, max_distance=max_distance)
            theirs = t5.T5Attention._relative_position_bucket(relative, bidirectional=bidirectional,
                                                              num_buckets=num_buckets, max_distance=max_distance)
            assert torch.equal(ours, theirs), (bidirectional, num_buckets, max_distance)


def test_t5_exact_tie_lands_in_the_upper_bucket():
    """Causal, 72 buckets, max_distance 100: e = 36 and (60/36)^2 = 100/36, so distance 60 has
    log(60/36) / log(100/36) * 36 equal to 18 exactly, and lands in bucket 36 + 18."""
    assert Fraction(60, 36) ** 2 == Fraction(100, 36)
    bucket = encodings.t5_relative_bucket(torch.tensor([-60, -59]), bidirectional=False, num_buckets=72,
                                          max_distance=100)
    assert bucket.tolist() == [36 + 36 // 2, 36 + 36 // 2 - 1]


T5_EXAMPLE = re.compile(r"``relative_position=(-?\d+), bidirectional=(True|False), num_buckets=(\d+), "
                        r"max_distance=(\d+)``: exact (\d+),\s+(transformers|float64) (\d+)")


def test_t5_docstring_examples_are_what_rope_and_transformers_compute():
    """Every example the docstring of t5_relative_bucket states: rope's bucket is the exact one
    (the rational reference) and transformers' (or the float64 formula's) is the one stated, so
    the docstring cannot go stale; at least one states a disagreement with transformers."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    examples = T5_EXAMPLE.findall(" ".join(encodings.t5_relative_bucket.__doc__.split()))
    assert len(examples) >= 4
    disagreements = 0
    for relative, bidirectional, num_buckets, max_distance, exact, other, value in examples:
        relative, exact, value = int(relative), int(exact), int(value)
        num_buckets, max_distance = int(num_buckets), int(max_distance)
        settings = dict(bidirectional=bidirectional == "True", num_buckets=num_buckets, max_distance=max_distance)
        ours = encodings.t5_relative_bucket(torch.tensor([relative]), **settings).item()
        assert ours == exact == t5_bucket_reference(relative, **settings)
        if other == "transformers":
            theirs = t5.T5Attention._relative_position_bucket(torch.tensor([relative]), **settings).item()
            disagreements += theirs != exact
        else:  # the paper's formula in float64
            both = settings["bidirectional"]
            half = num_buckets // 2 if both else num_buckets
            first = half if both and relative > 0 else 0
            distance, e = (abs(relative) if both else max(-relative, 0)), half // 2
            theirs = first + min(e + int(math.log(distance / e) / math.log(max_distance / e) * (half - e)), half - 1)
        assert theirs == value, (relative, settings, other)
    assert disagreements >= 1


@pytest.mark.parametrize(
    "relative, kwargs, error, name",
    [
        (torch.tensor([1.0]), {}, TypeError, "relative_position"),
        (torch.tensor([True]), {}, TypeError, "relative_position"),
        ([1, 2], {}, TypeError, "relative_position"),
        (torch.tensor([1]), dict(bidirectional=1), TypeError, "bidirectional"),
        (torch.tensor([1]), dict(num_buckets=3), ValueError, "num_buckets"),
        (torch.tensor([1]), dict(num_buckets=1, bidirectional=False), ValueError, "num_buckets"),
        (torch.tensor([1]), dict(num_buckets=32.0), TypeError, "num_buckets"),
        (torch.tensor([1]), dict(num_buckets=32, max_distance=8), ValueError, "max_distance"),
        (torch.tensor([1]), dict(max_distance=-5), ValueError, "max_distance"),
    ],
)
def test_t5_rejects_bad_input(relative, kwargs, error, name):
    with pytest.raises(error, match=name):
        encodings.t5_relative_bucket(relative, **kwargs)


# ---------------------------------------------------------------- ALiBi


def alibi_slopes_reference(num_heads: int) -> list[float]:
    """The recipe of the ALiBi paper's code: a geometric sequence from 2^(-8/n) with ratio 2^(-8/n)
    for the power of two n <= num_heads, then every other slope of the 2n recipe."""

    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes_reference(2 * closest)[0::2][: num_heads - closest]


@pytest.mark.parametrize("num_heads", range(1, 130))
def test_alibi_slopes_match_the_paper_recipe(num_heads):
    slopes = encodings.alibi_slopes(num_heads)
    assert slopes.dtype == torch.float64 and slopes.shape == (num_heads,)
    expected = torch.tensor(alibi_slopes_reference(num_heads), dtype=torch.float64)
    torch.testing.assert_close(slopes, expected, rtol=1e-14, atol=0)


@given(st.integers(1, 300))
def test_alibi_slopes_interleave(num_heads):
    """All slopes together are the first terms of the geometric sequence of ratio 2^(-4/n)
    (n the power of two below), then the rest of the 2^(-8/n) sequence."""
    slopes = encodings.alibi_slopes(num_heads)
    n = 2 ** (num_heads.bit_length() - 1)
    extra = num_heads - n
    merged = torch.sort(slopes, descending=True).values
    fine = [2.0 ** (-4.0 * h / n) for h in range(1, 2 * extra + 1)]
    coarse = [2.0 ** (-8.0 * h / n) for h in range(extra + 1, n + 1)]
    assert merged.tolist() == fine + coarse


def test_alibi_slopes_match_transformers_bloom():
    """Bloom raises a float32 base to the integer power p, so its relative error grows to about
    (p + 1) half-ulps of float32; ours is float64."""
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    for num_heads in range(1, 130):
        theirs = bloom._get_alibi_slopes(num_heads, torch.device("cpu")).to(torch.float64)
        ours = encodings.alibi_slopes(num_heads)
        n = 2 ** (num_heads.bit_length() - 1)
        powers = torch.tensor(list(range(1, n + 1)) + list(range(1, 2 * (num_heads - n), 2)), dtype=torch.float64)
        assert bool(((theirs - ours).abs() <= (powers + 1) * 2.0**-24 * ours).all()), num_heads


@given(seeds, st.integers(1, 12), st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
def test_alibi_bias_matches_the_definition(seed, heads, dtype):
    gen = torch.Generator().manual_seed(seed)
    q_positions = torch.randint(-50, 5000, (int(torch.randint(1, 9, (), generator=gen)),), generator=gen)
    k_positions = torch.randint(-50, 5000, (int(torch.randint(1, 9, (), generator=gen)),), generator=gen)
    slopes64 = torch.rand(heads, generator=gen, dtype=torch.float64) + 0.01
    bias = encodings.alibi_bias(q_positions, k_positions, slopes64.to(dtype))
    assert bias.shape == (heads, len(q_positions), len(k_positions)) and bias.dtype == dtype
    slopes = slopes64.to(dtype).to(torch.float64).tolist()
    expected = torch.tensor(
        [[[-s * abs(kj - qi) for kj in k_positions.tolist()] for qi in q_positions.tolist()] for s in slopes],
        dtype=torch.float64,
    )
    assert torch.equal(bias, expected.to(dtype))


@given(seeds)
def test_alibi_bias_is_the_papers_causal_penalty(seed):
    """For keys at or before the query: -m (i - j), and the same for every shift of all positions."""
    length = 1 + int(torch.randint(0, 30, (), generator=torch.Generator().manual_seed(seed)))
    slopes = encodings.alibi_slopes(8)
    positions = torch.arange(length)
    bias = encodings.alibi_bias(positions, positions, slopes)
    i, j = torch.tril_indices(length, length)
    assert torch.equal(bias[:, i, j], -slopes[:, None] * (i - j).to(torch.float64))
    assert torch.equal(encodings.alibi_bias(positions + seed, positions + seed, slopes), bias)


@pytest.mark.parametrize("num_heads, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)])
def test_alibi_slopes_reject_bad_input(num_heads, error):
    with pytest.raises(error, match="num_heads"):
        encodings.alibi_slopes(num_heads)


@pytest.mark.parametrize(
    "q, k, slopes, error, name",
    [
        (torch.tensor([0.0]), torch.arange(3), torch.ones(2), TypeError, "q_positions"),
        (torch.arange(3), [0, 1], torch.ones(2), TypeError, "k_positions"),
        (torch.arange(4).reshape(2, 2), torch.arange(3), torch.ones(2), ValueError, "q_positions"),
        (torch.arange(3), torch.arange(3), torch.ones(2, dtype=torch.int64), TypeError, "slopes"),
        (torch.arange(3), torch.arange(3), torch.ones(2, 2), ValueError, "slopes"),
        (torch.arange(3), torch.arange(3), [0.5, 0.25], TypeError, "slopes"),
    ],
)
def test_alibi_bias_rejects_bad_input(q, k, slopes, error, name):
    with pytest.raises(error, match=name):
        encodings.alibi_bias(q, k, slopes)


# ---------------------------------------------------------------- Shaw and DeBERTa indices

lengths = st.integers(1, 40).flatmap(lambda k_len: st.tuples(st.integers(1, k_len), st.just(k_len)))


@given(lengths, st.integers(1, 12))
def test_shaw_indices_match_clip(shape, max_relative):
    q_len, k_len = shape
    out = encodings.shaw_relative_indices(q_len, k_len, max_relative)
    expected = [
        [max(-max_relative, min(max_relative, j - (k_len - q_len + i))) + max_relative for j in range(k_len)]
        for i in range(q_len)
    ]
    assert out.dtype == torch.int64 and out.tolist() == expected


@given(lengths, st.integers(1, 12))
def test_deberta_indices_match_the_piecewise_definition(shape, span):
    q_len, k_len = shape

    def delta(i, j):
        if i - j <= -span:
            return 0
        if i - j >= span:
            return 2 * span - 1
        return i - j + span

    out = encodings.deberta_relative_indices(q_len, k_len, span)
    assert out.tolist() == [[delta(k_len - q_len + i, j) for j in range(k_len)] for i in range(q_len)]


@given(st.integers(1, 30), st.integers(1, 12))
def test_deberta_position_to_content_index_is_the_transpose(length, span):
    """delta(j, i) as a [query, key] matrix: the same rule with the roles swapped."""
    delta = encodings.deberta_relative_indices(length, length, span)
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    assert torch.equal(delta.T, (j - i + span).clamp(0, 2 * span - 1))


@pytest.mark.parametrize("function", [encodings.shaw_relative_indices, encodings.deberta_relative_indices])
@pytest.mark.parametrize(
    "args, error, name",
    [
        ((5, 3, 2), ValueError, "q_len"),
        ((0, 3, 2), ValueError, "q_len"),
        ((2, 3.0, 2), TypeError, "k_len"),
        ((2, 3, 0), ValueError, "max_relative_position|span"),
        ((2, 3, True), TypeError, "max_relative_position|span"),
    ],
)
def test_relative_indices_reject_bad_input(function, args, error, name):
    with pytest.raises(error, match=name):
        function(*args)
