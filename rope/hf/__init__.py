"""Drop-in pieces for Hugging Face transformers models.

The one call is :func:`patch`: ``rope.hf.patch(model)`` looks up the model's family
(``model.config.model_type``) in :data:`FAMILIES`, installs rope's rotary modules and replaces the
family's apply function in the model's modeling module. It refuses, changing nothing, a model
it cannot reproduce, and returns a :class:`Patch` record; :func:`unpatch` undoes it. The
modeling module's function is shared by the process: it is restored when the last patched
model of that module is unpatched (:mod:`rope.hf.patching`). The pieces it puts together:

* :class:`RotaryEmbedding` replaces a model's ``rotary_emb`` module: ``forward(x, position_ids)``
  returns ``(cos, sin)`` in ``x.dtype``, already multiplied by the attention factor, the contract
  of transformers' ``LlamaRotaryEmbedding``: ``[batch, seq, rotary_dim]`` in the ``rotate_half``
  layout of most models, or in the layouts of Cohere and GLM-4V (each angle twice in a row) and
  GPT-OSS (each angle once), or Llama 4's complex ``freqs_cis`` (:data:`TABLE_FORMS`). Angles,
  cos and sin are computed in float64 and rounded once (transformers rounds the angle to float32
  first, which costs accuracy at long positions, and a model cast to bfloat16 rounds its
  frequencies too; rope's stay float32).
* :func:`apply_rotary_pos_emb` has the signature and result of transformers' function: its
  formula on the tables given, in float32 or better, rounded once, also for partial rotary (cos
  narrower than the head). Given the very ``(cos, sin)`` that :class:`RotaryEmbedding` returned,
  untouched (:mod:`rope.hf.provenance`), it rotates instead from the positions and frequencies
  they were made from with :func:`rope.apply_rotary`: the fused exact kernel on CUDA, float64 on
  the CPU, and no table rounded to the model's dtype in between.
* The other conventions of transformers' models have their own functions, with the same two
  paths (table of models in :mod:`rope.hf.functions`): :func:`apply_rotary_pos_emb_interleaved`
  (GLM, GLM-4, ERNIE 4.5, Helium), :func:`apply_rotary_pos_emb_interleaved_tables` (Cohere,
  Cohere 2, GLM-4V, ERNIE 4.5 VL), :func:`apply_rotary_pos_emb_pair_tables` (GPT-OSS),
  :func:`apply_rotary_pos_emb_pair_tables_interleaved` (the OpenAI privacy filter),
  :func:`apply_rotary_pos_emb_conjugate` (NanoChat), :func:`apply_rotary_pos_emb_interleave`
  (DeepSeek-V3, GLM-5, Mistral Large 4), :func:`apply_rotary_pos_emb_single` (Gemma 4),
  :func:`apply_rotary_pos_emb_keys_optional` (Qwen4-Exp), :func:`apply_rotary_pos_emb_last_queries`
  (Muse Glimmer's assistant),
  :func:`apply_rotary_pos_emb_trailing` (DeepSeek-V4), :func:`apply_rotary_pos_emb_every_two`
  (GPT-J, CodeGen), :func:`apply_rotary_emb_complex` (Llama 4) and
  :func:`apply_rotary_emb_complex_heads_first` (DeepSeek-V2); for vision towers
  :func:`apply_rotary_pos_emb_vision` (Qwen2-VL's, GLM-4V's and most others) and
  :func:`apply_rotary_pos_emb_vision_pairwise` (Inkling 2's), :func:`apply_rotary_pos_emb_2d`
  (SAM 2's and SAM 3's), :func:`apply_rotary_pos_emb_patches` (DINOv3's, Sapiens2's,
  EoMT-DINOv3's: the image's patches after its class and register tokens),
  :func:`apply_rotary_emb_complex_vision` (Llama 4's) and
  :func:`apply_rotary_pos_emb_2d_self_attn`, :func:`apply_rotary_pos_emb_2d_cross_attn` (EdgeTAM
  video's memory attention; :mod:`rope.hf.functions_2d`), :func:`apply_rotary_time_emb`
  (MusicFlamingo's, on its audio features; :mod:`rope.hf.time_rotary`).
* :func:`install` swaps rope's module into every ``rotary_emb`` of a loaded model (and rope's
  exactly rounded table, :func:`position_table`, into the attention's table buffer of GPT-J and
  CodeGen, :data:`POSITION_TABLES`), after checking that the new module returns the old one's
  tables (and in which form;
  :func:`rotary_replacements` lists the swaps without making them). Install (or patch) before
  casting the model to float16 or bfloat16: the cast rounds transformers' frequencies
  (transformers issue #29496), which install then names, with the fix.
* :mod:`rope.hf.vision` does the same for vision towers: an exact module in place of each
  transformers vision rotary module of the 2D ``axial`` form (Qwen2-VL's and 32 others, in the
  tower's own layout) or Llama 4's complex table, which :func:`patch` swaps too; and, through
  :mod:`rope.hf.grid`, the image-grid rotary modules called with the pixel values or a feature
  map (DINOv3, Sapiens2, EoMT-DINOv3, EfficientLoFTR), and, through :mod:`rope.hf.time_rotary`,
  MusicFlamingo's rotary time module (angles of its audio windows' timestamps).
* :mod:`rope.hf.axes` does the same for text rotary modules that read positions on axes laid out
  otherwise than M-RoPE: HunYuan-VL's XD-RoPE (``[4, batch, seq]`` or ``[3, batch, seq]``, blocks
  of the doubled table, so that a pair's two columns may follow different axes) and NeoMME's row
  and column (``[2, batch, seq]``, alternating pairs): :func:`install` puts an
  :class:`AxesRotaryEmbedding` in their place (exact angles of each column's axis, rounded once).
* :mod:`rope.hf.self_rotating` does the same for the conformers' rotary modules (wav2vec2-conformer,
  wav2vec2-bert, SeamlessM4T with ``position_embeddings_type="rotary"``), which hand their
  attention one stack of the cos and sin of their sequence's own positions, no position ids:
  :func:`install` puts a :class:`StackedRotaryTable` in their place (exact angles, rounded once).
* :mod:`rope.hf.methods` covers the models that rotate in a method of their attention class:
  :func:`patch` replaces that class attribute by :func:`apply_rotary_position_embeddings`
  (RoFormer's static method) or :func:`apply_rotary_embedding_stacked` (the conformers'
  ``_apply_rotary_embedding``, which rotates by the exact cos and sin behind rope's stack), and
  :func:`unpatch` puts the very object back once no patched model of the class remains; likewise
  V-JEPA 2's module-level ``rotate_queries_or_keys(x, pos)`` by :func:`rotate_queries_or_keys`
  (exact angles, where transformers forms them in the model's dtype).
* :mod:`rope.hf.clvp` covers CLVP, whose rotary module returns angles that its attention takes
  cos and sin of: :func:`install` puts a :class:`RotaryAngleTable` in its place (exactly reduced
  angles, float64 once patched) and :func:`patch` replaces its ``apply_rotary_pos_emb(q, k, v,
  cos, sin, position_ids)`` by :func:`apply_rotary_pos_emb_values` (rounded once to the model's dtype).
* :func:`diagnose` measures the rotary tables of any model, patched or not, against exact angles:
  per rotary module and layer type, the worst error in units of the model's dtype, below and
  beyond its configured length, and the first position past half a unit (:mod:`rope.hf.precision`).
* :data:`FAMILIES` maps each ``model_type`` to its :class:`Convention`: which function of the
  modeling module to replace, by which of the functions above, and the form of its tables
  (:mod:`rope.hf.families`, with the source of each).

Models with one RoPE configuration per layer type (Gemma 3, OLMo 3, ModernBERT: ``rope_parameters``
nested as ``{"sliding_attention": {...}, "full_attention": {...}}``) call ``rotary_emb(x,
position_ids, layer_type)``; their module is a :class:`LayerTypeRotaryEmbedding`, one
:class:`RotaryEmbedding` per layer type (:func:`rotary_embedding` picks the class for a config).
M-RoPE models (Qwen2-VL and its successors, ``mrope_section`` in the config) pass position ids
``[3, batch, seq]``; :class:`RotaryEmbedding` then turns each pair by the t, h or w position its
section assigns (:mod:`rope.mrope`), and ``apply_rotary_pos_emb`` rotates from those angles.

``dynamic`` and ``longrope`` pick their frequencies from the current length
``max(position_ids) + 1`` at every call; transformers instead keeps the largest ``dynamic`` base it
has seen until the length falls back below the original context. Both agree on any single forward.
"""

from .axes import AxesRotaryEmbedding
from .clvp import RotaryAngleTable, apply_rotary_pos_emb_values
from .embedding import (
    TABLE_FORMS,
    LayerTypeRotaryEmbedding,
    RotaryEmbedding,
    head_dim_of,
    layer_type_head_dim,
    layer_type_parameters,
    position_table,
    rope_parameters_from_config,
    rotary_embedding,
    rotate_half_tables,
)
from .families import FAMILIES, Convention
from .functions import (
    apply_rotary_emb_complex,
    apply_rotary_emb_complex_heads_first,
    apply_rotary_pos_emb,
    apply_rotary_pos_emb_2d,
    apply_rotary_pos_emb_conjugate,
    apply_rotary_pos_emb_every_two,
    apply_rotary_pos_emb_interleave,
    apply_rotary_pos_emb_interleaved,
    apply_rotary_pos_emb_interleaved_tables,
    apply_rotary_pos_emb_keys_optional,
    apply_rotary_pos_emb_last_queries,
    apply_rotary_pos_emb_pair_tables,
    apply_rotary_pos_emb_pair_tables_interleaved,
    apply_rotary_pos_emb_patches,
    apply_rotary_pos_emb_single,
    apply_rotary_pos_emb_trailing,
    apply_rotary_pos_emb_vision,
    apply_rotary_pos_emb_vision_pairwise,
    rotate_half,
    rotate_pairs_interleaved,
)
from .functions_2d import (
    apply_rotary_emb_complex_vision,
    apply_rotary_pos_emb_2d_cross_attn,
    apply_rotary_pos_emb_2d_self_attn,
)
from .install import POSITION_TABLES, Replacement, install, rotary_replacements
from .methods import apply_rotary_embedding_stacked, apply_rotary_position_embeddings, rotate_queries_or_keys
from .patching import Patch, patch, unpatch
from .precision import Diagnosis, RotaryPrecision, diagnose
from .probing import PROBE_TOLERANCE
from .self_rotating import StackedRotaryTable
from .time_rotary import TimeRotaryEmbedding, apply_rotary_time_emb

__all__ = [
    "AxesRotaryEmbedding",
    "FAMILIES",
    "POSITION_TABLES",
    "PROBE_TOLERANCE",
    "TABLE_FORMS",
    "Convention",
    "Diagnosis",
    "LayerTypeRotaryEmbedding",
    "Patch",
    "Replacement",
    "RotaryEmbedding",
    "RotaryAngleTable",
    "RotaryPrecision",
    "StackedRotaryTable",
    "TimeRotaryEmbedding",
    "apply_rotary_emb_complex",
    "apply_rotary_embedding_stacked",
    "apply_rotary_emb_complex_heads_first",
    "apply_rotary_emb_complex_vision",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_conjugate",
    "apply_rotary_pos_emb_every_two",
    "apply_rotary_pos_emb_interleave",
    "apply_rotary_pos_emb_interleaved",
    "apply_rotary_pos_emb_interleaved_tables",
    "apply_rotary_pos_emb_keys_optional",
    "apply_rotary_pos_emb_last_queries",
    "apply_rotary_pos_emb_pair_tables",
    "apply_rotary_pos_emb_pair_tables_interleaved",
    "apply_rotary_pos_emb_patches",
    "apply_rotary_pos_emb_single",
    "apply_rotary_pos_emb_trailing",
    "apply_rotary_pos_emb_values",
    "apply_rotary_pos_emb_2d",
    "apply_rotary_pos_emb_2d_cross_attn",
    "apply_rotary_pos_emb_2d_self_attn",
    "apply_rotary_time_emb",
    "apply_rotary_pos_emb_vision",
    "apply_rotary_pos_emb_vision_pairwise",
    "apply_rotary_position_embeddings",
    "diagnose",
    "head_dim_of",
    "install",
    "layer_type_head_dim",
    "layer_type_parameters",
    "patch",
    "position_table",
    "rope_parameters_from_config",
    "rotary_embedding",
    "rotary_replacements",
    "rotate_half",
    "rotate_half_tables",
    "rotate_pairs_interleaved",
    "rotate_queries_or_keys",
    "unpatch",
]
