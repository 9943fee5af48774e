"""rope.attention.linear_attention: the O(N) prefix-sum form against the float64 O(N^2) sum (RoFormer eq. 19)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import random_qk
from rope.attention.linear_attention import (
    elu_plus_one,
    rotary_linear_attention,
    rotary_linear_attention_parts,
    rotary_linear_attention_quadratic,
    rotary_linear_attention_weights,
)
from rope.reference import rotation_matrix
from strategies import frequencies, layouts, position_ids, seeds


@st.composite
def problems(draw, dtype=torch.float64):
    """Random q, k, v (GQA allowed, partial rotary allowed), positions and frequencies."""
    gen = torch.Generator().manual_seed(draw(seeds))
    batch, seq = draw(st.integers(1, 2)), draw(st.integers(1, 9))
    heads_k = draw(st.integers(1, 2))
    heads_q = heads_k * draw(st.integers(1, 3))
    head_dim = 2 * draw(st.integers(1, 8))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    v_dim = draw(st.integers(1, 5))
    q, k = random_qk(gen, batch, seq, heads_q, heads_k, head_dim, dtype=dtype)
    v = torch.randn(batch, seq, heads_k, v_dim, generator=gen, dtype=torch.float64).to(dtype)
    positions = draw(position_ids(batch, seq, highs=(16, 2**20)))
    return q, k, v, positions, draw(frequencies(rotary_dim))


def scale_of(reference):
    return 1e-10 * (1.0 + reference.abs().max().item())


@given(problems(), layouts, st.booleans())
def test_prefix_sums_equal_the_quadratic_sum(problem, layout, causal):
    q, k, v, positions, theta = problem
    fast = rotary_linear_attention(q, k, v, positions, theta, causal=causal, layout=layout)
    slow = rotary_linear_attention_quadratic(q, k, v, positions, theta, causal=causal, layout=layout)
    assert fast.dtype == torch.float64 and fast.shape == (*q.shape[:3], v.shape[-1])
    torch.testing.assert_close(fast, slow, rtol=0, atol=scale_of(slow))


@given(problems(), layouts, st.booleans(), st.integers(-(2**20), 2**20))
def test_shifting_every_position_changes_nothing(problem, layout, causal, shift):
    q, k, v, positions, theta = problem
    out = rotary_linear_attention(q, k, v, positions, theta, causal=causal, layout=layout)
    shifted = rotary_linear_attention(q, k, v, positions + shift, theta, causal=causal, layout=layout)
    torch.testing.assert_close(shifted, out, rtol=0, atol=1e-9 * (1.0 + out.abs().max().item()))


@given(problems(), layouts, st.booleans())
def test_weights_are_relative_rotations_over_the_plain_denominator(problem, layout, causal):
    """A_mn = phi(q_m)^T R_{n-m} phi(k_n) / sum_n' phi(q_m)^T phi(k_n'), written with R_{n-m} directly."""
    q, k, _, positions, theta = problem
    weights = rotary_linear_attention_weights(q, k, positions, theta, causal=causal, layout=layout)
    batch, seq, heads_q, head_dim = q.shape
    group = heads_q // k.shape[2]
    grid = positions.expand(batch, seq) if positions.dim() == 1 else positions
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    for b in range(batch):
        for h in range(heads_q):
            for m in range(seq):
                keys = range(m + 1) if causal else range(seq)
                denominator = sum(phi_q[b, m, h] @ phi_k[b, n, h // group] for n in keys)
                for n in range(seq):
                    offset = int(grid[b, n] - grid[b, m])
                    r = rotation_matrix(offset, theta, head_dim=head_dim, layout=layout)
                    expected = phi_q[b, m, h] @ r @ phi_k[b, n, h // group] / denominator if n in keys else 0.0
                    assert abs(weights[b, h, m, n].item() - expected) <= 1e-10 * (1 + abs(expected))


@given(problems(), layouts, st.booleans(), st.integers(-(2**20), 2**20))
def test_one_shared_position_gives_plain_linear_attention(problem, layout, causal, position):
    """All tokens at one position: R_m^T R_m = I, so eq. 19 is Katharopoulos et al.'s linear attention."""
    q, k, v, _, theta = problem
    seq = q.shape[1]
    out = rotary_linear_attention(q, k, v, torch.full((seq,), position), theta, causal=causal, layout=layout)
    group = q.shape[2] // k.shape[2]
    phi_q, phi_k = F.elu(q) + 1, (F.elu(k) + 1).repeat_interleave(group, dim=2)
    values = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bmhd,bnhd->bhmn", phi_q, phi_k)
    if causal:
        scores = scores * torch.ones(seq, seq, dtype=torch.bool).tril()
    expected = torch.einsum("bhmn,bnhe->bmhe", scores / scores.sum(-1, keepdim=True), values)
    torch.testing.assert_close(out, expected, rtol=0, atol=scale_of(expected))


@given(problems(), layouts)
def test_causal_output_ignores_later_tokens(problem, layout):
    q, k, v, positions, theta = problem
    seq = q.shape[1]
    gen = torch.Generator().manual_seed(7)
    k2, v2 = k.clone(), v.clone()
    k2[:, -1] = torch.randn(k2[:, -1].shape, generator=gen, dtype=k.dtype)
    v2[:, -1] = torch.randn(v2[:, -1].shape, generator=gen, dtype=v.dtype)
    before = rotary_linear_attention(q, k, v, positions, theta, layout=layout)
    after = rotary_linear_attention(q, k2, v2, positions, theta, layout=layout)
    assert torch.equal(before[:, : seq - 1], after[:, : seq - 1])
    assert not torch.equal(before[:, -1], after[:, -1])


@given(problems(), layouts, st.booleans())
def test_numerator_over_denominator_and_rotated_denominator(problem, layout, causal):
    """The parts divide to the output; with v = 1 the numerator is the rotated denominator, the row
    sum of the weights times the plain denominator."""
    q, k, v, positions, theta = problem
    numerator, denominator = rotary_linear_attention_parts(q, k, v, positions, theta, causal=causal, layout=layout)
    out = rotary_linear_attention(q, k, v, positions, theta, causal=causal, layout=layout)
    torch.testing.assert_close(numerator / denominator[..., None], out, rtol=0, atol=0)
    assert (denominator > 0).all()
    ones = torch.ones_like(v[..., :1])
    rotated, _ = rotary_linear_attention_parts(q, k, ones, positions, theta, causal=causal, layout=layout)
    weights = rotary_linear_attention_weights(q, k, positions, theta, causal=causal, layout=layout)
    expected = weights.sum(-1).transpose(1, 2) * denominator
    torch.testing.assert_close(rotated[..., 0], expected, rtol=0, atol=1e-10 * (1 + expected.abs().max().item()))


@given(problems(dtype=torch.float32), layouts, st.booleans())
def test_float32_inputs_stay_float32_and_close_to_float64(problem, layout, causal):
    q, k, v, positions, theta = problem
    out = rotary_linear_attention(q, k, v, positions, theta, causal=causal, layout=layout)
    slow = rotary_linear_attention_quadratic(q, k, v, positions, theta, causal=causal, layout=layout)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.to(torch.float64), slow, rtol=0, atol=1e-4 * (1.0 + slow.abs().max().item()))


def test_a_custom_feature_map_is_used_for_queries_and_keys():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 6, 2, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    theta, _ = rope.inv_freq({}, 8)
    positions = torch.arange(6)
    fast = rotary_linear_attention(q, k, v, positions, theta, feature_map=torch.exp)
    slow = rotary_linear_attention_quadratic(q, k, v, positions, theta, feature_map=torch.exp)
    torch.testing.assert_close(fast, slow, rtol=0, atol=scale_of(slow))
    assert not torch.allclose(fast, rotary_linear_attention(q, k, v, positions, theta), atol=1e-3)
    assert torch.equal(elu_plus_one(q), F.elu(q) + 1)


def _good():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 2, 8, generator=gen)
    k = torch.randn(1, 4, 1, 8, generator=gen)
    v = torch.randn(1, 4, 1, 3, generator=gen)
    return dict(q=q, k=k, v=v, positions=torch.arange(4), inv_freq=rope.inv_freq({}, 8)[0])


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.ones(4, 2, 8)), ValueError, "q must have shape"),
        (dict(k=torch.ones(1, 5, 1, 8)), ValueError, "must agree in batch, seq and head_dim"),
        (dict(v=torch.ones(1, 4, 2, 3)), ValueError, "v .* must agree with k"),
        (dict(v=torch.ones(4, 1, 3)), ValueError, "v must have shape"),
        (dict(v=[[1.0]]), TypeError, "v must be a torch.Tensor"),
        (dict(v=torch.ones(1, 4, 1, 3, dtype=torch.float64)), TypeError, "v must have the dtype"),
        (dict(k=torch.ones(1, 4, 3, 8), v=torch.ones(1, 4, 3, 3)), ValueError, "multiple of heads of k"),
        (dict(positions=torch.arange(5)), ValueError, "positions must have shape"),
        (dict(positions=torch.arange(4.0)), TypeError, "positions must be an integer tensor"),
        (dict(inv_freq=torch.ones(5)), ValueError, "rotary_dim 10 exceeds head_dim 8"),
        (dict(layout="neox"), ValueError, "layout must be"),
        (dict(feature_map="elu"), TypeError, "feature_map must be callable"),
        (dict(feature_map=lambda x: x.sum(-1)), ValueError, "feature_map must keep the shape"),
        (dict(causal=1), TypeError, "causal must be a bool"),
        (dict(causal="False"), TypeError, "causal must be a bool"),
        (dict(feature_map=lambda x: x.tolist()), TypeError, "feature_map must return a torch.Tensor"),
    ],
)
@pytest.mark.parametrize("function", [rotary_linear_attention, rotary_linear_attention_quadratic])
def test_bad_input_is_named(function, change, error, match):
    args = {**_good(), **change}
    keywords = {key: args.pop(key) for key in ("layout", "feature_map", "causal") if key in args}
    with pytest.raises(error, match=match):
        function(args["q"], args["k"], args["v"], args["positions"], args["inv_freq"], **keywords)
