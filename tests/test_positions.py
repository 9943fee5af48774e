"""Position ids for packed batches and context parallelism, and rotation through them."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import random_qk
from rope.positions import context_parallel_positions, packed_positions
from strategies import seeds

BACKEND = "triton" if rope.apply.HAS_TRITON else "torch"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel runs interpreted on CPU tensors


def rotate(q, k, positions, theta, **options):
    """rope.apply_rotary on DEVICE (the kernel where Triton is installed), result back on the CPU."""
    out = rope.apply_rotary(q.to(DEVICE), k.to(DEVICE), positions.to(DEVICE), theta.to(DEVICE),
                            backend=BACKEND, **options)
    return tuple(t.cpu() for t in out)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), seeds, st.booleans())
def test_packed_batch_equals_each_sequence_rotated_alone(lengths, seed, with_offsets):
    """The positions are what this checks; the rotation is the torch path's (the kernel's own
    packed-view tests are in test_operators_hostile.py)."""
    gen = torch.Generator().manual_seed(seed)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    offsets = torch.randint(0, 10**6, (len(lengths),), generator=gen) if with_offsets else None
    positions = packed_positions(cu_seqlens, offsets)
    expected = [(offsets[j].item() if with_offsets else 0) + t for j, n in enumerate(lengths) for t in range(n)]
    assert positions.tolist() == expected
    if not expected:
        return
    total = len(expected)
    q, k = random_qk(gen, 1, total, 3, 1, 8, dtype=torch.float32)
    theta, _ = rope.inv_freq({}, 8)
    q_out, k_out = rope.apply_rotary(q, k, positions, theta, backend="torch")
    for j in range(len(lengths)):
        lo, hi = cu_seqlens[j].item(), cu_seqlens[j + 1].item()
        start = offsets[j].item() if with_offsets else 0
        q_j, k_j = rope.apply_rotary(q[:, lo:hi], k[:, lo:hi], torch.arange(hi - lo) + start, theta, backend="torch")
        assert torch.equal(q_out[:, lo:hi], q_j) and torch.equal(k_out[:, lo:hi], k_j)


@pytest.mark.parametrize("zigzag", [False, True])
def test_context_parallel_shards_cover_the_sequence_once(zigzag):
    shards = [context_parallel_positions(24, 3, r, zigzag=zigzag) for r in range(3)]
    assert sorted(torch.cat(shards).tolist()) == list(range(24))
    if zigzag:  # causal load balance: every rank holds the same number of (query, key) pairs
        work = {int((s + 1).sum()) for s in shards}
        assert len(work) == 1


def _rank_main(rank, world_size, init_file, zigzag, result_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    gen = torch.Generator().manual_seed(1234)  # every rank draws the same full sequence
    seq = 16
    q, k = random_qk(gen, 2, seq, 4, 2, 16, dtype=torch.float32)
    theta, attention = rope.inv_freq({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}, 16)
    positions = context_parallel_positions(seq, world_size, rank, zigzag=zigzag)
    q_shard, k_shard = rotate(q[:, positions], k[:, positions], positions + 100, theta, attention_factor=attention)
    gathered = [torch.empty_like(q_shard) for _ in range(world_size)]
    dist.all_gather(gathered, q_shard)
    if rank == 0:
        order = torch.cat([context_parallel_positions(seq, world_size, r, zigzag=zigzag) for r in range(world_size)])
        sharded = torch.empty_like(q)
        sharded[:, order] = torch.cat(gathered, dim=1)
        full, _ = rotate(q, k, torch.arange(seq) + 100, theta, attention_factor=attention)
        torch.save({"sharded": sharded, "full": full}, result_file)
    dist.destroy_process_group()


@pytest.mark.slow  # two processes start and join a gloo group: about 7 s each
@pytest.mark.parametrize("zigzag", [False, True])
def test_context_parallel_rotation_equals_the_unsharded_one(zigzag, tmp_path):
    """Two CPU processes (gloo): each rotates its shard with its own positions; gathered, the
    result equals rotating the whole sequence at once."""
    result_file = tmp_path / "result.pt"
    mp.spawn(_rank_main, args=(2, str(tmp_path / "init"), zigzag, str(result_file)), nprocs=2, join=True)
    result = torch.load(result_file)
    assert result["sharded"].abs().max() > 0.1
    assert torch.equal(result["sharded"], result["full"])


def test_bad_positions_input_is_named():
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        packed_positions(torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="non-decreasing"):
        packed_positions(torch.tensor([0, 3, 2]))
    with pytest.raises(TypeError, match="cu_seqlens must be an integer tensor"):
        packed_positions(torch.tensor([0.0, 3.0]))
    with pytest.raises(ValueError, match="offsets must have one entry per sequence"):
        packed_positions(torch.tensor([0, 3, 5]), torch.tensor([1]))
    with pytest.raises(ValueError, match="must be a positive multiple of 4"):
        context_parallel_positions(10, 2, 0, zigzag=True)
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        context_parallel_positions(8, 2, 2)


INT64_MAX = 2**63 - 1


@given(st.lists(st.integers(0, 20), min_size=1, max_size=6), seeds)
def test_packed_positions_of_any_integer_dtype_are_the_int64_ones(lengths, seed):
    """cu_seqlens and offsets are read as int64 before any arithmetic: a narrow dtype gives the
    positions int64 gives (lengths are never computed, nor wrap, in the narrow dtype)."""
    gen = torch.Generator().manual_seed(seed)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])  # at most 120: fits int8
    offsets = torch.randint(0, 100, (len(lengths),), generator=gen)
    expected = [offsets[j].item() + t for j, n in enumerate(lengths) for t in range(n)]
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64):
        for given_offsets in (None, offsets.to(dtype)):
            got = packed_positions(cu_seqlens.to(dtype), given_offsets)
            assert got.dtype == torch.int64
            assert got.tolist() == (expected if given_offsets is not None else
                                    [t for n in lengths for t in range(n)])


@pytest.mark.parametrize("seed", range(4))
def test_narrow_cu_seqlens_that_decrease_are_refused(seed):
    """A decrease whose difference would wrap around in the narrow dtype (uint8 5 - 200 = 61) is
    still a decrease."""
    gen = torch.Generator().manual_seed(seed)
    high = int(torch.randint(129, 256, (1,), generator=gen))
    low = int(torch.randint(0, high - 128, (1,), generator=gen))  # high - low > 128: wraps in uint8 and int8 alike
    for cu in (torch.tensor([0, high, low], dtype=torch.uint8), torch.tensor([0, 100 * high, -100 * high],
                                                                              dtype=torch.int16)):
        with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
            packed_positions(cu)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), seeds)
def test_offsets_that_would_pass_int64_are_refused(lengths, seed):
    """The last token of sequence j is at offsets[j] + length_j - 1: up to the largest int64, and no
    further (no wrap to negative positions)."""
    gen = torch.Generator().manual_seed(seed)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    fits = torch.tensor([INT64_MAX - (n - 1) for n in lengths])
    got = packed_positions(cu_seqlens, fits)
    assert got.tolist() == [INT64_MAX - (n - 1) + t for n in lengths for t in range(n)]
    j = int(torch.randint(0, len(lengths), (1,), generator=gen))
    longer = [n + (i == j) for i, n in enumerate(lengths)]  # sequence j one token longer
    with pytest.raises(ValueError, match=rf"^offsets\[{j}\] = {fits[j].item()} puts the last"):
        packed_positions(torch.tensor([0, *torch.tensor(longer).cumsum(0).tolist()]), fits)
