"""The rope_types and keys of vLLM, HunYuan and the vision towers (issue 28), each against its
source's formula written here in float64 (the source named in each test), over inputs drawn
afresh by hypothesis: HunYuan's ``alpha``, vLLM's ``ntk`` (with and without ``mixed_b``), Phi-3's
``short_mscale`` and ``long_mscale``, ``deepseek_yarn`` and ``deepseek_llama_scaling``,
``telechat3-yarn``, ``apply_yarn_scaling``, ``axial``, ``mllama4`` and ``xdrope``."""

import math
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from rope.axial import llama4_vision_positions
from rope.registry import rope_type
from tests.helpers import assert_correctly_rounded

dims = st.integers(1, 16).map(lambda n: 8 * n)  # multiples of 8: two axes of whole pairs
thetas = st.floats(2.0, 6.0).map(lambda e: float(10.0**e))
factors = st.floats(1.0, 64.0)
lengths = st.integers(64, 65536)
seeds = st.integers(0, 2**32 - 1)


def default(base: float, dim: int) -> torch.Tensor:
    """theta_i = b^(-2i/d), float64."""
    return torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def assert_rounded_once(ours: torch.Tensor, reference: torch.Tensor) -> None:
    assert ours.dtype == torch.float32
    assert torch.equal(ours, reference.to(torch.float32)) or torch.allclose(
        ours.double(), reference, rtol=2.0**-23, atol=0)


def mscale(s: float, m: float = 1.0) -> float:
    """yarn_get_mscale of vLLM's common.py and DeepSeek's code."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


@given(dims, thetas, st.floats(1.0, 5000.0), st.sampled_from([None, 1.0]))
def test_hunyuan_alpha(dim, theta, alpha, factor):
    """transformers' HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters and vLLM's
    DynamicNTKAlphaRotaryEmbedding: base = rope_theta * alpha ** (dim / (dim - 2)), at every length."""
    config = {"rope_type": "dynamic", "rope_theta": theta, "alpha": alpha, "factor": factor}
    reference = default(theta * alpha ** (dim / (dim - 2)), dim)
    for seq_len in (None, 1, 10**6):
        ours, attention = rope.inv_freq(config, dim, seq_len=seq_len)
        assert_rounded_once(ours, reference)
        assert attention == 1.0


def test_hunyuan_alpha_keys():
    with pytest.warns(rope.RopeConfigWarning, match="'factor' is ignored \\(2.0\\)"):
        rope.inv_freq({"rope_type": "dynamic", "alpha": 4.0, "factor": 2.0, "max_position_embeddings": 64}, 16)
    with pytest.raises(ValueError, match="'alpha' must be >= 1"):
        rope.inv_freq({"rope_type": "dynamic", "alpha": 0.5}, 16)
    with pytest.raises(ValueError, match="needs the config key 'factor' \\(or 'alpha'\\)"):
        rope.inv_freq({"rope_type": "dynamic", "max_position_embeddings": 64}, 16)
    with pytest.raises(ValueError, match="'alpha' is not rope's"):
        rope.inv_freq({"rope_type": "linear", "factor": 2.0, "alpha": 4.0}, 16)


@given(dims, thetas, factors, st.floats(0.1, 2.0))
def test_ntk_mixed_b(dim, theta, factor, b):
    """vLLM's NTKScalingRotaryEmbedding with mixed_b: base unchanged, inv_freq / exp(a k^b),
    a = ln(factor) / (dim/2)^b, k = 1 .. dim/2 (https://kexue.fm/archives/9706)."""
    ours, attention = rope.inv_freq({"rope_type": "ntk", "rope_theta": theta, "factor": factor, "mixed_b": b}, dim)
    a = math.log(factor) / (dim / 2) ** b
    reference = default(theta, dim) / torch.tensor([math.exp(a * k**b) for k in range(1, dim // 2 + 1)],
                                                   dtype=torch.float64)
    assert_rounded_once(ours, reference)
    assert attention == 1.0
    assert math.isclose(ours[-1].item() * factor, default(theta, dim)[-1].item(), rel_tol=1e-6)  # lambda = s


@given(st.integers(1, 64).map(lambda n: 2 * n), thetas, factors)
def test_ntk_is_vllms(dim, theta, factor):
    """vLLM's NTKScalingRotaryEmbedding without mixed_b: inv_freq of the base b * factor, divided
    by factor ** (2 / dim): theta_i = (b s)^(-2i/d) / s^(2/d) (d = 2 too). rope's NTK-aware base
    b s^(d/(d-2)), which keeps theta_0 = 1, is ``ntk_aware``."""
    ours, attention = rope.inv_freq({"rope_type": "ntk", "rope_theta": theta, "factor": factor}, dim)
    reference = default(theta * factor, dim) / factor ** (2 / dim)
    assert_rounded_once(ours, reference)
    assert attention == 1.0
    assert math.isclose(ours[-1].item() * factor, default(theta, dim)[-1].item(), rel_tol=1e-6)  # the last pair: s
    mixed_one, _ = rope.inv_freq({"rope_type": "ntk", "rope_theta": theta, "factor": factor, "mixed_b": 1.0}, dim)
    assert torch.allclose(mixed_one.double(), reference, rtol=2.0**-23, atol=0)  # mixed_b = 1 is the same
    if dim >= 4 and factor > 1.01:
        aware, _ = rope.inv_freq({"rope_type": "ntk_aware", "rope_theta": theta, "factor": factor}, dim)
        assert aware[0].item() == 1.0 and ours[0].item() < 1.0  # ntk_aware keeps the first pair, vLLM's does not


def test_ntk_keys():
    with pytest.raises(ValueError, match="'mixed_b' is not rope's.*'ntk'"):
        rope.inv_freq({"rope_type": "ntk_aware", "factor": 2.0, "mixed_b": 1.0}, 16)
    with pytest.raises(ValueError, match="'mixed_b' must be > 0"):
        rope.inv_freq({"rope_type": "ntk", "factor": 2.0, "mixed_b": 0.0}, 16)
    with pytest.raises(ValueError, match="rope_type 'ntk' needs the config key 'factor'"):
        rope.inv_freq({"rope_type": "ntk"}, 16)


@given(st.data(), dims, thetas, lengths, st.floats(1.5, 32.0))
def test_phi3_short_and_long_mscale(data, dim, theta, ompe, ratio):
    """vLLM's Phi3LongRoPEScaledRotaryEmbedding: the short table times short_mscale, the long one
    times long_mscale; a table without its own keeps sqrt(1 + ln s / ln L)."""
    per_pair = st.lists(st.floats(1.0, 64.0), min_size=dim // 2, max_size=dim // 2)
    short, long = data.draw(per_pair), data.draw(per_pair)
    short_mscale, long_mscale = data.draw(st.floats(0.5, 2.0)), data.draw(st.floats(0.5, 2.0))
    mpe = int(ompe * ratio)
    base = {"rope_type": "longrope", "rope_theta": theta, "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": ompe, "max_position_embeddings": mpe}
    computed = math.sqrt(1 + math.log(mpe / ompe) / math.log(ompe))
    for seq_len, factors, mscale_key in ((ompe, short, "short_mscale"), (ompe + 1, long, "long_mscale")):
        given_value = short_mscale if mscale_key == "short_mscale" else long_mscale
        ours, attention = rope.inv_freq({**base, "short_mscale": short_mscale, "long_mscale": long_mscale}, dim,
                                        seq_len=seq_len)
        assert_rounded_once(ours, default(theta, dim) / torch.tensor(factors, dtype=torch.float64))
        assert attention == given_value
        other = "long_mscale" if mscale_key == "short_mscale" else "short_mscale"
        _, attention = rope.inv_freq({**base, other: 3.0}, dim, seq_len=seq_len)
        assert math.isclose(attention, computed, rel_tol=1e-12)
    with pytest.raises(ValueError, match="'attention_factor'.*'short_mscale'.*disagree"):
        rope.inv_freq({**base, "short_mscale": 1.0, "attention_factor": 1.0}, dim)


@given(dims, thetas, factors, lengths, st.sampled_from([None, 0.0, 0.5, 1.0, 1.7]),
       st.sampled_from([None, 0.0, 0.5, 1.0, 1.7]), st.sampled_from([(None, None), (16.0, 2.0), (64.0, 0.5)]))
def test_deepseek_yarn(dim, theta, factor, ompe, m, m_all, betas):
    """vLLM's DeepseekScalingRotaryEmbedding: YaRN's blend with the bounds floored and ceiled
    (yarn_find_correction_range), mscale = get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)
    with defaults mscale = 1, mscale_all_dim = 0."""
    fast, slow = betas
    config = {"rope_type": "deepseek_yarn", "rope_theta": theta, "factor": factor,
              "original_max_position_embeddings": ompe, "mscale": m, "mscale_all_dim": m_all,
              "beta_fast": fast, "beta_slow": slow}
    ours, attention = rope.inv_freq(config, dim)

    def correction_dim(rotations):
        return dim * math.log(ompe / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(fast or 32)), 0)
    high = min(math.ceil(correction_dim(slow or 1)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp
    pos_freqs = 1 / default(theta, dim)
    reference = (1 / (factor * pos_freqs)) * (1 - kept) + (1 / pos_freqs) * kept
    assert_rounded_once(ours, reference)
    expected = mscale(factor, 1.0 if m is None else m) / mscale(factor, 0.0 if m_all is None else m_all)
    assert math.isclose(attention, expected, rel_tol=1e-12)


@given(dims, thetas, factors, lengths, st.sampled_from([None, 0.0, 1.0, 1.7]), st.sampled_from([None, 0.0, 0.5]),
       st.sampled_from([(None, None), (16.0, 2.0)]))
def test_deepseek_llama_scaling_is_deepseek_yarn(dim, theta, factor, ompe, m, m_all, betas):
    """vLLM's get_rope sends "deepseek_yarn" and "deepseek_llama_scaling" to one branch
    (DeepseekScalingRotaryEmbedding, the same keys): the same numbers, bit for bit."""
    config = {"rope_theta": theta, "factor": factor, "original_max_position_embeddings": ompe, "mscale": m,
              "mscale_all_dim": m_all, "beta_fast": betas[0], "beta_slow": betas[1]}
    yarn, yarn_attention = rope.inv_freq({"rope_type": "deepseek_yarn", **config}, dim)
    llama, llama_attention = rope.inv_freq({"rope_type": "deepseek_llama_scaling", **config}, dim)
    assert torch.equal(yarn, llama) and yarn_attention == llama_attention
    entries = [rope_type(name) for name in ("deepseek_yarn", "deepseek_llama_scaling")]
    assert entries[0].required == entries[1].required and entries[0].optional == entries[1].optional


def telechat3_reference(dim, theta, factor, ompe, fast, slow, truncate, extrapolation, attn_factor):
    """vLLM's TeleChat3RoPEScaledRotaryEmbedding: YaRNScalingRotaryEmbedding._compute_inv_freq
    (yarn_find_correction_range with truncate, yarn_linear_ramp_mask, the mask times
    extrapolation_factor) and mscale = get_mscale(factor) * attn_factor with get_mscale(s) =
    0.07 ln s + 1 (1 for s <= 1)."""

    def correction_dim(rotations):
        return dim * math.log(ompe / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(fast), correction_dim(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    mask = (1 - ramp) * extrapolation
    pos_freqs = 1 / default(theta, dim)
    inv_freq = 1 / (factor * pos_freqs) * (1 - mask) + 1 / pos_freqs * mask
    mscale = (1.0 if factor <= 1 else 0.07 * math.log(factor) + 1.0) * attn_factor
    return inv_freq, mscale


MISSING = object()


@given(dims, thetas, factors, lengths, st.sampled_from([(None, None), (16.0, 2.0), (64.0, 0.5)]),
       st.sampled_from([MISSING, None, True, False]), st.sampled_from([MISSING, 0.0, 0.5, 1.0]),
       st.sampled_from([MISSING, 0.5, 1.0, 1.7]))
def test_telechat3_yarn(dim, theta, factor, ompe, betas, truncate, extrapolation, attn_factor):
    """vLLM's telechat3-yarn: vLLM's YaRN with the attention factor's slope 0.07 in place of 0.1,
    reading vLLM's extrapolation_factor and attn_factor; truncate absent means True, None falsy
    (vLLM passes the None on to its ``if truncate``)."""
    config = {"rope_type": "telechat3-yarn", "rope_theta": theta, "factor": factor,
              "original_max_position_embeddings": ompe, "beta_fast": betas[0], "beta_slow": betas[1]}
    for key, value in (("truncate", truncate), ("extrapolation_factor", extrapolation), ("attn_factor", attn_factor)):
        if value is not MISSING:
            config[key] = value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours, attention = rope.inv_freq(config, dim)
    reference, mscale_ = telechat3_reference(
        dim, theta, factor, ompe, betas[0] or 32, betas[1] or 1, True if truncate is MISSING else truncate,
        1.0 if extrapolation is MISSING else extrapolation, 1.0 if attn_factor is MISSING else attn_factor)
    assert_rounded_once(ours, reference)
    assert math.isclose(attention, mscale_, rel_tol=1e-12)
    yarn = {key: value for key, value in config.items() if key not in ("extrapolation_factor", "attn_factor")}
    if extrapolation in (MISSING, 1.0):  # the frequencies of rope's yarn (transformers'), the factor's slope 0.07
        assert torch.equal(ours, rope.inv_freq({**yarn, "rope_type": "yarn"}, dim)[0])


def test_telechat3_yarn_keys():
    config = {"rope_type": "telechat3-yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    with pytest.raises(ValueError, match="'attn_factor' must be > 0"):
        rope.inv_freq({**config, "attn_factor": 0.0}, 64)
    with pytest.raises(ValueError, match="'extrapolation_factor' must be >= 0"):
        rope.inv_freq({**config, "extrapolation_factor": -0.5}, 64)
    with pytest.raises(TypeError, match="'attn_factor' must be a real number"):
        rope.inv_freq({**config, "attn_factor": "1.0"}, 64)
    with pytest.raises(ValueError, match="needs the config key 'original_max_position_embeddings'"):
        rope.inv_freq({"rope_type": "telechat3-yarn", "factor": 4.0, "max_position_embeddings": 4096}, 64)
    with pytest.warns(rope.RopeConfigWarning, match="'mscale' is ignored"):  # vLLM's branch does not pass it either
        rope.inv_freq({**config, "mscale": 1.0}, 64)
    for key in ("attn_factor", "extrapolation_factor"):  # other types still refuse vLLM's YaRN keys
        with pytest.raises(ValueError, match=f"'{key}' is not rope's.*'telechat3-yarn'"):
            rope.inv_freq({**config, "rope_type": "yarn", key: 1.0}, 64)


def test_transformers_has_no_telechat3_type():
    """The installed transformers has no TeleChat3 rope type (nor a _compute_telechat_yarn_parameters):
    rope's telechat3-yarn follows vLLM alone. Where transformers gains one, test rope against it here."""
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    assert not [name for name in rope_utils.ROPE_INIT_FUNCTIONS if "telechat" in name]
    assert not [name for name in dir(rope_utils) if "telechat" in name.lower()]


def test_deepseek_v4_zero_mscales_mean_one():
    """DeepSeek-V4 (vLLM sets mscale = mscale_all_dim = 0): factor 1, where yarn reads 0 as absent."""
    config = {"factor": 16.0, "original_max_position_embeddings": 65536, "mscale": 0.0, "mscale_all_dim": 0.0}
    assert rope.inv_freq({"rope_type": "deepseek_yarn", **config}, 64)[1] == 1.0
    assert math.isclose(rope.inv_freq({"rope_type": "yarn", **config}, 64)[1], mscale(16.0), rel_tol=1e-12)


@given(dims, factors, lengths, st.sampled_from([None, 1.0]), st.sampled_from([None, 1.0]))
def test_apply_yarn_scaling_false_is_vllms_factor_one(dim, factor, ompe, m, m_all):
    """vLLM's YaRNScalingRotaryEmbedding: mscale = attn_factor (1) when apply_yarn_scaling is False,
    get_mscale(factor) * attn_factor otherwise; the frequencies do not change."""
    config = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": ompe, "mscale": m,
              "mscale_all_dim": m_all}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = rope.inv_freq({**config, "apply_yarn_scaling": False}, dim)
        on = rope.inv_freq({**config, "apply_yarn_scaling": True}, dim)
    plain = rope.inv_freq(config, dim)
    assert off[1] == 1.0
    assert on[1] == plain[1]
    if not (m and m_all):
        assert math.isclose(on[1], mscale(factor), rel_tol=1e-12)
    assert torch.equal(off[0], plain[0]) and torch.equal(on[0], plain[0])


def test_apply_yarn_scaling_keys():
    config = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    with pytest.raises(ValueError, match="'apply_yarn_scaling'.*'attention_factor'.*disagree"):
        rope.inv_freq({**config, "apply_yarn_scaling": False, "attention_factor": 1.2}, 64)
    with pytest.raises(TypeError, match="'apply_yarn_scaling' must be a bool"):
        rope.inv_freq({**config, "apply_yarn_scaling": "false"}, 64)


def exact_pair_cos_sin(per_pair: torch.Tensor, theta: torch.Tensor):
    """cos and sin of the exact angles p_i theta_i (``per_pair`` ``[..., pairs]``, theta the float32
    values), mpmath at 200 bits rounded once to float64: positions up to 2^40 lose bits in a float64
    product."""
    import mpmath

    with mpmath.workprec(200):
        thetas = [mpmath.mpf(float(t)) for t in theta]
        angles = [mpmath.mpf(p) * thetas[i % len(thetas)] for i, p in enumerate(per_pair.flatten().tolist())]
        cos = torch.tensor([float(mpmath.cos(a)) for a in angles], dtype=torch.float64)
        sin = torch.tensor([float(mpmath.sin(a)) for a in angles], dtype=torch.float64)
    return cos.reshape(per_pair.shape), sin.reshape(per_pair.shape)


def rotate_half_float64(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@given(st.integers(1, 8).map(lambda n: 4 * n), st.floats(1.5, 5.0).map(lambda e: 10.0**e), seeds)
def test_axial_is_the_vision_towers_rope(head_dim, theta, seed):
    """transformers' Qwen3VLVisionRotaryEmbedding (compute_axial_rope_parameters, the default of
    the vision towers): inv_freq = 1 / b^(arange(0, d/2, 2) / (d/2)), cos = cos(cat(h, w, h, w) *
    inv_freq) in the half layout."""
    gen = torch.Generator().manual_seed(seed)
    theta_axis = 1 / theta ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float64) / (head_dim // 2))
    ours, attention = rope.inv_freq({"rope_type": "axial", "rope_theta": theta}, head_dim)
    assert_rounded_once(ours, torch.cat([theta_axis, theta_axis]))
    assert attention == 1.0
    q = torch.randn(1, 6, 2, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 6, 1, head_dim, generator=gen, dtype=torch.float64)
    hw = torch.randint(0, 64, (6, 2), generator=gen)
    out_q, out_k = rope.apply_rotary_2d(q, k, hw, ours[: head_dim // 4], ours[head_dim // 4:])
    frequencies = ours.double()[: head_dim // 4]
    angles = torch.cat([hw[:, :1] * frequencies, hw[:, 1:] * frequencies], dim=-1)
    cos, sin = torch.cat([angles.cos()] * 2, -1)[None, :, None], torch.cat([angles.sin()] * 2, -1)[None, :, None]
    assert torch.allclose(out_q, rotate_half_float64(q, cos, sin), rtol=0, atol=1e-12)
    assert torch.allclose(out_k, rotate_half_float64(k, cos, sin), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="multiple of 4"):
        rope.inv_freq({"rope_type": "axial"}, 4 * head_dim + 2)


@given(st.integers(1, 8).map(lambda n: 4 * n), st.integers(1, 5), seeds)
def test_mllama4_is_llama4s_vision_rope(head_dim, side, seed):
    """vLLM's Llama4VisionRotaryEmbedding (transformers' the same): freq_dim = d/2, rope_freq =
    1 / b^(arange(0, freq_dim, 2) / freq_dim), freqs = cat((x + 1) f, (y + 1) f) repeated and
    interleaved, then [::2], the class token at angle 0; applied to q as complex pairs."""
    gen = torch.Generator().manual_seed(seed)
    base = 10000.0
    num_patches = side * side
    ours, _ = rope.inv_freq({"rope_type": "mllama4", "rope_theta": base}, head_dim)
    freq_dim = head_dim // 2
    rope_freq = 1 / base ** (torch.arange(0, freq_dim, 2, dtype=torch.float64)[: freq_dim // 2] / freq_dim)
    assert_rounded_once(ours, torch.cat([rope_freq, rope_freq]))
    rope_freq = rope_freq.float().double()  # the rotation turns by the float32 frequencies, as the sources do
    index = torch.cat([torch.arange(num_patches), torch.tensor([-2])])  # ID_CLS_TOKEN last
    x, y = index % side, index // side
    freqs_x = ((x + 1)[:, None] * rope_freq).repeat_interleave(2, dim=-1)
    freqs_y = ((y + 1)[:, None] * rope_freq).repeat_interleave(2, dim=-1)
    freqs = torch.cat([freqs_x, freqs_y], dim=-1)[..., ::2].masked_fill((index < 0)[:, None], 0)
    q = torch.randn(1, num_patches + 1, 2, head_dim, generator=gen, dtype=torch.float64)
    reference = torch.view_as_real(torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2))
                                   * torch.polar(torch.ones_like(freqs), freqs)[None, :, None]).flatten(-2)
    out, _ = rope.apply_rotary_2d(q, q, llama4_vision_positions(num_patches), ours[: head_dim // 4],
                                  ours[head_dim // 4:], layout="interleaved")
    assert torch.allclose(out, reference, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="square"):
        llama4_vision_positions(num_patches + 1 if side > 1 else 2)


@given(st.lists(st.integers(0, 4), min_size=4, max_size=4).filter(lambda s: sum(s) >= 2), st.floats(1.0, 100.0),
       st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), seeds)
def test_xdrope_is_hunyuan_vls_four_axes(section, alpha, dtype, seed):
    """vLLM's XDRotaryEmbedding: DynamicNTKAlpha's frequencies (base b alpha^(d/(d-2))), cos and
    sin split by xdrope_section along the pairs, block a from position row a (P, W, H, T), half
    layout; every coordinate rounded once."""
    gen = torch.Generator().manual_seed(seed)
    dim = 2 * sum(section)
    base = 10000.0
    config = {"rope_type": "xdrope", "rope_theta": base, "alpha": alpha, "xdrope_section": section}
    ours, attention = rope.inv_freq(config, dim)
    assert_rounded_once(ours, default(base * alpha ** (dim / (dim - 2)), dim))
    assert attention == 1.0
    seq = 5
    q = torch.randn(2, seq, 2, dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, seq, 1, dim, generator=gen, dtype=torch.float64).to(dtype)
    positions = torch.randint(-(2**40), 2**40, (4, 2, seq), generator=gen)
    out_q, out_k = rope.apply_xdrope(q, k, positions, ours, section)
    row = torch.repeat_interleave(torch.arange(4), torch.tensor(section))
    per_pair = positions[row].movedim(0, -1)  # [batch, seq, pairs]: the position of each pair's row
    cos, sin = exact_pair_cos_sin(per_pair, ours)
    cos, sin = torch.cat([cos, cos], -1)[:, :, None], torch.cat([sin, sin], -1)[:, :, None]
    assert_correctly_rounded(out_q, rotate_half_float64(q.double(), cos, sin))
    assert_correctly_rounded(out_k, rotate_half_float64(k.double(), cos, sin))


def test_xdrope_keys():
    with pytest.raises(ValueError, match="needs the config key 'xdrope_section'"):
        rope.inv_freq({"rope_type": "xdrope", "alpha": 2.0}, 16)
    with pytest.raises(ValueError, match="must sum to rotary_dim / 2 = 8"):
        rope.inv_freq({"rope_type": "xdrope", "alpha": 2.0, "xdrope_section": [2, 2, 2, 1]}, 16)
    with pytest.raises(TypeError, match="list of 4 integers"):
        rope.inv_freq({"rope_type": "xdrope", "alpha": 2.0, "xdrope_section": [4, 4]}, 16)
