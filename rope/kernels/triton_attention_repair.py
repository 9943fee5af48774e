"""The rows the fused attention kernels' float32 arithmetic cannot hold, recomputed exactly afterwards.

The kernels (:mod:`.triton_attention`, :mod:`.triton_attention_decode` and
:mod:`.triton_attention_backward`) form float32 logits L = q . k (a^2 on the rotary part) and do
not read q, k and v before computing: a pass over them would cost a decoding step as much memory
traffic as the kernel itself, and a scaled frame inside the kernels costs registers (per-row
power-of-two prescales in the forward spilled 296 bytes per thread on sm_80). A logit beyond
float32's range makes its row's maximum +inf (then inf - inf: NaN) or every logit of the row
-inf; a sum P V beyond it makes the output ±inf or NaN, where the exact output, a convex
combination of v, is finite. So the launchers check the kernels' results afterwards, one pass
over out and lse, and recompute the rows that fail the check with the float64 reference
:func:`rope.attention.blockwise.blockwise_attention` (``compute_dtype=torch.float64``: power-of-two
frames, finite for every finite input), rounded once to the kernels' dtypes. The choice: exact
(the kernels' own reference), nothing added to the kernels (no register, no variant to compile and
keep free of spills), and its cost, float64 torch operations, paid only for the rows recomputed.

Which rows (:func:`lost_rows`). With r = log2(e) s f the row's float32 scale (f its log-n factor,
else 1), M the largest of its logits, l = sum_j 2^(r (L_j - M)) in [1, k_len] and lambda = lse
log2(e) = r M + log2 l, a row is kept when its output is finite and::

    log2(k_len) + 1 - r 2^127  <=  lambda  <  r 2^127.

Then M < 2^127 (r M <= lambda), so no logit of the row is +inf, and M > -2^127 (r M >= lambda -
log2 k_len), so a logit the float32 arithmetic lost (-inf beyond the range, or a gap L_j - M beyond
it) lies at least 2^127 below M: its exact weight is below 2^(-r 2^127) <= 2^-128, since the
kernels take no r below 2^-120 (:func:`.triton_attention.check_logit_scale`), far below float32's
rounding of l >= 1. Every other row is recomputed: a NaN or infinite output or lse, an lse of ±inf
(s M beyond float32's range: the float64 result rounds to the same hard maximum and ±inf, now with
gradients), a very negative maximum. With ordinary inputs and scales lambda is tens against r 2^127
of about 2^124: nothing is recomputed.

The backward (:func:`repair_backward`): dk and dv sum over every query row of a key head, so a
lost row spoils its whole (batch row, key head) slice; such slices, and those with a non-finite
gradient (a sum beyond float32's range, which may be legitimate ±inf or an overflowed partial sum),
are recomputed by the float64 forward and :func:`rope.attention.blockwise.blockwise_attention_backward`
(which recomputes a row whose LSE is ±inf from its maximum and sum), each gradient rounded once.

Rows or slices that read a non-finite input (NaN or ±inf in q, k, v, or the incoming gradients) are
left as the kernels computed them: the NaN reaches the rows the kernels' docstrings say.

Not detected: a logit whose float32 products or partial sums overflow to -inf while the exact sum
cancels to a value within float32's range (``sum |q_i k_i|`` a^2 beyond 2^128 with ``|q . k|`` a^2
far below it) gives its key the weight 0 in the kernels (a +inf or NaN partial sum makes the row
NaN, and it is recomputed).

Cost on the ordinary path: one pass over out (elementwise finiteness) and lse, and one boolean
read on the host, which on CUDA waits for the kernels (a synchronisation). Under CUDA graph capture
the read cannot wait: there the check is an asynchronous device assertion that refuses, naming q
and k, a call with a row to recompute.
"""

from __future__ import annotations

import math

import torch

from ..attention.blockwise import blockwise_attention, blockwise_attention_backward

_LOG2E = 1 / math.log(2.0)
_HALF_RANGE = 2.0**127  # half of float32's range: the largest |M| of a kept row (module docstring)
_BLOCK_SIZE = 128  # the float64 reference's tile (memory: a block_size^2 tile of logits per head)


def lost_rows(run, k_len: int, out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """bool ``[batch, heads_q, q_len]``: the rows whose output or lse the kernels' float32 arithmetic may have
    lost (module docstring): output not finite, or lambda = lse log2(e) outside
    [log2(k_len) + 1 - r 2^127, r 2^127), r each row's log2(e) s f as the kernels hold it (float32)."""
    bound = run.row_scales().to(torch.float64) * _HALF_RANGE
    lam = lse.to(torch.float64) * _LOG2E
    kept = (lam < bound) & (lam >= math.log2(max(k_len, 1)) + 1 - bound)  # NaN: not kept
    return ~(kept & out.isfinite().all(dim=-1).transpose(1, 2))


def _any(lost: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether some row is lost: one boolean read (on CUDA a synchronisation). Under CUDA graph capture no read
    can wait: an asynchronous device assertion refuses such a call instead."""
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        torch._assert_async(~lost.any(), "q and k must give logits within float32's range under CUDA graph capture "
                                         "(the fused kernels recompute the other rows in float64, which a captured "
                                         "graph cannot branch to)")
        return False
    return bool(lost.any())


def _float64_options(run, inv_freq: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The frequencies and options of :func:`rope.attention.blockwise.blockwise_attention` for the kernels' call
    ``run``: zero frequencies without rotation (``rotate=False``, which takes no window and the factor 1)."""
    options = run.options
    theta = inv_freq if run.constants["ROTATE"] else torch.zeros_like(inv_freq)
    return theta, dict(layout=options.layout, causal=options.causal, window=options.window,
                       leaky_scale=options.leaky_scale, softmax_scale=options.scale, block_size=_BLOCK_SIZE,
                       logn_length=options.logn_length, attention_factor=options.attention_factor,
                       compute_dtype=torch.float64)


def _row(positions: torch.Tensor, b: int) -> torch.Tensor:
    """Batch row b's positions (one row per sequence, or the shared ones)."""
    return positions[b] if positions.dim() == 2 else positions


def repair_forward(run, q, k, v, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Recompute in place, in float64 and rounded once, the rows of the kernels' ``out`` ``[batch, q_len, heads_q,
    v_dim]`` and ``lse`` ``[batch, heads_q, q_len]`` that :func:`lost_rows` names, except those that read a
    non-finite q, k or v (left as computed). ``run`` is the call's :class:`.triton_attention.Launch`."""
    lost = lost_rows(run, k.shape[1], out, lse)
    if not _any(lost, q):
        return
    group = q.shape[2] // k.shape[2]
    readable = k.isfinite().all(dim=3).all(dim=1) & v.isfinite().all(dim=3).all(dim=1)  # [batch, heads_k]
    lost &= q.isfinite().all(dim=3).transpose(1, 2) & readable.repeat_interleave(group, dim=1)[..., None]
    theta, options = _float64_options(run, run.inv_freq)
    for b in lost.any(dim=2).any(dim=1).nonzero().flatten().tolist():
        rows = lost[b].any(dim=0).nonzero().flatten()
        exact, exact_lse = blockwise_attention(q[b:b + 1, rows], k[b:b + 1], v[b:b + 1], _row(run.q_positions, b)[rows],
                                               _row(run.k_positions, b), theta, **options)
        chosen = lost[b][:, rows]  # [heads_q, rows]
        out[b, rows] = torch.where(chosen.T[..., None], exact[0].to(out.dtype), out[b, rows])
        lse[b, :, rows] = torch.where(chosen, exact_lse[0].to(lse.dtype), lse[b, :, rows])


def repair_backward(run, q, k, v, out, lse, grad_out, grad_lse, dq, dk, dv) -> None:
    """Recompute in place, in float64 and rounded once, the gradients ``dq``, ``dk`` and ``dv`` of every (batch
    row, key head) slice that holds a row :func:`lost_rows` names or a non-finite gradient (module docstring),
    except the slices that read a non-finite q, k, v, grad_out or grad_lse (left as computed): the float64
    forward of the slice and its backward (:func:`rope.attention.blockwise.blockwise_attention_backward`)."""
    batch, q_len, heads_q, _ = q.shape
    heads_k = k.shape[2]
    group = heads_q // heads_k

    def per_key_head(rows: torch.Tensor) -> torch.Tensor:  # [batch, heads_q, ...] -> [batch, heads_k]
        return rows.flatten(2).any(dim=2).unflatten(1, (heads_k, group)).any(dim=2)

    lost = per_key_head(lost_rows(run, k.shape[1], out, lse) | ~dq.isfinite().all(dim=3).transpose(1, 2))
    lost |= ~(dk.isfinite().all(dim=3).all(dim=1) & dv.isfinite().all(dim=3).all(dim=1))
    if not _any(lost, q):
        return
    unreadable = per_key_head(~(q.isfinite().all(dim=3) & grad_out.isfinite().all(dim=3)).transpose(1, 2))
    if grad_lse is not None:
        unreadable |= per_key_head(~grad_lse.isfinite())
    unreadable |= ~(k.isfinite().all(dim=3).all(dim=1) & v.isfinite().all(dim=3).all(dim=1))
    lost &= ~unreadable
    theta, options = _float64_options(run, run.inv_freq)
    for b in lost.any(dim=1).nonzero().flatten().tolist():
        key_heads = lost[b].nonzero().flatten()
        heads = (key_heads[:, None] * group + torch.arange(group, device=q.device)).flatten()
        tensors = (q[b:b + 1, :, heads], k[b:b + 1, :, key_heads], v[b:b + 1, :, key_heads])
        positions = (_row(run.q_positions, b), _row(run.k_positions, b), theta)
        exact, exact_lse = blockwise_attention(*tensors, *positions, **options)
        d_out = grad_out[b:b + 1, :, heads].to(torch.float64)
        d_lse = torch.zeros_like(exact_lse) if grad_lse is None else grad_lse[b:b + 1, heads].to(torch.float64)
        gq, gk, gv = blockwise_attention_backward(*tensors, *positions, exact, exact_lse, d_out, d_lse, **options)
        dq[b, :, heads], dk[b, :, key_heads], dv[b, :, key_heads] = gq[0], gk[0], gv[0]
