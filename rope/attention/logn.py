"""log-n attention scaling: multiply the logits of a query that sees n keys by log_L(n).

Su ("Entropy invariance and the scale of attention", kexue.fm/archives/8823, 2021) writes the
entropy of one softmax row over n logits lambda * s_j as ::

    H = log sum_j exp(lambda s_j) - lambda sum_j p_j s_j,

and, approximating the log-sum-exp by ``log n + lambda * mean(s)`` and sum_j p_j s_j by max(s)
(the row concentrates on its largest logits), gets ``H ~ log n - lambda (max s - mean s)``.
Holding H fixed as n grows asks for lambda proportional to log n; normalizing so that nothing
changes at the training length L gives the factor log n / log L. Applied only where it is above
1 (Qwen's ``use_logn_attn`` and Su's ReRoPE patch do this), so short contexts are untouched.

In causal attention query m (counted from 0) sees n = m + 1 keys.
"""

from __future__ import annotations

import math

import torch

from .._checks import float_tensor, integer, integer_tensor


def logn_scale(positions: torch.Tensor, training_length: int) -> torch.Tensor:
    """``max(1, ln(m + 1) / ln(L))`` for each query position m, float64, shape of ``positions``.

    Multiply the query (or the logits of its row) by this factor, on top of 1/sqrt(d).
    ``training_length`` L is the pre-training context length (>= 2).

    Args:
        positions: the query positions m, integer, >= 0, any shape.
        training_length: L, the pre-training context length (>= 2).
    """
    integer_tensor("positions", positions)
    training_length = integer("training_length", training_length, minimum=2)  # ln L must be positive
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0 (counted from 0), got minimum {int(positions.min())}")
    visible = positions.to(torch.float64) + 1
    return (torch.log(visible) / math.log(training_length)).clamp(min=1.0)


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of ``softmax(logits)`` along the last dimension, float64.

    ``H = logsumexp(x) - sum_j p_j x_j``; -inf logits (masked keys) contribute nothing.

    Args:
        logits: floating, ``[..., keys]`` with at least one key.

    Returns:
        float64, of logits' shape without the last dimension.
    """
    float_tensor("logits", logits)
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last dimension, got shape {tuple(logits.shape)}")
    x = logits.to(torch.float64)
    p = torch.softmax(x, dim=-1)
    weighted = torch.where(p > 0, p * x, torch.zeros_like(x))
    return torch.logsumexp(x, dim=-1) - weighted.sum(dim=-1)
