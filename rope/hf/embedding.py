"""The rotary module: rope's replacement for a transformers model's ``rotary_emb``.

:class:`RotaryEmbedding` reads a transformers config (``rope_parameters`` flat, nested by layer
type, with M-RoPE sections) and returns cos/sin tables laid out as the model's own module lays
them out (:data:`TABLE_FORMS`), from float64 angles rounded once, each carrying the positions and
frequencies it was made from (``rope_source``) for the functions of :mod:`rope.hf.functions`.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from ..apply import rotation_angles
from ..config import parse_config
from ..frequencies import inv_freq
from ..mrope import mrope_angles

_SEQ_DEPENDENT = ("dynamic", "longrope")


def rope_parameters_from_config(config: Any) -> dict[str, Any]:
    """The ``rope_parameters`` mapping of a transformers config object, with the top-level keys
    transformers folds in (``rope_theta``, ``partial_rotary_factor``, ``max_position_embeddings``,
    and a top-level ``original_max_position_embeddings``, which takes priority as in Phi-3).
    A mapping nested by layer type (Gemma 3: ``{"full_attention": {...}, "sliding_attention":
    {...}}``) gets them folded into each layer type's mapping."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    per_type = layer_type_parameters(params)
    if per_type is not None:
        return {layer_type: _fold_top_level(config, p) for layer_type, p in per_type.items()}
    return _fold_top_level(config, params)


def _fold_top_level(config: Any, params: dict[str, Any]) -> dict[str, Any]:
    params = dict(params)
    for key in ("rope_theta", "partial_rotary_factor", "max_position_embeddings"):
        if params.get(key) is None and getattr(config, key, None) is not None:
            params[key] = getattr(config, key)
    if getattr(config, "original_max_position_embeddings", None) is not None:
        params["original_max_position_embeddings"] = config.original_max_position_embeddings
    return params


def layer_type_parameters(params: Mapping[str, Any]) -> dict[str, dict] | None:
    """The per-layer-type mappings of ``rope_parameters`` nested by layer type, or ``None`` for a
    flat mapping. Layer types set to ``None`` have no RoPE and are left out, as in transformers."""
    if not any(isinstance(value, Mapping) for value in params.values()):
        return None
    flat = sorted(key for key, value in params.items() if value is not None and not isinstance(value, Mapping))
    if flat:
        raise ValueError(f"rope_parameters mixes layer types with top-level keys {flat}; expected one or the other")
    return {key: dict(value) for key, value in params.items() if value is not None}


def head_dim_of(config: Any) -> int:
    """``config.head_dim``, else ``hidden_size // num_attention_heads``."""
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None:
        try:
            head_dim = config.hidden_size // config.num_attention_heads
        except AttributeError as err:
            raise ValueError("config needs head_dim or hidden_size and num_attention_heads") from err
    return head_dim


TABLE_FORMS = ("rotate_half", "interleaved", "pairs", "complex")
"""How a model's rotary module lays out the angles theta_0 .. theta_{p-1} of its p pairs in the
last axis of cos and sin: ``rotate_half`` (theta_0 .. theta_{p-1} twice: Llama and most models),
``interleaved`` (theta_0, theta_0, theta_1, theta_1, ..: Cohere, GLM-4V) or ``pairs`` (each once:
GPT-OSS); or ``complex``: one complex64 tensor s exp(i m theta_i) per pair instead of (cos, sin)
(Llama 4's ``freqs_cis``)."""


def layer_type_head_dim(config: Any, layer_type: str) -> int:
    """The head dimension of the layers of ``layer_type``: from the first such layer's entry of
    ``config.per_layer_config`` where the config varies by layer (Gemma 4's full-attention layers
    have wider heads), else :func:`head_dim_of`."""
    per_layer, layer_types = getattr(config, "per_layer_config", None), getattr(config, "layer_types", None)
    if per_layer is not None and layer_types and layer_type in layer_types:
        return head_dim_of(per_layer[list(layer_types).index(layer_type)])
    return head_dim_of(config)


class RotaryEmbedding(nn.Module):
    """``(cos, sin)`` tables for transformers models, from a transformers config or explicit
    ``rope_parameters`` and ``head_dim``, laid out as ``tables`` says (:data:`TABLE_FORMS`).

    With ``rope_parameters`` nested by layer type (Gemma 3, OLMo 3, ModernBERT: one configuration
    for sliding-window layers, another for full attention), it holds one module per type in
    :attr:`layer_types` and ``forward(x, position_ids, layer_type)`` picks one, as transformers'
    module for those models does.
    """

    def __init__(self, config: Any = None, *, rope_parameters: dict | None = None, head_dim: int | None = None,
                 tables: str = "rotate_half"):
        super().__init__()
        if tables not in TABLE_FORMS:
            raise ValueError(f"tables must be one of {', '.join(map(repr, TABLE_FORMS))}, got {tables!r}")
        self.tables = tables
        if config is not None:
            rope_parameters = rope_parameters_from_config(config)
        if rope_parameters is None or (config is None and head_dim is None):
            raise ValueError("RotaryEmbedding needs a config, or both rope_parameters and head_dim")
        per_type = layer_type_parameters(rope_parameters)
        used = getattr(config, "layer_types", None)
        if per_type is not None and used:  # as transformers: a module for each type the layers use
            per_type = {layer_type: p for layer_type, p in per_type.items() if layer_type in set(used)}
        self.layer_types = None if per_type is None else nn.ModuleDict(
            {layer_type: RotaryEmbedding(rope_parameters=p, tables=tables,
                                         head_dim=head_dim or layer_type_head_dim(config, layer_type))
             for layer_type, p in per_type.items()}
        )
        if self.layer_types is not None:
            return
        head_dim = head_dim or head_dim_of(config)
        self.rope_config = parse_config(rope_parameters)
        self.head_dim = head_dim
        theta, self.attention_scaling = inv_freq(self.rope_config, head_dim)
        self.register_buffer("inv_freq", theta, persistent=False)
        self.register_buffer("mrope_axes", self.rope_config.mrope_axes(head_dim), persistent=False)

    def frequencies(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` for this call's positions."""
        if self.rope_config.rope_type not in _SEQ_DEPENDENT:
            return self.inv_freq, self.attention_scaling
        theta, attention = inv_freq(self.rope_config, self.head_dim, seq_len=int(position_ids.max()) + 1)
        return theta.to(position_ids.device), attention

    def pair_angles(self, position_ids: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Float64 angle of every pair: m theta_i, or p_a(i) theta_i with M-RoPE, where
        ``position_ids`` is ``[3, batch, seq]`` (or ``[batch, seq]``, the same position on t, h, w,
        as transformers expands it)."""
        if self.mrope_axes is None:
            return rotation_angles(position_ids, theta)
        return mrope_angles(position_ids, theta, self.mrope_axes.to(position_ids.device))

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layer_types is not None:
            if layer_type not in self.layer_types:
                raise ValueError(f"layer_type must be one of {', '.join(map(repr, self.layer_types))} (the config's "
                                 f"layer types), got {layer_type!r}")
            return self.layer_types[layer_type](x, position_ids)
        if layer_type is not None:
            raise ValueError(f"layer_type {layer_type!r} given, but the rope_parameters are not nested by layer type")
        if position_ids.dtype.is_floating_point:
            raise TypeError(f"position_ids must be an integer tensor, got {position_ids.dtype}")
        if self.mrope_axes is not None and position_ids.dim() == 2:
            position_ids = position_ids.expand(3, -1, -1)
        if self.mrope_axes is None and position_ids.dim() == 3:
            raise ValueError(f"position_ids of shape {tuple(position_ids.shape)} look like M-RoPE's [3, batch, seq], "
                             "but the rope_parameters have no mrope_section")
        theta, attention = self.frequencies(position_ids)
        theta = theta.to(position_ids.device)
        angles = self.pair_angles(position_ids, theta)
        source = (position_ids, theta, attention, self.mrope_axes, self.tables)
        if self.tables == "complex":
            rotations = torch.polar(torch.ones_like(angles), angles).mul(attention).to(torch.complex64).to(x.device)
            rotations.rope_source = source
            return rotations
        cos, sin = _tables(angles, attention, x.dtype, self.tables)
        cos, sin = cos.to(x.device), sin.to(x.device)
        cos.rope_source = source
        return cos, sin


def _tables(angles: torch.Tensor, attention_factor: float, dtype: torch.dtype,
            form: str = "rotate_half") -> tuple[torch.Tensor, torch.Tensor]:
    """Tables from float64 pair angles, laid out as ``form`` (:data:`TABLE_FORMS`), cos and sin
    times the attention factor, rounded once to ``dtype``."""
    if form == "rotate_half":
        angles = torch.cat((angles, angles), dim=-1)
    elif form == "interleaved":
        angles = angles.repeat_interleave(2, dim=-1)
    return (torch.cos(angles) * attention_factor).to(dtype), (torch.sin(angles) * attention_factor).to(dtype)


def rotate_half_tables(positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of shape ``positions.shape + (2 len(inv_freq),)`` for the ``rotate_half``
    formula: float64 angles m theta_i (each repeated for both halves), cos and sin times
    ``attention_factor``, rounded once to ``dtype``."""
    return _tables(rotation_angles(positions, inv_freq), attention_factor, dtype)
