"""The RoPE-inside-attention kernels as differentiable PyTorch operators.

* ``torch.ops.rope.fused_attention(q, k, v, q_positions, k_positions, inv_freq, layout, causal,
  window, leaky_scale, softmax_scale, logn_length, attention_factor) -> (out, lse)``: the forward kernel
  (:func:`.triton_attention.launch`, or for decoding shapes, :func:`.triton_attention_decode.prefers_decode`,
  :func:`.triton_attention_decode.launch_decode`); out in q's dtype, lse float32;
* ``torch.ops.rope.fused_attention_backward(..., out, lse, grad_out, grad_lse, ...) -> (dq, dk,
  dv)``: the backward kernels (:func:`.triton_attention_backward.launch_backward`).

Both have fake implementations (metadata checks, output shapes) and the forward an autograd
formula, so that ``torch.compile(fullgraph=True)`` traces :func:`fused_rotary_attention` as one
opaque call. Arguments are checked as in :mod:`rope.attention.blockwise`: everything but tensor
values in the real and the fake implementations, the values (frequencies, positions, a key for
every query) in the real ones. As there, the flags and numbers are declared ``Scalar`` so that a
wrong type reaches the package's checks instead of a silent conversion.
"""

from __future__ import annotations

import torch
from torch.types import Number

from .. import _checks
from ..attention.blockwise import backward_formula, setup_context
from ..layouts import ROTATED, rotated_block_first
from .triton_attention import check_metadata, launch
from .triton_attention_backward import check_saved, launch_backward
from .triton_attention_decode import launch_decode, prefers_decode


def fused_rotary_attention(q, k, v, q_positions, k_positions, inv_freq, *, layout: str = "half",
                           causal: bool = True, window: int | None = None, leaky_scale: float | None = None,
                           softmax_scale: float | None = None, logn_length: int | None = None,
                           attention_factor: float = 1.0, rotated: str = "first") -> torch.Tensor:
    """Attention ``softmax(s L + mask) V`` with RoPE, ReRoPE or Leaky ReRoPE logits L, q and k rotated
    on load by the Triton kernels; differentiable in q, k and v.

    Shapes and options (``logn_length``: log-n scaling of each query's logits; ``attention_factor``:
    YaRN's factor on the rotated coordinates) as
    :func:`rope.kernels.triton_attention.launch` (float16, bfloat16 or
    float32 q, k, v of one dtype; float32 inv_freq; integer positions in (-2^31, 2^31)); returns
    ``[batch, q_len, heads_q, v_dim]`` in q's dtype. The float64 reference is
    :func:`rope.attention.blockwise.rotary_attention`. Finite inputs never give NaN, in the output or
    the gradients: the rows whose float32 arithmetic may have overflowed (a logit ``q . k`` a^2 or a
    sum P V beyond float32's range) are recomputed in float64
    (:mod:`rope.kernels.triton_attention_repair`); a ``softmax_scale`` or ``attention_factor`` the
    kernels' float32 arithmetic cannot hold is refused by name
    (:func:`rope.kernels.triton_attention.launch`).

    Args:
        q: ``[batch, q_len, heads_q, d]``, float16, bfloat16 or float32.
        k: ``[batch, k_len, heads_k, d]``, heads_q a multiple of heads_k.
        v: ``[batch, k_len, heads_k, v_dim]``.
        q_positions: integer ``[q_len]`` or ``[batch, q_len]``, in (-2^31, 2^31).
        k_positions: integer ``[k_len]`` or ``[batch, k_len]``, in (-2^31, 2^31).
        inv_freq: the frequencies theta_i ``[rotary_dim / 2]``, float32.
        layout: ``"half"`` or ``"interleaved"`` pairing of the rotated coordinates.
        causal: mask every key whose position exceeds the query's.
        window: ReRoPE's window w, or ``None`` for plain RoPE logits.
        leaky_scale: Leaky ReRoPE's k (with a window), or ``None`` for ReRoPE.
        softmax_scale: s, by default ``1 / sqrt(d)``.
        logn_length: L of log-n scaling, or ``None`` for none.
        attention_factor: a, YaRN's factor on the rotated coordinates of q and k.
        rotated: ``"first"`` or ``"last"``: which rotary_dim coordinates of each head are rotated
            (``"last"``: DeepSeek-V4; q and k get that block moved to the front, one copy of each,
            which leaves every logit as it was: :func:`rope.layouts.rotated_block_first`).
    """
    # checked before dispatch, which would turn an int beyond int64 (window=2**64) into a bare
    # OverflowError; the operator takes the checked values (floats as float, ints within int64)
    options = check_metadata(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale,
                             softmax_scale, logn_length, attention_factor)
    _checks.choice("rotated", rotated, ROTATED)
    q, k = (rotated_block_first(x, 2 * inv_freq.shape[-1], rotated) for x in (q, k))
    out, _ = fused_attention(q, k, v, q_positions, k_positions, inv_freq, layout, causal, options.window,
                             options.leaky_scale, None if softmax_scale is None else options.scale,
                             options.logn_length, options.attention_factor)
    return out


@torch.library.custom_op("rope::fused_attention", mutates_args=())
def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: str = "half",
    causal: Number = True,
    window: Number | None = None,
    leaky_scale: Number | None = None,
    softmax_scale: Number | None = None,
    logn_length: Number | None = None,
    attention_factor: Number = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of :func:`rope.kernels.triton_attention.launch`, or of the decoding kernel
    :func:`rope.kernels.triton_attention_decode.launch_decode` where it serves the shapes;
    differentiable in q, k and v.

    Args:
        q: ``[batch, q_len, heads_q, d]``, float16, bfloat16 or float32.
        k: ``[batch, k_len, heads_k, d]``, heads_q a multiple of heads_k.
        v: ``[batch, k_len, heads_k, v_dim]``.
        q_positions: integer ``[q_len]`` or ``[batch, q_len]``, in (-2^31, 2^31).
        k_positions: integer ``[k_len]`` or ``[batch, k_len]``, in (-2^31, 2^31).
        inv_freq: the frequencies theta_i ``[rotary_dim / 2]``, float32.
        layout: ``"half"`` or ``"interleaved"`` pairing of the rotated coordinates.
        causal: mask every key whose position exceeds the query's.
        window: ReRoPE's window w, or ``None`` for plain RoPE logits.
        leaky_scale: Leaky ReRoPE's k (with a window), or ``None`` for ReRoPE.
        softmax_scale: s, by default ``1 / sqrt(d)``.
        logn_length: L of log-n scaling, or ``None`` for none.
        attention_factor: a, YaRN's factor on the rotated coordinates of q and k.

    Returns:
        ``(out, lse)``: out ``[batch, q_len, heads_q, v_dim]`` in q's dtype, lse float32
        ``[batch, heads_q, q_len]``.
    """
    forward = launch_decode if prefers_decode(q, k) else launch
    return forward(q, k, v, q_positions, k_positions, inv_freq, layout=layout, causal=causal, window=window,
                   leaky_scale=leaky_scale, softmax_scale=softmax_scale, logn_length=logn_length,
                   attention_factor=attention_factor)


@fused_attention.register_fake
def _(q, k, v, q_positions, k_positions, inv_freq, layout="half", causal=True, window=None, leaky_scale=None,
      softmax_scale=None, logn_length=None, attention_factor=1.0):
    check_metadata(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale, softmax_scale,
                    logn_length, attention_factor)
    batch, q_len, heads_q, _ = q.shape
    return q.new_empty(batch, q_len, heads_q, v.shape[3]), q.new_empty(batch, heads_q, q_len, dtype=torch.float32)


@torch.library.custom_op("rope::fused_attention_backward", mutates_args=())
def fused_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    inv_freq: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor,
    layout: str = "half",
    causal: Number = True,
    window: Number | None = None,
    leaky_scale: Number | None = None,
    softmax_scale: Number | None = None,
    logn_length: Number | None = None,
    attention_factor: Number = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of :func:`fused_attention` (:func:`rope.kernels.triton_attention_backward.launch_backward`).

    Args:
        q: ``[batch, q_len, heads_q, d]``, float16, bfloat16 or float32.
        k: ``[batch, k_len, heads_k, d]``, heads_q a multiple of heads_k.
        v: ``[batch, k_len, heads_k, v_dim]``.
        q_positions: integer ``[q_len]`` or ``[batch, q_len]``, in (-2^31, 2^31).
        k_positions: integer ``[k_len]`` or ``[batch, k_len]``, in (-2^31, 2^31).
        inv_freq: the frequencies theta_i ``[rotary_dim / 2]``, float32.
        out: the forward's output.
        lse: the forward's log-sum-exp of each row.
        grad_out: the gradient with respect to out.
        grad_lse: the gradient with respect to lse.
        layout: ``"half"`` or ``"interleaved"`` pairing of the rotated coordinates.
        causal: mask every key whose position exceeds the query's.
        window: ReRoPE's window w, or ``None`` for plain RoPE logits.
        leaky_scale: Leaky ReRoPE's k (with a window), or ``None`` for ReRoPE.
        softmax_scale: s, by default ``1 / sqrt(d)``.
        logn_length: L of log-n scaling, or ``None`` for none.
        attention_factor: a, YaRN's factor on the rotated coordinates of q and k.
        rotated: ``"first"`` or ``"last"``: which rotary_dim coordinates of each head are rotated
            (``"last"``: DeepSeek-V4; q and k get that block moved to the front, one copy of each,
            which leaves every logit as it was: :func:`rope.layouts.rotated_block_first`).
    """
    return launch_backward(q, k, v, q_positions, k_positions, inv_freq, out, lse, grad_out, grad_lse, layout=layout,
                           causal=causal, window=window, leaky_scale=leaky_scale, softmax_scale=softmax_scale,
                           logn_length=logn_length, attention_factor=attention_factor)


@fused_attention_backward.register_fake
def _(q, k, v, q_positions, k_positions, inv_freq, out, lse, grad_out, grad_lse, layout="half", causal=True,
      window=None, leaky_scale=None, softmax_scale=None, logn_length=None, attention_factor=1.0):
    check_metadata(q, k, v, q_positions, k_positions, inv_freq, layout, causal, window, leaky_scale, softmax_scale,
                    logn_length, attention_factor)
    check_saved(q, v, out, lse, grad_out, grad_lse)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


fused_attention.register_autograd(backward_formula(fused_attention_backward), setup_context=setup_context)
