"""Drop-in pieces for Hugging Face transformers models.

* :class:`RotaryEmbedding` replaces a model's ``rotary_emb`` module: ``forward(x, position_ids)``
  returns ``(cos, sin)`` in ``x.dtype``, already multiplied by the attention factor, the contract
  of transformers' ``LlamaRotaryEmbedding``: ``[batch, seq, rotary_dim]`` in the ``rotate_half``
  layout of most models, or in the layouts of Cohere and GLM-4V (each angle twice in a row) and
  GPT-OSS (each angle once), or Llama 4's complex ``freqs_cis`` (:data:`TABLE_FORMS`). Angles,
  cos and sin are computed in float64 and rounded once (transformers rounds the angle to float32
  first, which costs accuracy at long positions).
* :func:`apply_rotary_pos_emb` has the signature and result of transformers' function, computes in
  float32 or better, and also handles partial rotary (cos narrower than the head). Given the ``cos``
  that :class:`RotaryEmbedding` returned, it rotates from the positions and frequencies that
  ``cos`` was made from (the ``rope_source`` attribute) with :func:`rope.apply_rotary`: the fused
  exact kernel on CUDA, float64 on the CPU, and no table rounded to the model's dtype in between.
  Any other ``cos`` (sliced, converted, someone else's) takes the ``rotate_half`` table formula.
* :func:`apply_rotary_pos_emb_interleaved` is the same for the models that rotate the pairs
  (2i, 2i + 1): GLM, GLM-4 and ERNIE 4.5 (whose table formula it uses for other tables), and,
  from rope's tables, Cohere and GLM-4V.
* :func:`apply_rotary_emb_complex` is the same for Llama 4's ``apply_rotary_emb``,
  :func:`apply_rotary_pos_emb_interleave` for DeepSeek-V3's function of that name, and
  :func:`apply_rotary_pos_emb_single` for Gemma 4's one-tensor function.
* :func:`install` swaps :class:`RotaryEmbedding` into every ``rotary_emb`` of a loaded model,
  after checking that the new module returns the old one's tables (and in which form).

Models with one RoPE configuration per layer type (Gemma 3, OLMo 3, ModernBERT: ``rope_parameters``
nested as ``{"sliding_attention": {...}, "full_attention": {...}}``) call ``rotary_emb(x,
position_ids, layer_type)``; :class:`RotaryEmbedding` then holds one module per layer type.
M-RoPE models (Qwen2-VL and its successors, ``mrope_section`` in the config) pass position ids
``[3, batch, seq]``; :class:`RotaryEmbedding` then turns each pair by the t, h or w position its
section assigns (:mod:`rope.mrope`), and ``apply_rotary_pos_emb`` rotates from those angles.

``dynamic`` and ``longrope`` pick their frequencies from the current length
``max(position_ids) + 1`` at every call; transformers instead keeps the largest ``dynamic`` base it
has seen until the length falls back below the original context. Both agree on any single forward.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from .apply import apply_rotary, rotation_angles
from .config import parse_config
from .frequencies import inv_freq
from .layouts import interleaved_to_half
from .mrope import apply_mrope, mrope_angles

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


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(x_0, x_1, x_2, x_3, ..) -> (-x_1, x_0, -x_3, x_2, ..): the pairs (2i, 2i + 1) turned by 90 degrees."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """transformers-compatible (Llama and most models): ``q * cos + rotate_half(q) * sin`` on the
    first ``cos.shape[-1]`` coordinates (the rest pass through), in float32 or better, rounded
    once to q's dtype. ``position_ids`` is accepted for the older signature and ignored."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "half")


def apply_rotary_pos_emb_interleaved(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible for the models that pair coordinates (2i, 2i + 1) but build
    ``rotate_half`` tables (GLM, GLM-4, ERNIE 4.5): pair i of the first ``cos.shape[-1]``
    coordinates turns by the angle of ``cos[..., i]``, as their ``apply_rotary_pos_emb`` does by
    taking the first half of the table and repeating each entry twice."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "interleaved")


def apply_rotary_pos_emb_single(x, cos, sin, unsqueeze_dim: int = 1):
    """transformers-compatible with the one-tensor ``apply_rotary_pos_emb(x, cos, sin)`` of Gemma 4:
    :func:`apply_rotary_pos_emb` on x alone (from rope's tables the key slot gets one head of x,
    and its result is dropped)."""
    source = getattr(cos, "rope_source", None)
    if source is not None and unsqueeze_dim in (1, 2) and x.dim() == 4:
        one_head = x.narrow(unsqueeze_dim, 0, 1)
        return _rotate_from_source(x, one_head, *source, heads_dim=unsqueeze_dim, layout="half")[0]
    return _apply(x, x, cos, sin, unsqueeze_dim, "half")[0]


def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim: int = 1):
    """transformers-compatible with DeepSeek-V2/V3's ``apply_rotary_pos_emb_interleave``
    (``rope_interleave``): pair i is (2i, 2i + 1) of the input, from ``rotate_half`` tables, and the
    rotated pairs come out in the half-split order, (y_a of every pair, then y_b of every pair).
    That is the half-split rotation of the input with its coordinates reordered from interleaved
    to half-split (:func:`rope.layouts.interleaved_to_half`), which is how it is computed here."""
    order = interleaved_to_half(q.shape[-1], cos.shape[-1]).to(q.device)
    return apply_rotary_pos_emb(q[..., order], k[..., order], cos, sin, unsqueeze_dim=unsqueeze_dim)


def apply_rotary_emb_complex(xq, xk, freqs_cis):
    """transformers-compatible with Llama 4's ``apply_rotary_emb``: q and k ``[batch, seq, heads,
    head_dim]``, pairs (2i, 2i + 1) read as complex numbers and multiplied by ``freqs_cis[b, s, i]``,
    in float32 or better, rounded once to q's dtype. Given the ``freqs_cis`` that
    :class:`RotaryEmbedding` (``tables="complex"``) returned, it rotates from the exact angles."""
    source = getattr(freqs_cis, "rope_source", None)
    if source is not None and xq.dim() == xk.dim() == 4:
        return _rotate_from_source(xq, xk, *source, heads_dim=2, layout="interleaved")

    def rotate(x):
        dtype = torch.promote_types(x.dtype, torch.float32)
        pairs = torch.view_as_complex(x.to(dtype).reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(pairs * freqs_cis[:, :, None, :].to(pairs.dtype)).flatten(3).to(x.dtype)

    return rotate(xq), rotate(xk)


def _apply(q, k, cos, sin, unsqueeze_dim, layout):
    source = getattr(cos, "rope_source", None)
    if source is not None and unsqueeze_dim in (1, 2) and q.dim() == k.dim() == 4:
        return _rotate_from_source(q, k, *source, heads_dim=unsqueeze_dim, layout=layout)
    rotary_dim = cos.shape[-1]
    if sin.shape != cos.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have the same shape")
    if rotary_dim % 2 or rotary_dim > q.shape[-1] or rotary_dim > k.shape[-1]:
        raise ValueError(f"cos has width {rotary_dim}; expected an even width <= head_dim {q.shape[-1]}")
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    turn = rotate_half
    if layout == "interleaved":  # angle i of the first half, for both coordinates of pair i
        cos = cos[..., : rotary_dim // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : rotary_dim // 2].repeat_interleave(2, dim=-1)
        turn = rotate_pairs_interleaved

    def rotate(x):
        dtype = torch.promote_types(x.dtype, torch.float32)
        head, tail = x[..., :rotary_dim].to(dtype), x[..., rotary_dim:]
        y = head * cos.to(dtype) + turn(head) * sin.to(dtype)
        return torch.cat((y.to(x.dtype), tail), dim=-1)

    return rotate(q), rotate(k)


def _rotate_from_source(q, k, position_ids, theta, attention, axes, tables, *, heads_dim, layout):
    """rope.apply_rotary (rope.mrope.apply_mrope with M-RoPE axes) on [batch, heads, seq, dim]
    (heads_dim 1) or [batch, seq, heads, dim] views; a batch of one position row is shared.
    Tables with each angle twice in a row come from models that pair (2i, 2i + 1): the half-split
    function on them is a mistake and raises."""
    if tables == "interleaved" and layout == "half":
        raise ValueError("cos holds each angle twice in a row (the tables of Cohere and GLM-4V, whose models pair "
                         "coordinates (2i, 2i + 1)): use rope.hf.apply_rotary_pos_emb_interleaved")
    if heads_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    if axes is None:
        positions = position_ids[0] if position_ids.dim() == 2 and position_ids.shape[0] == 1 else position_ids
        q_out, k_out = apply_rotary(q, k, positions, theta.to(q.device), layout=layout, attention_factor=attention)
    else:
        positions = position_ids[:, 0] if position_ids.shape[1] == 1 else position_ids
        q_out, k_out = apply_mrope(q, k, positions, theta.to(q.device), axes, layout=layout,
                                   attention_factor=attention)
    return (q_out.transpose(1, 2), k_out.transpose(1, 2)) if heads_dim == 1 else (q_out, k_out)


PROBE_TOLERANCE = 1e-5
"""How far install's probe lets the old and new tables differ: transformers' float32 angles at
positions below 8 are off by less than 1e-6; a wrong layout or axis assignment is off by O(1)."""


def _probe_positions(embedding: RotaryEmbedding, device) -> torch.Tensor:
    """Positions 0..7 in a fixed shuffled order per row: ``[1, 8]``, or ``[3, 1, 8]`` with M-RoPE
    (t, h, w differ, so a wrong assignment of pairs to axes shows)."""
    gen = torch.Generator().manual_seed(0)
    rows = 3 if embedding.mrope_axes is not None else 1
    positions = torch.stack([torch.randperm(8, generator=gen) for _ in range(rows)])
    return (positions[:, None] if rows == 3 else positions).to(device)


def _table_gap(name: str, old: nn.Module, new: RotaryEmbedding, device) -> float | None:
    """The largest difference between the (cos, sin) of ``old`` and ``new`` at probe positions,
    over every layer type; ``None`` where the shapes differ. Raises if ``old`` cannot be called."""
    x = torch.zeros(1, dtype=torch.float32, device=device)
    cases = [(None, new)] if new.layer_types is None else list(new.layer_types.items())
    worst = 0.0
    for layer_type, embedding in cases:
        positions = _probe_positions(embedding, device)
        extra = () if layer_type is None else (layer_type,)
        try:
            theirs = old(x, positions, *extra)
        except Exception as err:  # any failure means the module does not follow the contract
            call = "rotary_emb(x, position_ids" + ("" if layer_type is None else f", {layer_type!r}") + ")"
            raise ValueError(f"install: {name} could not be called as {call} "
                             f"({type(err).__name__}: {err}); nothing was replaced") from err
        ours = new(x, positions, *extra)
        if new.tables == "complex":  # one complex tensor each
            theirs, ours = (theirs,), (ours,)
        if not (isinstance(theirs, tuple) and len(theirs) == len(ours)
                and all(isinstance(a, torch.Tensor) and a.shape == b.shape and a.is_complex() == b.is_complex()
                        for a, b in zip(theirs, ours))):
            return None
        worst = max(worst, *(float((a.to(b.dtype) - b).abs().max()) for a, b in zip(theirs, ours)))
    return worst


def _reproduce(name: str, old: nn.Module, config: Any, device) -> RotaryEmbedding:
    """The :class:`RotaryEmbedding` of ``config`` whose table form reproduces ``old``, or an error."""
    found = []
    for form in TABLE_FORMS:
        new = RotaryEmbedding(config, tables=form)
        new = new.to(device) if device is not None else new
        gap = _table_gap(name, old, new, device)
        if gap is not None and gap <= PROBE_TOLERANCE:
            return new
        found.append(f"{form}: " + ("other shapes" if gap is None else f"off by {gap:.3g}"))
    raise ValueError(
        f"install: {name} ({type(old).__name__}) is not reproduced by rope.hf.RotaryEmbedding: its (cos, sin) at "
        f"probe positions differ in every table form ({'; '.join(found)}): another scaling or convention; "
        "nothing was replaced"
    )


def install(model: nn.Module) -> int:
    """Replace every ``rotary_emb`` submodule of a transformers model by :class:`RotaryEmbedding`
    built from the model's config; returns how many were replaced.

    Every replacement is first checked: the old and new modules must return the same ``(cos,
    sin)`` at a few probe positions (shuffled per axis for M-RoPE, for every layer type if the
    config has several), to within :data:`PROBE_TOLERANCE`, in one of the :data:`TABLE_FORMS`,
    which the new module then keeps. A module no form reproduces (a convention rope does not
    know) raises ValueError and the model is left untouched, instead of running with wrong
    positions.
    """
    replacements = []
    for owner_name, module in model.named_modules():
        old = getattr(module, "rotary_emb", None)
        if isinstance(old, nn.Module) and not isinstance(old, RotaryEmbedding):
            config = getattr(old, "config", None) or model.config
            device = next((buffer.device for buffer in old.buffers()), None)
            name = f"{owner_name}.rotary_emb" if owner_name else "rotary_emb"
            replacements.append((module, _reproduce(name, old, config, device)))
    for module, new in replacements:
        module.rotary_emb = new
    return len(replacements)
