"""Hostile calls of the public operators ``torch.ops.rope.rotary`` and ``torch.ops.rope.rotary_``.

Every bad argument is refused before the kernel runs, with a ``TypeError`` (wrong type) or
``ValueError`` (wrong value) naming it: eagerly, and while ``torch.compile`` traces (the fake
implementation sees the fake tensors of the trace). The arguments the dispatcher itself cannot
convert to the schema (a ``str`` flag, a ``float`` width) raise its ``RuntimeError``, which names
the argument too. Good edge cases (empty dimensions, strided views, packed qkv projections
rotated in place, overlapping inputs read out of place) match a float64 rotation whose cos and
sin come from mpmath, at the exact angle m theta_i with theta_i the float32 frequency.

Without a GPU the kernel runs in Triton's interpreter (tests/conftest.py): tiny shapes.
"""

import itertools
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("triton")

import rope.kernels.operators  # registers torch.ops.rope.rotary and torch.ops.rope.rotary_
from helpers import FLOAT_DTYPES, assert_device_assertion, exact_rotation, ulp, value_checks_assert_on
from rope.limits import KERNEL_SCALE_RANGE

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, SEQ, HEADS_Q, HEADS_K, HEAD_DIM, ROTARY_DIM = 2, 3, 2, 1, 8, 6
PAIRS = ROTARY_DIM // 2
OPERATORS = {"rotary": torch.ops.rope.rotary, "rotary_": torch.ops.rope.rotary_}


def frequencies(pairs: int = PAIRS, base: float = 1e4) -> torch.Tensor:
    """float32 theta_i = base^(-2i / 2 pairs) (RoFormer eq. 15)."""
    return (base ** (-torch.arange(pairs, dtype=torch.float64) / pairs)).float()


def good_call(seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    """Keyword arguments of a valid call of either operator, positions anywhere below 2^31."""
    gen = torch.Generator().manual_seed(seed)
    return dict(
        q=torch.randn(BATCH, SEQ, HEADS_Q, HEAD_DIM, generator=gen, dtype=torch.float64).to(DEVICE, dtype),
        k=torch.randn(BATCH, SEQ, HEADS_K, HEAD_DIM, generator=gen, dtype=torch.float64).to(DEVICE, dtype),
        positions=torch.randint(0, 2**31 - 1, (BATCH, SEQ), generator=gen).to(DEVICE),
        inv_freq=frequencies().to(DEVICE),
        interleaved=False, rotary_dim=ROTARY_DIM, scale=1.0, conjugate=False,
    )


def replace(**changes):
    """A change of a call: each argument set to a value, or to a function of the call."""
    return lambda call: {**call, **{name: new(call) if callable(new) else new for name, new in changes.items()}}


def mrope(axes, positions_shape=(3, BATCH, SEQ)):
    """An M-RoPE call: positions ``positions_shape``, ``axes`` one row per pair."""
    gen = torch.Generator().manual_seed(1)
    return replace(axes=axes, positions=lambda call: torch.randint(0, 2**31 - 1, positions_shape, generator=gen)
                   .to(DEVICE))


def _buffer(*shape) -> torch.Tensor:
    """A float32 tensor of distinct values 0, 1, 2, ... (a write into it shows)."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32, device=DEVICE).view(shape)


def _overlapping_rows(call):
    """q of the right shape whose heads start 4 elements apart, so that consecutive heads share 4."""
    storage = _buffer(BATCH * SEQ * HEADS_Q * HEAD_DIM)
    return storage.as_strided((BATCH, SEQ, HEADS_Q, HEAD_DIM), (SEQ * HEADS_Q * HEAD_DIM, HEADS_Q * HEAD_DIM, 4, 1))


def _packed(heads_q: int, k_start: int):
    """q = qkv[:, :, :heads_q] and k = qkv[:, :, k_start : k_start + HEADS_K] of one projection."""
    def change(call):
        qkv = _buffer(BATCH, SEQ, heads_q + HEADS_K + 2, HEAD_DIM)
        return {**call, "q": qkv[:, :, :heads_q], "k": qkv[:, :, k_start:k_start + HEADS_K]}
    return change


def _half_a_row_into_q(call):
    """k starting half a head into q's first head, in a buffer with room for two heads per head."""
    buffer = _buffer(BATCH, SEQ, HEADS_Q, 2 * HEAD_DIM)
    return {**call, "q": buffer[..., :HEAD_DIM], "k": buffer[:, :, :HEADS_K, HEAD_DIM // 2:HEAD_DIM // 2 + HEAD_DIM]}


_last_dim_stride_2 = lambda x: torch.cat((x, x), dim=-1)[..., ::2]  # noqa: E731
_axes = lambda values: torch.tensor(values).to(DEVICE)  # noqa: E731

# id: (change of a good call, exception, message, kind). Kinds: "metadata" is refused by the real
# and the fake implementations (so also while tracing), "values" only where the kernel would run
# (the real implementation: tensor values), "schema" by the dispatcher before either.
BAD_CALLS = {
    "q complex64": (replace(q=lambda c: c["q"].to(torch.complex64)), TypeError, "^q must be float16", "metadata"),
    "q int32": (replace(q=lambda c: c["q"].int()), TypeError, "^q must be float16", "metadata"),
    "q bool": (replace(q=lambda c: c["q"] > 0), TypeError, "^q must be float16", "metadata"),
    "q 3-D": (replace(q=lambda c: c["q"][0]), ValueError, r"^q must have shape \[batch", "metadata"),
    "k float64, q float32": (replace(k=lambda c: c["k"].double()), TypeError, "^k must have q's dtype", "metadata"),
    "k batch 1": (replace(k=lambda c: c["k"][:1]), ValueError, "^k must agree with q", "metadata"),
    "k seq 2": (replace(k=lambda c: c["k"][:, :2]), ValueError, "^k must agree with q", "metadata"),
    "k head_dim 6": (replace(k=lambda c: c["k"][..., :6]), ValueError, "^k must agree with q", "metadata"),
    "head_dim 1026": (replace(q=torch.zeros(BATCH, SEQ, 1, 1026, device=DEVICE),
                              k=torch.zeros(BATCH, SEQ, 1, 1026, device=DEVICE)),
                      ValueError, "^q and k: the kernel takes head_dim up to 1024", "metadata"),
    "k on meta": (replace(k=lambda c: c["k"].to("meta")), ValueError, "^k is on meta", "metadata"),
    "positions on meta": (replace(positions=lambda c: c["positions"].to("meta")), ValueError, "^positions is on meta",
                          "metadata"),
    "inv_freq on meta": (replace(inv_freq=lambda c: c["inv_freq"].to("meta")), ValueError, "^inv_freq is on meta",
                         "metadata"),
    "positions float32": (replace(positions=lambda c: c["positions"].float()), TypeError,
                          "^positions must be an integer tensor", "metadata"),
    "positions bool": (replace(positions=lambda c: c["positions"] > 2**30), TypeError,
                       "^positions must be an integer tensor", "metadata"),
    "positions [seq + 1]": (replace(positions=torch.arange(SEQ + 1, device=DEVICE)), ValueError,
                            r"^positions must have shape \[seq\]", "metadata"),
    "positions [seq - 1]": (replace(positions=torch.arange(SEQ - 1, device=DEVICE)), ValueError,
                            r"^positions must have shape \[seq\]", "metadata"),
    "positions [batch, seq + 1]": (replace(positions=torch.zeros(BATCH, SEQ + 1, dtype=torch.int64, device=DEVICE)),
                                   ValueError, r"^positions must have shape \[seq\]", "metadata"),
    "positions [1, seq]": (replace(positions=lambda c: c["positions"][:1]), ValueError,
                           r"^positions must have shape \[seq\]", "metadata"),
    "positions 0-D": (replace(positions=torch.tensor(5, device=DEVICE)), ValueError,
                      r"^positions must have shape \[seq\]", "metadata"),
    "positions [3, batch, seq] without axes": (replace(positions=torch.zeros(3, BATCH, SEQ, dtype=torch.int64,
                                                                            device=DEVICE)),
                                               ValueError, r"^positions must have shape \[seq\]", "metadata"),
    "inv_freq float64": (replace(inv_freq=lambda c: c["inv_freq"].double()), TypeError, "^inv_freq must be float32",
                         "metadata"),
    "inv_freq bfloat16": (replace(inv_freq=lambda c: c["inv_freq"].bfloat16()), TypeError,
                          "^inv_freq must be float32", "metadata"),
    "inv_freq int64": (replace(inv_freq=torch.ones(PAIRS, dtype=torch.int64, device=DEVICE)), TypeError,
                       "^inv_freq must be float32", "metadata"),
    "inv_freq 2-D": (replace(inv_freq=lambda c: c["inv_freq"][None]), ValueError, "^inv_freq must be 1-D",
                     "metadata"),
    "inv_freq short": (replace(inv_freq=lambda c: c["inv_freq"][:-1]), ValueError,
                       "^inv_freq must have rotary_dim / 2 = 3 entries, got 2", "metadata"),
    "inv_freq long": (replace(inv_freq=frequencies(PAIRS + 1).to(DEVICE)), ValueError,
                      "^inv_freq must have rotary_dim / 2 = 3 entries, got 4", "metadata"),
    "inv_freq NaN": (replace(inv_freq=lambda c: c["inv_freq"].index_fill(0, torch.tensor([1], device=DEVICE),
                                                                        float("nan"))),
                     ValueError, "^inv_freq must hold finite values", "values"),
    "inv_freq inf": (replace(inv_freq=lambda c: c["inv_freq"].index_fill(0, torch.tensor([0], device=DEVICE),
                                                                        float("inf"))),
                     ValueError, "^inv_freq must hold finite values", "values"),
    "inv_freq 2^16 (float32 math)": (replace(inv_freq=lambda c: c["inv_freq"] * 0 + 2.0**16), ValueError,
                                     "^inv_freq must hold values below 2", "values"),
    "inv_freq -1e30 (float32 math)": (replace(inv_freq=lambda c: c["inv_freq"] * 0 - 1e30),
                                      ValueError, "^inv_freq must hold values below 2", "values"),
    "positions 2^31 (float32 math)": (replace(positions=lambda c: c["positions"].index_fill(
        1, torch.tensor([1], device=DEVICE), 2**31)), ValueError, r"^positions must hold values in \(-2\^31, 2\^31\)",
        "values"),
    "positions -2^63 (float32 math)": (replace(positions=lambda c: c["positions"].index_fill(
        1, torch.tensor([2], device=DEVICE), -(2**63))), ValueError, r"^positions must hold values in \(-2\^31",
        "values"),
    "rotary_dim odd": (replace(rotary_dim=5), ValueError, "^rotary_dim must be even", "metadata"),
    "rotary_dim 0": (replace(rotary_dim=0), ValueError, "^rotary_dim must be even, >= 2", "metadata"),
    "rotary_dim negative": (replace(rotary_dim=-6), ValueError, "^rotary_dim must be even, >= 2", "metadata"),
    "rotary_dim > head_dim": (replace(rotary_dim=HEAD_DIM + 2, inv_freq=frequencies(HEAD_DIM // 2 + 1).to(DEVICE)),
                              ValueError, "^rotary_dim must be .* <= head_dim = 8, got 10", "metadata"),
    "rotary_dim True": (replace(rotary_dim=True), ValueError, "^rotary_dim must be even.*got 1$", "metadata"),
    "rotary_dim float": (replace(rotary_dim=6.0), RuntimeError, "for argument 'rotary_dim'", "schema"),
    "scale NaN": (replace(scale=float("nan")), ValueError, "^scale must be finite", "metadata"),
    "scale inf": (replace(scale=float("inf")), ValueError, "^scale must be finite", "metadata"),
    "scale -inf": (replace(scale=float("-inf")), ValueError, "^scale must be finite", "metadata"),
    "scale 0": (replace(scale=0.0), ValueError, "^scale must be > 0", "metadata"),
    "scale negative": (replace(scale=-1.0), ValueError, "^scale must be > 0", "metadata"),
    "scale above the kernel's range": (replace(scale=2 * KERNEL_SCALE_RANGE[1]), ValueError, "^scale must be <=",
                                       "metadata"),
    "scale below the kernel's range": (replace(scale=KERNEL_SCALE_RANGE[0] / 2), ValueError, "^scale must be >=",
                                       "metadata"),
    "scale str": (replace(scale="1"), RuntimeError, "for argument 'scale'", "schema"),
    "interleaved 'no'": (replace(interleaved="no"), RuntimeError, "for argument 'interleaved'", "schema"),
    "interleaved None": (replace(interleaved=None), RuntimeError, "for argument 'interleaved'", "schema"),
    "interleaved 0": (replace(interleaved=0), TypeError, "^interleaved must be a bool", "metadata"),
    "conjugate 1": (replace(conjugate=1), TypeError, "^conjugate must be a bool", "metadata"),
    "conjugate 1.0": (replace(conjugate=1.0), TypeError, "^conjugate must be a bool", "metadata"),
    "axes 2 entries": (mrope(_axes([0, 1])), ValueError, "^axes must have rotary_dim / 2 = 3 entries", "metadata"),
    "axes float": (mrope(_axes([0.0, 1.0, 2.0])), TypeError, "^axes must be an integer tensor", "metadata"),
    "axes bool": (mrope(_axes([False, True, True])), TypeError, "^axes must be an integer tensor", "metadata"),
    "axes 2-D": (mrope(_axes([[0, 1, 2]])), ValueError, "^axes must be 1-D", "metadata"),
    "axes on meta": (mrope(torch.tensor([0, 1, 2], device="meta")), ValueError, "^axes is on meta", "metadata"),
    "axes value 3": (mrope(_axes([0, 3, 1])), ValueError, r"^axes must hold values in \{0, 1, 2\}", "values"),
    "axes value -1": (mrope(_axes([0, -1, 1])), ValueError, r"^axes must hold values in \{0, 1, 2\}", "values"),
    "axes with positions [batch, seq]": (mrope(_axes([0, 1, 2]), (BATCH, SEQ)), ValueError,
                                         r"^positions \(M-RoPE position_ids\) must have shape \[3, seq\]", "metadata"),
    "axes with positions [3, seq + 1]": (mrope(_axes([0, 1, 2]), (3, SEQ + 1)), ValueError,
                                         r"^positions \(M-RoPE position_ids\) must have shape \[3, seq\]", "metadata"),
}

# Refused by rotary_ only: it writes what it reads. Out of place the same calls are fine.
BAD_IN_PLACE = {
    "q last-dimension stride 2": (replace(q=lambda c: _last_dim_stride_2(c["q"])), ValueError,
                                  "^in-place rotation needs q with a contiguous last dimension", "metadata"),
    "k last-dimension stride 2": (replace(k=lambda c: _last_dim_stride_2(c["k"])), ValueError,
                                  "^in-place rotation needs k with a contiguous last dimension", "metadata"),
    "k is q": (replace(k=lambda c: c["q"]), ValueError, "^q and k overlap in memory", "metadata"),
    "k a second view of q's bytes": (replace(k=lambda c: c["q"].as_strided(c["q"].shape, c["q"].stride())),
                                     ValueError, "^q and k overlap in memory", "metadata"),
    "packed qkv, k on q's last head": (_packed(HEADS_Q, HEADS_Q - 1), ValueError, "^q and k overlap in memory",
                                       "metadata"),
    "k half a head into q": (_half_a_row_into_q, ValueError, "^q and k overlap in memory", "metadata"),
    "k expanded over heads (stride 0)": (replace(k=lambda c: c["k"][:, :, :1].expand(BATCH, SEQ, 2, HEAD_DIM)),
                                         ValueError, "^k holds some elements more than once", "metadata"),
    "q expanded over batch (stride 0)": (replace(q=lambda c: c["q"][:1].expand(BATCH, SEQ, HEADS_Q, HEAD_DIM)),
                                         ValueError, "^q holds some elements more than once", "metadata"),
    "q heads 4 elements apart": (replace(q=_overlapping_rows), ValueError, "^q holds some elements more than once",
                                 "metadata"),
    "inv_freq inside q": (replace(inv_freq=lambda c: c["q"].view(-1)[:PAIRS]), ValueError,
                          "^q shares memory with inv_freq", "metadata"),
    "q requires grad": (replace(q=lambda c: c["q"].clone().requires_grad_()), ValueError, "^q requires grad: rotary_",
                        "metadata"),
    "k requires grad": (replace(k=lambda c: c["k"].clone().requires_grad_()), ValueError, "^k requires grad: rotary_",
                        "metadata"),
}


def _bad_calls(kinds):
    return [pytest.param(operator, *case, id=f"{operator}: {name}")
            for operator, table in (("rotary", BAD_CALLS), ("rotary_", {**BAD_CALLS, **BAD_IN_PLACE}))
            for name, case in table.items() if case[3] in kinds]


def call_bad(operator: str, name: str, compiled: bool = False):
    """``operator`` called with the bad call ``name`` (of BAD_CALLS or BAD_IN_PLACE), through
    torch.compile(fullgraph=True) with ``compiled``."""
    change = {**BAD_CALLS, **BAD_IN_PLACE}[name][0]
    call = change(good_call())
    if not compiled:
        return OPERATORS[operator](**call)
    tensors = {key: value for key, value in call.items() if isinstance(value, torch.Tensor)}
    options = {key: value for key, value in call.items() if not isinstance(value, torch.Tensor)}
    torch._dynamo.reset()
    compiled = torch.compile(lambda **tensors: OPERATORS[operator](**tensors, **options), fullgraph=True,
                             backend="aot_eager")
    return compiled(**tensors)


def _snapshot(call) -> dict:
    return {name: call[name].clone() for name in ("q", "k") if call[name].device.type != "meta"}


@pytest.mark.parametrize("operator, change, error, match, kind", _bad_calls({"metadata", "values", "schema"}))
def test_bad_argument_is_refused_naming_it(operator, change, error, match, kind):
    """Each bad call raises the policy's exception naming the argument, before anything is written;
    bad values on CUDA fail the documented device assertion instead (in a fresh process: it leaves
    the CUDA context unusable)."""
    if kind == "values" and value_checks_assert_on(DEVICE):
        name = next(name for name, case in BAD_CALLS.items() if case[0] is change)
        assert_device_assertion(f"import test_operators_hostile as t; t.call_bad({operator!r}, {name!r})")
        return
    call = change(good_call())
    before = _snapshot(call)
    with pytest.raises(error, match=match):
        OPERATORS[operator](**call)
    for name, value in before.items():
        assert torch.equal(call[name], value), f"{name} was written before the call was refused"


@pytest.mark.parametrize("operator, change, error, match, kind", _bad_calls({"metadata"}))
def test_bad_metadata_is_refused_while_tracing(operator, change, error, match, kind):
    """The fake implementation, which torch.compile and opcheck run on fake tensors (views of one
    buffer stay views of one fake buffer), refuses the same calls with the same messages."""
    call = change(good_call())
    with FakeTensorMode() as mode:
        fake = {name: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for name, v in call.items()}
        with pytest.raises(error, match=match):
            OPERATORS[operator](**fake)


def _raised(exception, error, match) -> bool:
    """Whether ``error`` with a message matching ``match`` is the exception or one of its causes
    (torch.compile wraps what a fake implementation raises in its own errors)."""
    while exception is not None:
        if isinstance(exception, error) and re.search(match, str(exception)):
            return True
        exception = exception.__cause__ or exception.__context__
    return False


@pytest.mark.parametrize("operator, name", [
    *((operator, name) for operator in OPERATORS
      for name in ("positions float32", "rotary_dim odd", "interleaved 0", "inv_freq short", "inv_freq NaN",
                   "axes value 3")),
    *(("rotary_", name) for name in ("k is q", "packed qkv, k on q's last head", "k expanded over heads (stride 0)")),
])
def test_torch_compile_refuses_bad_calls(operator, name):
    """Under torch.compile(fullgraph=True): metadata is refused while tracing (torch's error,
    caused by ours), values when the compiled graph runs the operator (ours, eagerly on the CPU)."""
    _, error, match, kind = {**BAD_CALLS, **BAD_IN_PLACE}[name]
    if kind == "values" and value_checks_assert_on(DEVICE):  # a fresh process: the failed assertion poisons CUDA
        assert_device_assertion(f"import test_operators_hostile as t; t.call_bad({operator!r}, {name!r}, True)")
        return
    with pytest.raises(Exception) as excinfo:
        call_bad(operator, name, compiled=True)
    assert _raised(excinfo.value, error, match), f"{excinfo.value!r} does not come from {error.__name__}: {match}"
    traced = isinstance(excinfo.value, torch._dynamo.exc.TorchDynamoException)
    assert traced == (kind == "metadata"), f"{name} refused {'while tracing' if traced else 'when run'}"


# The in-place overlap checks against brute force.

@st.composite
def strided_views(draw):
    """(q layout, k layout, head_dim): views of one storage, each a storage offset and the (size,
    stride) of batch, seq and heads (the last dimension contiguous); k shares q's batch and seq
    sizes, as the operators require. Half the layouts have any strides (most hold some element
    twice), half nest the dimensions in some order with gaps (none does; q and k may interleave)."""
    width = draw(st.integers(2, 5))
    batch_seq = [draw(st.integers(1, 4)) for _ in range(2)]

    def layout():
        sizes = [*batch_seq, draw(st.integers(1, 4))]
        if draw(st.booleans()):
            strides = [draw(st.integers(0, 12)) for _ in sizes]
        else:
            strides, extent = [0, 0, 0], width
            for d in draw(st.permutations(range(3))):
                strides[d] = extent + draw(st.integers(0, 3))
                extent = strides[d] * sizes[d]
        return draw(st.integers(0, 40)), list(zip(sizes, strides))

    return layout(), layout(), width


def _view(storage: torch.Tensor, layout, width: int) -> torch.Tensor:
    offset, dims = layout
    return storage.as_strided((*(n for n, _ in dims), width), (*(s for _, s in dims), 1), offset)


def _addresses(x: torch.Tensor) -> list[int]:
    """The storage index of every element of x, by enumeration."""
    return [x.storage_offset() + sum(i * s for i, s in zip(index, x.stride()))
            for index in itertools.product(*map(range, x.shape))]


def _overlap_refusal(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """What rotary_ must refuse first, found by enumerating addresses: q or k holding an element
    twice, then q and k sharing one; None for views it may rotate in place."""
    q_addresses, k_addresses = _addresses(q), _addresses(k)
    if len(set(q_addresses)) < q.numel():
        return "^q holds some elements more than once"
    if len(set(k_addresses)) < k.numel():
        return "^k holds some elements more than once"
    return "^q and k overlap in memory" if set(q_addresses) & set(k_addresses) else None


@given(strided_views())
def test_overlap_checks_are_exact(views):
    """On any strides rotary_ refuses q or k holding an element twice, and q and k sharing one,
    exactly when the enumeration of addresses says so (either way round). Checked on the fake
    implementation, which runs the real one's checks without launching the kernel."""
    q_layout, k_layout, width = views
    storage = torch.empty(max(offset + sum((n - 1) * s for n, s in dims) + width for offset, dims in views[:2]))
    views = _view(storage, q_layout, width), _view(storage, k_layout, width)
    for q, k in (views, views[::-1]):
        expected = _overlap_refusal(q, k)
        with FakeTensorMode() as mode:
            call = {name: mode.from_tensor(t) for name, t in
                    dict(q=q, k=k, positions=torch.zeros(q.shape[1], dtype=torch.int64),
                         inv_freq=torch.ones(1)).items()}
            if expected is None:
                torch.ops.rope.rotary_(**call, interleaved=False, rotary_dim=2, scale=1.0, conjugate=False)
                continue
            with pytest.raises(ValueError, match=expected):
                torch.ops.rope.rotary_(**call, interleaved=False, rotary_dim=2, scale=1.0, conjugate=False)


# Good edge cases, against the exact rotation.

def assert_rotated(out, x, positions, inv_freq, *, interleaved, scale=1.0, conjugate=False):
    """out is x rotated: within one ulp of out's dtype of the exact rotation plus the kernel's
    arithmetic, 2^-20 (float32 math: 16 float32 ulps) or 2^-44 (float64 inputs) of the length
    s |(x_a, x_b)| of the pair; loose for any accurate float32 cos and sin, far below the error of
    a wrong angle, pair or position. Coordinates past rotary_dim are copied exactly."""
    rotary_dim = 2 * inv_freq.shape[0]
    layout = "interleaved" if interleaved else "half"
    reference = exact_rotation(x, positions, inv_freq, layout=layout, attention_factor=scale, conjugate=conjugate)
    x64, out = x.to("cpu", torch.float64), out.to("cpu", torch.float64)
    pairs = (x64[..., :rotary_dim].unflatten(-1, (-1, 2)) if interleaved
             else x64[..., :rotary_dim].unflatten(-1, (2, -1)).transpose(-1, -2))
    length = scale * pairs.norm(dim=-1, keepdim=True)  # [..., pairs, 1]
    length = length.expand(*length.shape[:-1], 2)
    length = length.flatten(-2) if interleaved else length.transpose(-1, -2).flatten(-2)
    slack = 2.0**-44 if x.dtype == torch.float64 else 2.0**-20
    bound = ulp(reference[..., :rotary_dim], x.dtype) + slack * length
    error = (out[..., :rotary_dim] - reference[..., :rotary_dim]).abs()
    assert torch.all(error <= bound), f"{x.dtype}: error reaches {(error / bound).max().item():.3g} x the bound"
    assert torch.equal(out[..., rotary_dim:], x64[..., rotary_dim:]), "the tail changed"


def _rotate(operator, call):
    """The rotated (q, k) of a call: returned by rotary, written into q and k by rotary_."""
    if operator == "rotary":
        return OPERATORS[operator](**call)
    OPERATORS[operator](**call)
    return call["q"], call["k"]


def _strided_views(call):
    """q a transposed [batch, heads, seq, head_dim + 2] buffer, k a slice of a wider one (both
    last dimension contiguous only), positions every other column, inv_freq every other entry."""
    q_buffer = torch.zeros(BATCH, HEADS_Q, SEQ, HEAD_DIM + 2, dtype=call["q"].dtype, device=DEVICE)
    q_buffer[..., :HEAD_DIM] = call["q"].transpose(1, 2)
    k_buffer = torch.zeros(BATCH, SEQ, HEADS_K + 1, HEAD_DIM, dtype=call["k"].dtype, device=DEVICE)
    k_buffer[:, :, 1:] = call["k"]
    wide_positions = torch.stack((call["positions"], -call["positions"]), dim=-1).flatten(-2)
    return {**call, "q": q_buffer[..., :HEAD_DIM].transpose(1, 2), "k": k_buffer[:, :, 1:],
            "positions": wide_positions[:, ::2], "inv_freq": frequencies(2 * PAIRS).to(DEVICE)[::2]}


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_strided_views_rotate_exactly(operator, dtype):
    """Views whose only contiguous dimension is the last: the same rotation as the exact one,
    nothing written outside them."""
    call = _strided_views(good_call(seed=1, dtype=dtype))
    call.update(interleaved=dtype in (torch.float16, torch.float32), scale=0.75, conjugate=dtype == torch.bfloat16)
    q, k = call["q"].clone(), call["k"].clone()
    q_base, k_base = call["q"]._base.clone(), call["k"]._base.clone()
    q_out, k_out = _rotate(operator, call)
    options = dict(interleaved=call["interleaved"], scale=0.75, conjugate=call["conjugate"])
    for x, out in ((q, q_out), (k, k_out)):
        assert_rotated(out, x, call["positions"], call["inv_freq"], **options)
    assert torch.equal(call["q"]._base[..., HEAD_DIM:], q_base[..., HEAD_DIM:])
    assert torch.equal(call["k"]._base[:, :, :1], k_base[:, :, :1])


# Layouts of a fused qkv projection: (its shape, the q and k views of it).
PACKINGS = {
    "heads [q | k | v]": ((BATCH, SEQ, HEADS_Q + 2 * HEADS_K, HEAD_DIM),
                          lambda qkv: (qkv[:, :, :HEADS_Q], qkv[:, :, HEADS_Q:HEADS_Q + HEADS_K])),
    "[batch, seq, 3, heads, head_dim]": ((BATCH, SEQ, 3, HEADS_Q, HEAD_DIM), lambda qkv: (qkv[:, :, 0], qkv[:, :, 1])),
    "[batch, seq, heads, 3, head_dim]": ((BATCH, SEQ, HEADS_Q, 3, HEAD_DIM),
                                         lambda qkv: (qkv[..., 0, :], qkv[..., 1, :])),
}


@pytest.mark.parametrize("packing", PACKINGS)
def test_packed_qkv_views_rotate_in_place(packing):
    """q and k sliced from one projection share storage, and their address ranges interleave,
    yet no element: rotary_ rotates both exactly and leaves v alone."""
    shape, views = PACKINGS[packing]
    qkv = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    original = qkv.clone()
    q, k = views(qkv)
    call = {**good_call(seed=2), "q": q, "k": k}
    q_before, k_before = q.clone(), k.clone()
    OPERATORS["rotary_"](**call)
    for x, out in ((q_before, q), (k_before, k)):
        assert_rotated(out, x, call["positions"], call["inv_freq"], interleaved=False)
    v = torch.ones(shape, dtype=torch.bool, device=DEVICE)
    for view in views(v):
        view.fill_(False)
    assert torch.equal(qkv[v], original[v]), "v changed"


def test_out_of_place_reads_overlapping_inputs():
    """rotary only reads q and k: one buffer passed as both, or a stride-0 expanded k, is fine."""
    call = good_call(seed=3)
    expanded_k = call["k"][:, :, :1].expand(BATCH, SEQ, 3, HEAD_DIM)
    for q, k in ((call["q"], call["q"]), (call["q"], expanded_k)):
        q_out, k_out = OPERATORS["rotary"](**{**call, "q": q, "k": k})
        assert_rotated(q_out, q, call["positions"], call["inv_freq"], interleaved=False)
        assert_rotated(k_out, k, call["positions"], call["inv_freq"], interleaved=False)


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("shape", [(0, SEQ, HEADS_Q, HEADS_K), (BATCH, 0, HEADS_Q, HEADS_K), (BATCH, SEQ, 0, 0)])
def test_empty_tensors_launch_nothing(operator, shape, monkeypatch):
    """Batch, seq or heads 0: nothing to rotate, no launch; rotary returns empty tensors."""
    batch, seq, heads_q, heads_k = shape
    monkeypatch.setattr(rope.kernels.operators.triton_rotary, "launch", lambda *args, **kwargs: pytest.fail("launched"))
    call = {**good_call(), "q": torch.empty(batch, seq, heads_q, HEAD_DIM, device=DEVICE),
            "k": torch.empty(batch, seq, heads_k, HEAD_DIM, device=DEVICE),
            "positions": torch.zeros(batch, seq, dtype=torch.int64, device=DEVICE)}
    result = OPERATORS[operator](**call)
    if operator == "rotary":
        assert [tuple(t.shape) for t in result] == [tuple(call["q"].shape), tuple(call["k"].shape)]
    else:
        assert result is None


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize("empty", ["q", "k"])
def test_no_heads_on_one_side_rotates_the_other(operator, empty):
    """heads_q = 0 (or heads_k = 0): the other tensor is rotated exactly."""
    call = good_call(seed=4)
    call[empty] = call[empty][:, :, :0]
    other = "k" if empty == "q" else "q"
    before = call[other].clone()
    outputs = dict(zip("qk", _rotate(operator, call)))
    assert outputs[empty].shape == call[empty].shape
    assert_rotated(outputs[other], before, call["positions"], call["inv_freq"], interleaved=False)


def test_opcheck_and_one_graph_on_packed_qkv_in_place():
    """opcheck accepts the in-place operator on packed views, and torch.compile(fullgraph=True)
    traces it (the overlap check runs on the trace's fake views) to the eager result."""
    def rotate_packed(qkv, positions, inv_freq):
        torch.ops.rope.rotary_(qkv[:, :, :HEADS_Q], qkv[:, :, HEADS_Q:HEADS_Q + HEADS_K], positions, inv_freq,
                               True, ROTARY_DIM, 1.0, False)
        return qkv

    call = good_call(seed=5)
    qkv = torch.randn(PACKINGS["heads [q | k | v]"][0], generator=torch.Generator().manual_seed(5)).to(DEVICE)
    torch.library.opcheck(torch.ops.rope.rotary_.default, (qkv[:, :, :HEADS_Q], qkv[:, :, HEADS_Q:HEADS_Q + 1],
                                                            call["positions"], call["inv_freq"], True, ROTARY_DIM,
                                                            1.0, False))
    torch._dynamo.reset()
    compiled = torch.compile(rotate_packed, fullgraph=True, backend="aot_eager")
    expected = rotate_packed(qkv.clone(), call["positions"], call["inv_freq"])
    assert torch.equal(compiled(qkv.clone(), call["positions"], call["inv_freq"]), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_float64_math_takes_any_finite_frequency(dtype):
    """float-float math (float16 and bfloat16 q and k) and float64 math (float64) reduce any float32
    theta_i exactly (126-bit turns): the bound on frequencies of float32 math does not apply."""
    call = good_call(seed=6, dtype=dtype)
    call["inv_freq"] = torch.tensor([2.0**16, -1e30, 3e38], device=DEVICE)
    q_out, k_out = OPERATORS["rotary"](**call)
    for x, out in ((call["q"], q_out), (call["k"], k_out)):
        assert_rotated(out, x, call["positions"], call["inv_freq"], interleaved=False)
