"""rope.attention.logn against the formula in plain Python, and softmax_entropy against its definition."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rope.attention import logn
from strategies import seeds


@given(seeds, st.integers(2, 10**6))
def test_logn_scale_matches_the_formula(seed, training_length):
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4 * training_length, (3, 5), generator=gen)
    scale = logn.logn_scale(positions, training_length)
    assert scale.dtype == torch.float64 and scale.shape == (3, 5)
    expected = [max(1.0, math.log(m + 1) / math.log(training_length)) for m in positions.flatten().tolist()]
    torch.testing.assert_close(scale.flatten(), torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)


@given(st.integers(2, 10**5))
def test_logn_scale_is_one_up_to_the_training_length_and_grows_beyond(training_length):
    positions = torch.arange(3 * training_length) if training_length < 5000 else torch.tensor(
        [0, training_length - 2, training_length - 1, training_length, 3 * training_length]
    )
    scale = logn.logn_scale(positions, training_length)
    inside = positions + 1 <= training_length
    assert bool((scale[inside] == 1).all())
    assert bool((scale[~inside] > 1).all())
    assert bool((scale[1:] >= scale[:-1]).all())
    # n = L^2 keys: the factor is exactly 2 up to rounding
    square = logn.logn_scale(torch.tensor([training_length**2 - 1]), training_length)
    assert abs(square.item() - 2.0) < 1e-14


def test_logn_scale_rejects_bad_input():
    with pytest.raises(TypeError, match="positions"):
        logn.logn_scale(torch.tensor([1.0, 2.0]), 512)
    with pytest.raises(TypeError, match="positions"):
        logn.logn_scale([1, 2], 512)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        logn.logn_scale(torch.tensor([3, -1]), 512)
    with pytest.raises(ValueError, match="training_length"):
        logn.logn_scale(torch.tensor([3]), 1)
    with pytest.raises(TypeError, match="training_length"):
        logn.logn_scale(torch.tensor([3]), 512.0)


@given(seeds, st.integers(1, 50), st.floats(0.1, 30.0))
def test_softmax_entropy_matches_the_definition(seed, n, spread):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, n, generator=gen, dtype=torch.float64) * spread
    entropy = logn.softmax_entropy(logits)
    for row, h in zip(logits.tolist(), entropy.tolist()):
        top = max(row)
        weights = [math.exp(x - top) for x in row]
        total = sum(weights)
        expected = -sum(w / total * math.log(w / total) for w in weights if w > 0)
        assert abs(h - expected) <= 1e-12 * (1 + abs(expected)) + 1e-12 * spread
        assert -1e-12 <= h <= math.log(n) + 1e-12


def test_softmax_entropy_ignores_masked_keys_and_rejects_bad_input():
    logits = torch.tensor([[0.3, -1.2, float("-inf"), 2.0]], dtype=torch.float64)
    torch.testing.assert_close(logn.softmax_entropy(logits), logn.softmax_entropy(logits[:, [0, 1, 3]]))
    with pytest.raises(TypeError, match="logits"):
        logn.softmax_entropy(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="logits"):
        logn.softmax_entropy(torch.empty(3, 0))
