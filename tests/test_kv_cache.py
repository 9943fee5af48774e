"""rope.attention.kv_cache: dynamic NTK with keys cached before rotation equals recomputing everything;
keys cached after rotation go stale once the base grows (transformers issue #25104)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import random_qk
from rope.attention.kv_cache import DynamicNTKKeyCache, current_length, dynamic_ntk_scores
from rope.reference import rotation_matrix
from strategies import layouts, seeds


def config(length, factor=4.0, base=10000.0):
    return {"rope_type": "dynamic", "factor": factor, "max_position_embeddings": length, "rope_theta": base}


def random_sequence(seed, total, *, heads_k=2, group=2, head_dim=8):
    return random_qk(torch.Generator().manual_seed(seed), 1, total, heads_k * group, heads_k, head_dim)


def decode(cache, q, k, prefill):
    """Prefill ``prefill`` tokens, then one token per step; yield (step end, logits)."""
    yield prefill, cache.step(q[:, :prefill], k[:, :prefill], torch.arange(prefill))
    for t in range(prefill, q.shape[1]):
        yield t + 1, cache.step(q[:, t : t + 1], k[:, t : t + 1], torch.tensor([t]))


@given(seeds, layouts, st.integers(4, 12), st.floats(1.5, 16.0))
def test_unrotated_cache_equals_recomputing_at_the_current_length(seed, layout, length, factor):
    total = 3 * length
    q, k = random_sequence(seed, total)
    cache = DynamicNTKKeyCache(config(length, factor), 8, store="unrotated", layout=layout)
    for end, scores in decode(cache, q, k, prefill=length // 2):
        start = end - scores.shape[2]
        reference = dynamic_ntk_scores(q[:, start:end], k[:, :end], torch.arange(start, end), torch.arange(end),
                                       config(length, factor), 8, layout=layout)
        assert scores.shape == (1, 4, end - start, end)
        torch.testing.assert_close(scores, reference, rtol=0, atol=1e-12)


@given(seeds, layouts, st.integers(4, 12))
def test_rotated_cache_is_exact_until_the_base_moves_then_stale(seed, layout, length):
    total = 3 * length
    q, k = random_sequence(seed, total)
    cache = DynamicNTKKeyCache(config(length), 8, store="rotated", layout=layout)
    for end, scores in decode(cache, q, k, prefill=length // 2):
        start = end - scores.shape[2]
        reference = dynamic_ntk_scores(q[:, start:end], k[:, :end], torch.arange(start, end), torch.arange(end),
                                       config(length), 8, layout=layout)
        error = (scores - reference).abs().max().item()
        if end <= length:
            assert error <= 1e-12
        else:
            # the newest key shares the query's base; older keys keep older bases
            torch.testing.assert_close(scores[..., -1], reference[..., -1], rtol=0, atol=1e-12)
            assert error > 1e-6


@given(seeds, layouts)
def test_rotated_cache_keeps_each_key_at_the_base_of_its_step(seed, layout):
    length, total, head_dim = 6, 15, 8
    q, k = random_sequence(seed, total, heads_k=1, group=1, head_dim=head_dim)
    cache = DynamicNTKKeyCache(config(length), head_dim, store="rotated", layout=layout)
    *_, (end, scores) = decode(cache, q, k, prefill=3)
    def theta(seq_len):
        return rope.inv_freq(config(length), head_dim, seq_len=seq_len)[0]
    query = rotation_matrix(total - 1, theta(total), layout=layout) @ q[0, -1, 0]
    for n in range(total):
        step_length = max(n + 1, 3)  # the prefill step saw positions 0..2
        key = rotation_matrix(n, theta(step_length), layout=layout) @ k[0, n, 0]
        assert abs(scores[0, 0, 0, n].item() - (query @ key).item()) <= 1e-12


def test_the_stale_error_grows_with_the_length():
    length = 16
    q, k = random_sequence(11, 6 * length)
    stale = DynamicNTKKeyCache(config(length), 8, store="rotated")
    fresh = DynamicNTKKeyCache(config(length), 8, store="unrotated")
    pairs = zip(decode(stale, q, k, length), decode(fresh, q, k, length))
    gaps = [(a - b).abs().max().item() for (_, a), (_, b) in pairs]
    assert gaps[0] == 0
    assert max(gaps[-length:]) > 10 * max(gaps[1:3])


def test_bad_arguments_are_named():
    q, k = random_sequence(0, 4)
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        DynamicNTKKeyCache({"rope_type": "default"}, 8)
    with pytest.raises(ValueError, match="factor"):
        DynamicNTKKeyCache({"rope_type": "dynamic", "max_position_embeddings": 8}, 8)
    with pytest.raises(ValueError, match="store"):
        DynamicNTKKeyCache(config(8), 8, store="both")
    with pytest.raises(ValueError, match="layout"):
        DynamicNTKKeyCache(config(8), 8, layout="gptj")
    with pytest.raises(ValueError, match="head_dim"):
        DynamicNTKKeyCache(config(8), 0)
    cache = DynamicNTKKeyCache(config(8), 8)
    with pytest.raises(TypeError, match="positions"):
        cache.step(q, k, torch.arange(4.0))
    with pytest.raises(ValueError, match="positions"):
        cache.step(q, k, torch.arange(3))
    with pytest.raises(ValueError, match="head_dim 6"):
        DynamicNTKKeyCache(config(8), 6).step(q, k, torch.arange(4))
    cache.step(q, k, torch.arange(4))
    with pytest.raises(ValueError, match="cached keys"):
        cache.step(q[:, :1, :1], k[:, :1, :1], torch.tensor([4]))


def test_negative_positions_are_refused_naming_them():
    """Dynamic NTK's length l = max(position) + 1 counts tokens from position 0: a negative position
    is refused naming its argument (it surfaced as inv_freq's "seq_len must be >= 1"), and a
    refused step appends nothing."""
    q, k = random_sequence(1, 3)
    cache = DynamicNTKKeyCache(config(8), 8)
    with pytest.raises(ValueError, match=r"^positions must hold positions >= 0 .*got -3"):
        cache.step(q, k, torch.tensor([-3, -2, -1]))
    assert cache.keys is None and cache.positions.numel() == 0
    with pytest.raises(ValueError, match="^q_positions must hold positions >= 0"):
        dynamic_ntk_scores(q, k, torch.tensor([-1, 0, 1]), torch.arange(3), config(8), 8)
    with pytest.raises(ValueError, match="^k_positions must hold positions >= 0"):
        dynamic_ntk_scores(q, k, torch.arange(3), torch.tensor([0, -5, 1]), config(8), 8)
    with pytest.raises(TypeError, match="^q_positions"):
        dynamic_ntk_scores(q, k, [0, 1, 2], torch.arange(3), config(8), 8)


@pytest.mark.parametrize("positions, error, message", [
    ([[0, 1, 2]], TypeError, r"^positions\[0\] must be a torch.Tensor"),
    ([torch.tensor([1.5])], TypeError, r"^positions\[0\] must be an integer tensor"),
    ([torch.arange(3), torch.tensor([-5])], ValueError, r"^positions\[1\] must hold positions >= 0 .*got -5"),
    ([torch.tensor([[3, 4]])], ValueError, r"^positions\[0\] must be 1-D"),
])
def test_current_length_refuses_what_has_no_length_naming_it(positions, error, message):
    """l = max(position) + 1 counts tokens from position 0: a list, float positions, a negative
    position or a 2-D tensor is refused naming it (they gave an AttributeError, l = 2 for 1.5 and
    l = -4 for -5)."""
    with pytest.raises(error, match=message):
        current_length(*positions)


def test_current_length_counts_from_position_zero():
    """l = max + 1 over every tensor, at the int64 extremes too; 1 with no token at all."""
    top = 2**63 - 1
    assert current_length() == 1 == current_length(torch.zeros(0, dtype=torch.int64))
    assert current_length(torch.tensor([3, 0]), torch.tensor([top, 7])) == 2**63
    assert current_length(torch.tensor([4], dtype=torch.uint8)) == 5


@pytest.mark.parametrize("length, error", [(0, ValueError), (-1, ValueError), (2**63 + 1, ValueError),
                                            (1.5, TypeError), ("3", TypeError), (True, TypeError)])
def test_the_frequencies_name_their_length(length, error):
    """DynamicNTKKeyCache.frequencies(length) refuses a length outside [1, 2^63] naming ``length``
    (it surfaced as inv_freq's ``seq_len``, an argument the caller never passed)."""
    with pytest.raises(error, match="^length must"):
        DynamicNTKKeyCache(config(8), 8).frequencies(length)


@pytest.mark.parametrize("q_len, k_len", [(0, 0), (0, 3), (3, 0)])
def test_no_query_or_no_key_gives_the_empty_logits(q_len, k_len):
    """As rope.attention.rerope.rotary_scores: the logits of q_len queries and k_len keys, empty."""
    q, k = random_sequence(2, 3)
    scores = dynamic_ntk_scores(q[:, :q_len], k[:, :k_len], torch.arange(q_len), torch.arange(k_len), config(8), 8)
    assert scores.shape == (1, 4, q_len, k_len) and scores.dtype == torch.float64


def test_head_dim_must_be_the_heads():
    """A head_dim other than q's and k's is refused naming it: larger, the frequencies' rotary_dim
    would be refused naming inv_freq; smaller, q would be rotated with another head size's
    frequencies, silently."""
    q, k = random_sequence(3, 4)  # head_dim 8
    with pytest.raises(ValueError, match="head_dim 16"):
        DynamicNTKKeyCache(config(8), 16).step(q, k, torch.arange(4))
    for head_dim in (4, 16):
        with pytest.raises(ValueError, match=f"head_dim {head_dim}"):
            dynamic_ntk_scores(q, k, torch.arange(4), torch.arange(4), config(8), head_dim)
    with pytest.raises(ValueError, match="head_dim 8, got k"):
        dynamic_ntk_scores(q, k[..., :4], torch.arange(4), torch.arange(4), config(8), 8)


def test_the_cache_stays_on_the_device_of_q():
    """Positions (given as int32 here) are kept as int64 on q's device with the keys, and no step
    moves anything to the CPU: on CUDA positions, frequencies and cache stay with q."""
    import inspect

    assert ".cpu()" not in inspect.getsource(DynamicNTKKeyCache.step)
    q, k = random_sequence(4, 10)
    cache = DynamicNTKKeyCache(config(4), 8)
    reference = DynamicNTKKeyCache(config(4), 8)
    for start, end in ((0, 6), (6, 7), (7, 10)):
        positions = torch.arange(start, end)
        got = cache.step(q[:, start:end], k[:, start:end], positions.to(torch.int32))
        torch.testing.assert_close(got, reference.step(q[:, start:end], k[:, start:end], positions), rtol=0, atol=0)
        assert cache.positions.dtype == torch.int64 and cache.positions.device == q.device
        assert cache.keys.device == q.device and torch.equal(cache.positions, torch.arange(end))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("store", ["unrotated", "rotated"])
def test_the_cache_on_cuda_equals_the_cpu_one(store):
    q, k = random_sequence(5, 12)
    caches = {device: DynamicNTKKeyCache(config(4), 8, store=store) for device in ("cpu", "cuda")}
    for start, end in ((0, 5), (5, 6), (6, 12)):
        positions = torch.arange(start, end)
        cpu = caches["cpu"].step(q[:, start:end], k[:, start:end], positions)
        cuda = caches["cuda"].step(q[:, start:end].cuda(), k[:, start:end].cuda(), positions)  # positions moved
        assert cuda.device.type == "cuda" and caches["cuda"].positions.device.type == "cuda"
        torch.testing.assert_close(cuda.cpu(), cpu, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="cached keys are on cuda"):
        caches["cuda"].step(q[:, :1], k[:, :1], torch.tensor([12]))
