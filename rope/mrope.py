"""Multimodal RoPE (M-RoPE): a position per axis (time, height, width) and an axis per pair.

Qwen2-VL (Wang et al. 2024, "Qwen2-VL", section 2.1) gives every token a position triple
p = (t, h, w): a visual token at frame f, row r, column c of a grid that starts at position s has
p = (s + f, s + r, s + c); a text token at position m has p = (m, m, m). Rotated pair i belongs
to one axis a(i) and turns by the angle p_a(i) * theta_i, so ::

    R_p = exp(t B_t + h B_h + w B_w),
    B_axis = the RoPE generator on that axis's pairs only.

The three generators act on disjoint pairs, hence commute, and R_p^T R_q = R_(q - p): the score
q^T R_p^T R_q k depends on the difference of all three coordinates, as in :mod:`rope.axial`.
A text token has t = h = w = m, so R_p = R_m: on text, M-RoPE is exactly 1D RoPE with the same
theta_i, whatever the assignment of pairs to axes.

Which pairs rotate with which axis is given by ``mrope_section = (s_t, s_h, s_w)``, with
s_t + s_h + s_w = rotary_dim / 2 (pairs in the order of :func:`rope.layouts.pair_indices`):

* chunked (Qwen2-VL, Qwen2.5-VL, GLM-4V): pairs 0 .. s_t-1 follow t, the next s_h follow h,
  the last s_w follow w. Time gets the fastest frequencies and width the slowest.
* interleaved (Qwen3-VL, Qwen3.5; config key ``mrope_interleaved``): pair i follows h when
  i mod 3 = 1 and i < 3 s_h, w when i mod 3 = 2 and i < 3 s_w, and t otherwise, so every axis
  gets fast and slow frequencies (transformers' ``recomposition_frequencies`` of Qwen3-VL).
* alternating (ERNIE 4.5 VL): h and w take turns over the fast pairs, t takes the slowest
  (:func:`section_axes` reads that model's section, listed as (s_h, s_w, s_t)).
* openpangu (vLLM's ``rope_type`` ``openpangu``, ``MRotaryEmbeddingInterleaved`` in
  ``vllm/model_executor/layers/rotary_embedding/openpangu_rope.py``): the last pair follows t;
  the others are dealt one at a time, each to the axis with pairs left that has so far received
  the smallest fraction of its share (ties to the lower axis), never the previous pair's axis
  while another axis has pairs left (:func:`openpangu_axes`).

:func:`apply_mrope` is :func:`rope.apply_rotary` with the axes (one path,
:func:`rope.apply.rotate_qk`): the torch path computes angles, cos, sin and products in float64
and rounds once; on CUDA the fused Triton kernel runs instead, each pair reading its row of the
position ids (exactly reduced angles; float-float math for float16 and bfloat16, float64 math
for float64, float32 math for float32; one rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch

from . import _checks
from ._checks import integer_tensor
from .apply import check_axes, exact_cos_sin, per_pair_positions, rotate_qk
from .limits import MROPE_AXES

MROPE_STYLES = ("chunked", "interleaved", "alternating", "openpangu")


def check_section(mrope_section, name: str = "mrope_section") -> tuple[int, int, int]:
    """``mrope_section`` as a tuple of three positive ints (pairs on t, h and w), or an error
    naming ``name``: ``TypeError`` unless a sequence of ints (NumPy integers are ints, and come
    back as ``int``), ``ValueError`` unless three of them, each positive.

    Args:
        mrope_section: the section ``(s_t, s_h, s_w)`` to check.
        name: the name the errors give it (a config key, say).
    """
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence) or any(
        isinstance(s, bool) or not isinstance(s, Integral) for s in mrope_section
    ):
        raise TypeError(f"{name} must be a list of three ints (pairs on t, h, w), got {mrope_section!r}")
    if len(mrope_section) != len(MROPE_AXES) or any(s <= 0 for s in mrope_section):
        raise ValueError(f"{name} must be three positive ints (pairs on t, h, w), got {list(mrope_section)}")
    return tuple(int(s) for s in mrope_section)


def section_axes(mrope_section, pairs: int, *, style: str = "chunked") -> torch.Tensor:
    """The axis (0 = t, 1 = h, 2 = w) of each of ``pairs`` rotated pairs, int64 ``[pairs]``.

    ``chunked``: s_t zeros, s_h ones, s_w twos. ``interleaved``: 1 at i = 1, 4, .., 3 s_h - 2,
    2 at i = 2, 5, .., 3 s_w - 1, 0 elsewhere. ``alternating`` (ERNIE 4.5 VL, whose config lists
    its section as (s_h, s_w, s_t), read here in that order): h and w alternate over the first
    s_h + s_w pairs (h on even i), t takes the last s_t, so s_h must equal s_w. Either way axis a
    gets exactly s_a pairs; a section that does not fit (sum != pairs, interleaved positions past
    the last pair, unequal h and w when alternating) is an error. ``openpangu``: the sequence of
    :func:`openpangu_axes`.

    Args:
        mrope_section: the config's ``mrope_section``, three positive ints summing to ``pairs``.
        pairs: the number of rotated pairs, rotary_dim / 2.
        style: ``"chunked"``, ``"interleaved"``, ``"alternating"`` or ``"openpangu"``.
    """
    sections = check_section(mrope_section)
    pairs = _checks.integer("pairs", pairs, minimum=1)
    if sum(sections) != pairs:
        raise ValueError(
            f"mrope_section {list(sections)} sums to {sum(sections)}, but there are rotary_dim / 2 = {pairs} pairs"
        )
    _checks.choice("style", style, MROPE_STYLES)
    if style == "chunked":
        return torch.repeat_interleave(torch.arange(len(MROPE_AXES)), torch.tensor(sections))
    if style == "openpangu":
        return openpangu_axes(sections)
    index = torch.arange(pairs)
    if style == "alternating":
        s_h, s_w, s_t = sections
        if s_h != s_w:
            raise ValueError(f"alternating mrope_section (s_h, s_w, s_t) = {list(sections)} needs s_h == s_w")
        return torch.where(index < s_h + s_w, 1 + index % 2, 0)
    axes = torch.zeros(pairs, dtype=torch.int64)
    for axis in (1, 2):
        axes[(index % 3 == axis) & (index < 3 * sections[axis])] = axis
    counts = tuple(int((axes == a).sum()) for a in range(len(MROPE_AXES)))
    if counts != sections:
        raise ValueError(
            f"interleaved mrope_section {list(sections)} does not fit {pairs} pairs: every third pair from "
            f"pair 1 (h) and pair 2 (w) gives {counts[1]} and {counts[2]} pairs"
        )
    return axes


def openpangu_axes(mrope_section) -> torch.Tensor:
    """openPangu-VL's assignment of pairs to axes (vLLM's ``get_mrope_interleaved_id_list``
    with ``force_last``), int64 ``[s_t + s_h + s_w]``.

    The last pair is reserved for t, so axis a has n_a = (s_t - 1, s_h, s_w) pairs to deal. Pair
    i goes to the axis a with pairs left that minimises (placed_a / n_a, a), placed_a counting the
    pairs a has received; the axis of pair i - 1 is skipped unless it is the only one with pairs
    left. Every axis therefore spreads over fast and slow frequencies in proportion to its share.

    Args:
        mrope_section: ``(s_t, s_h, s_w)``, three positive ints.
    """
    share = list(check_section(mrope_section))
    share[0] -= 1
    placed = [0] * len(share)
    axes: list[int] = []
    for _ in range(sum(share)):
        left = [a for a in range(len(share)) if placed[a] < share[a]]
        fresh = [a for a in left if not axes or a != axes[-1]]
        axis = min(fresh or left, key=lambda a: (placed[a] / share[a], a))
        placed[axis] += 1
        axes.append(axis)
    return torch.tensor(axes + [0], dtype=torch.int64)


def _check_position_ids(position_ids: torch.Tensor) -> None:
    integer_tensor("position_ids", position_ids)
    if position_ids.dim() not in (2, 3) or position_ids.shape[0] != len(MROPE_AXES):
        raise ValueError(
            "position_ids must have shape [3, seq] or [3, batch, seq] (rows t, h, w), "
            f"got {tuple(position_ids.shape)}"
        )


def pair_positions(position_ids: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """The position p_a(i) that pair i turns by: row ``axes[i]`` of ``position_ids`` ``[3, ...]``
    (t, h, w), shape ``position_ids.shape[1:] + (pairs,)``; ``axes`` from :func:`section_axes`.

    Args:
        position_ids: integer ``[3, seq]`` or ``[3, batch, seq]``, rows t, h, w.
        axes: the axis of each pair, integer ``[pairs]`` with values in {0, 1, 2}.
    """
    _check_position_ids(position_ids)
    integer_tensor("axes", axes, dim=1)
    check_axes(axes, axes.shape[0])
    return per_pair_positions(position_ids, axes)


def mrope_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor,
                  axes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p_a(i) * theta_i, the angle reduced modulo 2 pi exactly (float64; float32
    where float64 does not exist), shape ``position_ids.shape[1:] + (pairs,)``. ``inv_freq``:
    finite float32 or float64 theta_i (:func:`rope._checks.finite_frequencies`).

    Args:
        position_ids: integer ``[3, seq]`` or ``[3, batch, seq]``, rows t, h, w.
        inv_freq: the frequencies theta_i ``[pairs]``.
        axes: the axis of each pair, integer ``[pairs]`` (:func:`section_axes`).

    Returns:
        ``(cos, sin)``.
    """
    _check_position_ids(position_ids)
    _checks.finite_frequencies("inv_freq", inv_freq, dtypes=_checks.FREQUENCY_DTYPES, values=False)  # values:
    _checks.same_device("position_ids", position_ids, inv_freq=inv_freq)  # by rope.angles.cos_sin
    check_axes(axes, inv_freq.shape[0])
    return exact_cos_sin(per_pair_positions(position_ids, axes), inv_freq, per_pair=True)


def apply_mrope(
    q: torch.Tensor,
    k: torch.Tensor,
    position_ids: torch.Tensor,
    inv_freq: torch.Tensor,
    axes: torch.Tensor,
    *,
    layout: str = "half",
    rotated: str = "first",
    rotary_dim: int | None = None,
    attention_factor: float = 1.0,
    conjugate: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by their (t, h, w) positions.

    Args:
        q: ``[batch, seq, heads_q, head_dim]``.
        k: ``[batch, seq, heads_k, head_dim]`` (heads_k may differ: GQA, MQA).
        position_ids: integer ``[3, seq]`` or ``[3, batch, seq]``, rows t, h, w
            (e.g. from :func:`multimodal_positions`).
        inv_freq: the rotary_dim/2 frequencies theta_i (any scaling type, :func:`rope.inv_freq`).
        axes: the axis of each pair, :func:`section_axes` of the config's ``mrope_section``: an
            integer ``[rotary_dim / 2]`` tensor on any device (int64 on q's device, as a model's
            buffer is, saves a copy per call).
        layout: ``"half"`` (Qwen) or ``"interleaved"`` (GLM-4V) pairing of coordinates.
        rotated: as in :func:`rope.apply_rotary`: the first (every M-RoPE model) or the last
            rotary_dim coordinates of each head.
        rotary_dim: rotated width (default ``2 * len(inv_freq)``); the rest passes through.
        attention_factor: multiplies cos and sin.
        conjugate: rotate by minus the angles (the transpose).
        backend: as in :func:`rope.apply_rotary`: ``"auto"`` runs the fused Triton kernel
            (exactly reduced angles) on CUDA tensors, float64 torch otherwise.

    Returns:
        ``(q_out, k_out)`` in the dtype of q and k, each value rounded once (from float64 on the
        torch path, from float32 in the kernel).

    Raises:
        TypeError, ValueError: for any bad argument, naming it (README, "Errors"); on CUDA a bad
            axis value fails an asynchronous device assertion instead (no host synchronisation).
    """
    return rotate_qk(q, k, position_ids, inv_freq, axes=axes, layout=layout, rotated=rotated, rotary_dim=rotary_dim,
                     attention_factor=attention_factor, conjugate=conjugate, backend=backend)



def _frame_times(frames: int, time_interval: int | float) -> torch.Tensor:
    """trunc(time_interval * f) for frames f = 0 .. frames - 1, int64: an int time_interval exactly,
    a float one as transformers' ``get_vision_position_ids`` computes it, the float32 product
    float32(f) * float32(time_interval) rounded once and truncated; ``ValueError`` naming
    time_interval where that does not fit int64."""
    if isinstance(time_interval, int):
        if (frames - 1) * time_interval > _checks.INT64_MAX:
            last = (frames - 1) * time_interval
            raise ValueError(f"time_interval {time_interval} puts frame {frames - 1} at {last}, past the largest int64 "
                             "position")
        return torch.arange(frames) * time_interval
    interval = torch.tensor(time_interval, dtype=torch.float32)
    if not torch.isfinite(interval):
        raise ValueError(f"time_interval must lie in float32's range (frame times are float32 products, as in "
                         f"transformers), got {time_interval!r}")
    times = torch.arange(frames).to(torch.float32) * interval
    if frames and float(times[-1]) >= 2.0**63:
        raise ValueError(f"time_interval {time_interval!r} puts frame {frames - 1} at {float(times[-1])}, past the "
                         "largest int64 position")
    return times.long()


def _segment(segment) -> int | tuple[int, int, int]:
    """A text run's length or a visual block's (T, H, W), as ints (NumPy integers are ints)."""
    expected = "each segment must be a positive int (text tokens) or a (T, H, W) tuple of positive ints"
    parts = segment if isinstance(segment, tuple) else (segment,)
    if any(isinstance(n, bool) or not isinstance(n, Integral) for n in parts) or len(parts) not in (1, 3):
        error = ValueError if isinstance(segment, tuple) and len(parts) != 3 else TypeError
        raise error(f"{expected}, got {segment!r}")
    if any(n <= 0 for n in parts):
        raise ValueError(f"{expected}, got {segment!r}")
    return tuple(int(n) for n in parts) if isinstance(segment, tuple) else int(segment)


def multimodal_positions(segments, *, start: int = 0, time_interval: float = 1) -> torch.Tensor:
    """Position ids ``[3, tokens]`` (rows t, h, w) of a sequence of text runs and visual grids.

    ``segments`` lists, in order, ints (a run of that many text tokens) and ``(T, H, W)`` tuples
    (a visual block of T frames of H x W tokens, after the vision encoder's merging, tokens in
    frame, row, column order). A block starting at position s gets
    t = s + trunc(time_interval * frame), h = s + row, w = s + column; text continues one past
    the largest position used so far (Qwen2-VL's rule; for an image, s + max(H, W), as
    transformers' ``get_rope_index``). An int ``time_interval`` multiplies exactly; a float one
    (Qwen2.5-VL spaces frames by seconds times tokens per second) as transformers computes it:
    float32(frame) * float32(time_interval), rounded once to float32, then truncated. ``start``,
    the segments' sizes and an int ``time_interval`` are ints or NumPy integers; a position that
    would not fit int64 is a ``ValueError`` naming start and time_interval.

    Args:
        segments: text runs (positive ints) and visual blocks (``(T, H, W)`` tuples of positive ints),
            in order; at least one.
        start: the position of the first token, >= 0.
        time_interval: the step of t from one frame to the next, >= 0, int or float.
    """
    start = _checks.integer("start", start, minimum=0)
    if isinstance(time_interval, Integral) and not isinstance(time_interval, bool):
        time_interval = _checks.integer("time_interval", time_interval, minimum=0)
    else:
        time_interval = _checks.number("time_interval", time_interval, minimum=0.0)
    blocks, position = [], start
    for segment in segments:
        segment = _segment(segment)
        if isinstance(segment, int):
            last = position + segment - 1
            if last > _checks.INT64_MAX:
                raise ValueError(f"positions must fit int64: the text run of {segment} tokens from {position} would "
                                 f"reach {last} (start={start}, time_interval={time_interval!r})")
            blocks.append((torch.arange(segment) + position).expand(len(MROPE_AXES), -1))
        else:
            frames, rows, columns = segment
            times = _frame_times(frames, time_interval)
            last = position + max(int(times[-1]), rows - 1, columns - 1)
            if last > _checks.INT64_MAX:
                raise ValueError(f"positions must fit int64: the block {segment} from {position} would reach {last} "
                                 f"(start={start}, time_interval={time_interval!r})")
            t, h, w = torch.meshgrid(times, torch.arange(rows), torch.arange(columns), indexing="ij")
            blocks.append(torch.stack([t, h, w]).reshape(len(MROPE_AXES), -1) + position)
        position = last + 1
    if not blocks:
        raise ValueError("segments must hold at least one text run or visual block")
    return torch.cat(blocks, dim=1)
