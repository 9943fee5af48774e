"""rope.apply_rotary against the float64 matrix form, and the algebra the book relies on."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import FLOAT_DTYPES, assert_correctly_rounded
from rope.reference import rotate_by_complex, rotate_by_matrix, rotate_elementwise, rotation_matrix
from strategies import layouts


@st.composite
def problems(draw, dtype=None):
    """Random q, k (GQA allowed), positions ([seq] or [batch, seq], up to 2^31 - 1) and frequencies."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch, seq = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    heads_q, heads_k = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 24))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    dtype = dtype or draw(st.sampled_from(FLOAT_DTYPES))
    q = torch.randn(batch, seq, heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, seq, heads_k, head_dim, generator=gen).to(dtype)
    high = draw(st.sampled_from([64, 2**16, 2**31 - 1]))
    shape = (seq,) if draw(st.booleans()) else (batch, seq)
    positions = torch.randint(0, high, shape, generator=gen)
    theta, _ = rope.inv_freq({"rope_theta": draw(st.floats(10.0, 1e6))}, rotary_dim)
    return q, k, positions, theta, head_dim


@given(problems(), layouts, st.sampled_from([1.0, 0.75, 1.2345]))
def test_matches_matrix_form_with_one_rounding(problem, layout, attention_factor):
    q, k, positions, theta, head_dim = problem
    q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, attention_factor=attention_factor)
    for x, out in ((q, q_out), (k, k_out)):
        assert out.dtype == x.dtype and out.shape == x.shape
        reference = rotate_by_matrix(x, positions, theta, layout=layout, attention_factor=attention_factor)
        assert_correctly_rounded(out, reference)


@given(problems(dtype=torch.float32), layouts)
def test_partial_rotary_leaves_the_tail_untouched(problem, layout):
    q, k, positions, theta, head_dim = problem
    rotary_dim = 2 * theta.numel()
    q_out, k_out = rope.apply_rotary(q, k, positions, theta, layout=layout, rotary_dim=rotary_dim)
    assert torch.equal(q_out[..., rotary_dim:], q[..., rotary_dim:])
    assert torch.equal(k_out[..., rotary_dim:], k[..., rotary_dim:])


@given(problems(dtype=torch.float64), layouts)
def test_matrix_complex_and_elementwise_forms_agree(problem, layout):
    q, _, positions, theta, _ = problem
    matrix = rotate_by_matrix(q, positions, theta, layout=layout)
    torch.testing.assert_close(rotate_by_complex(q, positions, theta, layout=layout), matrix, rtol=0, atol=1e-12)
    torch.testing.assert_close(rotate_elementwise(q, positions, theta, layout=layout), matrix, rtol=0, atol=1e-12)


@given(problems(dtype=torch.float64), layouts)
def test_conjugate_is_the_transpose_and_inverts(problem, layout):
    q, k, positions, theta, _ = problem
    q_rot, k_rot = rope.apply_rotary(q, k, positions, theta, layout=layout)
    q_back, k_back = rope.apply_rotary(q_rot, k_rot, positions, theta, layout=layout, conjugate=True)
    torch.testing.assert_close(q_back, q, rtol=0, atol=1e-12)
    torch.testing.assert_close(k_back, k, rtol=0, atol=1e-12)
    q_conj, _ = rope.apply_rotary(q, k, positions, theta, layout=layout, conjugate=True)
    grid = positions.expand(q.shape[0], q.shape[1]) if positions.dim() == 1 else positions
    mats = torch.stack([rotation_matrix(int(m), theta, head_dim=q.shape[-1], layout=layout) for m in grid.flatten()])
    expected = torch.einsum("bsji,bshj->bshi", mats.reshape(*grid.shape, *mats.shape[-2:]), q)
    torch.testing.assert_close(q_conj, expected, rtol=0, atol=1e-12)


@given(st.integers(0, 2**20), st.integers(0, 2**20), st.integers(1, 16), layouts)
def test_relative_property(m, n, pairs, layout):
    """R_m^T R_n = R_{n-m}, and R_m is orthogonal."""
    theta, _ = rope.inv_freq({}, 2 * pairs)
    r_m, r_n = rotation_matrix(m, theta, layout=layout), rotation_matrix(n, theta, layout=layout)
    torch.testing.assert_close(r_m.T @ r_n, rotation_matrix(n - m, theta, layout=layout), rtol=0, atol=1e-9)
    torch.testing.assert_close(r_m.T @ r_m, torch.eye(2 * pairs, dtype=torch.float64), rtol=0, atol=1e-12)


@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(1, 4), st.integers(0, 8), st.integers(0, 3),
       st.sampled_from(["first", "last"]))
def test_layouts_give_the_same_scores_after_weight_permutation(seed, heads, half_rotary, extra, seq, rotated):
    """A model trained with interleaved pairs, its q/k weights permuted, scores identically in half layout
    (the rotated block first or last in each head)."""
    gen = torch.Generator().manual_seed(seed)
    rotary_dim = 2 * half_rotary
    head_dim, hidden, seq = rotary_dim + 2 * extra, 12, seq + 2
    w_q = torch.randn(heads * head_dim, hidden, generator=gen, dtype=torch.float64)
    w_k = torch.randn(heads * head_dim, hidden, generator=gen, dtype=torch.float64)
    x = torch.randn(1, seq, hidden, generator=gen, dtype=torch.float64)
    positions = torch.randint(0, 10**6, (seq,), generator=gen)
    theta, _ = rope.inv_freq({}, rotary_dim)

    def scores(wq, wk, layout):
        q = (x @ wq.T).reshape(1, seq, heads, head_dim)
        k = (x @ wk.T).reshape(1, seq, heads, head_dim)
        q, k = rope.apply_rotary(q, k, positions, theta, layout=layout, rotary_dim=rotary_dim, rotated=rotated)
        return torch.einsum("bshd,bthd->bhst", q, k)

    converted = [rope.permute_qk_weight(w, heads, head_dim, to="half", rotary_dim=rotary_dim, rotated=rotated)
                 for w in (w_q, w_k)]
    torch.testing.assert_close(scores(*converted, "half"), scores(w_q, w_k, "interleaved"), rtol=1e-12, atol=1e-10)
    back = rope.permute_qk_weight(converted[0], heads, head_dim, to="interleaved", rotary_dim=rotary_dim,
                                  rotated=rotated)
    assert torch.equal(back, w_q)
    unrotated = torch.arange(head_dim - rotary_dim) + (rotary_dim if rotated == "first" else 0)
    rows = converted[0].reshape(heads, head_dim, hidden)[:, unrotated]
    assert torch.equal(rows, w_q.reshape(heads, head_dim, hidden)[:, unrotated])  # the unrotated rows stay


def test_gradients_are_the_conjugate_rotation():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 3, 2, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 3, 1, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    positions = torch.randint(0, 1000, (2, 3), generator=gen)
    theta, _ = rope.inv_freq({}, 6)
    assert torch.autograd.gradcheck(lambda a, b: rope.apply_rotary(a, b, positions, theta, rotary_dim=6), (q, k))


def _inputs():
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8)
    return q, k, torch.arange(4), rope.inv_freq({}, 8)[0]


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda q, k, p, f: (q, k, p.float(), f), TypeError, "positions must be an integer"),
        (lambda q, k, p, f: (q, k.double(), p, f), TypeError, "same dtype"),
        (lambda q, k, p, f: (q, k[:, :3], p, f), ValueError, "must agree"),
        (lambda q, k, p, f: (q[0], k, p, f), ValueError, r"q must have shape \[batch, seq, heads, head_dim\]"),
        (lambda q, k, p, f: (q, k, p[:3], f), ValueError, "positions must have shape"),
        (lambda q, k, p, f: (q.int(), k.int(), p, f), TypeError, "q must be float16"),
        (lambda q, k, p, f: (q, k, p, torch.cat([f, f])), ValueError, "rotary_dim 16 exceeds head_dim 8"),
        (lambda q, k, p, f: (q, k, p.to("meta"), f), ValueError, "positions is on meta"),
    ],
)
def test_bad_input_is_named(change, error, match):
    with pytest.raises(error, match=match):
        rope.apply_rotary(*change(*_inputs()))


def test_bad_options_are_named():
    q, k, p, f = _inputs()
    with pytest.raises(ValueError, match="layout must be"):
        rope.apply_rotary(q, k, p, f, layout="neox")
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        rope.apply_rotary(q, k, p, f[:2], rotary_dim=3)
    with pytest.raises(ValueError, match="attention_factor must be > 0"):
        rope.apply_rotary(q, k, p, f, attention_factor=-1.0)
    with pytest.raises(ValueError, match="inv_freq has 3 entries, expected rotary_dim/2 = 4"):
        rope.apply_rotary(q, k, p, f[:3], rotary_dim=8)
