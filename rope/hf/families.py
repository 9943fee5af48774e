"""The family table: how each transformers model family applies RoPE, and rope's replacement.

:data:`FAMILIES` maps a transformers ``model_type`` (``model.config.model_type``) to its
:class:`Convention`: the module-level function(s) of the family's modeling module
(``transformers/models/<family>/modeling_<family>.py``) that its attention calls to rotate q and
k, rope's function with the same signature and result (:mod:`rope.hf.functions`), and the form
of the tables the family's ``rotary_emb`` returns (:data:`rope.hf.TABLE_FORMS`), which
:func:`rope.hf.install` finds by probing and :func:`rope.hf.patch` checks against this table.

Each convention was read from the transformers 5.23 source of the families named below. Which
model types follow it is not listed by hand: :mod:`rope.hf.coverage` decides it from each
modeling module's functions and a probe of a tiny model, and writes
:mod:`rope.hf.coverage_table`; every covered type is checked logit for logit on a tiny model
(``tests/test_hf_coverage.py``, ``tests/test_hf_families.py``, ``tests/test_hf_patch.py``). A
composite's row is the convention of its own modeling module; the modules of its parts of other
types (a text model of type ``deepseek_v3``) follow those types' rows (:mod:`rope.hf.patching`):

* :data:`LLAMA`: ``apply_rotary_pos_emb``, ``q * cos + rotate_half(q) * sin`` with
  ``rotate_half`` splitting the head in halves, pairs (i, i + d/2) (``modeling_llama.py``, and
  the same function in the modeling file of every family listed with it; where the rotary part is
  narrower than the head, in Phi, GPT-NeoX, StableLM and Persimmon, the attention or the function
  passes the rest of the head through).
* :data:`KEYS_OPTIONAL`: Llama's ``apply_rotary_pos_emb`` with ``k=None`` allowed, which rotates
  and returns q alone (``modeling_qwen4_exp.py``: its indexer rotates queries and pooled keys).
* :data:`LAST_QUERIES`: Llama's ``apply_rotary_pos_emb`` on keys longer than the queries, which
  take the last rows of the tables (``modeling_muse_glimmer_assistant.py``: a drafter attending
  to the main model's context).
* :data:`GLM`: ``apply_rotary_pos_emb`` reading the first half of ``rotate_half`` tables, each
  entry twice (``cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)``), with a
  ``rotate_half`` that pairs (2i, 2i + 1) (``modeling_glm.py``, ``modeling_glm4.py``,
  ``modeling_ernie4_5.py``, ``modeling_helium.py``).
* :data:`COHERE`: ``apply_rotary_pos_emb`` with pairs (2i, 2i + 1) on tables whose rotary module
  repeats each angle twice in a row (``repeat_interleave``; ``modeling_cohere.py``,
  ``modeling_cohere2.py``).
* :data:`GPT_OSS`: ``apply_rotary_pos_emb`` calling ``_apply_rotary_emb``: the halves (x1, x2)
  become (x1 cos - x2 sin, x2 cos + x1 sin), tables with each angle once (``modeling_gpt_oss.py``).
* :data:`DEEPSEEK_V3`: ``apply_rotary_pos_emb`` (Llama's, with ``rope_interleave=False``) and
  ``apply_rotary_pos_emb_interleave`` (the default: pairs (2i, 2i + 1) turned and returned
  half-split) on the ``qk_rope_head_dim`` coordinates (``modeling_deepseek_v3.py``).
* :data:`INTERLEAVE`: ``apply_rotary_pos_emb_interleave`` alone, DeepSeek-V3's function without
  its Llama one (``modeling_glm_moe_dsa.py``, ``modeling_longcat_flash.py``; Mistral Large 4's
  also takes ``k=None``).
* :data:`NANOCHAT`: ``apply_rotary_pos_emb`` with a ``rotate_half`` of (x1, x2) -> (x2, -x1): each
  pair turned by the negated angle (``modeling_nanochat.py``).
* :data:`PRIVACY_FILTER`: ``apply_rotary_pos_emb`` calling ``_apply_rotary_emb``: pairs (2i, 2i + 1)
  on tables with each angle once (``modeling_openai_privacy_filter.py``).
* :data:`GEMMA4`: ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)``, Llama's formula on one
  tensor (``modeling_gemma4.py``).
* :data:`DEEPSEEK_V4`: ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)`` on one tensor, tables
  with each angle once repeated twice in a row, pairs (2i, 2i + 1) of the last ``2 cos.shape[-1]``
  coordinates (``modeling_deepseek_v4.py``).
* :data:`GPTJ`: ``apply_rotary_pos_emb(tensor, sin, cos)``, ``tensor cos + rotate_every_two(tensor)
  sin`` on tables with each angle once repeated twice in a row, looked up by the attention in its
  ``embed_positions`` buffer (``modeling_gptj.py``, ``modeling_codegen.py``).
* :data:`LLAMA4`: ``apply_rotary_emb(xq, xk, freqs_cis)``, pairs (2i, 2i + 1) as complex numbers
  times ``freqs_cis``, and its vision tower's ``vision_apply_rotary_emb(query, key, freqs_ci)``, the
  same with ``freqs_ci`` viewed as ``[1, seq, 1, head_dim / 2]``, in complex64, on the tower's
  table (``modeling_llama4.py``; :mod:`rope.hf.functions_2d`): both replaced, so a whole Llama 4
  model, its tower alone or its text model alone rotates exactly.
* :data:`DEEPSEEK_V2`: Llama 4's ``apply_rotary_emb`` on q and k ``[batch, heads, seq, head_dim]``
  (``modeling_deepseek_v2.py``).
* :data:`VISION`: ``apply_rotary_pos_emb_vision(q, k, cos, sin)`` of the vision towers, Llama's
  formula in float32 on q, k ``[seq, heads, head_dim]`` and tables ``[seq, head_dim]`` unsqueezed
  at -2 (``modeling_qwen2_vl.py``, ``modeling_glm4v.py``, ``modeling_mlcd.py`` and the other
  modules that define it with ``rotate_half``). Its tables come from the tower's vision rotary
  module, which :mod:`rope.hf.vision` swaps; a model type follows it only where the tower is the
  model (its text models, where it has them, follow their own convention).
* :data:`VISION_PAIRWISE`: Inkling 2's ``apply_rotary_pos_emb_vision``, the same with a
  ``rotate_pairwise`` that pairs (2i, 2i + 1) (``modeling_inkling2.py``).
* :data:`SAM`: ``apply_rotary_pos_emb_2d(q, k, cos, sin)``, pairs (2i, 2i + 1) in float32 on
  tables ``[seq, head_dim]`` broadcast as they are (``modeling_sam3.py``, ``modeling_sam2_video.py``);
  the video trackers' memory attention also passes ``num_k_exclude_rope`` (object pointers left
  unrotated) and ``repeat_freqs_k`` (each frame of memory turned by the tables), which rope's takes.
* :data:`PATCHES`: DINOv3's ``apply_rotary_pos_emb(q, k, cos, sin)``, Llama's formula on the last
  ``cos.shape[-2]`` tokens of q and k (the image's patches) with tables ``[patches, head_dim]``
  broadcast as they are, the class and register tokens before them passed through
  (``modeling_dinov3_vit.py``, ``modeling_sapiens2.py``, ``modeling_eomt_dinov3.py``). Its tables
  come from an image-grid rotary module, which :mod:`rope.hf.grid` swaps.
* :data:`EDGETAM`: EdgeTAM video's ``apply_rotary_pos_emb_2d_self_attn`` (SAM's formula) and
  ``apply_rotary_pos_emb_2d_cross_attn``, which turns the queries by ``cos``, ``sin`` and of the
  keys only the spatial ones of each memory frame by ``cos_k``, ``sin_k`` (repeated per frame),
  the temporal ones and the last ``num_k_exclude_rope`` (object pointers) passing through
  (``modeling_edgetam_video.py``; :mod:`rope.hf.functions_2d`). EdgeTAM video's forward needs an
  inference session, which the probe does not make: it is probed by its memory attention
  (:func:`rope.hf.part_feeds.edgetam_memory_attention`).

* :data:`ROFORMER`: the static method ``apply_rotary_position_embeddings(sinusoidal_pos, query_layer,
  key_layer, value_layer=None)`` of RoFormer's attention class, pairs (2i, 2i + 1) on its own
  ``[sin | cos]`` table, the values too where ``rotary_value`` (``modeling_roformer.py``; a method
  convention, :mod:`rope.hf.methods`: the class attribute is replaced, and the model's table,
  float64 angles rounded once, stays).
* :data:`CONFORMER`: the method ``_apply_rotary_embedding(self, hidden_states,
  relative_position_embeddings)`` of the conformers' attention class, ``rotate_half`` on the
  hidden states viewed as heads, from the ``stacked`` cos and sin of
  :class:`rope.hf.StackedRotaryTable` (``modeling_wav2vec2_conformer.py``,
  ``modeling_wav2vec2_bert.py``, ``modeling_seamless_m4t.py``; a method convention).
* :data:`VJEPA2`: ``rotate_queries_or_keys(x, pos)`` of V-JEPA 2, called on each third of the head
  with the patches' frame, row or column, angles computed at each call, no table
  (``modeling_vjepa2.py``; a module-level function of its own signature, :mod:`rope.hf.methods`).
* :data:`CLVP`: CLVP's ``apply_rotary_pos_emb(q, k, v, cos, sin, position_ids)``, Llama's formula on
  q, k and the values, on the rows ``position_ids`` of tables ``[n, d]`` that its attention takes
  as cos and sin of the ``angles`` of :class:`rope.hf.RotaryAngleTable` (float64, exactly reduced)
  (``modeling_clvp.py``; :mod:`rope.hf.clvp`).
* :data:`MUSICFLAMINGO`: ``apply_rotary_time_emb(hidden_states, cos, sin)``, which turns the audio
  features themselves (not q and k) in pairs (2i, 2i + 1) on the first ``cos.shape[-1]``
  coordinates, in float64, by tables broadcast as given: those of its rotary time module
  ``pos_emb`` (the timestamps of each window, 2-D over window and time), which
  :mod:`rope.hf.time_rotary` swaps (``modeling_musicflamingo.py``; its text model follows its own row).

Model types not in the table are refused by :func:`rope.hf.patch`, with the reason
:mod:`rope.hf.coverage` found (:data:`rope.hf.coverage_table.REFUSED`); the functions and
:func:`rope.hf.install` remain usable for them by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from .. import _checks
from . import clvp, methods, time_rotary
from . import functions as ours  # rope's replacements, one per convention
from . import functions_2d as ours_2d  # those of vision and video attentions beyond functions.py
from .coverage_table import COVERED
from .embedding import TABLE_FORMS


@dataclass(frozen=True)
class Convention:
    """How one family's modeling module rotates q and k: ``name``, the family it was read from;
    ``functions``, ``(name, replacement)`` pairs: the module-level function its attention calls by
    that name (or, for ``"*.<attribute>"``, the attribute of its attention class:
    :mod:`rope.hf.methods`), and rope's function with the same signature and result; ``tables``, the
    :data:`rope.hf.TABLE_FORMS` entry of the tables its rotary module returns.

    Args:
        name: the family the convention was read from (a ``model_type``).
        functions: ``(name, replacement)`` pairs: the modeling module's function and rope's.
        tables: the form of the family's tables, one of :data:`rope.hf.TABLE_FORMS` (or of
            :data:`rope.hf.methods.TABLE_FORMS`).
    """

    name: str
    functions: tuple[tuple[str, Callable], ...]
    tables: str

    def __post_init__(self):
        _checks.choice("tables", self.tables, (*TABLE_FORMS, *methods.TABLE_FORMS))


LLAMA = Convention("llama", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb),), "rotate_half")
KEYS_OPTIONAL = Convention("qwen4_exp", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_keys_optional),),
                           "rotate_half")
LAST_QUERIES = Convention("muse_glimmer_assistant",
                          (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_last_queries),), "rotate_half")
GLM = Convention("glm", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_interleaved),), "rotate_half")
COHERE = Convention("cohere", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_interleaved_tables),), "interleaved")
GPT_OSS = Convention("gpt_oss", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_pair_tables),), "pairs")
DEEPSEEK_V3 = Convention("deepseek_v3", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb),
                                         ("apply_rotary_pos_emb_interleave", ours.apply_rotary_pos_emb_interleave)),
                         "rotate_half")
INTERLEAVE = Convention("glm_moe_dsa", (("apply_rotary_pos_emb_interleave", ours.apply_rotary_pos_emb_interleave),),
                        "rotate_half")
NANOCHAT = Convention("nanochat", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_conjugate),), "rotate_half")
PRIVACY_FILTER = Convention("openai_privacy_filter",
                            (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_pair_tables_interleaved),), "pairs")
GEMMA4 = Convention("gemma4", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_single),), "rotate_half")
DEEPSEEK_V4 = Convention("deepseek_v4", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_trailing),), "pairs")
GPTJ = Convention("gptj", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_every_two),), "pairs")
LLAMA4 = Convention("llama4", (("apply_rotary_emb", ours.apply_rotary_emb_complex),
                               ("vision_apply_rotary_emb", ours_2d.apply_rotary_emb_complex_vision)), "complex")
DEEPSEEK_V2 = Convention("deepseek_v2", (("apply_rotary_emb", ours.apply_rotary_emb_complex_heads_first),), "complex")
VISION = Convention("qwen2_vl_vision", (("apply_rotary_pos_emb_vision", ours.apply_rotary_pos_emb_vision),),
                    "rotate_half")
SAM = Convention("sam3", (("apply_rotary_pos_emb_2d", ours.apply_rotary_pos_emb_2d),), "interleaved")
PATCHES = Convention("dinov3_vit", (("apply_rotary_pos_emb", ours.apply_rotary_pos_emb_patches),), "rotate_half")
VISION_PAIRWISE = Convention("inkling2_vision",
                             (("apply_rotary_pos_emb_vision", ours.apply_rotary_pos_emb_vision_pairwise),),
                             "interleaved")
EDGETAM = Convention("edgetam_video", (("apply_rotary_pos_emb_2d_self_attn", ours_2d.apply_rotary_pos_emb_2d_self_attn),
                                       ("apply_rotary_pos_emb_2d_cross_attn",
                                        ours_2d.apply_rotary_pos_emb_2d_cross_attn)), "interleaved")
ROFORMER = Convention("roformer", (("*.apply_rotary_position_embeddings",
                                   staticmethod(methods.apply_rotary_position_embeddings)),), "pairs")
CONFORMER = Convention("wav2vec2-conformer", (("*._apply_rotary_embedding", methods.apply_rotary_embedding_stacked),),
                       "stacked")
VJEPA2 = Convention("vjepa2", (("rotate_queries_or_keys", methods.rotate_queries_or_keys),), "none")
CLVP = Convention("clvp", (("apply_rotary_pos_emb", clvp.apply_rotary_pos_emb_values),), "angles")
MUSICFLAMINGO = Convention("musicflamingo", (("apply_rotary_time_emb", time_rotary.apply_rotary_time_emb),),
                           "interleaved")

CONVENTIONS = MappingProxyType({c.name: c for c in (KEYS_OPTIONAL, LAST_QUERIES, PATCHES, LLAMA, GLM, COHERE, GPT_OSS,
                                                    DEEPSEEK_V3, INTERLEAVE, NANOCHAT, PRIVACY_FILTER, GEMMA4,
                                                    DEEPSEEK_V4, GPTJ, LLAMA4, DEEPSEEK_V2, VISION, VISION_PAIRWISE,
                                                    SAM, EDGETAM, ROFORMER, CONFORMER, VJEPA2, CLVP,
                                                    MUSICFLAMINGO)})
"""Each :class:`Convention` by its name."""

FAMILIES = MappingProxyType({model_type: CONVENTIONS[name] for model_type, (name, *_) in COVERED.items()})
"""transformers ``model_type`` -> its :class:`Convention` (read-only): every type of
:data:`rope.hf.coverage_table.COVERED`, the types :mod:`rope.hf.coverage` found to follow a
convention and to be reproduced by rope on a tiny model."""

CONVENTIONS_START = "<!-- rope.hf conventions: generated by python -m rope.hf.coverage, do not edit -->"
CONVENTIONS_END = "<!-- end of rope.hf conventions -->"


def readme_table() -> str:
    """README's table of the conventions (each :data:`CONVENTIONS` entry: the functions replaced in
    the modeling module, rope's replacements, the table form), between :data:`CONVENTIONS_START`
    and :data:`CONVENTIONS_END`."""
    lines = [CONVENTIONS_START, "", "| convention | replaced in the modeling module | by | tables |",
             "| --- | --- | --- | --- |"]
    for convention in CONVENTIONS.values():
        replaced = ", ".join(f"`{name}`" for name, _ in convention.functions)
        by = ", ".join(f"`rope.hf.{function.__name__}`" for _, function in convention.functions)
        lines.append(f"| {convention.name} | {replaced} | {by} | `{convention.tables}` |")
    return "\n".join([*lines, "", CONVENTIONS_END])
