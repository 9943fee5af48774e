"""XD-RoPE (HunYuan-VL): M-RoPE over four position axes, with HunYuan's NTK alpha base.

vLLM's ``XDRotaryEmbedding`` (``vllm/model_executor/layers/rotary_embedding/xdrope.py``,
https://github.com/vllm-project/vllm) gives pair i the frequency theta_i = b'^(-2i/d) with the fixed
base b' = b * alpha^(d/(d-2)) (its ``DynamicNTKAlphaRotaryEmbedding``) and splits the d/2 pairs into
four consecutive blocks of ``xdrope_section`` = (s_0, s_1, s_2, s_3) pairs, s_0 + s_1 + s_2 + s_3 =
d/2: pair i of block a turns by p_a theta_i, where p_a is row a of the ``[4, ...]`` position ids (the
P, W, H, T positions of HunYuan-VL; text tokens have the same position on every row). Attention
factor 1.

:func:`apply_xdrope` rotates with the exact path of :func:`rope.apply_mrope` in two calls, since
that path has three position rows: blocks 0-2 in the first, block 3 in the second, each call giving
the other call's pairs the frequency 0, which turns them by exactly nothing (cos 0 = 1, sin 0 = 0),
so every coordinate is still rounded once from the exact rotation.
"""

from __future__ import annotations

import torch

from . import _checks
from .apply import apply_rotary
from .frequencies import inv_freq
from .mrope import apply_mrope
from .registry import register_rope_type

XD_AXES = 4
"""The position rows of XD-RoPE: P, W, H, T."""


def _section(name: str, value) -> tuple[int, ...]:
    """``xdrope_section``: four integers >= 0 (pairs per axis), at least one of them > 0."""
    if not isinstance(value, (list, tuple)) or len(value) != XD_AXES:
        raise TypeError(f"{name} must be a list of {XD_AXES} integers (pairs per axis), got {value!r}")
    section = tuple(_checks.integer(f"{name}[{a}]", v, minimum=0) for a, v in enumerate(value))
    if not sum(section):
        raise ValueError(f"{name} must give at least one pair to an axis, got {list(section)}")
    return section


def xdrope_axes(xdrope_section, pairs: int) -> torch.Tensor:
    """The axis (0 .. 3) of each of the ``pairs`` rotated pairs: block a of ``xdrope_section[a]``
    consecutive pairs, int64 ``[pairs]``; the section must sum to ``pairs`` (rotary_dim / 2).

    Args:
        xdrope_section: four integers >= 0, the pairs that follow each position row.
        pairs: the number of rotated pairs, rotary_dim / 2.
    """
    section = _section("xdrope_section", xdrope_section)
    pairs = _checks.integer("pairs", pairs, minimum=1)
    if sum(section) != pairs:
        raise ValueError(f"xdrope_section {list(section)} must sum to rotary_dim / 2 = {pairs} (one axis per pair), "
                         f"got {sum(section)}")
    return torch.repeat_interleave(torch.arange(XD_AXES), torch.tensor(section))


def _xdrope(cfg, dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """theta_i = (b alpha^(d/(d-2)))^(-2i/d), the frequencies of ``dynamic`` with ``alpha``; the
    section is checked against d here (it must sum to d/2)."""
    xdrope_axes(cfg.extra["xdrope_section"], dim // 2)
    return inv_freq({"rope_type": "dynamic", "rope_theta": cfg.rope_theta, "alpha": cfg.extra["alpha"]}, dim)


def _alpha(name: str, value) -> float:
    return _checks.number(name, value, minimum=1.0)


register_rope_type("xdrope", _xdrope, required_keys=("alpha", "xdrope_section"),
                   key_checks={"alpha": _alpha, "xdrope_section": _section})


def apply_xdrope(
    q: torch.Tensor,
    k: torch.Tensor,
    position_ids: torch.Tensor,
    inv_freq: torch.Tensor,
    xdrope_section,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    conjugate: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by XD-RoPE: pair i of block a turns by ``position_ids[a]`` times theta_i.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]``.
        position_ids: integer ``[4, seq]`` or ``[4, batch, seq]``, the P, W, H, T positions.
        inv_freq: the rotary_dim/2 frequencies (``rope.inv_freq`` of an ``xdrope`` config).
        xdrope_section: four integers >= 0 summing to rotary_dim/2, the pairs of each row.
        layout, rotary_dim, conjugate, backend: as in :func:`rope.apply_rotary`.

    Returns:
        ``(q_out, k_out)``, each coordinate rounded once from the exact rotation (torch path).
    """
    position_ids = _checks.integer_tensor("position_ids", position_ids)
    if position_ids.dim() not in (2, 3) or position_ids.shape[0] != XD_AXES:
        raise ValueError(f"position_ids must be [4, seq] or [4, batch, seq] (P, W, H, T), got "
                         f"{list(position_ids.shape)}")
    inv_freq = _checks.float_tensor("inv_freq", inv_freq, dtypes=(torch.float32, torch.float64), dim=1)
    axes = xdrope_axes(xdrope_section, inv_freq.shape[0]).to(inv_freq.device)
    last = axes == XD_AXES - 1
    zero = torch.zeros((), dtype=inv_freq.dtype, device=inv_freq.device)
    options = {"layout": layout, "rotary_dim": rotary_dim, "conjugate": conjugate, "backend": backend}
    q, k = apply_mrope(q, k, position_ids[:XD_AXES - 1], torch.where(last, zero, inv_freq),
                       axes.clamp(max=XD_AXES - 2), **options)
    return apply_rotary(q, k, position_ids[XD_AXES - 1], torch.where(last, inv_freq, zero), **options)

