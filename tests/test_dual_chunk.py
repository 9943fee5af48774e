"""rope.attention.dual_chunk against a loop over the paper's definitions (An et al. 2024, section 3)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rope.attention.dual_chunk import dual_chunk_relative_positions


@st.composite
def settings(draw):
    chunk = draw(st.integers(1, 12))
    window = draw(st.integers(0, chunk))
    k_len = draw(st.integers(1, 60))
    q_len = draw(st.integers(1, k_len))
    return q_len, k_len, chunk, window


def dca_loop(q_len, k_len, s, w):
    """M[i][j] = P_q[i] - P_k[j] with the paper's three query position lists, c = s + w."""
    c = s + w
    key = [j % s for j in range(k_len)]
    intra = [i % s for i in range(k_len)]                                    # Eq. 2
    successive = [([s + t for t in range(w)] + [c - 1] * (s - w))[i % s] for i in range(k_len)]  # Eq. 7
    inter = [c - 1] * k_len                                                  # Eq. 5
    rows = []
    for i in range(k_len - q_len, k_len):
        row = []
        for j in range(k_len):
            if j > i:
                row.append(i - j)
            elif i // s == j // s:
                row.append(intra[i] - key[j])
            elif i // s - j // s == 1:
                row.append(successive[i] - key[j])
            else:
                row.append(inter[i] - key[j])
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64)


@given(settings())
def test_matches_the_paper_definitions(case):
    q_len, k_len, chunk, window = case
    m = dual_chunk_relative_positions(q_len, k_len, chunk_size=chunk, local_window=window)
    assert m.dtype == torch.int64 and m.shape == (q_len, k_len)
    assert torch.equal(m, dca_loop(q_len, k_len, chunk, window))


@given(settings())
def test_same_chunk_pairs_and_the_local_window_keep_true_distances(case):
    q_len, k_len, s, w = case
    m = dual_chunk_relative_positions(q_len, k_len, chunk_size=s, local_window=w)
    i = torch.arange(k_len - q_len, k_len)[:, None]
    j = torch.arange(k_len)[None, :]
    true = (i - j).expand_as(m)
    same_chunk = (i // s == j // s).expand_as(m)
    assert torch.equal(m[same_chunk], true[same_chunk])
    window_pairs = ((i // s - j // s == 1) & (i % s < w)).expand_as(m)
    assert torch.equal(m[window_pairs], true[window_pairs])
    future = (j > i).expand_as(m)
    assert torch.equal(m[future], true[future])


@given(settings())
def test_causal_positions_stay_below_the_pretraining_length(case):
    q_len, k_len, s, w = case
    m = dual_chunk_relative_positions(q_len, k_len, chunk_size=s, local_window=w)
    i = torch.arange(k_len - q_len, k_len)[:, None]
    j = torch.arange(k_len)[None, :]
    causal = (j <= i).expand_as(m)
    assert m[causal].min() >= 0 and m[causal].max() <= s + w - 1
    # inter-chunk pairs lie in [c - s, c - 1] (Eq. 6)
    inter = (i // s - j // s >= 2).expand_as(m)
    if inter.any():
        assert m[inter].min() >= w and m[inter].max() <= s + w - 1


def test_long_sequences_reach_the_bound_that_plain_positions_exceed():
    s, w, n = 6, 4, 64
    m = dual_chunk_relative_positions(n, n, chunk_size=s, local_window=w)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert m[causal].max().item() == s + w - 1 and m[causal].min().item() == 0
    assert (torch.arange(n)[:, None] - torch.arange(n)[None, :])[causal].max().item() == n - 1 > s + w - 1


@given(settings())
def test_decoding_rows_are_the_last_rows_of_the_full_matrix(case):
    q_len, k_len, s, w = case
    full = dual_chunk_relative_positions(k_len, k_len, chunk_size=s, local_window=w)
    tail = dual_chunk_relative_positions(q_len, k_len, chunk_size=s, local_window=w)
    assert torch.equal(tail, full[k_len - q_len :])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="local_window must be <= chunk_size"):
        dual_chunk_relative_positions(4, 4, chunk_size=3, local_window=4)
    with pytest.raises(ValueError, match="local_window"):
        dual_chunk_relative_positions(4, 4, chunk_size=3, local_window=-1)
    with pytest.raises(ValueError, match="chunk_size"):
        dual_chunk_relative_positions(4, 4, chunk_size=0, local_window=0)
    with pytest.raises(TypeError, match="chunk_size"):
        dual_chunk_relative_positions(4, 4, chunk_size=3.0, local_window=1)
    with pytest.raises(ValueError, match="q_len must be <= k_len"):
        dual_chunk_relative_positions(5, 4, chunk_size=3, local_window=1)
    with pytest.raises(ValueError, match="k_len"):
        dual_chunk_relative_positions(1, 0, chunk_size=3, local_window=1)
