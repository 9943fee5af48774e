"""rope.inv_freq against transformers' own ROPE_INIT_FUNCTIONS, over configs drawn by hypothesis."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

# multiples of 8, so that every partial_rotary_factor below gives an even rotary width
head_dims = st.integers(1, 32).map(lambda n: 8 * n)
thetas = st.floats(2.0, 7.0).map(lambda e: float(10.0**e))
factors = st.floats(1.0, 64.0)
lengths = st.integers(64, 65536)
partials = st.sampled_from([1.0, 0.75, 0.5, 0.25])


def hf_frequencies(params: dict, head_dim: int, max_position_embeddings: int, seq_len=None):
    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(params),
    )
    if params["rope_type"] == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, seq_len=seq_len)


def assert_matches_hf(params: dict, head_dim: int, max_position_embeddings: int, seq_len=None, conditioning=1.0):
    ours, our_attention = rope.inv_freq(
        {**params, "max_position_embeddings": max_position_embeddings}, head_dim, seq_len=seq_len
    )
    theirs, their_attention = hf_frequencies(params, head_dim, max_position_embeddings, seq_len)
    assert ours.dtype == torch.float32 and ours.shape == theirs.shape
    # transformers raises b to a float32 exponent 2i/d in float32: its error grows with |ln theta_i|,
    # and a ramp w (yarn, llama3) blending theta/s and theta multiplies it by up to slope(w) * s:
    # `conditioning` bounds that product.
    still = theirs == 0  # proportional: pairs that do not rotate
    assert torch.equal(ours == 0, still)
    theirs, ours = theirs[~still].double(), ours[~still].double()
    rtol = 2.0**-22 * (1 + theirs.log().abs()) * conditioning
    rel = (ours - theirs).abs() / theirs
    assert (rel <= rtol).all(), f"worst relative error {rel.max().item():.3g} for {params}"
    assert math.isclose(our_attention, float(their_attention), rel_tol=1e-12)


@given(head_dims, thetas)
def test_default(head_dim, theta):
    assert_matches_hf({"rope_type": "default", "rope_theta": theta}, head_dim, 4096)


@given(head_dims, thetas, factors, partials)
def test_linear(head_dim, theta, factor, partial):
    params = {"rope_type": "linear", "rope_theta": theta, "factor": factor, "partial_rotary_factor": partial}
    assert_matches_hf(params, head_dim, 4096)


@given(head_dims, thetas, factors, lengths, st.one_of(st.none(), st.integers(1, 300000)), partials)
def test_dynamic(head_dim, theta, factor, mpe, seq_len, partial):
    params = {"rope_type": "dynamic", "rope_theta": theta, "factor": factor, "partial_rotary_factor": partial}
    if int(head_dim * partial) <= 2:
        return
    assert_matches_hf(params, head_dim, mpe, seq_len)


optional = lambda strategy: st.one_of(st.none(), strategy)  # noqa: E731


@given(
    head_dims,
    thetas,
    factors,
    lengths,
    partials,
    st.fixed_dictionaries(
        {},
        optional={
            "beta_fast": st.floats(8.0, 64.0),
            "beta_slow": st.floats(0.25, 2.0),
            "mscale": st.floats(0.5, 2.0),
            "mscale_all_dim": st.floats(0.5, 2.0),
            "attention_factor": st.floats(0.5, 2.0),
            "truncate": st.booleans(),
        },
    ),
)
def test_yarn(head_dim, theta, factor, ompe, partial, extra):
    params = {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": factor,
        "original_max_position_embeddings": ompe,
        "partial_rotary_factor": partial,
        **extra,
    }
    # beta_fast / beta_slow >= 4 keeps the ramp at least 0.04 d wide: slope below 12 per unit.
    assert_matches_hf(params, head_dim, int(ompe * factor), conditioning=16.0 * factor)


@given(st.data(), head_dims, thetas, lengths, st.floats(1.0, 32.0), partials)
def test_longrope(data, head_dim, theta, ompe, ratio, partial):
    half = int(head_dim * partial) // 2
    factor_lists = st.lists(st.floats(1.0, 64.0), min_size=half, max_size=half)
    params = {
        "rope_type": "longrope",
        "rope_theta": theta,
        "original_max_position_embeddings": ompe,
        "short_factor": data.draw(factor_lists),
        "long_factor": data.draw(factor_lists),
        "partial_rotary_factor": partial,
        **data.draw(st.fixed_dictionaries({}, optional={"factor": factors, "attention_factor": st.floats(0.5, 2.0)})),
    }
    seq_len = data.draw(optional(st.integers(1, 4 * ompe)))
    assert_matches_hf(params, head_dim, int(ompe * ratio), seq_len)


@given(head_dims, thetas, factors, lengths, st.floats(0.25, 4.0), st.floats(0.1, 8.0), partials)
def test_llama3(head_dim, theta, factor, ompe, low, gap, partial):
    params = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": low + gap,
        "original_max_position_embeddings": ompe,
        "partial_rotary_factor": partial,
    }
    # the smoothing weight (L / w - low) / gap has slope up to (low + gap) / gap.
    assert_matches_hf(params, head_dim, 4 * ompe, conditioning=(1 + (low + gap) / gap) * factor)


@given(head_dims, thetas, factors)
def test_ntk_closed_form(head_dim, theta, factor):
    """NTK-aware: b' = b s^(d/(d-2)); theta_0 stays 1, the lowest frequency is divided by s."""
    ours, attention = rope.inv_freq({"rope_type": "ntk_aware", "rope_theta": theta, "factor": factor}, head_dim)
    d = head_dim
    base = theta * factor ** (d / (d - 2))
    expected = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    torch.testing.assert_close(ours.double(), expected, rtol=2.0**-23, atol=0)
    plain, _ = rope.inv_freq({"rope_type": "default", "rope_theta": theta}, head_dim)
    assert ours[0].item() == 1.0
    torch.testing.assert_close(ours[-1].double(), plain[-1].double() / factor, rtol=2.0**-22, atol=0)
    assert attention == 1.0


@given(head_dims, thetas, st.one_of(st.none(), factors), st.sampled_from([1.0, 0.75, 0.5, 0.3, 0.25, 0.1]))
def test_proportional(head_dim, theta, factor, partial):
    """Gemma 4's full-attention layers: a full head's frequencies on the first pairs, 0 on the rest."""
    params = {"rope_type": "proportional", "rope_theta": theta, "partial_rotary_factor": partial}
    if factor is not None:
        params["factor"] = factor
    assert_matches_hf(params, head_dim, 4096)
    theta_ours, _ = rope.inv_freq(params, head_dim)
    assert theta_ours.shape == (head_dim // 2,)
    assert int((theta_ours != 0).sum()) == int(partial * head_dim // 2)


@given(head_dims, thetas, factors, lengths, partials)
def test_yarn_truncate_none_is_false(head_dim, theta, factor, ompe, partial):
    """transformers reads get("truncate", True): a stored None gives the untruncated ramp."""
    params = {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "original_max_position_embeddings": ompe,
              "partial_rotary_factor": partial, "truncate": None}
    assert_matches_hf(params, head_dim, int(ompe * factor), conditioning=16.0 * factor)
    untruncated, _ = rope.inv_freq({**params, "truncate": False}, head_dim)
    assert rope.inv_freq(params, head_dim)[0].equal(untruncated)


@given(st.data(), head_dims, thetas, lengths, st.floats(0.01, 0.99), partials, st.sampled_from(["yarn", "longrope"]))
def test_a_derived_factor_below_one_is_computed_as_transformers_does(data, head_dim, theta, ompe, ratio, partial,
                                                                     rope_type):
    """max_position_embeddings < original_max_position_embeddings and no factor: s = ratio < 1 is
    used, as in transformers, with a RopeConfigWarning naming both lengths."""
    mpe = max(1, int(ompe * ratio))
    params = {"rope_type": rope_type, "rope_theta": theta, "original_max_position_embeddings": ompe,
              "partial_rotary_factor": partial, "factor": None}
    if rope_type == "longrope":
        half = int(head_dim * partial) // 2
        for key in ("short_factor", "long_factor"):
            params[key] = data.draw(st.lists(st.floats(1.0, 64.0), min_size=half, max_size=half))
    with pytest.warns(rope.RopeConfigWarning, match=f"max_position_embeddings / original_max_position_embeddings = "
                                                    f"{mpe} / {ompe} = .* < 1"):
        # the ramp's float32 error on theta / s weighs 1 / s more than on theta
        assert_matches_hf(params, head_dim, mpe, conditioning=16.0 * ompe / mpe)
