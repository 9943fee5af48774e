"""RoPE inside attention for decoding: few queries against a long cache, the keys split across programs.

:func:`.triton_attention.launch` gives each program a block of queries of one head and lets it
stream every key. A decoding step has one query per sequence (a few with speculative decoding),
so that kernel runs batch x heads programs, each over the whole cache, on a GPU with more
multiprocessors than that: most of the machine idles while the memory traffic that bounds decoding
is spread over too few programs. This kernel, the split-key scheme of Flash-Decoding (Dao, Haziza,
Massa and Sizov, "Flash-Decoding for long-context inference", 2023), changes both axes:

* the rows of a program are the queries of every head that shares one key head (GQA packing:
  q_len x group rows, so each cached key is loaded once per key head, not once per query head);
* the keys are cut into ``splits`` chunks of whole key blocks, one program per (chunk, key head,
  sequence), each folding its chunk into a partial output O_s (normalised by its own sum l_s) and
  the maximum M_s of its logits before the scale, with the same online softmax, tile rule and
  rotations as the prefill kernel (:func:`.triton_attention.attend_key_block`);
* the partials combine exactly: LSE = log sum_s exp(LSE_s) and (:func:`combine_partials`), with
  r the row's scale log2(e) s (times its log-n factor) and M = max_s M_s, the weights
  w_s = l_s 2^(r (M_s - M)) / sum_t l_t 2^(r (M_t - M)) (= exp(LSE_s - LSE)) give
  O = sum_s w_s O_s (a chunk with no key a row may see has M_s = -inf and weight 0). The maxima
  are taken before the scale, as in the prefill kernel, so that no scale the options accept makes
  a weight inf - inf (exp(LSE_s - LSE) would, where the LSEs are beyond float32's range).

The logits, options and domain are those of :func:`.triton_attention.launch`; the partials are
float32, the output is rounded once to q's dtype, and the rows whose float32 arithmetic may have
overflowed are recomputed as there (:mod:`.triton_attention_repair`). :func:`prefers_decode` says
when the operators of :mod:`.attention_operators` take this kernel; the backward is the prefill
kernels' (it needs only out and lse).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _checks
from .emulation import loop_bound
from .triton_attention import (
    LN2_C,
    attend_key_block,
    frame_turns,
    load_head,
    load_positions,
    prepare_launch,
    query_frames,
    row_factors,
)
from .triton_attention_repair import repair_forward
from .triton_rotary import interpreting, launch_device

DECODE_ROWS = 16
"""The most query rows (q_len x the GQA group) :func:`prefers_decode` sends to this kernel: one
tile of rows, the smallest ``tl.dot`` takes."""

DECODE_LAUNCH = (64, 8)
"""(BLOCK_N, num_warps) on a GPU unless given: longer key blocks than the prefill kernel's for
16-row tiles, over 8 warps, which compile without register spills for sm_80 and sm_90
(``rope.kernels.targets --spills``; 4 warps spilled up to 376 bytes per thread; untimed: no GPU ran it)."""


@triton.jit
def _group_rows(Q_POS, q_len, group, BLOCK_M: tl.constexpr):
    """(token, head in group, mask, positions, lowest, highest) of the rows r = t group + g: query
    token t and the g-th query head of the key head, int64 [BLOCK_M]; the extreme positions of the
    real rows."""
    r = tl.arange(0, BLOCK_M)
    token = (r // group).to(tl.int64)
    mask = token < q_len
    positions, lowest, highest = load_positions(Q_POS, token, mask)
    return token, (r % group).to(tl.int64), mask, positions, lowest, highest


@triton.jit
def attention_decode_kernel(
    # Tensors: q, k, v; the partial outputs (float32 [batch, heads_q, q_len, splits, V_DIM]), log-sum-exps,
    # maxima of the logits before the scale and sums (float32 [batch, heads_q, q_len, splits]); positions and
    # frequencies as the prefill kernel takes them
    Q, K, V,
    OUT_PART, LSE_PART, MAX_PART, SUM_PART,
    Q_POS, K_POS, FREQ, LEAKY_FREQ, ROW_SCALE,
    # Strides (batch, token, head) in elements; the last dimension of each is contiguous
    sq_b, sq_s, sq_h,
    sk_b, sk_s, sk_h,
    sv_b, sv_s, sv_h,
    # Batch strides of the positions and of the log-n factors (0: one row shared by the batch)
    spq_b, spk_b, srs_b,
    # Sizes, keys per chunk (a multiple of BLOCK_N), softmax_scale log2(e), the window, the attention factor
    q_len, k_len, heads_q, group, chunk, splits,
    qk_scale, window, factor,
    # Compile time: as the prefill kernel (triton_attention.kernel_constants)
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, TAIL: tl.constexpr, TAIL_PAD: tl.constexpr,
    V_DIM: tl.constexpr, V_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr, CAUSAL: tl.constexpr, MODE: tl.constexpr, PRECISION: tl.constexpr,
    BF16_BY_BITS: tl.constexpr, ROTATE: tl.constexpr, LOGN: tl.constexpr, FMA_BY_PARTS: tl.constexpr,
    PYTHON_LOOPS: tl.constexpr, ROT_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (s, b h_k): every query of the query heads h_k group .. (h_k + 1) group - 1 of batch
    row b against the keys [s chunk, (s + 1) chunk) of key head h_k. Launched by :func:`launch_decode`."""
    heads_k = heads_q // group
    bh = tl.program_id(1)
    batch = (bh // heads_k).to(tl.int64)
    head_k = (bh % heads_k).to(tl.int64)
    split = tl.program_id(0)

    token, g, row_mask, m, m_lo, m_hi = _group_rows(Q_POS + batch * spq_b, q_len, group, BLOCK_M)
    head = head_k * group + g
    per, leaky_per = frame_turns(FREQ, LEAKY_FREQ, HALF, HALF_PAD, MODE)
    qa, qb, qt = load_head(Q + batch * sq_b + token * sq_s + head * sq_h, row_mask, HALF, HALF_PAD, TAIL,
                           TAIL_PAD, INTERLEAVED)
    qa1, qb1, qa2, qb2, bent_turns = query_frames(qa, qb, m, window, per, leaky_per, factor, True, True, MODE,
                                                  BF16_BY_BITS, ROTATE, FMA_BY_PARTS)
    row_scale = row_factors(ROW_SCALE + batch * srs_b, token, row_mask, LOGN) * qk_scale

    m_run = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_run = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, V_PAD), tl.float32)
    first = split * chunk
    end = tl.minimum(first + chunk, k_len)
    for start in range(loop_bound(first, PYTHON_LOOPS), loop_bound(end, PYTHON_LOOPS), BLOCK_N):
        m_run, l_run, acc = attend_key_block(
            m_run, l_run, acc, qa1, qb1, qa2, qb2, qt, m, m_lo, m_hi, row_scale,
            K + batch * sk_b + head_k * sk_h, V + batch * sv_b + head_k * sv_h,
            K_POS + batch * spk_b, start, end, sk_s, sv_s, per, leaky_per, factor, window,
            HALF, HALF_PAD, TAIL, TAIL_PAD, V_DIM, V_PAD, INTERLEAVED, CAUSAL, MODE, PRECISION, BF16_BY_BITS, ROTATE,
            FMA_BY_PARTS, BLOCK_N, ROT_SCALE)

    # The chunk's partial: O_s = acc / l, LSE_s as the prefill kernel's (-inf, with O_s = 0, where a row saw no
    # key), the maximum M_s of its logits before the scale and its sum l_s
    seen = l_run != 0  # NaN sums included
    out = acc / tl.where(seen, l_run, 1.0)[:, None]
    lse = tl.where(seen, m_run * (row_scale * LN2_C) + tl.log2(tl.where(seen, l_run, 1.0)) * LN2_C, float("-inf"))
    part = ((batch * heads_q + head) * q_len + token) * splits + split
    d = tl.arange(0, V_PAD)
    tl.store(OUT_PART + part[:, None] * V_DIM + d[None, :], out, mask=row_mask[:, None] & (d < V_DIM)[None, :])
    tl.store(LSE_PART + part, lse, mask=row_mask)
    tl.store(MAX_PART + part, m_run, mask=row_mask)
    tl.store(SUM_PART + part, l_run, mask=row_mask)


def prefers_decode(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether this kernel, not the prefill kernel, serves q ``[batch, q_len, heads_q, d]`` and
    k ``[batch, k_len, heads_k, d]``: at most :data:`DECODE_ROWS` query rows per key head (q_len x
    group), which the prefill kernel would spread over that many programs of one row each."""
    return q.shape[1] * (q.shape[2] // max(k.shape[2], 1)) <= DECODE_ROWS


def split_count(batch_heads: int, k_len: int, block_n: int, device: torch.device) -> int:
    """Chunks of the keys: enough programs for two per multiprocessor (four in Triton's interpreter,
    whose programs run one after another), each chunk at least one key block; at least 1, also
    for no key (``k_len`` 0) or no program row (``batch_heads`` 0, counted as one)."""
    if interpreting() or device.type != "cuda":
        target = 4
    else:
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(k_len, block_n), triton.cdiv(target, max(batch_heads, 1))))


def launch_decode(q, k, v, q_positions, k_positions, inv_freq, *, layout: str = "half", causal: bool = True,
                  window: int | None = None, leaky_scale: float | None = None, softmax_scale: float | None = None,
                  block_n: int | None = None, splits: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None, rotate: bool = True, logn_length: int | None = None,
                  attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) as :func:`.triton_attention.launch` returns them, the keys split into ``splits``
    chunks (by default :func:`split_count`; at most one per key block) and the queries of each GQA
    group packed as the rows of one program.

    Shapes, options and checks are :func:`.triton_attention.launch`'s, except that q_len x group
    may not exceed :data:`DECODE_ROWS` (``ValueError`` otherwise: the prefill kernel serves more
    rows) and ``block_n`` sets the key block (16 in Triton's interpreter, :data:`DECODE_LAUNCH` on
    a GPU). As there, no query row (batch, q_len or heads_q of size 0) gives an empty out and lse
    of their shapes and dtypes, and ``v_dim = 0`` an empty out and every row's lse.
    """
    if not interpreting():  # the decoding defaults; the interpreter's are the prefill kernel's
        block_n = DECODE_LAUNCH[0] if block_n is None else block_n
        num_warps = DECODE_LAUNCH[1] if num_warps is None else num_warps
    run = prepare_launch(q, k, v, q_positions, k_positions, inv_freq, layout=layout, causal=causal, window=window,
                         leaky_scale=leaky_scale, softmax_scale=softmax_scale, block_m=None, block_n=block_n,
                         num_warps=num_warps, num_stages=num_stages, rotate=rotate, logn_length=logn_length,
                         attention_factor=attention_factor)
    batch, q_len, heads_q, _ = q.shape
    heads_k, k_len = k.shape[2], k.shape[1]
    if not prefers_decode(q, k):
        raise ValueError(f"q_len x group must be at most {DECODE_ROWS} rows for the decoding kernel, got "
                         f"{q_len} x {heads_q // heads_k}: use triton_attention.launch")
    block_n = run.sizes["BLOCK_N"]
    if splits is not None:  # checked whatever the shapes, as the prefill kernel checks its launch sizes
        splits = _checks.integer("splits", splits, minimum=1, maximum=max(1, triton.cdiv(k_len, block_n)))
    out = q.new_empty(batch, q_len, heads_q, v.shape[3])
    lse = torch.empty(batch, heads_q, q_len, dtype=torch.float32, device=q.device)
    if lse.numel() == 0:  # no query row, as launch (batch, q_len or heads_q 0; v_dim = 0 still has every row's lse)
        return out, lse
    if splits is None:
        splits = split_count(batch * heads_k, k_len, block_n, q.device)
    chunk = triton.cdiv(triton.cdiv(k_len, splits), block_n) * block_n
    splits = triton.cdiv(k_len, chunk)  # no empty chunk
    out_part = torch.empty(batch, heads_q, q_len, splits, v.shape[3], dtype=torch.float32, device=q.device)
    lse_part = torch.empty(batch, heads_q, q_len, splits, dtype=torch.float32, device=q.device)
    max_part, sum_part = torch.empty_like(lse_part), torch.empty_like(lse_part)
    rows = max(16, triton.next_power_of_2(q_len * (heads_q // heads_k)))
    with launch_device(q):
        attention_decode_kernel[(splits, batch * heads_k)](
            q, k, v,
            out_part, lse_part, max_part, sum_part,
            run.q_positions, run.k_positions, run.inv_freq, run.leaky, run.row_scale,
            *q.stride()[:3],
            *k.stride()[:3],
            *v.stride()[:3],
            *run.batch_strides,
            q_len, k_len, heads_q, heads_q // heads_k, chunk, splits,
            *run.runtime_scalars(q, k)[4:], run.factor,
            **run.constants, BLOCK_M=rows, BLOCK_N=block_n, **run.launch_options, enable_fp_fusion=False,
        )
    out.copy_(combine_partials(out_part, max_part, sum_part, run.row_scales()).transpose(1, 2))
    lse = torch.logsumexp(lse_part, dim=-1)  # LSE = log sum_s exp(LSE_s): ±inf where one is
    repair_forward(run, q, k, v, out, lse)  # the rows the float32 arithmetic may have lost, in float64
    return out, lse


def combine_partials(out_part, max_part, sum_part, row_scale):
    """O = sum_s w_s O_s of the chunks' partials, w_s = l_s 2^(r (M_s - M)) / sum_t l_t 2^(r (M_t - M)) with
    M = max_s M_s, the maxima taken before the scale r = log2(e) s f: every gap M_s - M is finite or -inf (a
    chunk without a key for the row), so no weight is inf - inf whatever the scale (exp(LSE_s - LSE) would be
    where the LSEs are beyond float32's range); one chunk gives its O_s unchanged; a NaN stays NaN."""
    top = max_part.amax(dim=-1, keepdim=True)
    weights = sum_part * torch.exp2((max_part - top) * (row_scale[..., None] if row_scale.dim() else row_scale))
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights[..., None] * out_part).sum(dim=-2)
