"""Applying the rotation: y = R_m x for every token and head, the production torch path.

For pair i = (x_a, x_b) of a head at position m, with angle m * theta_i (RoFormer eq. 34)::

    y_a = s (x_a cos(m theta_i) - x_b sin(m theta_i))
    y_b = s (x_b cos(m theta_i) + x_a sin(m theta_i))

with s the attention factor; the pairs are those of the first ``rotary_dim`` coordinates of a
head, or with ``rotated="last"`` of the last (DeepSeek-V4, :mod:`rope.layouts`), and the
other coordinates pass through unchanged. M-RoPE
(:mod:`rope.mrope`) is the same rotation with a position per pair: pair i turns by
p_a(i) theta_i, p_a(i) row ``axes[i]`` (t, h or w) of the position ids. :func:`apply_rotary` and
:func:`rope.mrope.apply_mrope` are one path, :func:`rotate_qk`: the checks, then the fused kernel
or the torch path.

Exactness. theta_i is a float32 number and m an integer, so the angle is reduced modulo 2 pi
exactly (:func:`rope.angles.cos_sin`: 126-bit fixed-point turns), cos and sin are within 2^-52,
and the products are float64, rounded once to the input dtype. Every output is within half an
ulp of its dtype from the exact value plus at most 2^-50 s ``|(x_a, x_b)|``, at every int64 position
(tests/test_apply_exactness.py checks this against mpmath). The usual recipe (float32 product,
float32 cos) is off by about 0.06 in cos at position 2^20.

Gradients. The backward of y = s R_m x is dx = s R_m^T dy: the same rotation with the sines
negated, computed and rounded once in the same way (:class:`_Rotation`), in every dtype.

Overflow. An output beyond its dtype's range is +-inf, never NaN: where float64 itself could
overflow (float64 inputs, or attention factors above 2^512) each pair is scaled by a power of two
first, which is exact.

Speed. On the CPU the angles below 2^29 are exact float64 products m theta_i with torch's own
cos and sin (:func:`rope.angles.cos_sin`), and the rotation is one pass over memory in the CPU
kernel of :mod:`rope.cpu` (compiled on first use where a C compiler is; torch operations block by
block elsewhere, :mod:`rope.rotation`); a decoding step's angles and both rotations are one call
of that kernel. Prefills and decoding steps run faster than transformers' float32 recipe, in
float32 and bfloat16, with one thread and with all (``rope/data/bench_torch_path.md``, written by
``benchmarks/bench_torch_path.py``).

Devices without float64 (Apple's MPS) take a float32 route: the same exact turns in integer
arithmetic, float32 cos/sin of the reduced angle and float32 products, the accuracy of the
Triton kernel's float32 math. On CUDA the fused Triton kernel (:mod:`rope.kernels.operators`)
runs instead, in one launch.

No check waits for the device: the checks of tensor values (finite frequencies, M-RoPE axes) are
asynchronous device assertions on CUDA (:func:`rope._checks.assert_values`), and no code of either
path here reads a CUDA tensor's values on the host (tests/test_mrope.py forces this on the CPU).
"""

from __future__ import annotations

import importlib.util

import torch

from . import _checks
from .angles import EXACT_PRODUCT_POSITIONS, cos_sin, cos_sin_of_checked
from .cpu import rotary as cpu_rotary
from .layouts import LAYOUTS, ROTATED
from .limits import KERNEL_MAX_HEAD_DIM, KERNEL_SCALE_RANGE, MIN_ATTENTION_FACTOR, MROPE_AXES
from .rotation import BLOCK_ELEMENTS, rotate_small, rotate_tensors

BACKENDS = ("auto", "torch", "triton")
HAS_TRITON = importlib.util.find_spec("triton") is not None
DEVICES_WITHOUT_FLOAT64 = ("mps",)
_SAFE_FACTOR = 2.0**512  # below it, float64 products of float32-range inputs cannot overflow


def _check_positions(positions, batch: int, seq: int, *, mrope: bool) -> None:
    """Integer positions ``[seq]`` or ``[batch, seq]``; with ``mrope``, ``position_ids`` ``[3, seq]``
    or ``[3, batch, seq]`` (rows t, h, w)."""
    name, rows = ("position_ids", (len(MROPE_AXES),)) if mrope else ("positions", ())
    _checks.integer_tensor(name, positions)
    shapes = ((*rows, seq), (*rows, batch, seq))
    if tuple(positions.shape) not in shapes:
        short, full = (f"[{', '.join([*map(str, rows), *dims])}]" for dims in (("seq",), ("batch", "seq")))
        rows_are = " (rows t, h, w)" if mrope else ""
        raise ValueError(f"{name} must have shape {short} = {list(shapes[0])} or {full} = {list(shapes[1])}"
                         f"{rows_are}, got {tuple(positions.shape)}")


def check_axes(axes, pairs: int, *, values: bool = True) -> None:
    """M-RoPE axes: an integer tensor ``[pairs]`` (on any device), with ``values`` also each in
    {0, 1, 2}, through :func:`rope._checks.assert_values` (an eager ``ValueError`` off CUDA, an
    asynchronous device assertion on CUDA and under torch.compile: no host synchronisation).

    Args:
        axes: the axis of each pair (0, 1, 2: rows t, h, w of the position ids), integer ``[pairs]``.
        pairs: the number of rotated pairs, rotary_dim/2.
        values: also check the values, not only the dtype and shape.
    """
    _checks.integer_tensor("axes", axes, dim=1)
    expected = f"{pairs} values in {{0, 1, 2}} (one per pair)"
    if axes.shape[0] != pairs:
        raise ValueError(f"axes must hold {expected}, got {axes.shape[0]} values")
    if values:
        _checks.assert_values("axes", ((axes >= 0) & (axes < len(MROPE_AXES))).all(), expected)


def check_inputs(q, k, positions, inv_freq, rotary_dim, *, axes=None, values: bool = True) -> int:
    """Validate the tensors of a rotation (shapes, dtypes, devices; with ``values``, the values of
    the frequencies and axes too) and return the rotary width.

    q ``[batch, seq, heads_q, head_dim]`` and k ``[batch, seq, heads_k, head_dim]`` of one floating
    dtype; positions integer ``[seq]`` or ``[batch, seq]``, or with M-RoPE ``axes`` the position
    ids ``[3, seq]`` or ``[3, batch, seq]`` (:func:`check_axes`); inv_freq the rotary_dim/2
    frequencies (:func:`rope._checks.finite_frequencies`), not requiring grad while autograd
    records; rotary_dim even, at most head_dim (``None``: 2 len(inv_freq)).

    Args:
        q: queries ``[batch, seq, heads_q, head_dim]``, floating.
        k: keys ``[batch, seq, heads_k, head_dim]``, of q's dtype.
        positions: integer ``[seq]`` or ``[batch, seq]``; with ``axes``, the position ids
            ``[3, seq]`` or ``[3, batch, seq]``.
        inv_freq: the rotary_dim/2 frequencies theta_i.
        rotary_dim: the rotated width, even and at most head_dim, or ``None`` for 2 len(inv_freq).
        axes: the M-RoPE axis of each pair (:func:`check_axes`), or ``None`` for plain RoPE.
        values: also check the values of the frequencies and axes.

    Returns:
        The rotary width, rotary_dim or its default.
    """
    _checks.head_tensors(q=q, k=k)
    _checks.tensor("positions" if axes is None else "position_ids", positions)
    _checks.tensor("inv_freq", inv_freq)
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, seq and head_dim (heads may differ)"
        )
    _checks.same_device("q", q, k=k, **{"positions" if axes is None else "position_ids": positions},
                        inv_freq=inv_freq)
    _check_positions(positions, q.shape[0], q.shape[1], mrope=axes is not None)
    _checks.finite_frequencies("inv_freq", inv_freq, dtypes=_checks.FREQUENCY_DTYPES, values=values)
    if inv_freq.requires_grad and torch.is_grad_enabled():
        raise ValueError("inv_freq requires grad: the rotation has no gradient with respect to the "
                         "frequencies (exact integer turns, constants to autograd); pass inv_freq.detach() "
                         "if none is needed")
    head_dim = q.shape[3]
    if rotary_dim is None:
        rotary_dim = 2 * inv_freq.shape[0]
    rotary_dim = _checks.integer("rotary_dim", rotary_dim, minimum=2, even=True)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds head_dim {head_dim}")
    if inv_freq.shape[0] != rotary_dim // 2:
        raise ValueError(f"inv_freq has {inv_freq.shape[0]} entries, expected rotary_dim/2 = {rotary_dim // 2}")
    if axes is not None:
        check_axes(axes, rotary_dim // 2, values=values)
    return rotary_dim


def _check_options(layout, rotated, attention_factor, conjugate, backend) -> float:
    """Validate the keyword options of :func:`rotate_qk`; return the attention factor as a float,
    at least float64's smallest normal number (below it, s cos and s sin lose bits to underflow
    and the accuracy bound of the module docstring would not hold)."""
    _checks.choice("layout", layout, LAYOUTS)
    _checks.choice("rotated", rotated, ROTATED)
    _checks.choice("backend", backend, BACKENDS)
    _checks.flag("conjugate", conjugate)
    return _checks.number("attention_factor", attention_factor, positive=True, minimum=MIN_ATTENTION_FACTOR)


def use_kernel(q, backend: str, inv_freq, attention_factor: float) -> bool:
    """Whether ``backend`` ("auto", "torch" or "triton") runs the fused kernel. "auto" takes it for
    CUDA tensors the kernel can rotate: head_dim up to :data:`rope.limits.KERNEL_MAX_HEAD_DIM`, no
    float64 frequencies (:func:`rope._checks.finite_frequencies`: the kernel takes float32 theta_i)
    and attention factors in :data:`rope.limits.KERNEL_SCALE_RANGE`; it leaves the others, and
    arguments that are not tensors of four dimensions, to the torch path, which checks them. "triton"
    raises where Triton is missing or the frequencies are float64; its other limits are the
    operator's checks (:mod:`rope.kernels.operators`).

    Args:
        q: the queries (their device, shape and dtype decide "auto").
        backend: "auto", "torch" or "triton", already checked.
        inv_freq: the frequencies (float64 ones stay on the torch path).
        attention_factor: the factor, a float already checked.
    """
    if backend == "torch":
        return False
    if backend == "auto":
        low, high = KERNEL_SCALE_RANGE
        return (HAS_TRITON and isinstance(q, torch.Tensor) and isinstance(inv_freq, torch.Tensor) and q.is_cuda
                and q.dim() == 4 and q.shape[-1] <= KERNEL_MAX_HEAD_DIM and inv_freq.dtype != torch.float64
                and low <= attention_factor <= high)
    if _checks.tensor("inv_freq", inv_freq).dtype == torch.float64:
        raise TypeError("backend='triton' takes float32 inv_freq (theta_i as float32 numbers); float64 "
                        "frequencies are honoured exactly by backend='torch' (or pass inv_freq.float() if their "
                        "float32 rounding is meant)")
    if not HAS_TRITON:
        raise ValueError("backend='triton' needs the triton package (pip install triton)")
    return True


def has_float64(device: torch.device) -> bool:
    """Whether tensors on ``device`` can be float64 (not on Apple's MPS).

    Args:
        device: the device asked about.
    """
    return device.type not in DEVICES_WITHOUT_FLOAT64


def exact_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, *,
                  per_pair: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the exactly reduced angles m theta_i (:func:`rope.angles.cos_sin`): float64,
    or float32 on devices without float64 (:func:`has_float64`).

    Args:
        positions: integer positions m, any shape.
        inv_freq: the frequencies theta_i ``[pairs]``.
        per_pair: positions already hold one entry per pair (last dimension ``pairs``, as
            :func:`per_pair_positions` returns), rather than one per token.

    Returns:
        ``(cos, sin)``, of shape ``positions.shape + (pairs,)`` (``positions.shape`` with
        ``per_pair``).
    """
    return cos_sin(positions, inv_freq, per_pair=per_pair, float64=has_float64(positions.device))


def _checked_cos_sin(positions, inv_freq, *, per_pair: bool = False):
    """:func:`exact_cos_sin` of arguments :func:`check_inputs` checked (the frequencies' values aside)."""
    return cos_sin_of_checked(positions, inv_freq, per_pair=per_pair, float64=has_float64(positions.device))


def rotate_by_cos_sin(q, k, cos, sin, *, layout, rotary_dim, attention_factor=1.0, conjugate=False,
                      rotated="first"):
    """q and k rotated by the cos and sin of their pairs' angles, ``[seq, pairs]`` (shared by the
    batch) or ``[batch, seq, pairs]`` (or already ``[batch or 1, seq, 1, pairs]``): times the
    attention factor (sin negated for the conjugate), :func:`rope.rotation.rotate_tensors` on both.

    Args:
        q: queries ``[batch, seq, heads_q, head_dim]``.
        k: keys ``[batch, seq, heads_k, head_dim]``.
        cos: cos of the angles, ``[seq, pairs]``, ``[batch, seq, pairs]`` or ``[batch or 1, seq, 1, pairs]``.
        sin: sin of the angles, of cos's shape.
        layout: ``"half"`` or ``"interleaved"``.
        rotary_dim: the rotated width.
        attention_factor: multiplies cos and sin.
        conjugate: rotate by the negated angles, R^T.
        rotated: ``"first"`` or ``"last"``: which rotary_dim coordinates are rotated.

    Returns:
        ``(q_out, k_out)``, rotated.
    """
    if cos.dim() != 4:  # [batch or 1, seq, 1, pairs]
        cos, sin = ((t[None] if t.dim() == 2 else t)[:, :, None, :] for t in (cos, sin))
    if attention_factor != 1.0 or conjugate:
        cos, sin = cos * attention_factor, sin * (-attention_factor if conjugate else attention_factor)
    safe = q.dtype == torch.float64 or cos.dtype == torch.float32 or attention_factor > _SAFE_FACTOR
    return rotate_tensors((q, k), cos, sin, layout, rotary_dim, safe=safe, rotated=rotated)


def per_pair_positions(position_ids: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """p_a(i), the position pair i turns by: row ``axes[i]`` of ``position_ids`` ``[3, ...]``, shape
    ``position_ids.shape[1:] + (pairs,)``, for axes of any integer dtype on any device, checked by
    the caller (:func:`check_axes`).

    Args:
        position_ids: the t, h, w positions, ``[3, seq]`` or ``[3, batch, seq]``.
        axes: the axis (row) of each pair, integer ``[pairs]``.
    """
    rows = axes.to(device=position_ids.device, dtype=torch.int64, non_blocking=True)
    return position_ids[rows].movedim(0, -1)


def _kernel_rotation(q, k, positions, inv_freq, axes, *, layout, rotated, rotary_dim, attention_factor, conjugate):
    """``torch.ops.rope.rotary`` (:mod:`rope.kernels.operators`, imported here: it imports Triton),
    which checks its arguments itself: shapes, dtypes, devices and the kernel's limits, then the
    values of the frequencies and axes. Checked here only what the operator's schema would convert
    or refuse with a ``RuntimeError`` before its checks run (a tensor given as another type, a
    ``rotary_dim`` that is not an int), and the axes, which are converted here."""
    from .kernels import operators  # noqa: F401  (registers torch.ops.rope.rotary)

    for name, x in (("q", q), ("k", k), ("positions" if axes is None else "position_ids", positions)):
        _checks.tensor(name, x)
    if rotary_dim is None:
        rotary_dim = 2 * inv_freq.numel()  # 2 len(inv_freq); an inv_freq that is not 1-D is the operator's to refuse
    rotary_dim = _checks.integer("rotary_dim", rotary_dim)
    if axes is not None:  # any integer dtype on any device; no copy where int64 on q's device already (a buffer)
        axes = _checks.integer_tensor("axes", axes).to(device=q.device, dtype=torch.int64, non_blocking=True)
    return torch.ops.rope.rotary(
        q=q, k=k, positions=positions, inv_freq=inv_freq, interleaved=layout == "interleaved",
        rotary_dim=rotary_dim, scale=attention_factor, conjugate=conjugate, axes=axes, rotated=rotated,
    )


def rotate_qk(q, k, positions, inv_freq, *, axes=None, layout="half", rotated="first", rotary_dim=None,
              attention_factor=1.0, conjugate=False, backend="auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The one path of :func:`apply_rotary` and :func:`rope.mrope.apply_mrope`: check the options,
    then rotate with the fused kernel or on the torch path, each checking the tensors once.

    Pair i of a token turns by the angle p_i theta_i: p_i = m, the token's position
    (``positions`` ``[seq]`` or ``[batch, seq]``), or with M-RoPE ``axes`` p_i = row ``axes[i]``
    of the position ids ``[3, seq]`` or ``[3, batch, seq]`` (Qwen2-VL, section 2.1). The options
    are :func:`apply_rotary`'s. On the torch path shapes, dtypes and devices are checked here
    (:func:`check_inputs`), on the kernel path by the operator (:func:`_kernel_rotation`); the values
    of the frequencies and axes by the path that runs, eagerly off CUDA and as asynchronous device
    assertions on CUDA.

    Args:
        q: queries ``[batch, seq, heads_q, head_dim]``.
        k: keys ``[batch, seq, heads_k, head_dim]``.
        positions: positions ``[seq]`` or ``[batch, seq]``; with ``axes``, the position ids
            ``[3, seq]`` or ``[3, batch, seq]``.
        inv_freq: the rotary_dim/2 frequencies theta_i.
        axes: the M-RoPE axis of each pair, integer ``[pairs]``, or ``None`` for plain RoPE.
        layout: as in :func:`apply_rotary`.
        rotated: as in :func:`apply_rotary`.
        rotary_dim: as in :func:`apply_rotary`.
        attention_factor: as in :func:`apply_rotary`.
        conjugate: as in :func:`apply_rotary`.
        backend: as in :func:`apply_rotary`.

    Returns:
        ``(q_out, k_out)``, as :func:`apply_rotary` returns them.
    """
    attention_factor = _check_options(layout, rotated, attention_factor, conjugate, backend)
    if use_kernel(q, backend, inv_freq, attention_factor):
        return _kernel_rotation(q, k, positions, inv_freq, axes, layout=layout, rotated=rotated, rotary_dim=rotary_dim,
                                attention_factor=attention_factor, conjugate=conjugate)
    rotary_dim = check_inputs(q, k, positions, inv_freq, rotary_dim, axes=axes, values=False)
    if axes is None and positions.numel() <= _FEW_POSITIONS and _decoding_on_the_cpu(q, k, rotary_dim, inv_freq,
                                                                                    attention_factor):
        few = _rotate_few_tokens(q, k, positions, inv_freq, layout, rotary_dim, attention_factor, conjugate, rotated)
        if few is not None:
            return few
    if axes is None:  # the frequencies' values are checked by rope.angles.cos_sin_of_checked
        cos, sin = _checked_cos_sin(positions.reshape(*positions.shape[:-1] or (1,), positions.shape[-1], 1),
                                    inv_freq)  # [batch or 1, seq, 1, pairs]
    else:
        check_axes(axes, rotary_dim // 2)
        per_pair = per_pair_positions(positions, axes)
        cos, sin = _checked_cos_sin(per_pair.reshape(*per_pair.shape[:-2] or (1,), per_pair.shape[-2], 1,
                                                     per_pair.shape[-1]), inv_freq, per_pair=True)
    return rotate_by_cos_sin(q, k, cos, sin, layout=layout, rotary_dim=rotary_dim,
                             attention_factor=attention_factor, conjugate=conjugate, rotated=rotated)


_FEW_POSITIONS = 16


def _decoding_on_the_cpu(q, k, rotary_dim: int, inv_freq, attention_factor: float) -> bool:
    """Whether q and k take :func:`_rotate_few_tokens`: float32, float16 or bfloat16 on the CPU
    (:func:`rope._checks.reads_are_free`), float32 frequencies, and few enough coordinates for one
    block (:func:`rope.rotation.rotate_tensors`)."""
    return (q.dtype in (torch.float32, torch.float16, torch.bfloat16) and inv_freq.dtype == torch.float32
            and attention_factor <= _SAFE_FACTOR and _checks.reads_are_free(q.device)
            and (q.numel() // q.shape[3] + k.numel() // k.shape[3]) * rotary_dim <= BLOCK_ELEMENTS
            if q.shape[3] else False)


def _rotate_few_tokens(q, k, positions, inv_freq, layout, rotary_dim, attention_factor, conjugate, rotated):
    """Decoding's torch path in one step, for the arguments :func:`_decoding_on_the_cpu` takes and
    positions below 2^29 (else ``None``): the angles as exact float64 products m theta_i
    (:func:`rope.angles.cos_sin_of_checked`'s fast case), q and k together: in one call of the
    CPU kernel (:func:`rope.cpu.rotary.rotate_few`) where it is built, else in one block
    (:func:`rope.rotation.rotate_small`, or :func:`rope.rotation.rotate_tensors` where autograd
    records); the same bound as the longer path, without the layers between."""
    values = positions.flatten().tolist()
    if not values or not -EXACT_PRODUCT_POSITIONS < min(values) <= max(values) < EXACT_PRODUCT_POSITIONS:
        return None
    if cpu_rotary.available():  # angles, frequency check and both rotations in one call
        sin_factor = -attention_factor if conjugate else attention_factor
        rows = positions.shape[0] if positions.dim() == 2 else 1
        return cpu_rotary.rotate_few(q, k, values, rows, inv_freq, layout, rotary_dim, attention_factor, sin_factor,
                                     rotated)
    _checks.frequency_values("inv_freq", inv_freq)
    angles = positions.to(torch.float64).view(-1, positions.shape[-1], 1, 1) * inv_freq  # exact
    cos, sin = torch.cos(angles), torch.sin(angles)
    if attention_factor != 1.0 or conjugate:
        cos, sin = cos * attention_factor, sin * (-attention_factor if conjugate else attention_factor)
    if rotated != "first" or torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return rotate_tensors((q, k), cos, sin, layout, rotary_dim, safe=False, rotated=rotated)
    return rotate_small(q, k, cos, sin, layout, rotary_dim)


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    layout: str = "half",
    rotated: str = "first",
    rotary_dim: int | None = None,
    attention_factor: float = 1.0,
    conjugate: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by their positions.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]``; heads_k may differ from heads_q (GQA, MQA).
        positions: integer positions, ``[seq]`` (shared by the batch) or ``[batch, seq]``
            (offsets, packed sequences: any values).
        inv_freq: the rotary_dim/2 frequencies theta_i, finite, e.g. from :func:`rope.inv_freq`:
            float32, or float64 (honoured exactly, on the torch path); never rounded
            (float16/bfloat16 are refused: :func:`rope._checks.finite_frequencies`). Constants
            to autograd: one that requires grad is refused while gradients are recorded.
        layout: ``"half"`` (pairs (i, i + d/2)) or ``"interleaved"`` (pairs (2i, 2i + 1)).
        rotated: which d coordinates of each head are rotated: ``"first"`` (0 .. d-1, every
            partial-rotary model but one) or ``"last"`` (head_dim-d .. head_dim-1, pairs counted
            from head_dim - d: DeepSeek-V4, which is ``layout="interleaved", rotated="last"``;
            :mod:`rope.layouts` gives the sources).
        rotary_dim: rotated width d (default ``2 * len(inv_freq)``); the rest of the head passes through.
        attention_factor: multiplies cos and sin (YaRN, LongRoPE), as transformers does; at
            least 2^-1022.
        conjugate: rotate by -m * theta_i, the transpose R_m^T (the inverse when attention_factor is 1).
        backend: ``"torch"`` (exactly reduced angles and float64 math, rounded once; float32 math
            on devices without float64), ``"triton"`` (the fused kernel: float-float math for
            float16 and bfloat16, with no float64 arithmetic, correctly rounded unless the exact
            value lies within 2^-43 s ``|(x_a, x_b)|`` of a rounding tie; float64 math for float64,
            correctly rounded as on the torch path; float32 math, within a stated bound, for
            float32; differentiable), or ``"auto"``: the kernel for CUDA
            tensors when Triton is installed, torch otherwise. The kernel's float32 math
            (float32 q and k) takes ``|theta_i| < 2^16`` and positions ``|m| < 2^31`` and refuses others
            (on CUDA as a device assertion): beyond those, use float64 q and k or ``"torch"``.

    Returns:
        ``(q_out, k_out)`` in the dtype of q and k, each value rounded once; on the torch path
        within half an ulp plus 2^-50 s ``|(x_a, x_b)|`` of the exact rotation (module docstring);
        the kernel's bounds are in :mod:`rope.kernels.triton_rotary`.

    Raises:
        TypeError, ValueError: for any bad argument, naming it (README, "Errors").
    """
    return rotate_qk(q, k, positions, inv_freq, layout=layout, rotated=rotated, rotary_dim=rotary_dim,
                     attention_factor=attention_factor, conjugate=conjugate, backend=backend)
