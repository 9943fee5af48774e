"""The rotary modules: rope's replacements for a transformers model's ``rotary_emb``.

:class:`RotaryEmbedding` reads a transformers config (flat ``rope_parameters``, with M-RoPE
sections or without) and :class:`LayerTypeRotaryEmbedding` one whose ``rope_parameters`` are nested
by layer type (one :class:`RotaryEmbedding` per type; :func:`rotary_embedding` picks the class).
Both return cos/sin tables laid out as the model's own module lays them out
(:data:`TABLE_FORMS`), from exactly reduced angles, cos and sin rounded once to the model's dtype
(:func:`rope.rotation.round_once`: torch's own conversion rounds float64 to bfloat16 or float16
through float32, twice). Each pair of tables records the positions and frequencies it was made
from (:mod:`rope.hf.provenance`), from which the functions of :mod:`rope.hf.functions` rotate
while the tables are untouched.

The frequencies theta_i are float32 numbers, and stay so: casting a model (``model.half()``,
``model.to(torch.bfloat16)``) moves this module's ``inv_freq`` but does not round it, unlike
transformers' own modules (transformers issue #29496).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .. import _checks
from ..apply import exact_cos_sin
from ..config import parse_config
from ..frequencies import inv_freq
from ..mrope import mrope_cos_sin
from ..rotation import round_once
from . import provenance

_SEQ_DEPENDENT = ("dynamic", "longrope")


def rope_parameters_from_config(config: Any) -> dict[str, Any]:
    """The ``rope_parameters`` mapping of a transformers config object, read as transformers reads
    it (``standardize_rope_params`` and the frequency functions of ``modeling_rope_utils``):

    * ``rope_theta`` and ``partial_rotary_factor`` of the config fill in where the mapping has none;
    * ``max_position_embeddings`` is always the config's: transformers reads
      ``config.max_position_embeddings`` (dynamic NTK's L, yarn's and longrope's implied factor)
      and ignores such a key inside ``rope_parameters`` (it warns "Unrecognized keys");
    * ``original_max_position_embeddings``, for ``llama3``, ``yarn`` and ``longrope`` only: in a
      flat mapping a top-level ``config.original_max_position_embeddings`` takes priority (Phi-3),
      else the mapping's own, else ``max_position_embeddings``; in a mapping nested by layer type
      (Gemma 3: ``{"full_attention": {...}, "sliding_attention": {...}}``) each layer type keeps
      its own, else gets ``max_position_embeddings``: the top-level value is not used there.

    A mapping nested by layer type gets these folded into each layer type's mapping.

    Args:
        config: a transformers config object (``rope_parameters``, or the legacy ``rope_scaling``,
            and the top-level keys above).

    Returns:
        A flat mapping, or one mapping per layer type.
    """
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"config.rope_parameters must be a mapping, got {type(params).__name__}")
    params = dict(params)
    per_type = layer_type_parameters(params)
    if per_type is not None:
        return {layer_type: _fold_top_level(config, p, nested=True) for layer_type, p in per_type.items()}
    return _fold_top_level(config, params, nested=False)


_ORIGINAL_LENGTH_TYPES = ("llama3", "yarn", "longrope")
"""The rope types transformers' ``standardize_rope_params`` gives an ``original_max_position_embeddings``."""


def _fold_top_level(config: Any, params: dict[str, Any], *, nested: bool) -> dict[str, Any]:
    """One (flat, or one layer type's) mapping with the config's top-level keys folded in as
    transformers folds them (:func:`rope_parameters_from_config`)."""
    params = dict(params)
    for key in ("rope_theta", "partial_rotary_factor"):
        if params.get(key) is None and getattr(config, key, None) is not None:
            params[key] = getattr(config, key)
    length = getattr(config, "max_position_embeddings", None)
    if length is not None:  # transformers reads config.max_position_embeddings, never the mapping's key
        params["max_position_embeddings"] = length
    if params.get("rope_type", params.get("type", "default")) in _ORIGINAL_LENGTH_TYPES:
        original = getattr(config, "original_max_position_embeddings", None)
        if not nested and original is not None:
            params["original_max_position_embeddings"] = original
        elif params.get("original_max_position_embeddings") is None and length is not None:
            params["original_max_position_embeddings"] = length
    return params


def layer_type_parameters(params: Mapping[str, Any]) -> dict[str, dict] | None:
    """The per-layer-type mappings of ``rope_parameters`` nested by layer type, or ``None`` for a
    flat mapping. Layer types set to ``None`` have no RoPE and are left out, as in transformers.

    Args:
        params: a ``rope_parameters`` mapping, flat or nested by layer type (not both).
    """
    if not any(isinstance(value, Mapping) for value in params.values()):
        return None
    flat = sorted(key for key, value in params.items() if value is not None and not isinstance(value, Mapping))
    if flat:
        raise ValueError(f"rope_parameters mixes layer types with top-level keys {flat}; expected one or the other")
    return {key: dict(value) for key, value in params.items() if value is not None}


def head_dim_of(config: Any) -> int:
    """``config.head_dim``, else ``hidden_size // num_attention_heads`` (as transformers reads it).

    Args:
        config: a transformers config object.
    """
    head_dim = getattr(config, "head_dim", None)
    if head_dim is not None:
        return _checks.integer("config.head_dim", head_dim, minimum=1)
    hidden_size, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if hidden_size is None or heads is None:
        raise ValueError("config needs head_dim or hidden_size and num_attention_heads")
    return (_checks.integer("config.hidden_size", hidden_size, minimum=1)
            // _checks.integer("config.num_attention_heads", heads, minimum=1))


TABLE_FORMS = ("rotate_half", "interleaved", "pairs", "complex")
"""How a model's rotary module lays out the angles theta_0 .. theta_{p-1} of its p pairs in the
last axis of cos and sin: ``rotate_half`` (theta_0 .. theta_{p-1} twice: Llama and most models),
``interleaved`` (theta_0, theta_0, theta_1, theta_1, ..: Cohere, GLM-4V) or ``pairs`` (each once:
GPT-OSS); or ``complex``: one complex64 tensor s exp(i m theta_i) per pair instead of (cos, sin)
(Llama 4's ``freqs_cis``)."""


def layer_type_head_dim(config: Any, layer_type: str) -> int:
    """The head dimension of the layers of ``layer_type``: from the first such layer's entry of
    ``config.per_layer_config`` where the config varies by layer (Gemma 4's full-attention layers
    have wider heads), else :func:`head_dim_of`.

    Args:
        config: a transformers config object.
        layer_type: a layer type, such as ``"full_attention"``.
    """
    per_layer, layer_types = getattr(config, "per_layer_config", None), getattr(config, "layer_types", None)
    if per_layer is not None and layer_types and layer_type in layer_types:
        return head_dim_of(per_layer[list(layer_types).index(layer_type)])
    return head_dim_of(config)


def _parameters(name: str, config: Any, rope_parameters: Mapping | None,
                head_dim: int | None) -> dict[str, Any]:
    """The ``rope_parameters`` a rotary module of class ``name`` is built from: the config's
    (:func:`rope_parameters_from_config`) or the mapping given, which then needs ``head_dim``."""
    if config is not None and rope_parameters is not None:
        raise ValueError(f"{name} takes a config or rope_parameters, not both (the config's rope_parameters would "
                         "be used)")
    if config is not None:
        return rope_parameters_from_config(config)
    if rope_parameters is None or head_dim is None:
        raise ValueError(f"{name} needs a config, or both rope_parameters and head_dim")
    if not isinstance(rope_parameters, Mapping):
        raise TypeError(f"rope_parameters must be a mapping, got {type(rope_parameters).__name__}")
    return dict(rope_parameters)


class Float32Frequencies(nn.Module):
    """A module whose frequency buffers (:attr:`FLOAT32_BUFFERS`, float32) keep their values when
    the model is cast: ``.to()``, ``.cuda()``, ``.half()``, ``.to(torch.bfloat16)`` and the like
    move them to the new device only. nn.Module would cast them with the model, rounding theta_i to
    8 significant bits in bfloat16 (transformers issue #29496: at position 1000 the angles are then
    off by whole radians). Every rotary module of :mod:`rope.hf` derives from it."""

    FLOAT32_BUFFERS: tuple[str, ...] = ("inv_freq",)

    def _apply(self, fn, recurse: bool = True):
        kept = {name: self._buffers[name] for name in self.FLOAT32_BUFFERS}
        super()._apply(fn, recurse)
        for name, theta in kept.items():
            self._buffers[name] = theta.to(self._buffers[name].device)
        return self


class RotaryEmbedding(Float32Frequencies):
    """``(cos, sin)`` tables for transformers models, from a transformers config or explicit flat
    ``rope_parameters`` and ``head_dim``, laid out as ``tables`` says (:data:`TABLE_FORMS`): the
    drop-in for modules such as transformers' ``LlamaRotaryEmbedding``.

    ``forward(x, position_ids)`` takes integer ``position_ids`` ``[batch, seq]`` (M-RoPE: also
    ``[3, batch, seq]``) on x's device and returns tables ``[batch, seq, width]`` in x's dtype
    (Llama 4's form: complex64), each entry cos or sin of the float64 angle times the attention
    factor, rounded once. The tables carry their source (:mod:`rope.hf.provenance`).

    ``rope_parameters`` nested by layer type belong to :class:`LayerTypeRotaryEmbedding`, and are
    refused here; :func:`rotary_embedding` picks the class for a config.

    ``inv_freq`` stays float32 whatever the module is cast to (:meth:`_apply`).

    Args:
        config: a transformers config object with flat ``rope_parameters``; or ``None`` and
            ``rope_parameters`` with ``head_dim``.
        rope_parameters: a flat ``rope_parameters`` mapping, instead of a config.
        head_dim: the head dimension (with a config, default :func:`head_dim_of`).
        tables: the layout of the tables, one of :data:`TABLE_FORMS`.
    """

    def __init__(self, config: Any = None, *, rope_parameters: Mapping | None = None, head_dim: int | None = None,
                 tables: str = "rotate_half"):
        super().__init__()
        self.tables = _checks.choice("tables", tables, TABLE_FORMS)
        head_dim = _checks.optional_integer("head_dim", head_dim, minimum=1)
        rope_parameters = _parameters("RotaryEmbedding", config, rope_parameters, head_dim)
        per_type = layer_type_parameters(rope_parameters)
        if per_type is not None:
            raise ValueError(f"rope_parameters are nested by layer type ({sorted(per_type)}): use "
                             "rope.hf.LayerTypeRotaryEmbedding (rope.hf.rotary_embedding(config) picks the class)")
        head_dim = head_dim or head_dim_of(config)
        self.rope_config = parse_config(rope_parameters)
        self.head_dim = head_dim
        theta, self.attention_scaling = inv_freq(self.rope_config, head_dim)
        self.register_buffer("inv_freq", theta, persistent=False)
        self.register_buffer("mrope_axes", self.rope_config.mrope_axes(head_dim), persistent=False)

    def frequencies(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` for this call's positions: ``dynamic`` and ``longrope``
        read the length max(position_ids) + 1.

        Args:
            position_ids: this call's integer positions.
        """
        if self.rope_config.rope_type not in _SEQ_DEPENDENT:
            return self.inv_freq, self.attention_scaling
        if position_ids.numel() == 0:
            raise ValueError(f"position_ids is empty; rope_type {self.rope_config.rope_type!r} reads the length "
                             "max(position_ids) + 1")
        length = int(position_ids.max()) + 1
        if length < 1:
            raise ValueError(f"position_ids must hold a position >= 0 (rope_type {self.rope_config.rope_type!r} "
                             f"reads the length max(position_ids) + 1), got max {length - 1}")
        theta, attention = inv_freq(self.rope_config, self.head_dim, seq_len=length)
        return theta.to(position_ids.device), attention

    def pair_cos_sin(self, position_ids: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every pair's angle, m theta_i, or p_a(i) theta_i with M-RoPE (where
        ``position_ids`` is ``[3, batch, seq]``), reduced modulo 2 pi exactly (float64).

        Args:
            position_ids: integer ``[batch, seq]``, or ``[3, batch, seq]`` with M-RoPE.
            theta: the frequencies theta_i, from :meth:`frequencies`.

        Returns:
            ``(cos, sin)``, ``[batch, seq, pairs]``.
        """
        if self.mrope_axes is None:
            return exact_cos_sin(position_ids, theta)
        return mrope_cos_sin(position_ids, theta, self.mrope_axes.to(position_ids.device))

    def _checked_positions(self, x, position_ids) -> torch.Tensor:
        """``position_ids`` checked against x and the configuration; M-RoPE's ``[batch, seq]``
        expanded to its three rows (the same position on t, h, w, as transformers expands it)."""
        _checks.float_tensor("x", x)
        _checks.integer_tensor("position_ids", position_ids)
        _checks.same_device("x", x, position_ids=position_ids)
        if self.mrope_axes is None and position_ids.dim() == 3:
            raise ValueError(f"position_ids of shape {tuple(position_ids.shape)} look like M-RoPE's [3, batch, seq], "
                             "but the rope_parameters have no mrope_section")
        if position_ids.dim() == 3 and position_ids.shape[0] == 3:
            return position_ids
        if position_ids.dim() != 2:
            expected = "[batch, seq] or [3, batch, seq]" if self.mrope_axes is not None else "[batch, seq]"
            raise ValueError(f"position_ids must have shape {expected}, got {tuple(position_ids.shape)}")
        return position_ids if self.mrope_axes is None else position_ids.expand(3, -1, -1)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        position_ids = self._checked_positions(x, position_ids)
        theta, attention = self.frequencies(position_ids)
        theta = theta.to(position_ids.device)
        with torch.inference_mode(False):  # tensors with version counters, for provenance, in any mode
            cos, sin = self.pair_cos_sin(position_ids, theta)
            if self.tables == "complex":
                tables = (torch.complex(cos * attention, sin * attention).to(torch.complex64),)
            else:
                tables = laid_out_tables(cos, sin, attention, x.dtype, self.tables)
            provenance.attach(tables, position_ids=position_ids, inv_freq=theta, attention_factor=attention,
                              mrope_axes=self.mrope_axes, form=self.tables, exact=(cos, sin))
        return tables[0] if self.tables == "complex" else tables


class LayerTypeRotaryEmbedding(nn.Module):
    """The rotary module of models with one RoPE configuration per layer type (Gemma 3, OLMo 3,
    ModernBERT: ``rope_parameters`` nested as ``{"sliding_attention": {...}, "full_attention":
    {...}}``): one :class:`RotaryEmbedding` per type in :attr:`layer_types`, built from a
    transformers config or explicit nested ``rope_parameters`` and ``head_dim``.

    ``forward(x, position_ids, layer_type)`` returns the tables of ``layer_type``'s module, the
    contract of transformers' ``Gemma3RotaryEmbedding``. As there, a config's ``layer_types``
    limits the modules to the types its layers use, layer types set to ``None`` have no RoPE, and
    each type's head dimension is :func:`layer_type_head_dim` (Gemma 4's full-attention layers
    have wider heads). Where ``rope_parameters`` is keyed by labels that are no layer type of the
    config (DeepSeek-V4's ``main`` and ``compress``, which its layers and compressors pick by
    name), every label gets its module, as transformers' ``DeepseekV4RotaryEmbedding`` does.

    Args:
        config: a transformers config object with ``rope_parameters`` nested by layer type; or
            ``None`` and ``rope_parameters`` with ``head_dim``.
        rope_parameters: ``rope_parameters`` nested by layer type, instead of a config.
        head_dim: the head dimension of every layer type (with a config, default
            :func:`layer_type_head_dim`).
        tables: the layout of the tables, one of :data:`TABLE_FORMS`.
    """

    def __init__(self, config: Any = None, *, rope_parameters: Mapping | None = None, head_dim: int | None = None,
                 tables: str = "rotate_half"):
        super().__init__()
        self.tables = _checks.choice("tables", tables, TABLE_FORMS)
        head_dim = _checks.optional_integer("head_dim", head_dim, minimum=1)
        per_type = layer_type_parameters(_parameters("LayerTypeRotaryEmbedding", config, rope_parameters, head_dim))
        if per_type is None:
            raise ValueError("rope_parameters are not nested by layer type: use rope.hf.RotaryEmbedding "
                             "(rope.hf.rotary_embedding(config) picks the class)")
        used = set(getattr(config, "layer_types", None) or ())
        if used & set(per_type):  # as transformers: a module for each type the layers use
            per_type = {layer_type: p for layer_type, p in per_type.items() if layer_type in used}
        if not per_type:
            raise ValueError("rope_parameters name no layer type with RoPE (every one is None)")
        self.layer_types = nn.ModuleDict(
            {layer_type: RotaryEmbedding(rope_parameters=p, tables=tables,
                                         head_dim=head_dim or layer_type_head_dim(config, layer_type))
             for layer_type, p in per_type.items()}
        )

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables of ``layer_type``'s :class:`RotaryEmbedding` (its ``forward``).

        Args:
            x: a tensor of the model's dtype on its device (its values are not read).
            position_ids: integer ``[batch, seq]`` (M-RoPE: also ``[3, batch, seq]``).
            layer_type: one of :attr:`layer_types`.
        """
        return self.layer_types[_checks.choice("layer_type", layer_type, self.layer_types)](x, position_ids)


ROTARY_MODULES = (RotaryEmbedding, LayerTypeRotaryEmbedding)
"""rope's rotary module classes: what :func:`rope.hf.install` puts in place of a ``rotary_emb``."""


def rotary_embedding(config: Any, *, tables: str = "rotate_half") -> RotaryEmbedding | LayerTypeRotaryEmbedding:
    """The rotary module of a transformers config, laid out as ``tables``: a
    :class:`LayerTypeRotaryEmbedding` where its ``rope_parameters`` are nested by layer type, else a
    :class:`RotaryEmbedding`.

    Args:
        config: a transformers config object.
        tables: the layout of the tables, one of :data:`TABLE_FORMS`.
    """
    nested = layer_type_parameters(rope_parameters_from_config(config)) is not None
    return (LayerTypeRotaryEmbedding if nested else RotaryEmbedding)(config, tables=tables)


def position_table(embedding: RotaryEmbedding, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """The rotary table GPT-J and CodeGen keep by position (their ``embed_positions`` buffer), of
    ``embedding``'s frequencies theta_i and attention factor a: row m, for m < ``rows``, is (a
    sin m theta_0, .., a sin m theta_{p-1}, a cos m theta_0, .., a cos m theta_{p-1}), each from
    the exactly reduced angle, rounded once to ``dtype``, on the device of ``embedding``.

    Args:
        embedding: a :class:`RotaryEmbedding` without M-RoPE, whose frequencies do not depend on the length.
        rows: the number of positions, >= 1.
        dtype: the floating dtype of the table.
    """
    rows = _checks.integer("rows", rows, minimum=1)
    _checks.dtype_choice("dtype", dtype, _checks.FLOAT_DTYPES)
    if embedding.mrope_axes is not None or embedding.rope_config.rope_type in _SEQ_DEPENDENT:
        raise ValueError("embedding: a position table holds one angle per position and pair; M-RoPE and rope types "
                         f"that read the length ({', '.join(_SEQ_DEPENDENT)}) have none")
    positions = torch.arange(rows, device=embedding.inv_freq.device)[None]
    cos, sin = embedding.pair_cos_sin(positions, embedding.inv_freq)
    attention = embedding.attention_scaling
    return torch.cat((round_once(sin[0] * attention, dtype), round_once(cos[0] * attention, dtype)), dim=-1)


def laid_out_tables(cos: torch.Tensor, sin: torch.Tensor, attention_factor: float, dtype: torch.dtype,
                    form: str = "rotate_half") -> tuple[torch.Tensor, torch.Tensor]:
    """Tables from the float64 cos and sin of each pair's angle, laid out as ``form``
    (:data:`TABLE_FORMS`): times the attention factor in float64, rounded once to ``dtype``.

    Args:
        cos: float64 cos of each pair's angle, ``[..., pairs]``.
        sin: float64 sin, of cos's shape.
        attention_factor: multiplies cos and sin.
        dtype: the dtype of the tables.
        form: ``"rotate_half"``, ``"interleaved"`` or ``"pairs"``.
    """
    def laid_out(values):
        if form == "rotate_half":
            return torch.cat((values, values), dim=-1)
        return values.repeat_interleave(2, dim=-1) if form == "interleaved" else values

    return (round_once(laid_out(cos) * attention_factor, dtype),
            round_once(laid_out(sin) * attention_factor, dtype))


def rotate_half_tables(positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of shape ``positions.shape + (2 len(inv_freq),)`` for the ``rotate_half``
    formula: cos and sin of m theta_i reduced modulo 2 pi exactly (each repeated for both
    halves), times ``attention_factor``, rounded once to ``dtype``.

    Args:
        positions: integer positions m, any shape.
        inv_freq: finite float32 frequencies theta_i.
        attention_factor: multiplies cos and sin, > 0.
        dtype: the floating dtype of the tables.
    """
    _checks.integer_tensor("positions", positions)
    _checks.finite_frequencies("inv_freq", inv_freq)
    _checks.same_device("positions", positions, inv_freq=inv_freq)
    attention_factor = _checks.number("attention_factor", attention_factor, positive=True)
    _checks.dtype_choice("dtype", dtype, _checks.FLOAT_DTYPES)
    return laid_out_tables(*exact_cos_sin(positions, inv_freq), attention_factor, dtype)
