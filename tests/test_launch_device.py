"""Every Triton launch runs on its tensors' device (rope.kernels.triton_rotary.launch_device).

Triton launches on the *current* CUDA device: without a guard, tensors on cuda:1 while cuda:0 is
current would be handed to a kernel running on cuda:0. Each launcher therefore enters its tensors'
device around its launches. Here the guard is replaced by a recorder and each kernel by a wrapper
that notes the device entered when it is launched (then launches the real kernel): every launch of
every launcher must happen inside the guard, entered with q's device.
"""

import contextlib

import pytest
import torch

import rope

pytest.importorskip("triton")

from rope.kernels import (  # after the skip: these modules import Triton
    triton_attention,
    triton_attention_backward,
    triton_attention_decode,
    triton_rotary,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# module -> the names of the kernels its launcher launches
KERNELS = {
    triton_rotary: ("rotary_kernel", "tuned_kernel"),
    triton_attention: ("attention_forward_kernel",),
    triton_attention_backward: ("attention_dkdv_kernel", "attention_dq_kernel"),
    triton_attention_decode: ("attention_decode_kernel",),
}


class _Guard:
    """A stand-in for ``launch_device``: the devices entered, innermost last."""

    def __init__(self):
        self.entered = []

    @contextlib.contextmanager
    def __call__(self, x):
        self.entered.append(x.device)
        try:
            yield
        finally:
            self.entered.pop()


class _Watched:
    """A kernel whose launches note the device the guard has entered (None outside it)."""

    def __init__(self, kernel, guard, launches):
        self.kernel, self.guard, self.launches = kernel, guard, launches

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append(self.guard.entered[-1] if self.guard.entered else None)
            return self.kernel[grid](*args, **kwargs)
        return run


@pytest.fixture
def launches(monkeypatch):
    """The device entered at each kernel launch, in order."""
    guard, launches = _Guard(), []
    for module, names in KERNELS.items():
        if hasattr(module, "launch_device"):
            monkeypatch.setattr(module, "launch_device", guard)
        for name in names:
            monkeypatch.setattr(module, name, _Watched(getattr(module, name), guard, launches))
    return launches


def _attention_inputs(q_len=3):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, q_len, 2, 16, generator=gen)
    k, v = torch.randn(1, 9, 1, 16, generator=gen), torch.randn(1, 9, 1, 16, generator=gen)
    k_positions = torch.arange(9)
    theta = rope.inv_freq({}, 16)[0]
    return [t.to(DEVICE) for t in (q, k, v, k_positions[-q_len:], k_positions, theta)]


def test_the_rotary_launch_runs_under_the_tensors_device(launches):
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 3, h, 8, generator=gen).to(DEVICE) for h in (2, 1))
    positions = torch.arange(3).to(DEVICE)
    theta = rope.inv_freq({}, 8)[0].to(DEVICE)
    q_out, _ = rope.apply_rotary(q, k, positions, theta, backend="triton")
    assert launches == [q.device]
    assert torch.equal(q_out, rope.apply_rotary(q, k, positions, theta, backend="triton")[0])


def test_the_attention_launches_run_under_the_tensors_device(launches):
    q, k, v, q_positions, k_positions, theta = inputs = _attention_inputs()
    out, lse = triton_attention.launch(*inputs)
    assert launches == [q.device]
    triton_attention_backward.launch_backward(*inputs, out, lse, torch.ones_like(out))
    assert launches == [q.device] * 3  # the forward's, then the backward's two kernels
    triton_attention_decode.launch_decode(*inputs)
    assert launches == [q.device] * 4


def test_launch_device_enters_the_cuda_device_of_its_tensor(monkeypatch):
    """For a CUDA tensor the guard is torch.cuda.device(its device); for a CPU tensor nothing."""
    entered = []

    @contextlib.contextmanager
    def cuda_device(device):
        entered.append(device)
        yield

    monkeypatch.setattr(torch.cuda, "device", cuda_device)

    class OnSecondGpu:  # what the guard reads of a tensor on cuda:1
        is_cuda = True
        device = torch.device("cuda", 1)

    with triton_rotary.launch_device(OnSecondGpu()):
        assert entered == [torch.device("cuda", 1)]
    with triton_rotary.launch_device(torch.zeros(1)):
        pass
    assert entered == [torch.device("cuda", 1)]


@pytest.mark.parametrize("name", ["k", "v", "q_positions", "k_positions", "inv_freq"])
def test_attention_tensors_on_another_device_are_refused_by_name(name):
    arguments = dict(zip(["q", "k", "v", "q_positions", "k_positions", "inv_freq"], _attention_inputs()))
    arguments[name] = arguments[name].to("meta")
    for launcher in (triton_attention.launch, triton_attention_decode.launch_decode):
        with pytest.raises(ValueError, match=f"{name} is on meta but q is on {DEVICE}"):
            launcher(**arguments)


@pytest.mark.parametrize("name", ["k", "positions", "inv_freq"])
def test_rotary_tensors_on_another_device_are_refused_by_name(name):
    arguments = dict(q=torch.zeros(1, 3, 2, 8), k=torch.zeros(1, 3, 1, 8), positions=torch.arange(3),
                     inv_freq=rope.inv_freq({}, 8)[0])
    arguments = {key: t.to(DEVICE) for key, t in arguments.items()}
    arguments[name] = arguments[name].to("meta")
    with pytest.raises(ValueError, match=f"{name} is on meta but q is on {DEVICE}"):
        rope.apply_rotary(**arguments, backend="triton")


def test_backward_tensors_on_another_device_are_refused_by_name():
    inputs = _attention_inputs()
    out, lse = triton_attention.launch(*inputs)
    with pytest.raises(ValueError, match=f"grad_out is on meta but q is on {DEVICE}"):
        triton_attention_backward.launch_backward(*inputs, out, lse, torch.ones_like(out, device="meta"))
