"""The fused Triton RoPE kernel: q and k rotated in one launch, angles computed in the kernel.

For pair i = (x_a, x_b) of a head of the token at integer position m (RoFormer eq. 34),

    y_a = s (x_a cos(m theta_i) - x_b sin(m theta_i)),   y_b = s (x_b cos(m theta_i) + x_a sin(m theta_i)),

with s the attention factor and the sign of the sines flipped for the conjugate (transpose)
rotation, which is also the backward pass. Coordinates past ``rotary_dim`` are copied. The math
is float32 for float16, bfloat16 and float32 inputs and float64 for float64 inputs, with one
rounding to the input dtype at the end.

The angle is reduced exactly (see :mod:`rope.angles`): the kernel turns float32 theta_i into the
64-bit fixed-point turns T_i, multiplies by the int64 position (wrapping modulo 2^64), and
evaluates cos/sin of the angle, already in [-pi, pi), from its quarter turn and Taylor
polynomials (:func:`_cos_sin_of_turns`; float32 math) or with float64 library functions (float64
inputs). No cos/sin table is read.

M-RoPE (:mod:`rope.mrope`) is the same kernel with a position per pair: pair i of a token reads
row ``axes[i]`` (t, h or w) of ``[3, ...]`` position ids.

Grid: (token blocks, head blocks of q then of k, batch). Each program computes its
``BLOCK_S x rotary_dim/2`` angles once and rotates ``BLOCK_S x BLOCK_H`` heads with them. At
decode (one token per sequence) the batch is read as the token axis, so that a program still
holds BLOCK_S tokens. q and
k may be strided views (e.g. slices of a packed qkv projection); only the last dimension must
be contiguous.
"""

from __future__ import annotations

import math
import os
import struct

import torch
import triton
import triton.language as tl

from .angles import INV_TWO_PI_PIECES


# The four pieces of 1/(2 pi), compiled in as float64 immediates (no load on the angle's path).
_PIECE_0, _PIECE_1, _PIECE_2, _PIECE_3 = (tl.constexpr(piece) for piece in INV_TWO_PI_PIECES)


@triton.jit
def _phase_part(theta, piece):
    """frac(theta * piece) in units of 2^-64 turns, as int64 (wrapping)."""
    x = theta * piece  # exact: 24-bit times 26-bit significands
    fraction = x - x.to(tl.int64).to(tl.float64)  # exact, in (-1, 1)
    return (fraction * 9223372036854775808.0).to(tl.int64) * 2  # 2^63 units, times 2, wraps


@triton.jit
def _fixed_point_phase(theta):
    """T = frac(theta / 2 pi) * 2^64 mod 2^64 as int64; theta float64 holding a float32 value."""
    return (_phase_part(theta, _PIECE_0) + _phase_part(theta, _PIECE_1) + _phase_part(theta, _PIECE_2)
            + _phase_part(theta, _PIECE_3))


# 1/n!, the Taylor coefficients of _cos_sin_of_turns (rounded to float32 in the kernel).
_F2, _F3, _F4, _F5, _F6, _F7, _F8, _F9, _F10 = (tl.constexpr(1.0 / math.factorial(n)) for n in range(2, 11))


@triton.jit
def _cos_sin_of_turns(turns):
    """float32 cos and sin of 2 pi turns / 2^32, for int64 ``turns`` in [-2^31, 2^31).

    The quadrant q = round(turns / 2^30) comes from the integer, exactly; the rest is an angle
    x in [-pi/4, pi/4], where Taylor polynomials through x^9 (sine) and x^10 (cosine) are
    within 2e-9 of the functions (the next terms, (pi/4)^11/11! and (pi/4)^12/12!), below the
    float32 rounding of the result. Then cos(x + q pi/2) and sin(x + q pi/2) are cos x and sin x
    swapped and negated by q mod 4. No range reduction, no branch: the accurate library sine
    would reduce an angle that is already reduced."""
    quadrant = (turns + (1 << 29)) >> 30  # in {-2, ..., 2}
    x = (turns - (quadrant << 30)).to(tl.float32) * 1.4629180792671596e-09  # 2 pi / 2^32
    x2 = x * x
    sin = x - x * x2 * (_F3 - x2 * (_F5 - x2 * (_F7 - x2 * _F9)))
    cos = 1.0 - x2 * (_F2 - x2 * (_F4 - x2 * (_F6 - x2 * (_F8 - x2 * _F10))))
    q = quadrant & 3
    odd = (q & 1) == 1
    cos_q = tl.where(odd, sin, cos)
    sin_q = tl.where(odd, cos, sin)
    return tl.where((q == 1) | (q == 2), -cos_q, cos_q), tl.where(q >= 2, -sin_q, sin_q)


@triton.jit
def _cos_sin(pos, FREQ, scale_hi, scale_lo, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
             CONJUGATE: tl.constexpr, FP64: tl.constexpr):
    """s cos(m theta_i) and +-s sin(m theta_i), [BLOCK_S, HALF_PAD], from exactly reduced angles;
    ``pos`` is the int64 [BLOCK_S, HALF_PAD] position of each pair (:func:`_positions`)."""
    j = tl.arange(0, HALF_PAD)
    theta = tl.load(FREQ + j, mask=j < HALF, other=0.0).to(tl.float32).to(tl.float64)
    turns = pos * _fixed_point_phase(theta)[None, :]  # (m T) mod 2^64, signed: [-pi, pi)
    if FP64:
        angle = turns.to(tl.float64) * 3.4061215800865545e-19  # 2 pi / 2^64
        cos = tl.cos(angle)
        sin = tl.sin(angle)
    else:  # the top 32 bits suffice for float32
        cos, sin = _cos_sin_of_turns(turns >> 32)
    if FP64:  # the attention factor arrives as two float32 numbers (Triton passes floats as float32)
        cos = cos * scale_hi + cos * scale_lo
        sin = sin * scale_hi + sin * scale_lo
    else:
        cos = cos * scale_hi
        sin = sin * scale_hi
    if CONJUGATE:
        sin = -sin
    return cos, sin


@triton.jit
def _head_block(Q, K, QO, KO, block, blocks_q, batch, s, s_mask, heads_q, heads_k,
                sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h,
                BLOCK_H: tl.constexpr):
    """Pointers to coordinate 0 of the [BLOCK_S, BLOCK_H] heads of head block ``block`` (q's
    blocks first, then k's), in the input and the output, and the mask of real rows."""
    if block < blocks_q:
        h = (block * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
        row_mask = s_mask[:, None, None] & (h < heads_q)[None, :, None]
        x_row = Q + batch * sq_b + s[:, None, None] * sq_s + h[None, :, None] * sq_h
        o_row = QO + batch * sqo_b + s[:, None, None] * sqo_s + h[None, :, None] * sqo_h
    else:
        h = ((block - blocks_q) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
        row_mask = s_mask[:, None, None] & (h < heads_k)[None, :, None]
        x_row = K + batch * sk_b + s[:, None, None] * sk_s + h[None, :, None] * sk_h
        o_row = KO + batch * sko_b + s[:, None, None] * sko_s + h[None, :, None] * sko_h
    return x_row, o_row, row_mask


@triton.jit
def _pair_offsets(HALF: tl.constexpr, HALF_PAD: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Offsets (a_i, b_i) of the two coordinates of pair i, and the mask of real pairs."""
    j = tl.arange(0, HALF_PAD)
    if INTERLEAVED:
        a = 2 * j
        b = 2 * j + 1
    else:
        a = j
        b = j + HALF
    return a[None, None, :], b[None, None, :], (j < HALF)[None, None, :]


@triton.jit
def _rotate_and_store(x_row, o_row, row_mask, xa, xb, cos, sin, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                      TAIL: tl.constexpr, TAIL_PAD: tl.constexpr, INTERLEAVED: tl.constexpr,
                      COPY_TAIL: tl.constexpr):
    """Write the rotated pairs (xa, xb were loaded from x_row) and, out of place, the tail."""
    a, b, j_mask = _pair_offsets(HALF, HALF_PAD, INTERLEAVED)
    mask = row_mask & j_mask
    c = cos[:, None, :]
    s = sin[:, None, :]
    ya = xa.to(c.dtype) * c - xb.to(c.dtype) * s
    yb = xb.to(c.dtype) * c + xa.to(c.dtype) * s
    tl.store(o_row + a, ya.to(xa.dtype), mask=mask)
    tl.store(o_row + b, yb.to(xb.dtype), mask=mask)
    if COPY_TAIL:
        t = 2 * HALF + tl.arange(0, TAIL_PAD)
        tail_mask = row_mask & (t < 2 * HALF + TAIL)[None, None, :]
        tail = tl.load(x_row + t[None, None, :], mask=tail_mask)
        tl.store(o_row + t[None, None, :], tail, mask=tail_mask)


@triton.jit
def _load_pairs(x_row, row_mask, HALF: tl.constexpr, HALF_PAD: tl.constexpr, INTERLEAVED: tl.constexpr):
    a, b, j_mask = _pair_offsets(HALF, HALF_PAD, INTERLEAVED)
    mask = row_mask & j_mask
    return tl.load(x_row + a, mask=mask, other=0.0), tl.load(x_row + b, mask=mask, other=0.0)


@triton.jit
def _positions(POS, AXES, batch, s, s_mask, sp_b, sp_s, sp_a, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
               MROPE: tl.constexpr):
    """int64 [BLOCK_S, HALF_PAD]: the position pair i of each token turns by, the token's own, or
    with M-RoPE row AXES[i] (0 t, 1 h, 2 w) of the [3, ...] position ids. Loaded in the shape of
    the angles, the positions need no layout conversion through shared memory before the product
    with the turns (``python -m rope.kernel_targets --code`` shows the machine code)."""
    j = tl.arange(0, HALF_PAD)
    if MROPE:
        row_of_pair = tl.load(AXES + j, mask=j < HALF, other=0).to(tl.int64) * sp_a
    else:
        row_of_pair = tl.zeros((HALF_PAD,), dtype=tl.int64)
    pos = tl.load((POS + batch * sp_b + s * sp_s)[:, None] + row_of_pair[None, :], mask=s_mask[:, None], other=0)
    return pos.to(tl.int64)


@triton.jit
def _rotary_kernel(
    Q, K, QO, KO, POS, FREQ, AXES,
    seq_len, heads_q, heads_k, scale_hi, scale_lo, tokens_bucket,
    sq_b, sq_s, sq_h, sk_b, sk_s, sk_h,
    sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h,
    sp_b, sp_s, sp_a,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, COPY_TAIL: tl.constexpr, FP64: tl.constexpr,
    MROPE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, GROUP: tl.constexpr,
):
    """Program (i, g, b): tokens [i BLOCK_S, (i + 1) BLOCK_S) of batch row b, head blocks
    [g GROUP, (g + 1) GROUP) of the list (q's head blocks, then k's). The first block's loads are
    issued before the angle arithmetic, so that memory latency and the math overlap.
    ``tokens_bucket`` only keys the autotuning cache; AXES and sp_a are read only with MROPE."""
    batch = tl.program_id(2).to(tl.int64)
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = s < seq_len
    s = s.to(tl.int64)
    blocks_q = tl.cdiv(heads_q, BLOCK_H)
    blocks = blocks_q + tl.cdiv(heads_k, BLOCK_H)

    first = tl.program_id(1) * GROUP  # always < blocks: the grid has cdiv(blocks, GROUP) columns
    x_row, o_row, row_mask = _head_block(Q, K, QO, KO, first, blocks_q, batch, s, s_mask, heads_q, heads_k,
                                         sq_b, sq_s, sq_h, sk_b, sk_s, sk_h,
                                         sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h, BLOCK_H)
    xa, xb = _load_pairs(x_row, row_mask, HALF, HALF_PAD, INTERLEAVED)
    pos = _positions(POS, AXES, batch, s, s_mask, sp_b, sp_s, sp_a, HALF, HALF_PAD, MROPE)
    cos, sin = _cos_sin(pos, FREQ, scale_hi, scale_lo, HALF, HALF_PAD, CONJUGATE, FP64)
    _rotate_and_store(x_row, o_row, row_mask, xa, xb, cos, sin, HALF, HALF_PAD, TAIL, TAIL_PAD, INTERLEAVED,
                      COPY_TAIL)
    for i in tl.static_range(1, GROUP):
        if first + i < blocks:
            x_row, o_row, row_mask = _head_block(Q, K, QO, KO, first + i, blocks_q, batch, s, s_mask, heads_q,
                                                 heads_k, sq_b, sq_s, sq_h, sk_b, sk_s, sk_h,
                                                 sqo_b, sqo_s, sqo_h, sko_b, sko_s, sko_h, BLOCK_H)
            xa, xb = _load_pairs(x_row, row_mask, HALF, HALF_PAD, INTERLEAVED)
            _rotate_and_store(x_row, o_row, row_mask, xa, xb, cos, sin, HALF, HALF_PAD, TAIL, TAIL_PAD,
                              INTERLEAVED, COPY_TAIL)


# (BLOCK_S, BLOCK_H, GROUP, num_warps) tried on first use of a shape on a GPU: the leaders of a
# sweep over the benchmark shapes on an H100 (benchmarks/tune_blocks.py).
_CANDIDATES = [(1, 16, 1, 2), (2, 8, 1, 2), (4, 4, 1, 2), (8, 4, 1, 2), (2, 16, 1, 4), (2, 32, 1, 4),
               (2, 16, 4, 4), (4, 8, 2, 4)]


def _small_problems_take_the_first(configs, named_args, **kwargs):
    """Below 256 tokens launch latency dominates and the sizes hardly matter: no sweep."""
    return configs[:1] if named_args["tokens_bucket"] < 256 else configs


_tuned_kernel = triton.autotune(
    configs=[triton.Config({"BLOCK_S": s, "BLOCK_H": h, "GROUP": g}, num_warps=w) for s, h, g, w in _CANDIDATES],
    key=["tokens_bucket", "heads_q", "heads_k", "HALF", "TAIL", "INTERLEAVED", "FP64", "MROPE"],
    prune_configs_by={"early_config_prune": _small_problems_take_the_first},
    restore_value=["QO", "KO"],  # in place, QO is Q: tuning must not rotate it several times
)(_rotary_kernel)


def _launch_sizes(batch: int, seq_len: int, heads: int) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_H, GROUP) where no autotuning runs (Triton's interpreter on CPU)."""
    block_h = min(triton.next_power_of_2(heads), 16)
    return (2 if batch * seq_len >= 2048 else 1), block_h, 1


def kernel_constants(head_dim: int, rotary_dim: int, *, interleaved: bool, conjugate: bool, fp64: bool,
                     copy_tail: bool, mrope: bool = False) -> dict:
    """The ``tl.constexpr`` arguments of :func:`_rotary_kernel` other than the launch sizes."""
    half, tail = rotary_dim // 2, head_dim - rotary_dim
    return dict(
        HALF=half, HALF_PAD=triton.next_power_of_2(half), TAIL=tail, TAIL_PAD=triton.next_power_of_2(max(tail, 1)),
        INTERLEAVED=interleaved, CONJUGATE=conjugate, FP64=fp64, COPY_TAIL=copy_tail and tail > 0, MROPE=mrope,
    )


def launch(q, k, q_out, k_out, positions, inv_freq, *, interleaved, rotary_dim, scale, conjugate, axes=None,
           block_s=None, block_h=None, group=None, num_warps=4):
    """Rotate q into q_out and k into k_out (the outputs may alias the inputs: in place).

    q ``[batch, seq, heads_q, head_dim]``, k ``[batch, seq, heads_k, head_dim]``, last dimension
    contiguous; positions integer ``[seq]`` or ``[batch, seq]``; inv_freq ``[rotary_dim/2]``.
    M-RoPE: ``axes`` (int64 ``[rotary_dim/2]``, values 0, 1, 2) gives each pair's row of the
    positions, then ``[3, seq]`` or ``[3, batch, seq]`` (:mod:`rope.mrope`).
    On a GPU the launch sizes are autotuned per (token count rounded up to a power of two, heads,
    widths, layout) on first use; ``block_s``, ``block_h``, ``group`` and ``num_warps`` fix them.
    """
    batch, seq_len, heads_q, head_dim = q.shape
    if seq_len == 1 and batch > 1:
        # Decode, one token per sequence: read the batch as the token axis (views, no copies), so
        # that one program rotates BLOCK_S sequences and builds the turns T_i once for all of them.
        q, k, q_out, k_out = (t.transpose(0, 1) for t in (q, k, q_out, k_out))
        shared = positions.dim() == (1 if axes is None else 2)  # [seq] or [3, seq]: one row for the batch
        positions = positions.expand(*positions.shape[:-1], batch) if shared else positions.transpose(-2, -1)
        batch, seq_len = 1, batch
    heads_k = k.shape[2]

    def grid(meta):
        head_blocks = triton.cdiv(heads_q, meta["BLOCK_H"]) + triton.cdiv(heads_k, meta["BLOCK_H"])
        return triton.cdiv(seq_len, meta["BLOCK_S"]), triton.cdiv(head_blocks, meta["GROUP"]), batch

    scale_hi = struct.unpack("f", struct.pack("f", scale))[0]  # scale rounded to float32
    token_positions = positions if axes is None else positions[0]  # [seq] or [batch, seq]
    pos_strides = (0, token_positions.stride(0)) if token_positions.dim() == 1 else tuple(token_positions.stride())
    axis_stride = 0 if axes is None else positions.stride(0)
    args = (
        q, k, q_out, k_out, positions, inv_freq.contiguous(), inv_freq if axes is None else axes.contiguous(),
        seq_len, heads_q, heads_k, scale_hi, scale - scale_hi, triton.next_power_of_2(batch * seq_len),
        *q.stride()[:3], *k.stride()[:3], *q_out.stride()[:3], *k_out.stride()[:3], *pos_strides, axis_stride,
    )
    options = kernel_constants(
        head_dim, rotary_dim, interleaved=interleaved, conjugate=conjugate, fp64=q.dtype == torch.float64,
        copy_tail=q_out.data_ptr() != q.data_ptr() or k_out.data_ptr() != k.data_ptr(), mrope=axes is not None,
    )
    fixed = block_s or block_h or group
    if q.is_cuda and not fixed and not os.environ.get("TRITON_INTERPRET"):
        _tuned_kernel[grid](*args, **options)
        return
    default = _launch_sizes(batch, seq_len, max(heads_q, heads_k))
    sizes = dict(BLOCK_S=block_s or default[0], BLOCK_H=block_h or default[1], GROUP=group or default[2])
    _rotary_kernel[grid](*args, **options, **sizes, num_warps=num_warps)
