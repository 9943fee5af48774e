"""rope.attention.rerope against loops, explicit float64 rotation matrices and plain RoPE."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import random_qk
from rope.attention import rerope
from rope.reference import rotation_matrix
from strategies import layouts, seeds

leaky_scales = st.one_of(st.none(), st.floats(0.25, 64.0))


def random_case(seed, *, q_len=5, k_len=7, heads_k=2, group=2, half=3, tail=2, spread=50, dtype=torch.float64):
    """Random q, k (GQA), unsorted positions (some keys after their queries) and frequencies."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = 2 * half + tail
    q, k = random_qk(gen, 2, q_len, heads_k * group, heads_k, head_dim, k_seq=k_len, dtype=dtype)
    k_positions = torch.randint(0, spread, (k_len,), generator=gen)
    q_positions = torch.randint(0, spread, (q_len,), generator=gen) + spread // 2
    base = 10.0 ** (1 + 4 * torch.rand((), generator=gen).item())
    theta = rope.inv_freq({"rope_theta": base}, 2 * half)[0]
    return q, k, q_positions, k_positions, theta


def positions_loop(q_positions, k_positions, window, leaky_scale):
    rows = []
    for m in q_positions.tolist():
        row = []
        for n in k_positions.tolist():
            r = m - n
            if r < window:
                row.append(float(r))
            elif leaky_scale is None:
                row.append(float(window))
            else:
                row.append(window + (r - window) / leaky_scale)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


def scores_by_matrices(q, k, r_prime, theta, layout):
    """q_i^T R_{-r'_ij} k_j with explicit float64 block rotation matrices (identity past the rotary width)."""
    q, k = q.to(torch.float64), k.to(torch.float64)
    group = q.shape[2] // k.shape[2]
    out = torch.empty(q.shape[0], q.shape[2], q.shape[1], k.shape[1], dtype=torch.float64)
    for i in range(q.shape[1]):
        for j in range(k.shape[1]):
            matrix = rotation_matrix(-r_prime[i, j].item(), theta, head_dim=q.shape[3], layout=layout)
            for h in range(q.shape[2]):
                out[:, h, i, j] = torch.einsum("bd,de,be->b", q[:, i, h], matrix, k[:, j, h // group])
    return out


@given(seeds, st.integers(1, 40), leaky_scales)
def test_positions_match_the_definition(seed, window, leaky_scale):
    gen = torch.Generator().manual_seed(seed)
    q_positions = torch.randint(-20, 200, (6,), generator=gen)
    k_positions = torch.randint(-20, 200, (9,), generator=gen)
    r_prime = rerope.rerope_positions(q_positions, k_positions, window=window, leaky_scale=leaky_scale)
    assert r_prime.dtype == torch.float64 and r_prime.shape == (6, 9)
    expected = positions_loop(q_positions, k_positions, window, leaky_scale)
    torch.testing.assert_close(r_prime, expected, rtol=1e-15, atol=0)


@given(seeds, st.integers(1, 40))
def test_rerope_positions_never_exceed_the_window_and_leaky_is_continuous(seed, window):
    positions = torch.arange(300) + torch.randint(0, 1000, (), generator=torch.Generator().manual_seed(seed))
    r_prime = rerope.rerope_positions(positions, positions, window=window)
    assert r_prime.max().item() == min(window, 299)
    leaky = rerope.rerope_positions(positions, positions, window=window, leaky_scale=8.0)
    step = leaky[1:, 0] - leaky[:-1, 0]  # successive distances r = 1 .. 299 for the first key
    assert bool((step[:window] == 1).all()) and bool((step[window:] == 1 / 8).all())


@given(seeds, layouts, st.integers(1, 12), leaky_scales)
def test_training_form_matches_explicit_rotation_matrices(seed, layout, window, leaky_scale):
    q, k, q_positions, k_positions, theta = random_case(seed, q_len=4, k_len=5)
    scores = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                                  layout=layout)
    r_prime = positions_loop(q_positions, k_positions, window, leaky_scale)
    assert scores.dtype == torch.float64 and scores.shape == (2, 4, 4, 5)
    torch.testing.assert_close(scores, scores_by_matrices(q, k, r_prime, theta, layout), rtol=0, atol=1e-12)


@given(seeds, layouts, st.integers(1, 3000), leaky_scales, st.sampled_from([torch.float32, torch.float64]))
def test_two_pass_form_equals_training_form(seed, layout, window, leaky_scale, dtype):
    q, k, q_positions, k_positions, theta = random_case(seed, spread=4000, dtype=dtype)
    direct = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                                  layout=layout)
    two_pass = rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta, window=window,
                                             leaky_scale=leaky_scale, layout=layout)
    # the two forms round different float64 angles (about 4000 * 2^-53 rad at most)
    torch.testing.assert_close(two_pass, direct, rtol=0, atol=1e-10)


@given(seeds, layouts, leaky_scales, st.integers(0, 10**6))
def test_a_window_beyond_every_distance_gives_plain_rope(seed, layout, leaky_scale, offset):
    gen = torch.Generator().manual_seed(seed)
    seq, heads, head_dim = 6, 2, 8
    q = torch.randn(1, seq, heads, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, seq, heads, head_dim, generator=gen, dtype=torch.float64)
    positions = torch.arange(seq) + offset
    theta = rope.inv_freq({"rope_theta": 10000.0}, head_dim)[0]
    q_rot, k_rot = rope.apply_rotary(q, k, positions, theta, layout=layout, backend="torch")
    plain = torch.einsum("bihd,bjhd->bhij", q_rot, k_rot)
    for form in (rerope.rerope_scores, rerope.rerope_scores_two_pass):
        out = form(q, k, positions, positions, theta, window=seq, leaky_scale=leaky_scale, layout=layout)
        torch.testing.assert_close(out, plain, rtol=0, atol=1e-9 * (1 + offset) ** 0.5)


@given(seeds, layouts, st.integers(1, 30))
def test_leaky_scale_one_is_plain_rope_and_large_scales_approach_rerope(seed, layout, window):
    q, k, q_positions, k_positions, theta = random_case(seed)
    plain = rerope.rotary_scores(q, k, q_positions, k_positions, theta, layout=layout)
    leaky_one = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window, leaky_scale=1.0,
                                     layout=layout)
    torch.testing.assert_close(leaky_one, plain, rtol=0, atol=1e-12)
    hard = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window, layout=layout)
    nearly = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window, leaky_scale=1e9, layout=layout)
    torch.testing.assert_close(nearly, hard, rtol=0, atol=1e-6)


@given(seeds, layouts, st.integers(1, 30), leaky_scales)
def test_keys_after_the_query_keep_the_plain_rope_logit(seed, layout, window, leaky_scale):
    q, k, q_positions, k_positions, theta = random_case(seed)
    future = (q_positions[:, None] - k_positions[None, :]) < 0
    plain = rerope.rotary_scores(q, k, q_positions, k_positions, theta, layout=layout)
    for form in (rerope.rerope_scores, rerope.rerope_scores_two_pass):
        out = form(q, k, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale, layout=layout)
        torch.testing.assert_close(out[..., future], plain[..., future], rtol=0, atol=1e-12)


def test_rerope_changes_the_logits_of_distant_pairs():
    q, k, q_positions, k_positions, theta = random_case(7, spread=400)
    window = 5
    far = (q_positions[:, None] - k_positions[None, :]) > window
    assert far.any()
    plain = rerope.rotary_scores(q, k, q_positions, k_positions, theta)
    bent = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=window)
    assert (bent - plain)[..., far].abs().max() > 1e-3
    torch.testing.assert_close(bent[..., ~far], plain[..., ~far], rtol=0, atol=1e-12)


def test_query_head_h_reads_key_head_h_over_group():
    q, k, q_positions, k_positions, theta = random_case(3, heads_k=2, group=3)
    scores = rerope.rerope_scores(q, k, q_positions, k_positions, theta, window=4)
    for h in range(6):
        alone = rerope.rerope_scores(q[:, :, h : h + 1], k[:, :, h // 3 : h // 3 + 1], q_positions, k_positions, theta,
                                     window=4)
        torch.testing.assert_close(scores[:, h : h + 1], alone, rtol=0, atol=1e-13)


def test_bad_arguments_are_named():
    q, k, q_positions, k_positions, theta = random_case(0)
    call = rerope.rerope_scores
    with pytest.raises(ValueError, match="window"):
        call(q, k, q_positions, k_positions, theta, window=0)
    with pytest.raises(TypeError, match="window"):
        call(q, k, q_positions, k_positions, theta, window=2.0)
    with pytest.raises(ValueError, match="window"):  # beyond int64: below_window compares in int64
        call(q, k, q_positions, k_positions, theta, window=2**63)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="leaky_scale"):
            call(q, k, q_positions, k_positions, theta, window=2, leaky_scale=bad)
    with pytest.raises(TypeError, match="leaky_scale"):
        call(q, k, q_positions, k_positions, theta, window=2, leaky_scale=True)
    with pytest.raises(TypeError, match="q_positions"):
        call(q, k, q_positions.double(), k_positions, theta, window=2)
    with pytest.raises(ValueError, match="k_positions"):
        call(q, k, q_positions, k_positions[:-1], theta, window=2)
    with pytest.raises(ValueError, match="q must have shape"):
        call(q[0], k, q_positions, k_positions, theta, window=2)
    with pytest.raises(ValueError, match="multiple of heads_k"):
        call(q[:, :, :3], k, q_positions, k_positions, theta, window=2)
    with pytest.raises(ValueError, match="rotary_dim"):
        call(q, k, q_positions, k_positions, torch.ones(5), window=2)
    with pytest.raises(ValueError, match="layout"):
        rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta, window=2, layout="gptj")
    with pytest.raises(TypeError, match="k_positions"):
        rerope.rerope_positions(q_positions, [1, 2], window=2)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EXTREMES = [INT64_MIN, INT64_MIN + 1, -(2**62) - 1, -(2**62), -1, 0, 1, 2**62 - 1, 2**62, INT64_MAX - 1, INT64_MAX]


def mpmath_scores(q, k, q_positions, k_positions, theta, angle, layout):
    """sum over pairs (a, b) of (q_a k_a + q_b k_b) cos(alpha) + (q_a k_b - q_b k_a) sin(alpha), plus q . k past
    the rotary width, at 200 bits and rounded once, with alpha = angle(m, n, theta_p) from Python-int positions
    and the float32 theta_p as an mpmath number: the logit q^T R_{-r'} k of the bent position r'."""
    import mpmath

    rotary_dim, group = 2 * theta.numel(), q.shape[2] // k.shape[2]
    a, b = (t.tolist() for t in rope.layouts.pair_indices(rotary_dim, layout))
    out = torch.empty(q.shape[0], q.shape[2], q.shape[1], k.shape[1], dtype=torch.float64)
    with mpmath.workprec(200):
        thetas = [mpmath.mpf(float(t)) for t in theta]
        for i, m in enumerate(q_positions.tolist()):
            for j, n in enumerate(k_positions.tolist()):
                alphas = [angle(m, n, t) for t in thetas]
                cos, sin = [mpmath.cos(x) for x in alphas], [mpmath.sin(x) for x in alphas]
                for batch in range(q.shape[0]):
                    for h in range(q.shape[2]):
                        qv = [mpmath.mpf(x) for x in q[batch, i, h].tolist()]
                        kv = [mpmath.mpf(x) for x in k[batch, j, h // group].tolist()]
                        total = mpmath.fsum(qv[d] * kv[d] for d in range(rotary_dim, len(qv)))
                        for p, (ia, ib) in enumerate(zip(a, b)):
                            total += (qv[ia] * kv[ia] + qv[ib] * kv[ib]) * cos[p]
                            total += (qv[ia] * kv[ib] - qv[ib] * kv[ia]) * sin[p]
                        out[batch, h, i, j] = float(total)
    return out


def bent_angle(window, leaky_scale):
    """r' theta for r = m - n (Python ints): r theta inside the window, w theta (ReRoPE) or
    (w + (r - w) / k) theta (Leaky ReRoPE) beyond it, exactly."""
    import mpmath

    def angle(m, n, theta):
        r = m - n
        if r < window:
            return r * theta
        return window * theta if leaky_scale is None else (window + mpmath.mpf(r - window) / leaky_scale) * theta

    return angle


@pytest.mark.parametrize("shift", [2**40, 2**60, -(2**62), INT64_MAX - 100, INT64_MIN])
@pytest.mark.parametrize("leaky_scale", [None, 2.5, 0.5, 16.0])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_logits_depend_on_m_minus_n_only_far_from_position_zero(layout, leaky_scale, shift):
    # The two-pass form turns queries and keys separately; Leaky ReRoPE's bent frame used to form
    # (m + w (k - 1)) theta / k as a float64 product, off by 0.25 rad at 2^60.
    q, k, q_positions, k_positions, theta = random_case(7, spread=40)
    window = 9
    options = dict(window=window, leaky_scale=leaky_scale, layout=layout)
    near = rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta, **options)
    far = rerope.rerope_scores_two_pass(q, k, q_positions + shift, k_positions + shift, theta, **options)
    expected = mpmath_scores(q, k, q_positions, k_positions, theta, bent_angle(window, leaky_scale), layout)
    tolerance = 1e-14 * expected.abs().max().item()
    torch.testing.assert_close(far, near, rtol=0, atol=tolerance)
    torch.testing.assert_close(far, expected, rtol=0, atol=tolerance)
    # the training-time form takes r' from the exact difference m - n as well
    trained = rerope.rerope_scores(q, k, q_positions + shift, k_positions + shift, theta, **options)
    torch.testing.assert_close(trained, expected, rtol=0, atol=tolerance)


def test_the_window_test_is_exact_for_every_pair_of_int64_positions():
    # int64 m - n wraps around at 2^63: a query at 2^62 and a key at -2^62 read as r = -2^63 < w
    positions = torch.tensor(EXTREMES)
    for window in (1, 3, 2**62, INT64_MAX):
        below = rerope.below_window(positions, positions, window)
        expected = torch.tensor([[m - n < window for n in EXTREMES] for m in EXTREMES])
        assert torch.equal(below, expected), window
        for leaky_scale in (None, 3.0):
            r_prime = rerope.rerope_positions(positions, positions, window=window, leaky_scale=leaky_scale)
            torch.testing.assert_close(r_prime, positions_loop(positions, positions, window, leaky_scale),
                                       rtol=1e-15, atol=0)


@pytest.mark.parametrize("leaky_scale", [None, 2.0, 0.75])
@pytest.mark.parametrize("window", [3, 2**62])
def test_two_pass_form_at_extreme_positions_matches_its_definition(window, leaky_scale):
    # Pass 2 where r = m - n >= w exactly (Python ints); its angle as bent_frame defines it:
    # (r - w) phi + w theta with phi = theta / k rounded to float64, reduced exactly.
    import mpmath

    q, k, _, _, theta = random_case(11, q_len=4, k_len=len(EXTREMES), heads_k=1, group=2)
    q_positions = torch.tensor([2**62, -(2**62), INT64_MAX, INT64_MIN])
    k_positions = torch.tensor(EXTREMES)

    def angle(m, n, theta_p):
        r = m - n
        if r < window:
            return r * theta_p
        if leaky_scale is None:
            return window * theta_p
        return (r - window) * mpmath.mpf(float(theta_p) / leaky_scale) + window * theta_p

    logits = rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta, window=window,
                                           leaky_scale=leaky_scale)
    expected = mpmath_scores(q, k, q_positions, k_positions, theta, angle, "half")
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-14 * expected.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_bent_frequency_below_float64s_frequency_range_is_taken(dtype):
    # phi = theta / k below 2^-100 (k = 1e40): a float64 frequency column holds 0 or [2^-100, 2^127) only, so
    # bent_frame passes phi as float32 pieces; it was refused, naming inv_freq, though neither argument is wrong.
    import mpmath

    from rope.attention.blockwise import rotary_attention

    q, k, _, _, theta = random_case(13, q_len=4, k_len=len(EXTREMES), heads_k=1, group=2)
    theta = theta.to(dtype)
    q_positions = torch.tensor([2**62, -(2**62), INT64_MAX, INT64_MIN])
    k_positions = torch.tensor(EXTREMES)
    window, leaky_scale = 3, 1e40
    assert 0 < theta.max().item() / leaky_scale < 2.0**-100

    def angle(m, n, theta_p):
        r = m - n
        return r * theta_p if r < window else (r - window) * mpmath.mpf(float(theta_p) / leaky_scale) + window * theta_p

    logits = rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta, window=window,
                                           leaky_scale=leaky_scale)
    expected = mpmath_scores(q, k, q_positions, k_positions, theta, angle, "half")
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-14 * expected.abs().max().item())
    v = torch.randn(k.shape[:3] + (5,), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    out = rotary_attention(q, k, v, q_positions, k_positions, theta, window=window, leaky_scale=leaky_scale,
                           causal=False, softmax_scale=0.5, block_size=2)
    weights = torch.softmax(0.5 * expected, dim=-1)  # [batch, heads_q, q_len, k_len]
    reference = torch.einsum("bhij,bjhd->bihd", weights, v.repeat_interleave(2, dim=2))
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_bent_frame_in_float32_pieces_turns_as_its_float64_column(dtype, monkeypatch):
    # off the CPU (no free read of phi) the bent frame always takes phi in float32 pieces: the same turns, bit for bit
    q, k, _, _, theta = random_case(17, q_len=4, k_len=len(EXTREMES), heads_k=1, group=2)
    q_positions, k_positions = torch.tensor([2**62, -(2**62), INT64_MAX, INT64_MIN]), torch.tensor(EXTREMES)
    options = dict(window=3, leaky_scale=2.5)
    columns = rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta.to(dtype), **options)
    monkeypatch.setattr(rerope._checks, "reads_are_free", lambda device: False)
    assert rerope.bent_frame(q_positions, theta.to(dtype), 3, 2.5, query=True)[1].dtype == torch.float32
    pieces = rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta.to(dtype), **options)
    assert torch.equal(pieces, columns)


def test_a_bent_frequency_beyond_float32s_range_is_refused():
    q, k, q_positions, k_positions, _ = random_case(0)
    theta = torch.tensor([1e38, 1.0, 0.5], dtype=torch.float32)
    with pytest.raises(ValueError, match="leaky_scale"):
        rerope.rerope_scores_two_pass(q, k, q_positions, k_positions, theta, window=2, leaky_scale=0.25)
