"""rope.analysis.scaling against plain float64 loops, the defining equations and rope.inv_freq
(its ntk_aware, dynamic, yarn and llama3 types)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import rope
from helpers import assert_correctly_rounded, theta_loop, ulp
from rope import frequencies
from rope.analysis import scaling as sa
from rope.frequencies import default_theta
from strategies import seeds

half_dims = st.integers(min_value=2, max_value=96)
bases = st.floats(min_value=50.0, max_value=1e7)
factors = st.floats(min_value=1.0, max_value=64.0)
lengths = st.integers(min_value=16, max_value=2**17)
# wider ranges for the NTK-by-parts / Llama 3.1 comparisons
ramp_bases = st.floats(min_value=100.0, max_value=1e7)
ramp_dims = st.integers(min_value=2, max_value=128).map(lambda half: 2 * half)
ramp_lengths = st.integers(min_value=64, max_value=200_000)
extension_factors = st.floats(min_value=1.5, max_value=64.0)


@st.composite
def thresholds(draw):
    """0 < alpha < beta (in turns within L), as NTK-by-parts, YaRN and Llama 3.1 require."""
    alpha = draw(st.floats(min_value=0.05, max_value=8.0))
    return alpha, alpha * draw(st.floats(min_value=1.1, max_value=64.0))


def index_of_turns(turns, dim, base, length):
    """The fractional pair index whose theta turns `turns` times over `length` positions."""
    return dim * math.log(length / (2 * math.pi * turns)) / (2 * math.log(base))


def log_ramp_frequencies(base, dim, length, factor, alpha, beta):
    """theta_i' with gamma(r) = clamp(ln(r / alpha) / ln(beta / alpha), 0, 1), one pair at a time."""
    out = []
    for i in range(dim // 2):
        theta = base ** (-2 * i / dim)
        r = length * theta / (2 * math.pi)
        gamma = min(max(math.log(r / alpha) / math.log(beta / alpha), 0.0), 1.0)
        out.append((1 - gamma) * theta / factor + gamma * theta)
    return torch.tensor(out, dtype=torch.float64)


def assert_within_one_float32_ulp(out, reference):
    assert out.dtype == torch.float32
    err = (out.to(torch.float64) - reference).abs()
    assert bool(torch.all(err <= ulp(reference, torch.float32))), f"max error {err.max().item():.3e}"


@given(half=half_dims, base=bases, factor=factors)
def test_ntk_base_keeps_the_top_frequency_and_interpolates_the_bottom_one(half, base, factor):
    dim = 2 * half
    theta, scaled = theta_loop(base, dim), theta_loop(sa.ntk_aware_base(base, factor, dim), dim)
    assert scaled[0] == 1.0
    assert math.isclose(scaled[-1].item() * factor, theta[-1].item(), rel_tol=1e-12)
    expected_ratio = torch.tensor([factor ** (-2 * i / (dim - 2)) for i in range(half)], dtype=torch.float64)
    torch.testing.assert_close(scaled / theta, expected_ratio, rtol=1e-12, atol=0)
    ours, _ = rope.inv_freq({"rope_type": "ntk_aware", "rope_theta": base, "factor": factor}, dim)
    assert_within_one_float32_ulp(ours, scaled)


@given(half=half_dims, base=bases, factor=factors, length=lengths, seed=seeds)
def test_dynamic_factor_matches_rope_inv_freq(half, base, factor, length, seed):
    dim = 2 * half
    rng = np.random.default_rng(seed)
    seq_len = int(rng.integers(1, 8 * length))
    s_l = sa.dynamic_ntk_factor(factor, seq_len, length)
    expected = 1.0 if seq_len <= length else factor * seq_len / length - (factor - 1)
    assert math.isclose(s_l, expected, rel_tol=1e-13, abs_tol=1e-13)
    config = {"rope_type": "dynamic", "rope_theta": base, "factor": factor, "max_position_embeddings": length}
    ours, _ = rope.inv_freq(config, dim, seq_len=seq_len)
    assert_within_one_float32_ulp(ours, theta_loop(base * s_l ** (dim / (dim - 2)), dim))


@given(factor=st.integers(min_value=1, max_value=64), length=st.integers(min_value=1, max_value=2**14))
def test_dynamic_factor_reaches_s_before_s_times_the_length(factor, length):
    """s(l) = s at l = L (2 - 1/s), and s(sL) = s^2 - s + 1 (L a multiple of s keeps l an integer)."""
    L = factor * length
    assert math.isclose(sa.dynamic_ntk_factor(float(factor), L * (2 * factor - 1) // factor, L), factor, rel_tol=1e-13)
    assert math.isclose(sa.dynamic_ntk_factor(float(factor), factor * L, L), factor**2 - factor + 1, rel_tol=1e-13)
    assert sa.dynamic_ntk_factor(float(factor), L, L) == 1.0


@given(beta=st.integers(min_value=2, max_value=20), digits=st.integers(min_value=1, max_value=6), seed=seeds)
def test_beta_digits_are_the_base_beta_digits_for_integer_beta(beta, digits, seed):
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, beta**digits, size=9)
    out = sa.beta_digits(torch.tensor(positions), float(beta), digits)
    assert out.shape == (9, digits) and out.dtype == torch.float64
    for m, row in zip(positions.tolist(), out.tolist()):
        expected, rest = [], m
        for _ in range(digits):
            rest, digit = divmod(rest, beta)
            expected.append(digit)
        assert row == expected
        assert sum(d * beta**i for i, d in enumerate(row)) == m


@given(half=half_dims, base=bases)
def test_base_beta_gives_theta_as_a_power(half, base):
    dim = 2 * half
    beta = sa.base_beta(base, dim)
    powers = torch.tensor([beta ** (-i) for i in range(half)], dtype=torch.float64)
    torch.testing.assert_close(powers, theta_loop(base, dim), rtol=1e-12, atol=0)


@given(half=half_dims, base=bases, factor=factors, length=lengths, seed=seeds)
def test_unseen_angle_pairs_follow_the_definition(half, base, factor, length, seed):
    dim = 2 * half
    rng = np.random.default_rng(seed)
    theta = theta_loop(base, dim)
    scaled = theta * torch.tensor(rng.uniform(0.05, 1.0, half))
    new_length = int(length * rng.uniform(1.0, 8.0))
    mask = sa.unseen_angle_pairs(theta, length, scaled, new_length)
    for i in range(half):
        trained_span, new_span = length * theta[i].item(), new_length * scaled[i].item()
        assert bool(mask[i]) == (trained_span < 2 * math.pi and new_span > trained_span * (1 + 1e-9))
    # position interpolation never leaves the trained range; plain extrapolation leaves it in
    # exactly the pairs that never completed a turn
    s = int(max(factor, 2))
    assert not bool(sa.unseen_angle_pairs(theta, length, theta / s, s * length).any())
    direct = sa.unseen_angle_pairs(theta, length, theta, s * length)
    assert torch.equal(direct, length * theta < 2 * math.pi)


@given(half=half_dims, base=bases, length=lengths, rotations=st.floats(min_value=0.01, max_value=100.0))
def test_pair_index_for_rotations_inverts_the_rotation_count(half, base, length, rotations):
    dim = 2 * half
    index = sa.pair_index_for_rotations(rotations, dim, base, length)
    theta_at_index = base ** (-2 * index / dim)  # theta as a function of a fractional index
    assert math.isclose(length * theta_at_index / (2 * math.pi), rotations, rel_tol=1e-10)
    r = sa.rotations_over_context(theta_loop(base, dim), length)
    torch.testing.assert_close(r, length * theta_loop(base, dim) / (2 * math.pi), rtol=1e-13, atol=0)


@given(half=half_dims, base=bases, length=lengths, alpha=st.floats(0.25, 4.0), width=st.floats(1.0, 64.0))
def test_paper_ramp_matches_its_piecewise_definition(half, base, length, alpha, width):
    dim, beta = 2 * half, alpha + width
    theta = theta_loop(base, dim)
    gamma = sa.yarn_ramp_paper(theta, length, alpha, beta)
    for i in range(half):
        r = length * theta[i].item() / (2 * math.pi)
        expected = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
        assert math.isclose(gamma[i].item(), expected, rel_tol=1e-12, abs_tol=1e-12)


@given(half=half_dims, base=bases, factor=factors, length=lengths, truncate=st.booleans(),
       fast=st.floats(2.0, 64.0), slow=st.floats(0.25, 1.5))
def test_code_ramp_reproduces_rope_inv_freq_yarn(half, base, factor, length, truncate, fast, slow):
    dim = 2 * half
    config = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "original_max_position_embeddings": length,
              "beta_fast": fast, "beta_slow": slow, "truncate": truncate}
    ours, attention = rope.inv_freq(config, dim)
    gamma = sa.yarn_ramp_code(dim, base, length, fast, slow, truncate)
    assert_within_one_float32_ulp(ours, sa.blend_frequencies(theta_loop(base, dim), factor, gamma))
    assert math.isclose(attention, sa.yarn_mscale(factor), rel_tol=1e-15)
    assert sa.yarn_mscale is frequencies.yarn_mscale  # one temperature formula, the one rope.inv_freq uses
    assert math.isclose(sa.yarn_mscale(factor), 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0, rel_tol=1e-15)


@given(half=st.integers(min_value=8, max_value=96), base=bases, length=lengths)
def test_untruncated_code_ramp_lies_above_the_paper_ramp(half, base, length):
    """Both are 1 up to i(beta_fast) and 0 from i(beta_slow); between, the code's chord in the pair
    index lies above the paper's ramp, which is convex in the index."""
    dim = 2 * half
    low = sa.pair_index_for_rotations(32.0, dim, base, length)
    high = sa.pair_index_for_rotations(1.0, dim, base, length)
    code = sa.yarn_ramp_code(dim, base, length, 32.0, 1.0, truncate=False)
    paper = sa.yarn_ramp_paper(theta_loop(base, dim), length, 1.0, 32.0)
    index = torch.arange(half, dtype=torch.float64)
    outside = (index <= low) | (index >= high)
    if high <= dim - 1:  # transformers clamps high to d - 1, not d/2 - 1
        torch.testing.assert_close(code[outside], paper[outside], rtol=0, atol=1e-12)
    assert bool(torch.all(code >= paper - 1e-12))


def test_gpt_oss_correction_range_is_fractional_without_truncation():
    """GPT-OSS: d = 64, b = 150000, L = 4096; vLLM #28244 reports low 8.0928, high 17.398 untruncated."""
    low, high = sa.yarn_correction_range(64, 150000.0, 4096, 32.0, 1.0, truncate=False)
    assert math.isclose(low, 64 * math.log(4096 / (2 * math.pi * 32)) / (2 * math.log(150000.0)), rel_tol=1e-15)
    assert abs(low - 8.0928) < 1e-4 and abs(high - 17.398) < 1e-3
    assert sa.yarn_correction_range(64, 150000.0, 4096, 32.0, 1.0, truncate=True) == (8, 18)


@given(factor=st.floats(1.0, 100.0), mscale=st.floats(0.1, 2.0), mscale_all_dim=st.floats(0.1, 2.0))
def test_deepseek_scales_split_the_temperature(factor, mscale, mscale_all_dim):
    cos_sin, softmax = sa.deepseek_yarn_scales(factor, mscale, mscale_all_dim)
    config = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 4096,
              "mscale": mscale, "mscale_all_dim": mscale_all_dim}
    assert math.isclose(rope.inv_freq(config, 64)[1], cos_sin, rel_tol=1e-15)
    m = lambda a: 0.1 * a * math.log(factor) + 1.0 if factor > 1 else 1.0  # noqa: E731
    assert math.isclose(cos_sin**2 * softmax, m(mscale) ** 2, rel_tol=1e-12)  # rotary dimensions
    assert math.isclose(softmax, m(mscale_all_dim) ** 2, rel_tol=1e-12)  # all other dimensions
    same_cos_sin, same_softmax = sa.deepseek_yarn_scales(factor, mscale_all_dim, mscale_all_dim)
    assert same_cos_sin == 1.0 and math.isclose(same_softmax, m(mscale_all_dim) ** 2, rel_tol=1e-12)


def test_deepseek_scales_treat_zero_keys_as_absent():
    gen = torch.Generator().manual_seed(7)
    factor = 1.0 + 40 * torch.rand(1, generator=gen, dtype=torch.float64).item()
    plain = 0.1 * math.log(factor) + 1.0
    assert sa.deepseek_yarn_scales(factor, 1.0, 0.0) == (pytest.approx(plain, rel=1e-15), 1.0)
    cos_sin, softmax = sa.deepseek_yarn_scales(factor, 0.0, 0.5)
    assert cos_sin == pytest.approx(plain, rel=1e-15) and softmax == pytest.approx((0.05 * math.log(factor) + 1) ** 2)


@given(base=ramp_bases, dim=ramp_dims, length=ramp_lengths)
def test_wavelengths_and_rotations_match_a_loop(base, dim, length):
    theta = default_theta(base, dim)
    w, r = sa.wavelengths(theta), sa.rotations_over_context(theta, length)
    assert w.dtype == r.dtype == torch.float64
    for i in range(dim // 2):
        expected_w = 2 * math.pi * base ** (2 * i / dim)
        assert math.isclose(w[i].item(), expected_w, rel_tol=1e-13)
        assert math.isclose(r[i].item(), length / expected_w, rel_tol=1e-13)


@given(base=ramp_bases, dim=ramp_dims, length=ramp_lengths, factor=extension_factors, ab=thresholds())
def test_paper_ramp_is_llama3(base, dim, length, factor, ab):
    """Llama 3.1's rule is the YaRN paper's NTK-by-parts with alpha = low_freq_factor, beta = high_freq_factor."""
    low, high = ab
    config = {"rope_type": "llama3", "rope_theta": base, "factor": factor, "low_freq_factor": low,
              "high_freq_factor": high, "original_max_position_embeddings": length}
    llama3, attention = rope.inv_freq(config, dim)
    theta = default_theta(base, dim)
    ours = sa.blend_frequencies(theta, factor, sa.yarn_ramp_paper(theta, length, low, high))
    assert attention == 1.0
    assert_correctly_rounded(llama3, ours)


@given(base=ramp_bases, dim=ramp_dims, length=ramp_lengths, factor=extension_factors, ab=thresholds())
def test_untruncated_code_ramp_is_linear_in_log_turns(base, dim, length, factor, ab):
    """transformers' yarn with truncate=False ramps linearly in the pair index, i.e. in ln r:
    gamma(r) = clamp(ln(r / beta_slow) / ln(beta_fast / beta_slow), 0, 1)."""
    alpha, beta = ab
    assume(index_of_turns(beta, dim, base, length) >= 0 and index_of_turns(alpha, dim, base, length) <= dim - 1)
    reference = log_ramp_frequencies(base, dim, length, factor, alpha, beta)
    gamma = sa.yarn_ramp_code(dim, base, length, beta, alpha, truncate=False)
    torch.testing.assert_close(sa.blend_frequencies(default_theta(base, dim), factor, gamma), reference,
                               rtol=1e-12, atol=0)
    config = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "beta_fast": beta, "beta_slow": alpha,
              "original_max_position_embeddings": length, "truncate": False}
    assert_correctly_rounded(rope.inv_freq(config, dim)[0], reference)


@given(base=ramp_bases, dim=ramp_dims, length=ramp_lengths, factor=extension_factors, ab=thresholds())
def test_truncated_code_ramp_moves_the_thresholds_to_whole_pairs(base, dim, length, factor, ab):
    """With truncate=True (the default), YaRN is the log ramp between the turns of the pairs
    floor(i(beta_fast)) and ceil(i(beta_slow)): the thresholds move outward to whole pair indices."""
    alpha, beta = ab
    low, high = math.floor(index_of_turns(beta, dim, base, length)), math.ceil(index_of_turns(alpha, dim, base, length))
    assume(0 <= low < high <= dim - 1)
    assert sa.yarn_correction_range(dim, base, length, beta, alpha) == (low, high)
    turns_of = lambda i: length * base ** (-2 * i / dim) / (2 * math.pi)  # noqa: E731
    reference = log_ramp_frequencies(base, dim, length, factor, turns_of(high), turns_of(low))
    gamma = sa.yarn_ramp_code(dim, base, length, beta, alpha)
    torch.testing.assert_close(sa.blend_frequencies(default_theta(base, dim), factor, gamma), reference,
                               rtol=1e-12, atol=0)
    config = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "beta_fast": beta, "beta_slow": alpha,
              "original_max_position_embeddings": length}
    assert_correctly_rounded(rope.inv_freq(config, dim)[0], reference)


@given(base=ramp_bases, dim=ramp_dims, length=ramp_lengths, factor=extension_factors, ab=thresholds())
def test_paper_ramp_blend_against_a_loop(base, dim, length, factor, ab):
    alpha, beta = ab
    theta = default_theta(base, dim)
    out = sa.blend_frequencies(theta, factor, sa.yarn_ramp_paper(theta, length, alpha, beta))
    for i in range(dim // 2):
        theta_i = base ** (-2 * i / dim)
        r = length * theta_i / (2 * math.pi)
        gamma = min(max((r - alpha) / (beta - alpha), 0.0), 1.0)
        assert math.isclose(out[i].item(), (1 - gamma) * theta_i / factor + gamma * theta_i, rel_tol=1e-12)


@given(base=ramp_bases, dim=ramp_dims, length=ramp_lengths, factor=extension_factors, ab=thresholds(),
       ramp=st.sampled_from(["paper", "code", "code truncated"]))
def test_blended_frequencies_keep_their_order(base, dim, length, factor, ab, ramp):
    """theta_i' = theta_i (1/s + (1 - 1/s) gamma_i) with gamma_i non-increasing in i: still decreasing in i,
    and between theta_i / s and theta_i."""
    alpha, beta = ab
    theta = default_theta(base, dim)
    if ramp == "paper":
        gamma = sa.yarn_ramp_paper(theta, length, alpha, beta)
    else:
        gamma = sa.yarn_ramp_code(dim, base, length, beta, alpha, truncate=ramp == "code truncated")
    out = sa.blend_frequencies(theta, factor, gamma)
    assert bool((out[1:] < out[:-1]).all())
    assert bool((out <= theta * (1 + 1e-15)).all()) and bool((out >= theta / factor * (1 - 1e-15)).all())


@given(base=ramp_bases, dim=ramp_dims, factor=extension_factors, seed=seeds)
def test_kept_fraction_recovers_the_blend(base, dim, factor, seed):
    rng = np.random.default_rng(seed)
    gamma = torch.tensor(rng.uniform(0.0, 1.0, dim // 2))
    theta = default_theta(base, dim)
    by_hand = (1 - gamma) * theta / factor + gamma * theta
    assert torch.allclose(sa.kept_fraction(by_hand, theta, factor), gamma, rtol=0, atol=1e-12)
    blended = sa.blend_frequencies(theta, factor, gamma)
    assert torch.allclose(sa.kept_fraction(blended, theta, factor), gamma, rtol=0, atol=1e-12)


@given(base=ramp_bases, dim=ramp_dims, factor=extension_factors)
def test_kept_fraction_of_the_simple_schedules(base, dim, factor):
    """Unchanged frequencies keep everything; position interpolation keeps nothing."""
    default, _ = rope.inv_freq({"rope_theta": base}, dim)
    linear, _ = rope.inv_freq({"rope_type": "linear", "rope_theta": base, "factor": factor}, dim)
    assert torch.allclose(sa.kept_fraction(default, default, factor), torch.ones(dim // 2, dtype=torch.float64))
    assert sa.kept_fraction(linear, default, factor).abs().max().item() < 1e-6


@given(base=ramp_bases, ratio=st.floats(min_value=1.0, max_value=1e4), dim=ramp_dims.filter(lambda d: d >= 4))
def test_base_change_is_ntk_aware_scaling(base, ratio, dim):
    """b -> b' equals NTK-aware scaling with s = (b'/b)^((d-2)/d): same frequencies."""
    new_base = base * ratio
    s = sa.ntk_factor_for_base(base, new_base, dim)
    assert math.isclose(base * s ** (dim / (dim - 2)), new_base, rel_tol=1e-12)
    assert math.isclose(sa.ntk_aware_base(base, s, dim), new_base, rel_tol=1e-12)  # the inverse
    ntk, _ = rope.inv_freq({"rope_type": "ntk_aware", "rope_theta": base, "factor": s}, dim)
    assert_correctly_rounded(ntk, default_theta(new_base, dim))


@given(base=ramp_bases, dim=ramp_dims, length=ramp_lengths, factor=extension_factors, ab=thresholds())
def test_llama3_regimes_by_wavelength(base, dim, length, factor, ab):
    """Pairs with w < L/high are kept (gamma = 1), pairs with w > L/low interpolated (gamma = 0),
    the rest blended with a weight in [0, 1] that falls as the wavelength grows."""
    low, high = ab
    config = {"rope_type": "llama3", "rope_theta": base, "factor": factor, "low_freq_factor": low,
              "high_freq_factor": high, "original_max_position_embeddings": length}
    scaled, _ = rope.inv_freq(config, dim)
    gamma = sa.kept_fraction(scaled, default_theta(base, dim), factor).tolist()
    blended = []
    for i, g in enumerate(gamma):
        wavelength = 2 * math.pi * base ** (2 * i / dim)
        margin = 1e-9 * wavelength  # leave pairs that sit on a threshold to the other tests
        if wavelength < length / high - margin:
            assert abs(g - 1) < 1e-6
        elif wavelength > length / low + margin:
            assert abs(g) < 1e-6
        elif length / high + margin < wavelength < length / low - margin:
            assert -1e-6 < g < 1 + 1e-6
            blended.append(g)
    assert all(later <= earlier + 1e-6 for earlier, later in zip(blended, blended[1:]))


THETA_8 = default_theta(1e4, 8)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: sa.ntk_aware_base(1e4, 4.0, 2), ValueError, "dim"),
        (lambda: sa.ntk_aware_base(1.0, 4.0, 64), ValueError, "base"),
        (lambda: sa.ntk_aware_base(1e4, 0.5, 64), ValueError, "factor"),
        (lambda: sa.ntk_aware_base(1e4, "4", 64), TypeError, "factor"),
        (lambda: sa.dynamic_ntk_factor(4.0, 0, 4096), ValueError, "seq_len"),
        (lambda: sa.dynamic_ntk_factor(4.0, 10, 4096.0), TypeError, "max_position_embeddings"),
        (lambda: sa.dynamic_ntk_factor(4.0, 10, 0), ValueError, "max_position_embeddings"),
        (lambda: sa.beta_digits([-1, 3], 10.0, 3), ValueError, "positions"),
        (lambda: sa.beta_digits([1, 3], 10.0, 0), ValueError, "num_digits"),
        (lambda: sa.angle_spans([1.0, 0.1], 10), TypeError, "inv_freq"),
        (lambda: sa.angle_spans(torch.ones(2, 2), 10), ValueError, "inv_freq"),
        (lambda: sa.unseen_angle_pairs(torch.ones(3), 10, torch.ones(4), 20), ValueError, "same length"),
        (lambda: sa.pair_index_for_rotations(0.0, 64, 1e4, 4096), ValueError, "rotations"),
        (lambda: sa.yarn_ramp_paper(torch.ones(4), 4096, 2.0, 1.0), ValueError, "beta"),
        (lambda: sa.yarn_correction_range(64, 1e4, 4096, 1.0, 32.0), ValueError, "beta_fast"),
        (lambda: sa.yarn_correction_range(64, 1e4, 4096, truncate=1), TypeError, "truncate"),
        (lambda: sa.blend_frequencies(torch.ones(4), 4.0, torch.ones(3)), ValueError, "gamma"),
        (lambda: sa.blend_frequencies(torch.ones(4), 4.0, torch.full((4,), 2.0)), ValueError, "gamma"),
        (lambda: sa.yarn_mscale("4"), TypeError, "scale"),
        (lambda: sa.yarn_mscale(4.0, None), TypeError, "mscale"),
        (lambda: sa.deepseek_yarn_scales(0.5, 1.0, 1.0), ValueError, "factor"),
        (lambda: sa.wavelengths([1.0, 0.1]), TypeError, "inv_freq"),
        (lambda: sa.wavelengths(torch.ones(2, 2)), ValueError, "inv_freq"),
        (lambda: sa.wavelengths(torch.tensor([1.0, 0.0])), ValueError, "inv_freq"),
        (lambda: sa.wavelengths(torch.tensor([1.0, math.inf])), ValueError, "inv_freq"),
        (lambda: sa.wavelengths(torch.tensor([1, 2])), TypeError, "inv_freq"),
        (lambda: sa.rotations_over_context(THETA_8, 0), ValueError, "length"),
        (lambda: sa.rotations_over_context(THETA_8, 8.5), TypeError, "length"),
        (lambda: sa.rotations_over_context(THETA_8, True), TypeError, "length"),
        (lambda: sa.kept_fraction(THETA_8, THETA_8[:3], 2.0), ValueError, "shape"),
        (lambda: sa.kept_fraction(THETA_8, THETA_8, 1.0), ValueError, "factor"),
        (lambda: sa.kept_fraction(THETA_8, THETA_8, "2"), TypeError, "factor"),
        (lambda: sa.kept_fraction(THETA_8.tolist(), THETA_8, 2.0), TypeError, "scaled"),
        (lambda: sa.kept_fraction(THETA_8, -THETA_8, 2.0), ValueError, "original"),
        (lambda: sa.yarn_ramp_paper(THETA_8, 64, -1.0, 4.0), ValueError, "alpha"),
        (lambda: sa.yarn_ramp_paper(THETA_8, 64, 1.0, math.inf), ValueError, "beta"),
        (lambda: sa.deepseek_yarn_scales(4.0, 1.0, -20 / math.log(4.0)), ValueError, "mscale_all_dim"),
        (lambda: sa.ntk_aware_base(1e4, 1e300, 4), ValueError, "factor"),
        (lambda: sa.dynamic_ntk_factor(4.0, 10**400, 4096), ValueError, "seq_len"),
        (lambda: sa.yarn_ramp_paper(THETA_8, 0, 1.0, 4.0), ValueError, "length"),
        (lambda: sa.blend_frequencies(THETA_8, 0.5, torch.ones(4)), ValueError, "factor"),
        (lambda: sa.ntk_factor_for_base(1e4, 5e3, 128), ValueError, "new_base"),
        (lambda: sa.ntk_factor_for_base(1.0, 5e3, 128), ValueError, "base"),
        (lambda: sa.ntk_factor_for_base(1e4, 5e5, 2), ValueError, "dim"),
        (lambda: sa.ntk_factor_for_base(1e4, 5e5, 7), ValueError, "dim"),
        (lambda: sa.ntk_factor_for_base(1e4, 5e5, 128.0), TypeError, "dim"),
        (lambda: sa.deepseek_yarn_scales(4.0, None, 1.0), TypeError, "mscale"),
    ],
)
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()
