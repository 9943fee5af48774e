"""Typed RoPE configuration, read from a Hugging Face style ``rope_parameters`` mapping.

Hugging Face keeps RoPE settings in a plain dict (``config.rope_parameters``, formerly
``config.rope_scaling``). :func:`parse_config` turns such a mapping into a frozen
:class:`RopeConfig`, checking types and ranges once, so the frequency functions in
:mod:`rope.frequencies` can be pure functions of typed values.

Keys read (all others are ignored, as transformers does):

=================================  ====================================================
``rope_type`` (or legacy ``type``) ``default``, ``linear``, ``ntk``, ``dynamic``, ``yarn``,
                                   ``longrope``, ``llama3``, ``proportional``; missing means ``default``
``rope_theta``                     the base b of theta_i = b^(-2i/d); default 10000
``factor``                         the context-extension factor s (>= 1)
``max_position_embeddings``        the model's context length (``dynamic``; fallbacks)
``original_max_position_embeddings``  the pre-training context length L
``partial_rotary_factor``          fraction of the head dimension that rotates
yarn: ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim``, ``attention_factor``, ``truncate``
longrope: ``short_factor``, ``long_factor``, ``attention_factor``
llama3: ``low_freq_factor``, ``high_freq_factor``
M-RoPE: ``mrope_section``          pairs that follow the t, h, w positions (:mod:`rope.mrope`);
        ``mrope_interleaved``      interleaved assignment (Qwen3-VL) instead of chunked (Qwen2-VL);
        ``mrope_style``            (rope's own key) ``chunked``, ``interleaved`` or ``alternating``
=================================  ====================================================

M-RoPE combines with any ``rope_type``: the frequencies are those of the type, the section only
says which position each pair reads. ``rope_type`` ``mrope`` (old Qwen2-VL configs) means
``default`` with a required ``mrope_section``, as transformers reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .mrope import MROPE_STYLES, check_section, section_axes

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "proportional")

DEFAULT_THETA = 10000.0


@dataclass(frozen=True)
class RopeConfig:
    """A validated RoPE configuration. ``None`` means "not given"."""

    rope_type: str = "default"
    rope_theta: float = DEFAULT_THETA
    factor: float | None = None
    max_position_embeddings: int | None = None
    original_max_position_embeddings: int | None = None
    partial_rotary_factor: float = 1.0
    # yarn
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    # yarn and longrope
    attention_factor: float | None = None
    # longrope
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    # llama3
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    # M-RoPE
    mrope_section: tuple[int, int, int] | None = None
    mrope_style: str = "chunked"

    def rotary_dim(self, head_dim: int) -> int:
        """The rotated width d = int(head_dim * partial_rotary_factor), as transformers computes it;
        the whole head for ``proportional``, whose unrotated pairs get the frequency 0 instead."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
            raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
        if self.rope_type == "proportional":
            if head_dim % 2:
                raise ValueError(f"rope_type 'proportional' rotates the whole head: head_dim must be even, got {head_dim}")
            return head_dim
        dim = int(head_dim * self.partial_rotary_factor)
        if dim < 2 or dim % 2:
            raise ValueError(
                f"the rotary dimension int(head_dim * partial_rotary_factor) = "
                f"int({head_dim} * {self.partial_rotary_factor}) = {dim} must be even and >= 2"
            )
        return dim

    def mrope_axes(self, head_dim: int) -> torch.Tensor | None:
        """The t/h/w axis of each rotated pair (:func:`rope.mrope.section_axes`), or ``None``
        without an ``mrope_section``."""
        if self.mrope_section is None:
            return None
        return section_axes(self.mrope_section, self.rotary_dim(head_dim) // 2, style=self.mrope_style)

    def require(self, key: str) -> Any:
        """The value of ``key``, or a ValueError saying that this rope_type needs it."""
        value = getattr(self, key)
        if value is None:
            raise ValueError(f"rope_type {self.rope_type!r} needs the config key {key!r}")
        return value

    def original_length(self) -> int:
        """L, the pre-training context: ``original_max_position_embeddings``, else
        ``max_position_embeddings`` (transformers' ``standardize_rope_params`` does the same)."""
        if self.original_max_position_embeddings is not None:
            return self.original_max_position_embeddings
        if self.max_position_embeddings is not None:
            return self.max_position_embeddings
        raise ValueError(
            f"rope_type {self.rope_type!r} needs the config key 'original_max_position_embeddings' "
            "(or 'max_position_embeddings')"
        )

    def extension_factor(self) -> float:
        """s: ``factor``, else max_position_embeddings / original_max_position_embeddings."""
        if self.factor is not None:
            return self.factor
        if self.max_position_embeddings is not None and self.original_max_position_embeddings is not None:
            return self.max_position_embeddings / self.original_max_position_embeddings
        raise ValueError(
            f"rope_type {self.rope_type!r} needs the config key 'factor' (or both "
            "'max_position_embeddings' and 'original_max_position_embeddings')"
        )


def _number(key: str, value: Any, *, positive: bool = False, at_least: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"config key {key!r} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"config key {key!r} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"config key {key!r} must be > 0, got {value}")
    if at_least is not None and value < at_least:
        raise ValueError(f"config key {key!r} must be >= {at_least}, got {value}")
    return value


def _length(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config key {key!r} must be a positive int, got {value!r}")
    return value


def _factors(key: str, value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"config key {key!r} must be a list of numbers, got {value!r}")
    return tuple(_number(key, v, positive=True) for v in value)


def parse_config(config: Mapping[str, Any] | RopeConfig) -> RopeConfig:
    """Validate a ``rope_parameters`` mapping and return a :class:`RopeConfig`."""
    if isinstance(config, RopeConfig):
        return config
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping such as rope_parameters, got {type(config).__name__}")
    nested = sorted(key for key, value in config.items() if isinstance(value, Mapping))
    if nested:
        raise ValueError(
            f"config is nested by layer type (keys {', '.join(map(repr, nested))}), as in Gemma 3: pass the "
            "mapping of one layer type, or give the model config to rope.hf.RotaryEmbedding, which keeps one per type"
        )
    get = {k: v for k, v in config.items() if v is not None}.get

    rope_type = get("rope_type", get("type", "default"))
    if rope_type == "mrope":
        if get("mrope_section") is None:
            raise ValueError("rope_type 'mrope' needs the config key 'mrope_section'")
        rope_type = "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; expected one of {', '.join(ROPE_TYPES)} (or 'mrope')")

    fields: dict[str, Any] = {"rope_type": rope_type}
    if get("rope_theta") is not None:
        fields["rope_theta"] = _number("rope_theta", get("rope_theta"), positive=True)
        if fields["rope_theta"] <= 1:
            raise ValueError(f"config key 'rope_theta' must be > 1, got {fields['rope_theta']}")
    if get("factor") is not None:
        fields["factor"] = _number("factor", get("factor"), at_least=1.0)
    for key in ("max_position_embeddings", "original_max_position_embeddings"):
        if get(key) is not None:
            fields[key] = _length(key, get(key))
    if get("partial_rotary_factor") is not None:
        prf = _number("partial_rotary_factor", get("partial_rotary_factor"), positive=True)
        if prf > 1:
            raise ValueError(f"config key 'partial_rotary_factor' must be in (0, 1], got {prf}")
        fields["partial_rotary_factor"] = prf
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "low_freq_factor", "high_freq_factor"):
        if get(key) is not None:
            fields[key] = _number(key, get(key))
    if get("attention_factor") is not None:
        fields["attention_factor"] = _number("attention_factor", get("attention_factor"), positive=True)
    if get("truncate") is not None:
        if not isinstance(get("truncate"), bool):
            raise TypeError(f"config key 'truncate' must be a bool, got {get('truncate')!r}")
        fields["truncate"] = get("truncate")
    for key in ("short_factor", "long_factor"):
        if get(key) is not None:
            fields[key] = _factors(key, get(key))
    if get("mrope_section") is not None:
        fields["mrope_section"] = check_section(get("mrope_section"), "config key 'mrope_section'")
    if get("mrope_interleaved") is not None:
        if not isinstance(get("mrope_interleaved"), bool):
            raise TypeError(f"config key 'mrope_interleaved' must be a bool, got {get('mrope_interleaved')!r}")
        fields["mrope_style"] = "interleaved" if get("mrope_interleaved") else "chunked"
    if get("mrope_style") is not None:
        style = get("mrope_style")
        if style not in MROPE_STYLES:
            raise ValueError(f"config key 'mrope_style' must be one of {', '.join(map(repr, MROPE_STYLES))}, "
                             f"got {style!r}")
        if fields.get("mrope_style", style) != style:
            raise ValueError(f"config keys 'mrope_style' ({style!r}) and 'mrope_interleaved' "
                             f"({get('mrope_interleaved')!r}) disagree")
        fields["mrope_style"] = style
    return RopeConfig(**fields)
