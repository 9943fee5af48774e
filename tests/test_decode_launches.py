"""A call of the rotary operators launches one kernel and nothing else on the device.

The operators check the values of their tensors (rope/kernels/operators.py, "Checks"), which on
CUDA takes several small kernels per check; they check each tensor once and remember it by
identity and version counter, so that a decode step, which passes the same frequencies every
time, launches only the rotary kernel. Here a ``TorchDispatchMode`` records the ATen operators a
call runs and a wrapper around the kernel's launcher counts the Triton launches (the kernel runs
in Triton's interpreter on the CPU, whose own tensor copies inside the launch are not recorded).
Besides the one launch, only allocations and views may run: neither launches a kernel on CUDA.
A tensor written in place since its check is checked again, and a bad value there refused.

The launch size of few-token shapes (:func:`rope.kernels.triton_rotary.few_token_sizes`) is
checked against its rule, and rotating with it gives what the interpreter's sizes give.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

import rope.kernels.operators  # noqa: F401  (registers torch.ops.rope.rotary and torch.ops.rope.rotary_)
from helpers import value_checks_assert_on
from rope.kernels import triton_rotary

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA if DEVICE == "cuda" else torch._C.DispatchKey.CPU)
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class Recorder(TorchDispatchMode):
    """The ATen operators run under it (the rope operators' bodies included), and the Triton launches
    of ``triton_rotary``'s kernels, whose own operators (the interpreter's) are not recorded."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.ops, self.launches, self.launching = [], 0, False
        for name in ("rotary_kernel", "tuned_kernel"):
            monkeypatch.setattr(triton_rotary, name, _Counted(getattr(triton_rotary, name), self))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.launching:
            return func(*args, **kwargs)
        if func.namespace == "rope":  # run the operator's body under this mode too
            with self:
                return func.redispatch(BACKEND, *args, **kwargs)
        self.ops.append(func)
        return func(*args, **kwargs)

    def device_work(self) -> list[str]:
        """The recorded operators that are neither a view nor an allocation."""
        return [str(op) for op in self.ops if not (op.is_view or op._schema.name.split("::")[1] in ALLOCATIONS)]


class _Counted:
    """A kernel whose launches are counted, and whose operators the recorder skips."""

    def __init__(self, kernel, recorder):
        self.kernel, self.recorder = kernel, recorder

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.recorder.launches += 1
            self.recorder.launching = True
            try:
                return self.kernel[grid](*args, **kwargs)
            finally:
                self.recorder.launching = False
        return run


def decode_call(dtype=torch.bfloat16, batch=3, heads_q=4, heads_k=2, head_dim=16, seed=0, inv_freq=None):
    """A decode step: one token per sequence at its own position."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 1, heads_q, head_dim, generator=gen).to(DEVICE, dtype)
    k = torch.randn(batch, 1, heads_k, head_dim, generator=gen).to(DEVICE, dtype)
    if inv_freq is None:
        inv_freq = (1e4 ** (-torch.arange(head_dim // 2, dtype=torch.float64) / (head_dim // 2))).float().to(DEVICE)
    positions = torch.randint(0, 2**20, (batch, 1), generator=gen).to(DEVICE)
    return dict(q=q, k=k, positions=positions, inv_freq=inv_freq, interleaved=False, rotary_dim=head_dim, scale=1.0,
                conjugate=False)


@pytest.mark.parametrize("operator", ["rotary", "rotary_"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_decode_step_launches_one_kernel_once_its_tensors_are_checked(operator, dtype, monkeypatch):
    op = getattr(torch.ops.rope, operator)
    first = decode_call(dtype, seed=1)
    op(**first)  # checks the frequencies (and, float32 math, these positions)
    step = decode_call(dtype, seed=2, inv_freq=first["inv_freq"])
    step["positions"] = first["positions"] if dtype == torch.float32 else step["positions"]
    with Recorder(monkeypatch) as recorder:
        op(**step)
    assert recorder.launches == 1 and recorder.device_work() == [], recorder.device_work()


def test_new_positions_are_checked_in_float32_math_only(monkeypatch):
    """float32 math (float32 q and k) takes |m| < 2^31: fresh positions are checked; float64 math
    (float16, bfloat16) takes any int64 position, so a decode step checks nothing."""
    inv_freq = decode_call()["inv_freq"]
    for dtype, checked in ((torch.float32, True), (torch.bfloat16, False)):
        torch.ops.rope.rotary(**decode_call(dtype, seed=3, inv_freq=inv_freq))
        step = decode_call(dtype, seed=4, inv_freq=inv_freq)
        with Recorder(monkeypatch) as recorder:
            torch.ops.rope.rotary(**step)
        work = recorder.device_work()
        assert recorder.launches == 1 and bool(work) == checked, (dtype, work)
        checks = {"gt", "lt", "__and__", "all", "is_nonzero", "_assert_async"}  # the range check, eager or on CUDA
        assert {name.split(".")[1] for name in work} <= checks, work


def test_the_backward_pass_launches_one_kernel(monkeypatch):
    call = decode_call(torch.float32)
    torch.ops.rope.rotary(**call)
    q, k = call["q"].requires_grad_(), call["k"].requires_grad_()
    grads = torch.randn_like(q), torch.randn_like(k)
    with Recorder(monkeypatch) as recorder:
        outputs = torch.ops.rope.rotary(**call)
        torch.autograd.grad(outputs, (q, k), grads)
    assert recorder.launches == 2 and recorder.device_work() == [], recorder.device_work()


def test_m_rope_axes_are_checked_once(monkeypatch):
    call = decode_call(torch.bfloat16)
    call["positions"] = torch.randint(0, 2**20, (3, 3, 1), device=DEVICE)
    call["axes"] = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1], device=DEVICE)
    torch.ops.rope.rotary(**call)
    with Recorder(monkeypatch) as recorder:
        torch.ops.rope.rotary(**call)
    assert recorder.launches == 1 and recorder.device_work() == [], recorder.device_work()


def _refused(call, match):
    if value_checks_assert_on(DEVICE):
        pytest.skip("CUDA refuses by a device assertion, which ends the process (tests/test_operators_hostile.py)")
    with pytest.raises(ValueError, match=match):
        torch.ops.rope.rotary(**call)


@pytest.mark.parametrize("write", ["in place", "through a view", "new data"])
def test_a_checked_tensor_written_since_is_checked_again(write):
    call = decode_call(torch.float32)
    torch.ops.rope.rotary(**call)
    inv_freq = call["inv_freq"]
    if write == "in place":
        inv_freq[2] = float("nan")
    elif write == "through a view":
        inv_freq[1:][2] = float("inf")
    else:
        inv_freq.data = torch.full_like(inv_freq, 2.0**17)  # a new storage: a new address
    _refused(call, "inv_freq")
    positions = call["positions"]
    call["inv_freq"] = decode_call()["inv_freq"]
    torch.ops.rope.rotary(**call)
    positions[0, 0] = 2**31
    _refused(call, "positions")


def test_inference_tensors_are_checked_on_every_call(monkeypatch):
    """An inference tensor has no version counter: nothing tells that it was not written since."""
    with torch.inference_mode():
        call = decode_call(torch.bfloat16)
        torch.ops.rope.rotary(**call)
        with Recorder(monkeypatch) as recorder:
            torch.ops.rope.rotary(**call)
        finiteness = {"aten.isfinite.default", "aten.sum.default"}  # the CPU's check is one float64 sum
        assert recorder.launches == 1 and finiteness & set(recorder.device_work())
        call["inv_freq"][0] = float("nan")
        _refused(call, "inv_freq")


@pytest.mark.parametrize("processors", [40, 108, 132])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 64, 255])
@pytest.mark.parametrize("heads_q, heads_k", [(32, 8), (8, 8), (3, 1)])
def test_few_token_sizes_fill_the_sms_with_the_largest_head_blocks(tokens, heads_q, heads_k, processors):
    """One token per program; the head block is the largest power of two up to 16 (and to the heads)
    that still gives every SM a program, or 1; about two pairs per thread below 16 heads, eight at
    16 (64 pairs a head, a head_dim of 128)."""
    block_s, block_h, group, warps = triton_rotary.few_token_sizes(tokens, heads_q, heads_k, 64, processors)
    cap = min(16, 1 << (max(heads_q, heads_k) - 1).bit_length())  # 16, or the heads rounded up to a power of two

    def programs(h):
        return tokens * (-(-heads_q // h) - (-heads_k // h))

    assert (block_s, group) == (1, 1) and block_h in (1, 2, 4, 8, 16) and block_h <= cap
    assert block_h == 1 or programs(block_h) >= processors
    assert block_h == cap or programs(block_h * 2) < processors
    assert 32 * warps * max(2, block_h // 2) == block_h * 64  # pairs of the block = threads x pairs per thread
    assert (block_s, block_h, group, warps) in triton_rotary.few_token_launches()


def test_decode_on_an_h100_runs_a_program_per_head():
    """The decode shape of issue 27: one token, 32 query and 8 key heads of 128, 132 SMs: 40 programs of one warp."""
    assert triton_rotary.few_token_sizes(1, 32, 8, 64, 132) == (1, 1, 1, 1)
    assert triton_rotary.few_token_sizes(8, 32, 8, 64, 132) == (1, 2, 1, 2)  # 160 programs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_few_token_sizes_rotate_as_the_interpreters_sizes(dtype):
    """Each output is computed on its own: the launch sizes change nothing (the interpreter's own
    sizes, one program for all heads, against one and two heads a program)."""
    call = decode_call(dtype)
    expected = torch.ops.rope.rotary(**call)
    for block_h in (1, 2):
        q, k = call["q"], call["k"]
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        triton_rotary.launch(q, k, q_out, k_out, call["positions"], call["inv_freq"], interleaved=False,
                             rotary_dim=16, scale=1.0, conjugate=False, block_s=1, block_h=block_h, group=1,
                             num_warps=block_h)
        assert torch.equal(q_out, expected[0]) and torch.equal(k_out, expected[1])
