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
