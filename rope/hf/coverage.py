"""Which transformers model types :func:`rope.hf.patch` covers, decided from their code and a probe.

For every ``model_type`` of the installed transformers whose modeling module mentions rotary
embeddings, :func:`survey` decides:

1. the convention (:mod:`rope.hf.families`): the modeling module must define the convention's
   functions by name, and each must return what rope's replacement returns on random q, k and
   tables of the convention's form (float32, within :data:`FUNCTION_TOLERANCE`; a method
   convention's class attribute or function on its own arguments: :func:`rope.hf.methods.computes`);
   ``source_matches_llama`` also records whether the module's ``apply_rotary_pos_emb`` and
   ``rotate_half`` are Llama's source, token for token (docstrings aside);
2. the probe (:func:`probe`): a tiny randomly initialised model of the type (:func:`tiny_model`:
   sizes of :data:`TINY` on the config and each of its sub-configs, the first layer of each
   layer type, rotary sizes fitted to the tiny heads, what the default config leaves unset
   filled in (layer types, per-layer-type RoPE, keys of :data:`MISSING`), :data:`FIXES`, no
   download; a part of a composite model is built as its own class) must hold a ``rotary_emb``
   module or a position table (GPT-J's and CodeGen's, :data:`rope.hf.POSITION_TABLES`; else the
   rotary modules or functions it has instead are named; a model of a convention of
   :data:`rope.hf.methods.OWN_TABLES` keeps its own table or makes none), held by classes of modeling modules
   each of which computes its own convention (patch swaps the functions of each,
   :func:`rope.hf.patching.modeling_modules`: the type's own module the convention tried; another
   type's, as a composite's text model, the row of its classes' ``config.model_type`` in the
   current table, so a composite is covered once its text model's type is), which
   :func:`rope.hf.install` must accept, and, run by the first feed of :func:`rope.hf.feeds.candidates` that shows the
   rotation (token ids to the model or its text model, else embeddings, audio features or a
   waveform to the model or to a part holding a ``rotary_emb``; :func:`_chosen_feed`), give the
   same output after :func:`rope.hf.install` (rope's tables) and with the convention's functions
   replaced by rope's, to :data:`LOGITS_TOLERANCE` (transformers' float32 angles against rope's
   exact ones, at positions below 20), its attention calls a replaced function, and no rotary
   module but rope's runs in that forward (:func:`stock_rotary_calls`: a second table module
   the layers call, which patch would leave in place, refuses the type). The feed is recorded
   (:data:`rope.hf.coverage_table.FEEDS`), and :func:`output` runs it again for the tests.

A type that passes both is covered (:data:`rope.hf.coverage_table.COVERED`, from which
:data:`rope.hf.FAMILIES` is built); any other is refused with the first reason met
(:data:`rope.hf.coverage_table.REFUSED`), which :func:`rope.hf.patch` names. ``python -m
rope.hf.coverage`` writes both tables (``rope/hf/coverage_table.py``) and README's table; run it
after changing transformers' pin, and ``tests/test_hf_coverage.py`` checks that they are current.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import math
import pathlib
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import astuple, dataclass

import torch
from torch import nn

from .. import _checks
from . import families, feeds, methods, part_feeds, standins, vision
from .embedding import RotaryEmbedding, head_dim_of
from .feeds import Feed
from .install import install, rotary_replacements, rotary_slots
from .patching import modeling_modules

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, initializer_range=0.2, sliding_window=8,
            num_local_experts=4, num_experts=4, n_routed_experts=4, num_experts_per_tok=2, top_k_experts=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=32, n_shared_experts=1, n_group=1, topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            moe_num_experts=4, moe_k=2, moe_topk=2, num_shared_experts=1, expert_intermediate_size=32,
            ffn_hidden_size=32, embed_dim=32, num_heads=2, depth=1, out_hidden_size=64, mamba_n_heads=4,
            mamba_d_head=32, mamba_d_ssm=128, n_mamba_heads=4, mamba_headdim=32, mamba_d_state=16,
            index_n_heads=4, index_head_dim=16,
            vocab_size_per_layer_input=97, hidden_size_per_layer_input=8,
            intermediate_size_mlp=96, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64,
            projector_hidden_size=64, moe_hidden_size=32, dense_intermediate_size=96, shared_intermediate_size=32,
            merged_hidden_size=64, output_dim=64, downsample_hidden_size=32, cross_hidden_size=64,
            backbone_hidden_size=64, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=64, indexer_budget=8,
            indexer_compress_ratio=4, upsample_groups=64, num_filters=8, codebook_dim=16, codebook_size=64,
            vector_quantization_hidden_dimension=16, num_quantizers=2, base_channels=32, decoder_dim=64,
            upsample_initial_channel=32, encoder_hidden_size=16, text_vocab_size=97, encoder_hash_byte_group_vocab=97,
            adapter_in_dim=64, adapter_out_dim=64, pairwise_hidden_size=32, pair_transition_intermediate_size=32,
            mamba_num_heads=4, mamba_head_dim=16, moe_shared_expert_intermediate_size=32, ext_pw_out_channel=32,
            depthwise_separable_out_channel=32, nemo_conv_channels=32, output_channels=32, mlp_dim=96,
            downsample_channels=32, ffn_dim=96, hidden_sizes=64, emb_dim=32, num_embeds=97,
            cross_head_dim=16, cross_num_attention_heads=4, cross_num_key_value_heads=2, hidden_size_global=64,
            cross_attn_k=1, layer_scale_initial_scale=1.0, linear_num_heads=4, linear_head_dim=16,
            projection_intermediate_size=96, projection_hidden_dim=64, text_hidden_size=64,
            memory_attention_num_layers=2, memory_attention_feed_forward_hidden_size=96,
            memory_fuser_intermediate_dim=96, memory_attention_mlp_hidden_size=96, decoder_hidden_size=64,
            pred_hidden_size=64,
            pred_num_attention_heads=4, pred_num_hidden_layers=2)
"""The sizes of a tiny model: each key the config has (and does not derive) is set to this (the
vision keys ``embed_dim``, ``num_heads``, ``depth``, ``out_hidden_size`` shrink vision towers; the
``mamba_*`` keys the state-space layers of hybrid models; ``index_*`` DeepSeek-V3.2's indexer; the
projector, adapter and audio keys the parts between towers and text models of multimodal ones;
``indexer_*`` Qwen4-Exp's sparse-attention indexer, which its default config leaves unset (its
index heads as wide as the attention's rotary heads); the codec keys Mimi's and its kin's, whose
upsampling convolution has one group per hidden channel, and their layer scale, at 1 so that the
attention shows in the output; ``base_channels`` the VQ image tokenizers of Chameleon and Emu3
(a multiple of their 32 norm groups); ``cross_*`` Dia's cross-attention; ``hidden_size_global``
and ``cross_attn_k`` BLT's global model, as wide as its local ones; ``linear_*`` the linear-attention
layers of GLM-5-Next, Kimi Linear and Bailing's hybrid; ``projection_*`` and ``text_hidden_size``
the mergers of vision towers into text models (GLM-5-Next's, Inkling 2's); ``memory_*`` the memory
attention and fuser of SAM 2's, SAM 3's and EdgeTAM's video trackers; ``decoder_hidden_size`` the
LSTM prediction networks of Parakeet's and Nemotron's transducers; ``pred_*`` V-JEPA 2's predictor;
the rest the towers, codecs, vocoders and heads that keep a composite model over
:data:`MAX_PARAMETERS` otherwise). A size
the config holds per modality or per stage (a list) is set in each entry."""

MAX_PARAMETERS = 5_000_000
"""A tiny model larger than this (a size :data:`TINY` does not reach) is not built."""

LARGEST_WEIGHT = 1e3
"""A tiny model's weight larger than this, or not finite, was left uninitialised by transformers'
init (memory as ``torch.empty`` found it): :func:`_materialized` draws it again, seeded."""

LOGITS_TOLERANCE = dict(rtol=1e-4, atol=2e-5)
"""rope's exact angles against transformers' float32 ones, on a tiny model at positions below 20."""

FUNCTION_TOLERANCE = 1e-5
"""How far a modeling module's function may differ from rope's on float32 inputs of size 1."""

CONVENTIONS = tuple(sorted(families.CONVENTIONS.values(), key=lambda convention: -len(convention.functions)))
"""The conventions tried (:data:`rope.hf.families.CONVENTIONS`), those with more functions first (a
module with DeepSeek-V3's two functions is DeepSeek-V3's, not the one with its interleave function alone)."""


@dataclass(frozen=True)
class Row:
    """One model type: its modeling module's source file (relative to transformers' package),
    the convention it follows (``None``: refused), the reason it is refused (``""``: covered),
    and whether its ``apply_rotary_pos_emb`` and ``rotate_half`` are Llama's source.

    Args:
        model_type: the ``model_type``.
        source: ``models/<folder>/modeling_<folder>.py``.
        convention: the name of its :class:`rope.hf.Convention`, or ``None``.
        reason: why it is refused, or ``""``.
        source_matches_llama: its functions are Llama's, token for token.
        feed: how the probe ran it (:class:`rope.hf.feeds.Feed`): token ids to the model, or,
            where its forward needs more (pixels, audio), the part run and the inputs made.
    """

    model_type: str
    source: str
    convention: str | None
    reason: str
    source_matches_llama: bool = False
    feed: Feed = Feed()


def _transformers():
    import transformers
    return transformers


def module_name(model_type: str) -> str:
    """The import name of the modeling module of ``model_type`` (``transformers.models.<folder>.modeling_<folder>``)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    folder = model_type_to_module_name(model_type)
    return f"transformers.models.{folder}.modeling_{folder}"


def source_file(model_type: str) -> pathlib.Path:
    """The modeling module's file, without importing it."""
    root = pathlib.Path(_transformers().__file__).parent
    return root.joinpath(*module_name(model_type).split(".")[1:]).with_suffix(".py")


def rotary_model_types() -> list[str]:
    """Every ``model_type`` of the installed transformers whose modeling file mentions rotary
    embeddings (``rotary`` in its source), sorted."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return sorted(t for t in CONFIG_MAPPING_NAMES
                  if source_file(t).is_file() and "rotary" in source_file(t).read_text().lower())


def _body(tree: ast.Module, name: str) -> str | None:
    """The dumped AST of the module-level function ``name``, docstring dropped; ``None`` if absent."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            return ast.dump(ast.Module(body=[*body], type_ignores=[])) + ast.dump(node.args)
    return None


def source_matches_llama(model_type: str) -> bool:
    """Whether the modeling file's ``apply_rotary_pos_emb`` and ``rotate_half`` are Llama's, token
    for token (docstrings aside)."""
    llama, own = (ast.parse(source_file(t).read_text()) for t in ("llama", model_type))
    return all(_body(own, name) is not None and _body(own, name) == _body(llama, name)
               for name in ("apply_rotary_pos_emb", "rotate_half"))


_ARGUMENTS = {"q": "q", "xq": "q", "x": "q", "tensor": "q", "k": "k", "xk": "k", "cos": "cos", "sin": "sin",
              "freqs_cis": "freqs_cis", "query": "q", "key": "k", "freqs_ci": "freqs_cis", "cos_k": "cos",
              "sin_k": "sin", "hidden_states": "q"}
"""The positional parameters of rope's functions, by name, and the input each takes."""


def _inputs(ours: Callable, form: str, generator: torch.Generator):
    """Random float32 positional arguments of rope's function ``ours`` (read from its signature):
    q and k ``[1, 4, 4, 16]``, as many heads as tokens so that either layout of the heads
    broadcasts and only the values tell them apart, and tables of ``form`` that carry no
    provenance (so rope's function applies the formula); for a vision tower's function, q and k
    ``[4, 4, 16]`` and tables ``[4, width]``, its contract (seq first, no batch)."""
    q, k = (torch.randn(1, 4, 4, 16, generator=generator) for _ in range(2))
    positions = torch.randint(0, 4096, (1, 4), generator=generator)
    tables = RotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=16, tables=form)(q, positions)
    values = {"q": q, "k": k}
    if form == "complex":
        values["freqs_cis"] = tables * 1
    else:
        values["cos"], values["sin"] = (table * 1 for table in tables)
    if ours.__name__.startswith("apply_rotary_pos_emb_vision"):  # a tower's: q [seq, heads, dim], tables [seq, dim]
        values = {name: value[0] for name, value in values.items()}
    parameters = [p.name for p in inspect.signature(ours).parameters.values()
                  if p.default is inspect.Parameter.empty or p.name in ("k", "cos", "sin")]
    return tuple(values[_ARGUMENTS[name]] for name in parameters)


def _same_function(theirs: Callable, ours: Callable, args) -> bool:
    """Whether ``theirs(*args)`` returns what ``ours(*args)`` does, to :data:`FUNCTION_TOLERANCE`."""
    try:
        got, expected = theirs(*args), ours(*args)
    except Exception:  # another signature or shape contract: not this convention
        return False
    got, expected = (out if isinstance(out, tuple) else (out,) for out in (got, expected))
    return len(got) == len(expected) and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape and float((a - b).abs().max()) <= FUNCTION_TOLERANCE
        for a, b in zip(got, expected))


def _without_keys(args: tuple) -> tuple:
    return (args[0], None, *args[2:])


def _shorter_queries(args: tuple) -> tuple:
    return (args[0][..., : args[0].shape[-2] // 2, :], *args[1:])


def _fewer_table_rows(args: tuple) -> tuple:
    return (*args[:2], *(table[..., table.shape[-2] // 2:, :] for table in args[2:]))


def _memory_keys(args: tuple) -> tuple:
    q, k, *tables = args
    return (q, torch.cat((k, k, k), dim=-2), *tables, 2, 2)


EXTRA_CALLS = {"apply_rotary_pos_emb_keys_optional": _without_keys,
               "apply_rotary_pos_emb_last_queries": _shorter_queries,
               "apply_rotary_pos_emb_patches": _fewer_table_rows,
               "apply_rotary_pos_emb_2d_cross_attn": _memory_keys}
"""rope's functions that Llama's also matches on q and k alike, and the further call that tells
them apart (made from the first call's arguments): keys ``None``, queries shorter than the keys,
tables of fewer rows than the tokens (DINOv3's patches after its class and register tokens);
EdgeTAM's cross-attention on keys of two memory frames (one temporal key and the spatial ones of
``cos_k`` each) and two object pointers (``num_k_exclude_rope=2, repeat_freqs_k=2``)."""


def _computes(theirs: Callable, ours: Callable, form: str, generator: torch.Generator) -> bool:
    """Whether ``theirs`` returns what rope's ``ours`` does on random inputs (:func:`_inputs`),
    and on the further call of :data:`EXTRA_CALLS` where ``ours`` has one."""
    args = _inputs(ours, form, generator)
    extra = EXTRA_CALLS.get(ours.__name__)
    return _same_function(theirs, ours, args) and (extra is None or _same_function(theirs, ours, extra(args)))


def conventions_of(module) -> list[families.Convention]:
    """The conventions (:data:`CONVENTIONS`, in order) whose functions ``module`` defines and
    computes (:func:`_computes`; Qwen2-VL's module: Llama's for its text model, the vision one for
    its tower)."""
    generator = torch.Generator().manual_seed(0)
    return [convention for convention in CONVENTIONS
            if (methods.computes(module, convention) if methods.is_method(convention) else
                all(_computes(getattr(module, name, None) or (lambda *a: None), ours, convention.tables, generator)
                    for name, ours in convention.functions))]


def convention_of(module) -> families.Convention | str:
    """The first convention of :func:`conventions_of` ``module``, or the reason none fits: the
    rotary functions it defines instead."""
    found = conventions_of(module)
    if found:
        return found[0]
    own = _rotary_functions(module)
    return ("its rotary functions (" + (", ".join(own) or "none at module level") + ") compute none of rope's "
            "conventions (rope.hf.families.CONVENTIONS)")


def _rotary_functions(module) -> list[str]:
    """The module-level functions ``module`` defines whose names speak of rotation, sorted."""
    return sorted(name for name, value in vars(module).items() if callable(value) and not isinstance(value, type)
                  and getattr(value, "__module__", None) == module.__name__
                  and any(word in name for word in ("rotary", "rotate", "rope")))


def parts_convention(model_type: str, module) -> families.Convention | None:
    """For a composite whose modeling module defines no rotary function at all, its rotary modules
    all held by its parts of other types (HyperCLOVA X Vision V2: a Qwen2.5-VL vision tower and a
    HyperCLOVA X text model, built by ``AutoModel``), the row of its text model's type in the
    current table (:data:`rope.hf.FAMILIES`), which :func:`classify` probes it with: patch swaps
    the functions of its parts' modules, each by its own row (:func:`rope.hf.patching.modeling_modules`),
    and nothing in its own. ``None`` for any other module or type."""
    if _rotary_functions(module):
        return None
    try:
        text = tiny_config(model_type).get_text_config()
    except Exception:  # no config to read a text model from: no parts
        return None
    return families.FAMILIES.get(text.model_type) if text.model_type != model_type else None


def deepseek_v3_config(rope_interleave: bool = True):
    """DeepSeek-V3's multi-head latent attention rotates only qk_rope_head_dim coordinates, with
    YaRN (mscale = mscale_all_dim) and, by default, interleaved pairs returned half-split."""
    from transformers import DeepseekV3Config
    return DeepseekV3Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, initializer_range=0.2, rope_interleave=rope_interleave,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1, "rope_theta": 1e4})


def gemma4_text_config():
    """Gemma 4: sliding layers with default RoPE on heads of 16, full-attention layers with
    proportional RoPE on heads of 32 (from the per-layer config); its apply function takes one tensor."""
    from transformers import Gemma4TextConfig
    return Gemma4TextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=97, max_position_embeddings=64, sliding_window=8, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, initializer_range=0.2)


CONFIGS = {"deepseek_v3": deepseek_v3_config, "gemma4_text": gemma4_text_config}
"""Model types whose tiny config :data:`TINY` does not give, by their own function (taking options)."""


def tiny_config(model_type: str, **options):
    """A small config of ``model_type``: its own (:data:`CONFIGS`, taking ``options``), or
    transformers' default config with the sizes of :data:`TINY`, set on the config and on each of
    its sub-configs, wherever the config has the key and does not derive it (:func:`_shrink`), and
    the type's fix of :data:`FIXES`."""
    from transformers import AutoConfig

    if model_type in CONFIGS:
        return CONFIGS[model_type](**options)
    if options:
        raise ValueError(f"options: model_type {model_type!r} takes none, got {sorted(options)}")
    config = AutoConfig.for_model(model_type)
    _shrink(config, _modeling_source(model_type))
    if model_type in FIXES:
        FIXES[model_type](config)
    return config


MISSING = dict(dropout_rate=0.0, spatial_merge_size=2)
"""Values for keys a modeling module reads from a config whose class does not define them
(besides :data:`TINY`'s): released checkpoints' configs carry them, the default config lacks them."""


def skeleton(model_type: str, config, tries: int = 8) -> nn.Module:
    """A model of ``model_type`` built from ``config`` on the meta device (no memory: which
    modules and parameters it has), having set the keys the build reads and the config lacks (an
    ``AttributeError`` naming a config class and a key of :data:`MISSING` or :data:`TINY`) on
    that config or sub-config, one at a time, as released checkpoints' configs carry them."""
    cls = model_class(model_type, config)
    for _ in range(tries):
        try:
            with torch.device("meta"), standins.timm_standins():
                return cls._from_config(config)
        except AttributeError as err:
            found = re.fullmatch(r"'(\w+)' object has no attribute '(\w+)'", str(err))
            owners = [c for c in _configs(config) if found and type(c).__name__ == found.group(1)]
            if not owners or found.group(2) not in {**TINY, **MISSING}:
                raise
            for owner in owners:
                setattr(owner, found.group(2), {**TINY, **MISSING}[found.group(2)])
    with torch.device("meta"), standins.timm_standins():
        return cls._from_config(config)


def _configs(config) -> list:
    """``config`` and its sub-configs, recursively."""
    subs = [getattr(config, key, None) for key in getattr(config, "sub_configs", None) or {}]
    return [config, *(c for sub in subs if hasattr(sub, "to_dict") for c in _configs(sub))]


LAYER_PATTERN = dict(attn_layer_indices=[1], attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                     expert_layer_offset=1, block_types=["recurrent", "attention"], num_kv_shared_layers=0)
"""Keys from which hybrid models derive their layer types (Bamba, Jamba, RecurrentGemma, Gemma 3n):
set so that a tiny model of :data:`TINY`'s two layers has an attention layer, which rotates."""

HEAD_DIMS = (16, 32, 48, 64, 96)
"""Head dimensions tried, smallest first, for a config whose partial rotary factor leaves an odd
rotary dimension at :data:`TINY`'s."""


def _modeling_source(model_type: str) -> str:
    file = source_file(model_type)
    return file.read_text() if file.is_file() else ""


def _settable(config, key: str) -> bool:
    return hasattr(config, key) and not isinstance(getattr(type(config), key, None), property)


def _layer_indices(config) -> list[int] | None:
    """The layers a tiny model keeps: the first of each layer type (two at least), or ``None``
    where the config has no list of layer types it can be given."""
    types = getattr(config, "layer_types", None)
    if not isinstance(types, list) or not types or not _settable(config, "num_hidden_layers"):
        return None
    first = {}
    for index, kind in enumerate(types):
        first.setdefault(kind, index)
    indices = sorted(first.values())
    return indices if len(indices) >= 2 else [indices[0], indices[0] + 1][: len(types)]


def _shrink(config, source: str = "") -> None:
    """Set :data:`TINY`'s sizes and :data:`LAYER_PATTERN` on ``config`` and its sub-configs; keep
    the first layer of each layer type (with every per-layer list of the config); then fit the
    rotary sizes to the tiny heads (:func:`_fit_rotary`). A config with per-layer values (Gemma 4's
    ``per_layer_config``) is shrunk as one and split again: each kept layer's values scaled as its
    global value was (:func:`_split_per_layer`)."""
    overrides = _per_layer_overrides(config)
    if overrides is not None:  # read and set per-layer keys globally while shrinking; split again below
        config.allow_global_per_layer_attribute_access = True
        before = {key: config._getattr_without_heterogeneous_validation(key) for o in overrides.values() for key in o}
    layers = getattr(config, "num_hidden_layers", None)
    rope_head = (getattr(config, "qk_rope_head_dim", None) is not None  # MLA: head_dim derived as qk_rope_head_dim
                 and config.qk_rope_head_dim == getattr(config, "head_dim", None))
    indices = _layer_indices(config)
    per_layer = {key: value for key, value in vars(config).items()
                 if isinstance(value, list) and layers and len(value) == layers and _settable(config, key)}
    _fill_layer_types(config, source)
    for key, value in {**TINY, **LAYER_PATTERN}.items():
        if _settable(config, key):
            now = getattr(config, key)
            if isinstance(now, (list, tuple)) and now and key not in LAYER_PATTERN:  # a size per modality, stage
                value = type(now)([value] * len(now))
            with contextlib.suppress(Exception):  # a value the config's validation refuses: the key stays
                setattr(config, key, value)
    if indices is not None:
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            config.num_hidden_layers = len(indices)
            for key, value in per_layer.items():
                setattr(config, key, [TINY[key]] * len(indices) if key in TINY else [value[i] for i in indices])
    elif isinstance(getattr(config, "layer_types", None), list) and _settable(config, "layer_types"):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    if rope_head and _settable(config, "head_dim"):
        config.head_dim = config.qk_rope_head_dim
    if hasattr(config, "kv_lora_rank") and _settable(config, "num_key_value_heads"):  # MLA: one key per head
        config.num_key_value_heads = config.num_attention_heads
    _per_layer_type_rope(config, source)
    _fit_rotary(config, source)
    if overrides is not None:
        _split_per_layer(config, overrides, before, indices)
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            _shrink(sub, source)


OTHER_LAYER_TYPE = {"conv": "full_attention", "sliding_attention": "full_attention",
                    "linear_attention": "full_attention", "sparse": "dense", "dense": "sparse"}
"""For a list of layer types the default config leaves ``None``: the second type a tiny model
gets beside the one its modeling module tests for (``layer_types[i] != "conv"``: an attention
layer; ``mlp_layer_types[i] == "sparse"``: a dense one)."""


def _fill_layer_types(config, source: str) -> None:
    """Give each list of layer types (``layer_types``, ``mlp_layer_types``, ...) that the default
    config leaves ``None`` and the modeling module indexes one layer of each type it tests for
    (``<key>[i] == "<type>"``) and of :data:`OTHER_LAYER_TYPE`'s, as many as the config's layers."""
    layers = getattr(config, "num_hidden_layers", None)
    for key in [k for k, v in vars(config).items() if k.endswith("layer_types") and v is None]:
        tested = re.findall(rf"\b{key}\[[\w.]+\]\s*[!=]=\s*[\"'](\w+)[\"']", source)
        kinds = list(dict.fromkeys(tested))
        if not kinds or not isinstance(layers, int) or not _settable(config, key):
            continue
        kinds += [OTHER_LAYER_TYPE[kinds[0]]] if len(kinds) == 1 and kinds[0] in OTHER_LAYER_TYPE else []
        setattr(config, key, [kinds[i % len(kinds)] for i in range(layers)])


def _per_layer_type_rope(config, source: str) -> None:
    """Where the modeling module reads RoPE parameters per layer type
    (``rope_parameters[layer_type]``) and the default config has none at all: the default RoPE
    (the config's ``default_theta``) for each layer type, with the module's default M-RoPE
    sections where it has some (``.get("mrope_section", [...])``), as a released config names them."""
    params, types = _rope_mapping(config), getattr(config, "layer_types", None)
    if params != {} or not isinstance(types, list) or not re.search(r"rope_parameters\[layer_type\]", source):
        return
    default = {"rope_type": "default", "rope_theta": getattr(config, "default_theta", 1e4)}
    section = _default_sections(source)
    if section is not None:
        default["mrope_section"] = section
    config.rope_parameters = {kind: dict(default) for kind in dict.fromkeys(types)}


def _default_sections(source: str) -> list[int] | None:
    """The M-RoPE sections a modeling module defaults to (``.get("mrope_section", [...])``), or ``None``."""
    found = re.search(r"get\(\s*[\"']mrope_section[\"']\s*,\s*\[([\d,\s]+)\]", source)
    return None if found is None else [int(v) for v in found.group(1).split(",")]


def _per_layer_overrides(config) -> dict[int, dict] | None:
    """A heterogeneous config's per-layer values (layer index -> key -> value), or ``None``."""
    spec = config.__dict__.get("_heterogeneity_spec")
    return None if spec is None else {index: dict(values) for index, values in spec.per_layer_overrides.items()}


def _split_per_layer(config, overrides: dict[int, dict], before: dict, indices: list[int] | None) -> None:
    """Give the kept layers (``indices``, else the first ones) their per-layer values again, each
    integer scaled by the factor its global value shrank by (Gemma 4's full-attention head_dim of
    512 against 256 becomes twice the tiny head_dim), and forbid global reads again."""
    def scaled(key, value):
        now, was = config._getattr_without_heterogeneous_validation(key), before[key]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (value, now, was)) and was and now != was:
            return max(1, round(value * now / was))
        return value

    kept = indices if indices is not None else range(config.num_hidden_layers)
    config.per_layer_config = {new: {key: scaled(key, value) for key, value in overrides[old].items()}
                               for new, old in enumerate(kept) if old in overrides}
    config.allow_global_per_layer_attribute_access = False


def _rope_mapping(config) -> dict | None:
    params = getattr(config, "rope_parameters", None)
    return params if isinstance(params, dict) else None


def _fit_rotary(config, source: str) -> None:
    """Make the tiny heads rotate an even number of coordinates (a head dimension of
    :data:`HEAD_DIMS` where the partial rotary factor needs one) and fit M-RoPE sections: where
    the config has none and the modeling module defaults to its own
    (``rope_parameters.get("mrope_section", [...])``), heads as wide as those sections need (the
    config stays without, so :func:`rope.hf.install` finds them and their style); else the
    config's sections (or the default, where the head dimension is derived) scaled to the tiny
    pair count by largest remainders."""
    params = _rope_mapping(config)
    if params is None or not hasattr(config, "num_attention_heads"):
        return
    nested = [value for value in params.values() if isinstance(value, dict)]  # per layer type
    factors = {mapping.get("partial_rotary_factor") for mapping in (params, *nested)} - {None}
    factor = min(factors) if factors else getattr(config, "partial_rotary_factor", None) or 1.0
    section = params.get("mrope_section")
    default = _default_sections(source)
    if section is None and default is not None:
        if _settable(config, "head_dim"):  # heads wide enough for the module's own default, config left without
            config.head_dim = round(2 * sum(default) / factor)
            return
        section = default  # no head_dim to set: the sections, scaled, go into the config
    least = 2 if section is None else 12  # M-RoPE: two pairs per section at least

    def fits(dim: int) -> bool:
        return int(dim * factor) % 2 == 0 and int(dim * factor) >= least

    with contextlib.suppress(ValueError, TypeError, AttributeError, StopIteration):
        if not fits(head_dim_of(config)) and _settable(config, "head_dim"):
            config.head_dim = next(d for d in HEAD_DIMS if fits(d))
    if section is not None:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            params["mrope_section"] = _scaled(list(section), int(head_dim_of(config) * factor) // 2)


def _scaled(section: list[int], total: int) -> list[int]:
    """``section`` scaled to sum to ``total``, each part at least 1, by largest remainders."""
    exact = [total * part / sum(section) for part in section]
    parts = [max(1, int(value)) for value in exact]
    order = sorted(range(len(parts)), key=lambda i: int(exact[i]) - exact[i])
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _dbrx(config) -> None:
    config.attn_config.rope_theta = config.rope_parameters["rope_theta"]
    config.attn_config.clip_qkv = 8.0


def _deepseek_v4(config) -> None:
    config.compress_rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}
    config.partial_rotary_factor = 0.5
    config.qk_rope_head_dim = config.head_dim // 2
    for label in ("main", "compress"):
        config.rope_parameters[label]["partial_rotary_factor"] = 0.5
    config.rope_parameters["compress"].update(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                                              beta_fast=32, beta_slow=1, attention_factor=1.0)


def _set(**values) -> Callable:
    return lambda config: [setattr(config, key, value) for key, value in values.items()]


def _one_key_per_head(config) -> None:
    config.num_key_value_heads = config.num_attention_heads


def _kyutai(config) -> None:
    config.audio_pad_token_id = config.vocab_size + config.num_codebooks * config.codebook_vocab_size


def _efficientloftr(config) -> None:
    config.stage_num_blocks, config.out_features = [1, 1, 1, 1], [16, 16, 32, config.hidden_size]
    config.num_attention_heads = 8  # its tables span hidden_size: 2 head_dim (partial factor 4) = hidden_size / 4
    config.__post_init__()  # the blocks' channels and strides, derived from these


def _dots3(config) -> None:
    text = config.get_text_config()
    text.allow_global_per_layer_attribute_access = True
    factor = text.rope_parameters["sliding_attention"]["partial_rotary_factor"]
    text.head_dim = round(text.qk_rope_head_dim / factor)
    layers = {index: {**values, "qk_nope_head_dim": text.head_dim - text.qk_rope_head_dim}
              for index, values in _per_layer_overrides(text).items()}
    text.per_layer_config, text.allow_global_per_layer_attribute_access = layers, False


def _llama4_vision(config) -> None:
    config.intermediate_size = int(config.hidden_size / config.pixel_shuffle_ratio**2)


def _hiera(config) -> None:
    """A Hiera backbone of four one-block stages, 16 to 128 wide, and the FPN channels that read them."""
    backbone = config.vision_config.backbone_config
    backbone.hidden_size, backbone.embed_dim_per_stage = 16, [16, 32, 64, 128]
    backbone.blocks_per_stage, backbone.num_attention_heads_per_stage = [1, 1, 1, 1], [1, 1, 2, 4]
    backbone.global_attention_blocks = [1, 2, 3]
    config.vision_config.backbone_channel_list = backbone.embed_dim_per_stage[::-1]


def _dots3_audio(config) -> None:
    config.conv_output_size = config.downsample_hidden_size * ((config.feature_size + 7) // 8)
    config.adapter_input_size = config.hidden_size


def _sam3(config) -> None:
    config.vision_config.fpn_hidden_size = config.detr_encoder_config.hidden_size
    config.detr_decoder_config.initializer_range = 0.02
    config.mask_decoder_config.initializer_range = 0.05


def _codec_quantizer(config) -> None:
    config.quantization_dim = config.hidden_size + config.semantic_model_config.hidden_size
    _one_key_per_head(config)


def _clvp(config) -> None:
    for part in (config, getattr(config, "text_config", None), getattr(config, "speech_config", None)):
        if part is not None:
            part.projection_dim = 64
        if part is not None and hasattr(part, "use_rotary_embedding"):
            part.num_attention_heads = 1


def _lightglue(config) -> None:
    """LightGlue's descriptors as wide as its tiny layers, every keypoint through every layer
    (no early stop, pruning or match threshold, whose thresholds would make the output jump),
    20 keypoints per image, and its layers' outputs returned (:func:`rope.hf.feeds.first_output`)."""
    config.descriptor_dim, config.intermediate_size = config.hidden_size, 2 * config.hidden_size
    config.depth_confidence, config.width_confidence, config.filter_threshold = -1.0, -1.0, 0.0
    config.keypoint_detector_config.max_keypoints, config.keypoint_detector_config.keypoint_threshold = 20, 0.0
    config.output_hidden_states = True


def _esmfold2(config) -> None:
    """EsmFold2's atom encoders' rotary pairs fitted to their tiny heads of 8 pairs (its default
    3 x 2 spatial and 10 id pairs need heads of 32 or more): 3 x 1 spatial, 4 id pairs, 1 unturned;
    its single inputs as wide as the tiny atom encoder's output and the residue-type features; its
    weights drawn at :data:`TINY`'s spread (its config has no ``initializer_range``: transformers'
    0.02 leaves the tiny atom attention 1e-3 of the atom stream, where transformers' float32 angles
    at 2^16 move the probed output by 6e-8 only; at 0.2, by 5e-3)."""
    config.initializer_range = TINY["initializer_range"]
    for atoms in (config.atom_encoder, config.structure_head.diffusion_module.atom_encoder):
        atoms.num_spatial_rope_pairs_per_axis, atoms.num_uid_rope_pairs = 1, 4
    config.single_inputs_size = config.atom_encoder.output_dim + 2 * config.num_res_types + 1


def _musicflamingo(config) -> None:
    """MusicFlamingo's config derives its rotary width from the audio encoder's and its M from its
    base (``__post_init__``), which the tiny sizes replace: set again; its audio tokens take an id
    of the tiny vocabulary (1, which the sample tokens never draw); its encoder reads windows of
    ``2 max_source_positions`` feature frames (16 output frames here)."""
    config.head_dim = config.audio_config.hidden_size
    config.max_position_embeddings = config.rope_parameters["rope_theta"]
    config.audio_token_id = TINY["bos_token_id"]
    config.audio_config.max_source_positions = 16


def _hrm(config) -> None:
    config.num_layers_per_stack, config.L_cycles, config.L_bp_cycles = 1, 1, [1]
    config.num_hidden_layers = config.num_layers_per_stack * config.H_cycles * (config.L_cycles + 1)


FIXES = {"dbrx": _dbrx, "deepseek_v4": _deepseek_v4,
         "chameleon": _set(vocabulary_map={}), "emu3": _set(vocabulary_map={}),
         "granite4_vision": _set(deepstack_layer_map=[], downsample_rate="1/4"),
         "kyutai_speech_to_text": _kyutai, "hrm_text": _hrm, "efficientloftr": _efficientloftr,
         "clvp": _clvp, "clvp_encoder": _clvp, "lightglue": _lightglue, "esmfold2": _esmfold2,
         "dots3_note": _dots3, "dots3_note_text": _dots3,
         "dots3_note_audio_encoder": _dots3_audio, "neucodec": _codec_quantizer, "xcodec2": _codec_quantizer,
         "esm": _set(position_embedding_type="rotary"),
         "esmc": _one_key_per_head, "moonshine_streaming": _one_key_per_head,
         "granitemoehybrid": _set(position_embedding_type="rope", layer_types=["linear_attention", "full_attention"]),
         "zamba2": lambda config: _set(use_mem_rope=True, attention_hidden_size=128, attention_head_dim=32,
                                       hybrid_layer_ids=[i for i, kind in enumerate(config.layers_block_type)
                                                         if kind == "hybrid"])(config),
         "gptj": _set(rotary_dim=8), "codegen": _set(rotary_dim=8), "musicflamingo": _musicflamingo,
         "vjepa2": _set(crop_size=64, frames_per_clip=4),
         "llama4_vision_model": _llama4_vision, "qwen2_5_omni_dit": _set(mel_dim=64),
         "sapiens2": _set(num_key_value_heads_per_layer=[4, 2]),
         "eomt_dinov3": _set(num_blocks=1, num_queries=8, image_size=160),
         "sam2_video": lambda config: (_hiera(config), part_feeds.memory_grid(config)),
         "edgetam_video": lambda config: (_hiera(config), part_feeds.edgetam_grids(config)),
         "sam3_tracker_video": part_feeds.memory_grid,
         "sam3": _sam3,
         "seamless_m4t": _set(encoder_layers=2, encoder_ffn_dim=96, encoder_attention_heads=4, decoder_ffn_dim=96,
                              speech_encoder_layers=2, speech_encoder_attention_heads=4,
                              speech_encoder_intermediate_size=96, t2u_encoder_layers=2, t2u_decoder_layers=2,
                              t2u_encoder_ffn_dim=96, t2u_decoder_ffn_dim=96, t2u_encoder_attention_heads=4,
                              t2u_decoder_attention_heads=4, t2u_vocab_size=97, unit_hifi_gan_vocab_size=97,
                              unit_embed_dim=32, lang_embed_dim=16, spkr_embed_dim=16,
                              position_embeddings_type="rotary"),
         "wav2vec2-conformer": _set(position_embeddings_type="rotary"),
         "wav2vec2-bert": _set(position_embeddings_type="rotary"),
         "qwen3_omni_moe": lambda config: config.code2wav_config.rope_parameters.pop("mrope_section", None),
         "moonshine": _set(encoder_num_attention_heads=4, encoder_num_key_value_heads=4, encoder_num_hidden_layers=2),
         "hunyuan_vl": lambda config: config.text_config.rope_parameters.update(mrope_section=[2, 2, 2, 2]),
         "hunyuan_vl_text": lambda config: config.rope_parameters.update(mrope_section=[2, 2, 2, 2]),
         "longcat_flash": lambda config: _set(num_layers=1, zero_expert_num=4,
                                              qk_head_dim=config.qk_nope_head_dim + config.qk_rope_head_dim)(config)}
"""Model types whose default config does not build a rotating transformers model, and the fix:
DBRX's attention reads ``attn_config.rope_theta`` and clamps to ``clip_qkv``, which its
checkpoints' configs carry and the default config lacks; Granite 4.0-H and Zamba 2 rotate only
when configured to (``position_embedding_type="rope"``, ``use_mem_rope``), as their released
checkpoints are, and the default Granite 4.0-H config has no attention layer; Zamba 2 derives
its attention width (twice the hidden size) and its shared blocks' layers (``hybrid_layer_ids``,
from the layer types the tiny config keeps) at init, so the tiny ones are set. GPT-J and CodeGen
rotate the first ``rotary_dim`` coordinates of each head, which must fit the tiny heads;
DeepSeek-V4 rotates an eighth of each head (one pair of the tiny ones) and compresses 128 tokens
into each entry of its HCA layers: the tiny one rotates half the head, compresses 8 (HCA) and 4
(CSA) tokens, so that both compressors rotate entries within 20 tokens, and gives its compressed
layers YaRN with an attention factor of 1, as its checkpoints do. Chameleon and Emu3
read a vocabulary map of image tokens (none here), Granite 4 Vision its deepstack layers (none)
and Q-Former rate; Kyutai's audio padding id follows its vocabulary; HRM derives its cache's
layer count from its stack and cycles (one layer, one low cycle here); ESM C, Moonshine
Streaming, NeuCodec and XCodec2 project queries with as many heads as keys (one key per head);
the codecs' quantizer width is the acoustic plus the semantic hidden size; EfficientLoFTR
derives its backbone's blocks from the stages (one block each), and its rotary tables span the
hidden size, 4 n frequencies of heads of hidden_size / 8 (8 heads; its default config's ratio);
Sapiens2 lists its key-value heads per layer (24 layers, 16 or 8 heads: here one full-attention
layer of 4 and one grouped layer of 2); EoMT-DINOv3 adds its queries (200) before its last
``num_blocks`` (4) layers, more than the tiny 2 (1 here, with 8 queries), and reads its masks on
the configured grid (640 pixels a side: here 160, 10 patches, the probe's square image, enough
for diagnose's first 8 positions); dots.llm3's sliding layers
rotate ``head_dim * partial_rotary_factor`` coordinates, which must be its ``qk_rope_head_dim``;
Qwen3-Omni's code-to-wave transformer has no M-RoPE, but the sections its modeling module
defaults to (for the thinker) are fitted into every sub-config without them, so they are removed
from that one again; Moonshine's encoder heads (8 of the tiny width: 8 coordinates, of which its
partial rotary factor 0.9 would rotate 7) are 4 here, 16 coordinates of which it rotates 14;
LongCat-Flash counts its layers in ``num_layers`` (28, each two attentions) and its zero experts
in ``zero_expert_num`` (256), which the tiny one has 1 and 4 of, and keeps ``qk_head_dim`` (192)
apart from the nope and rope parts it sums; HunYuan-VL's rotary module needs the sections of
its four axes (``mrope_section``, a quarter of the tiny half head each), which its released
configs name (``xdrope_section``) and its default config does not. Llama 4's vision adapter
takes the pixel-shuffled patches (``hidden_size / pixel_shuffle_ratio**2`` wide: 256 at the tiny
width) in a layer as wide as ``intermediate_size``, which is set to that; Qwen2.5-Omni's DiT
concatenates its noisy mel frames (the feed's hidden states, of the tiny hidden size) with its
conditioning, so ``mel_dim`` is that width;
CLVP's encoders rotate max(projection_dim / (2 heads), 32) coordinates of each head (96 of the
default projection's 768 over 4 heads, wider than the tiny heads): one head of 64 coordinates and
a projection of 64 here, of which the first 32 rotate and the rest pass through;
dots.llm3's audio encoder derives its convolution's output width (``conv_output_size``) and its
adapter's input (which must be ``hidden_size``) at init, before the tiny sizes are set; SAM 2's
and EdgeTAM's Hiera backbone sets its four stages' widths, depths and global blocks per stage
(:func:`_hiera`: one block each, 16 to 128 wide), and SAM 2 Video's and SAM 3 Tracker Video's
memory attention a grid of :data:`rope.hf.feeds.GRID`'s rows and columns
(:func:`rope.hf.part_feeds.memory_grid`: 64 x 64 by default), EdgeTAM Video's too, with a 3 x 3
grid of keys and no 1-D latents (:func:`rope.hf.part_feeds.edgetam_grids`); SAM 3's vision neck (``fpn_hidden_size``,
256) feeds its DETR encoder, as wide as the tiny hidden size, which it is set to, and its DETR
decoder (refining boxes layer by layer) and mask decoder amplify float32 noise at the tiny init
range (pixels moved by 1e-7 move its masks, some 60 in size, by 0.01), so they are initialised
at 0.02 and 0.05 (masks near 0.5, float32 noise of the rotation 2% of the probe's tolerance);
SeamlessM4T's encoders, text-to-unit model and
vocoder take their sizes from keys of their own; V-JEPA 2's clip (64 frames of 256 x 256
pixels) is 4 frames of 64 x 64 here: 2 x 4 x 4 patches of 16 pixels and 2 frames; LightGlue's
descriptors (256 wide) match its tiny layers, and its thresholds are off (:func:`_lightglue`). The
conformers (wav2vec2-conformer,
wav2vec2-bert, SeamlessM4T's speech encoder) rotate only with ``position_embeddings_type="rotary"``
(their default is relative positions), as their rotary checkpoints are configured; ESM's default config uses
absolute positions; ESM-2's released checkpoints rotate (``position_embedding_type="rotary"``),
the configuration in which the type is covered: :func:`rope.hf.patch` refuses an ESM model
whose config does not rotate (it has no rotary module), naming that option."""


def model_class(model_type: str, config=None):
    """The class a tiny model of ``model_type`` is built as: its causal LM where transformers maps
    one holding this config, else its base model, else the class of its modeling module made for
    its config class (a part of a composite model: a text model, a vision tower)."""
    from transformers.models.auto import modeling_auto

    config_class = type(config) if config is not None else None
    for mapping in (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, modeling_auto.MODEL_MAPPING_NAMES):
        name = mapping.get(model_type)
        if isinstance(name, str):
            cls = getattr(importlib.import_module(module_name(model_type)), name, None)
            cls = cls or getattr(_transformers(), name, None)
            if cls is not None and (config_class is None or cls.config_class is config_class):
                return cls
    module = importlib.import_module(module_name(model_type))
    own = [value for value in vars(module).values() if isinstance(value, type) and
           getattr(value, "config_class", None) is config_class and value.__module__ == module.__name__]
    for suffix in ("ForCausalLM", "Model", ""):
        for cls in own:
            if cls.__name__.endswith(suffix) and "PreTrained" not in cls.__name__:
                return cls
    raise NoModelClass(f"its modeling module defines no model class for {config_class.__name__}")


class NoModelClass(ValueError):
    """A config class for which transformers defines no model class: a part's config, built by its
    parent model's class."""


def _part_only(model_type: str, config_class: type) -> str:
    """Why a type whose config configures only a part of other models is refused: those models."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    module = sys.modules[config_class.__module__]  # a part's config is defined beside its parents'
    parents = [t for t, name in CONFIG_MAPPING_NAMES.items() if any(
        sub is config_class for sub in (getattr(getattr(module, name, None), "sub_configs", None) or {}).values())]
    return (f"its config ({config_class.__name__}) configures a part of {', '.join(parents) or 'another model'} "
            f"and no model class of its own: patch meets it only inside such a model, under that model_type")


ZERO_INIT = {"neomme": ("output_projection.o_proj",), "esmfold2": ("adaln_linear",)}
"""Weights (by the end of their names) that a type's init sets to zero so that its attention adds
nothing at first (NeoMME's gated output projection, EsmFold2's atom layers' adaLN-Zero gates):
its tiny model would show nothing of the rotation, so :func:`_materialized` draws them (seeded)."""


def tiny_model(model_type: str, seed: int = 0, config=None) -> nn.Module:
    """A randomly initialised model of ``model_type`` (:func:`tiny_config`, :func:`model_class`,
    the keys the build reads set first: :func:`skeleton`) in eval mode, a timm tower that does not
    rotate built as rope's stand-in (:func:`rope.hf.standins.timm_standins`). Raises ``ValueError``
    where it would exceed :data:`MAX_PARAMETERS`."""
    config = tiny_config(model_type) if config is None else config
    return _materialized(skeleton(model_type, config), config, seed)


def _materialized(built: nn.Module, config, seed: int) -> nn.Module:
    """The model ``built`` on the meta device, built again with random weights (seeded), in eval
    mode; ``ValueError`` where it has more than :data:`MAX_PARAMETERS`."""
    size = sum(p.numel() for p in built.parameters())
    if size > MAX_PARAMETERS:
        parts = {name: sum(p.numel() for p in m.parameters()) for name, m in built.named_children()}
        name = max(parts, key=parts.get, default="")
        raise ValueError(f"its tiny model would have {size / 1e6:.1f}M parameters, over rope's limit of "
                         f"{MAX_PARAMETERS / 1e6:.0f}M for a probe, {parts.get(name, 0) / 1e6:.1f}M of them in {name} "
                         "(sizes rope's TINY does not set)")
    torch.manual_seed(seed)
    with standins.timm_standins():  # a timm tower that does not rotate: rope's stand-in
        model = type(built)._from_config(config).eval()
    with torch.no_grad():  # weights transformers' init leaves as torch.empty made them (Qwen3-Omni's talker experts)
        for weight in model.parameters():
            if weight.is_floating_point() and weight.numel() and not (
                    torch.isfinite(weight).all() and float(weight.abs().max()) <= LARGEST_WEIGHT):
                weight.normal_(0.0, TINY["initializer_range"])
        zeroed = tuple(f"{name}.weight" for name in ZERO_INIT.get(getattr(config, "model_type", None), ()))
        for name, weight in model.named_parameters():
            if zeroed and name.endswith(zeroed):
                weight.normal_(0.0, TINY["initializer_range"])
    return model


def sample_tokens(seed: int = 1, shape=(2, 20)) -> torch.Tensor:
    """Random token ids in [3, 97) (past the special tokens of :data:`TINY`), reproducible by seed."""
    return torch.randint(3, TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def text_part(model: nn.Module) -> str | None:
    """The qualified name of the text model inside a composite ``model``: its outermost submodule
    holding the text config (``model.config.get_text_config()``, or one of its model_type), or
    ``None`` where the model is its own text model or holds none."""
    from transformers import PreTrainedModel
    text = model.config.get_text_config()
    if text is model.config:
        return None
    return next((name for name, m in model.named_modules() if name and isinstance(m, PreTrainedModel)
                 and (m.config is text or m.config.model_type == text.model_type)), None)


def output(model: nn.Module, tokens: torch.Tensor, offset: int = 0, feed: Feed | None = None) -> torch.Tensor:
    """The model's logits (or last hidden state, for a base model, or first float output) run by
    ``feed`` (:func:`rope.hf.feeds.run`: seeded by ``tokens``, at positions ``offset, offset + 1,
    ...``; ``None``: the feed :data:`rope.hf.coverage_table.FEEDS` records for its model type,
    else ``tokens`` to the model)."""
    if feed is None:
        from .coverage_table import FEEDS
        recorded = FEEDS.get(getattr(model.config, "model_type", None))
        feed = Feed(*recorded) if recorded else Feed()
    return feeds.run(model, feed, tokens, offset)


def _codec_features(config) -> tuple:
    """The semantic encoder's features, a frame per acoustic frame of :data:`rope.hf.feeds.SAMPLES`."""
    frames = feeds.SAMPLES // math.prod(config.downsampling_ratios)
    return (("input_features", (2, frames, config.semantic_model_config.feature_projection_input_dim)),)


FEED_EXTRAS = {
    "neucodec": _codec_features, "xcodec2": _codec_features,
    "blt_local_decoder": lambda config: (("patch_embeds", (2, 20, config.hidden_size_global)),),
    "blt_local_encoder": lambda config: (("patch_ids", (2, 20)), ("num_patches", ())),
    "idefics": lambda config: (("image_encoder_embeddings", (2, 1, 4, config.vision_config.embed_dim)),
                               ("image_attention_mask", (2, 20, 1))),
    "muse_glimmer_assistant": lambda config: (
        ("context_hidden_states", (2, 20, len(config.target_layer_ids) * config.hidden_size)),
        ("attention_mask", (2, 40))),
    "voxtral_realtime_text": lambda config: (("t_cond", (1, config.hidden_size)),),
    "efficientloftr": lambda config: (("pixel_values", (1, 2, 1, 128, 192)),),
    "lightglue": lambda config: (("pixel_values", (1, 2, 1, 64, 96)),),
    "diffusion_gemma": lambda config: (("decoder_input_ids", (2, config.canvas_length)),),
    "seamless_m4t": lambda config: (("input_features", (2, feeds.FRAMES, config.feature_projection_input_dim)),
                                    ("decoder_input_ids", ())),
    "qwen2_5_omni_dit": lambda config: (
        ("condition_vector", (2, 20, config.mel_dim)), ("speaker_embedding", (2, 20, config.enc_emb_dim)),
        ("quantized_code", (2, 20 // config.repeats)), ("time_step", (2,))),
    "sam3": lambda config: (("pixel_values", (2, 3, *(n * config.vision_config.backbone_config.patch_size
                                                      for n in feeds.GRID[1:]))),),
    "musicflamingo": lambda config: (
        ("input_features", (2, config.audio_config.num_mel_bins, 2 * config.audio_config.max_source_positions)),
        ("input_features_mask", (2, 2 * config.audio_config.max_source_positions)))}
"""Model types whose forward needs an input its signature does not tell (:func:`rope.hf.feeds.candidates`'s
``extra``), from the tiny config: BLT's local decoder's patch embeddings (the global
transformer's output, one patch per byte), BLT's local encoder's patches (``patch_ids`` of
:data:`rope.hf.feeds.PATCH` bytes each, and their count: BLT's model computes both from its
patcher's entropies), IDEFICS's image features (one image of four patches,
every token attending to it), Muse Glimmer's assistant's context (the target model's hidden
states of its ``target_layer_ids``, concatenated, and a mask over context and block), Voxtral
Realtime's text model's time conditioning (``t_cond``, which its decoder layers read through
``**kwargs``), NeuCodec's and XCodec2's semantic features (a frame per acoustic frame),
DiffusionGemma's canvas (``decoder_input_ids``: without them its forward draws the canvas with an
unseeded ``torch.randint``, so no two runs agree), Qwen2.5-Omni's DiT's conditioning (a reference
mel spectrogram for its speaker encoder, a speaker embedding per frame, codec codes, which it
repeats ``repeats`` times per frame, and a diffusion time per sample), EfficientLoFTR's image pair
(``[batch, 2, channels, height, width]``, its forward's one input, of no patch size: grey images
of 128 x 192 pixels, a 4 x 6 grid of its transformer's tokens), LightGlue's image pair (the same
form: grey images of 64 x 96 pixels, in which its keypoint detector finds the keypoints whose
coordinates its encoder projects), SAM 3's image (its model
needs pixels beside the prompt's token ids: one image of :data:`rope.hf.feeds.GRID` patches per
prompt, whose ViT rotates), MusicFlamingo's audio (two windows of features and their mask, whose
audio tokens :mod:`rope.hf.audio_feeds` writes into the ids), SeamlessM4T's speech
(audio features, which its forward runs through the speech encoder, the part that rotates, in
priority over the token ids, and the text decoder's ids). Qwen2.5-Omni's token-to-wave
model, whose forward's arguments none of these make, is fed by :data:`PART_FEEDS`."""


PART_FEEDS = {"sam2_video": part_feeds.memory_attention, "sam3_tracker_video": part_feeds.memory_attention,
              "qwen2_5_omni_token2wav": part_feeds.token_to_wave, "edgetam_video": part_feeds.edgetam_memory_attention,
              "esmfold2": part_feeds.folded_complex}
"""Model types whose forward the probe cannot run from its signature, and the feeds it tries
first, from the tiny config, their rotating part's (:mod:`rope.hf.part_feeds`): the video
trackers' memory attention (their own forward takes an inference session; EdgeTAM Video's is
told its number of memory frames); Qwen2.5-Omni's
token-to-wave model's DiT (its own forward draws unseeded noise and ends in a vocoder); EsmFold2's
input embedder, its atom encoder's caller, on a complex :func:`rope.hf.part_feeds.complex_inputs`
builds (its own forward folds a featurized complex)."""


PROBE_SHIFT = 24
"""How far a probe moves the positions to see that a feed's output depends on them: the moved
positions stay below the tiny ``max_position_embeddings`` (64), which GPT-J's and CodeGen's
position tables hold."""

LIVE_OUTPUT = 0.1
"""The largest output entry a feed must give to be chosen (a similarity of untrained embeddings
is zero, and would show nothing of the rotation)."""


def _chosen_feed(model: nn.Module, modules: list):
    """The first feed of :func:`rope.hf.feeds.candidates` on which ``model`` runs, calls one of
    the functions of its modeling ``modules`` (``(module, convention)`` pairs), gives an output above
    :data:`LIVE_OUTPUT`, and another output at positions moved by :data:`PROBE_SHIFT` (the
    rotation shows in it: a codec's quantized codes may hide it); else the first that does all
    but the last; else the first on which it runs. Returns the feed and its output, or why none
    runs (and ``None``)."""
    tokens, failures, ranked = sample_tokens(), [], {}
    originals = {(module, name): methods.get(module, name) for module, held in modules for name, _ in held.functions}
    extra = FEED_EXTRAS[model.config.model_type](model.config) if model.config.model_type in FEED_EXTRAS else ()
    parts = PART_FEEDS[model.config.model_type](model.config) if model.config.model_type in PART_FEEDS else ()
    for candidate in [*parts, *feeds.candidates(model, text_part(model), extra)]:
        calls = []
        try:
            for (module, name), function in originals.items():
                methods.put(module, name, _counting(function, calls))
            out = output(model, tokens, feed=candidate)
            live = bool(calls) and float(out.abs().max()) > LIVE_OUTPUT
            moved = live and not torch.equal(output(model, tokens, PROBE_SHIFT, feed=candidate), out)
        except Exception as err:  # it needs another input: the next candidate
            failures.append(f"{candidate.describe()}: {type(err).__name__}: {_checks.first_line(err, 90)}")
            continue
        finally:
            for (module, name), function in originals.items():
                methods.put(module, name, function)
        if moved:
            return candidate, out
        ranked.setdefault(live, (candidate, out))
    if ranked:
        return ranked.get(True) or ranked[False]
    unmade = feeds.unmade_arguments(model)
    tried = "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")
    if unmade:
        return (f"its forward requires {', '.join(unmade)}, which the probe does not make (it makes ids, "
                f"embeddings, audio features and waveforms), and none of its parts' forwards runs on those it makes "
                f"({tried})"), None
    return (f"its forward runs on none of the {len(failures)} inputs the probe makes from its signature and config "
            f"({tried})"), None


def _counting(function: Callable, calls: list) -> Callable:
    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)
    return counted


def probe(model_type: str, convention: families.Convention) -> tuple[str, Feed]:
    """Why a tiny model of ``model_type`` is not reproduced with ``convention``, or ``""``: its
    output after :func:`rope.hf.install` and with the convention's functions replaced by rope's
    (counted: the attention must call one) equals its own to :data:`LOGITS_TOLERANCE`. The
    forward run is the first of :func:`rope.hf.feeds.candidates` on which the model runs and
    calls one of the convention's functions: token ids to the model, else to its text model
    (:func:`text_part`), else embeddings, audio features or a waveform to the model or the
    outermost holder of a ``rotary_emb``. Returns the reason and the feed run."""
    module = importlib.import_module(module_name(model_type))
    config = None  # until the tiny config is built
    try:
        config = tiny_config(model_type)
        if standins.rotating_tower(config):
            return _rotating_tower(model_type, config), Feed()
        built = skeleton(model_type, config)
    except NoModelClass:  # a part's config (a vision tower's, an encoder's): only ever inside another model
        return _part_only(model_type, type(config)), Feed()
    except ImportError as err:  # a library transformers builds a part with is not installed here
        missing = re.search(r"requires the (\w+) library", str(err))
        if missing is None:
            raise
        return _missing_library(missing.group(1), config, module), Feed()
    except Exception as err:  # transformers' own model is not built at the tiny sizes: not probed
        return (f"transformers does not build it from its default config at rope's tiny sizes ({type(err).__name__}: "
                f"{_checks.first_line(err, 200)})" + _text_verdict(config), Feed())
    vision_only = not rotary_slots(built) and bool(vision.vision_rotary_modules(built))
    own_tables = convention.name in methods.OWN_TABLES  # patch swaps its method alone
    if not rotary_slots(built) and not vision_only and not own_tables:
        return _no_rotary_emb(built, module), Feed()
    try:
        model = _materialized(built, config, seed=0)
    except ValueError as err:
        return _checks.first_line(err, 300) + _text_verdict(config), Feed()
    if model.config.model_type != model_type:
        return (f"transformers maps the model_type {model_type!r} to {type(model.config).__name__}, whose model_type "
                f"is {model.config.model_type!r}: patch sees every model of it as {model.config.model_type!r}"), Feed()
    try:  # the modules whose functions patch swaps, each with its convention (its part's row, if not own)
        modules = [(holder, held) for holder, held, _ in modeling_modules(model, model_type, convention)]
    except ValueError as err:
        return _checks.first_line(err, 300).removeprefix("patch: ").removesuffix("; nothing changed"), Feed()
    for holder, held in modules:  # another type's classes must compute their row's convention
        if holder is not module and held not in conventions_of(holder):
            found = convention_of(holder)
            return (f"its rotary modules are held by classes of {holder.__name__}, whose functions follow "
                    f"{found if isinstance(found, str) else 'the ' + found.name + ' convention'}, not "
                    f"{held.name} as their model type's row"), Feed()
    try:
        swaps, left = vision.vision_replacements(model) if vision_only else (
            () if own_tables else rotary_replacements(model), ())
    except ValueError as err:
        return _checks.first_line(err, 200).removeprefix("install: "), Feed()
    if left:  # a vision tower whose tables rope does not reproduce keeps transformers' float32 angles
        return _checks.first_line(left[0][1], 300), Feed()
    feed, expected = _chosen_feed(model, modules)
    if isinstance(feed, str):
        return feed, Feed()
    if not vision_only and not own_tables:
        install(model)
        swaps = vision.vision_replacements(model)[0]  # as patch does: its vision towers' too
    vision.swap(model, swaps)
    originals = {(holder, name): methods.get(holder, name) for holder, held in modules for name, _ in held.functions}
    calls = {name: [] for _, held in modules for name, _ in held.functions}
    left = stock_rotary_calls(model)
    try:
        for holder, held in modules:
            for name, ours in held.functions:
                methods.put(holder, name, _counting(ours, calls[name]))
        got = output(model, sample_tokens(), feed=feed)
    except Exception as err:  # rope's function refused the model's inputs
        quoted = _checks.first_line(err, 200)
        names = " and ".join(dict.fromkeys(held.name for _, held in modules))
        return f"rope's {names} functions fail on its inputs ({type(err).__name__}: {quoted})", feed
    finally:
        for (holder, name), function in originals.items():
            methods.put(holder, name, function)
        called = left.close()
    if called:
        name, kind = called[0]
        return (f"after install its forward still calls {kind} at {name} (patch swaps the modules named "
                "rotary_emb): those layers would keep transformers' float32 angles"), feed
    if not any(calls.values()):
        return f"its attention calls none of {', '.join(calls)} (it rotates with another function)", feed
    gap = float((got - expected).abs().max())
    if not torch.allclose(got, expected, **LOGITS_TOLERANCE):
        return f"its output with rope's tables and functions is off by {gap:.2g}", feed
    return "", feed


class _Calls:
    """Forward hooks on modules, recording which of them run (:meth:`close` removes the hooks)."""

    def __init__(self, modules: list[tuple[str, nn.Module]]):
        self.called: list[tuple[str, str]] = []
        self._handles = [m.register_forward_hook(self._record(name, type(m).__name__)) for name, m in modules]

    def _record(self, name: str, kind: str):
        def hook(module, args, out):
            if (name, kind) not in self.called:
                self.called.append((name, kind))
        return hook

    def close(self) -> list[tuple[str, str]]:
        for handle in self._handles:
            handle.remove()
        return self.called


def stock_rotary_calls(model: nn.Module) -> _Calls:
    """Hooks that record every rotary module of ``model`` that is not rope's (a module holding an
    ``inv_freq`` buffer, or a class named ``...Rotary...Embedding``) when it runs: after
    :func:`rope.hf.install`, a text forward that calls one still uses transformers' tables there."""
    stock = [(name, m) for name, m in model.named_modules()
             if not any(_is_ropes(held) for held in (m, *_parents(model, name)))
             and (isinstance(getattr(m, "inv_freq", None), torch.Tensor)
                  or re.search(r"Rotary\w*Embedding", type(m).__name__))]
    return _Calls(stock)


def _is_ropes(module: nn.Module) -> bool:
    """Whether ``module`` is one of rope's (what :func:`rope.hf.install` puts in place)."""
    return type(module).__module__.split(".")[0] == "rope"


def _parents(model: nn.Module, name: str) -> list[nn.Module]:
    """The modules that hold the submodule ``name`` (its dotted path's prefixes)."""
    parts = name.split(".")
    return [model.get_submodule(".".join(parts[:i])) for i in range(1, len(parts))]


def _no_rotary_emb(model: nn.Module, module) -> str:
    """Why a model without a ``rotary_emb`` module is refused: the rotary modules it has instead
    (class and place), or the module-level rotary functions of its modeling module."""
    held = [f"{type(m).__name__} at {name}" for name, m in model.named_modules()
            if name and any(word in type(m).__name__.lower() for word in ("rotary", "rope"))]
    if held:
        return (f"no rotary_emb module (what patch swaps): it rotates with {', '.join(held[:2])}"
                + (f" and {len(held) - 2} more" if len(held) > 2 else ""))
    own = sorted(name for name, value in vars(module).items() if callable(value) and not isinstance(value, type)
                 and getattr(value, "__module__", None) == module.__name__ and "rot" in name)
    if own and not _called(pathlib.Path(module.__file__).read_text(), own):
        return (f"its attention does not rotate: its tiny {type(model).__name__} holds no rotary module, and its "
                f"modeling module defines {', '.join(own)} but nothing else in it calls them")
    callers = _callers(pathlib.Path(module.__file__).read_text(), own)
    if callers and not any(type(m).__name__ in callers for m in model.modules()):
        return (f"this part does not rotate: its tiny {type(model).__name__} holds no rotary module and none of the "
                f"classes that call its modeling module's {', '.join(own)} ({', '.join(sorted(callers))})")
    return (f"no rotary_emb module (what patch swaps) nor other rotary module in its tiny {type(model).__name__}"
            + (f"; its modeling module defines {', '.join(own)}" if own else ""))


def _callers(source: str, names: list[str]) -> set[str]:
    """The classes of ``source`` (module level) whose bodies call a function of ``names`` by name,
    or a module-level function that does (transitively)."""
    body = ast.parse(source).body

    def calls(node, wanted) -> bool:
        return any(isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in wanted
                   for call in ast.walk(node))

    wanted, functions = set(names), [node for node in body if isinstance(node, ast.FunctionDef)]
    while grown := {f.name for f in functions if f.name not in wanted and calls(f, wanted)}:
        wanted |= grown
    return {node.name for node in body if isinstance(node, ast.ClassDef) and calls(node, wanted)}


def _called(source: str, names: list[str]) -> bool:
    """Whether ``source`` calls a function of ``names`` by name outside the module-level
    definitions of those functions (a decorator that is handed one, as transformers'
    ``use_kernelized_func``, is no call of it)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            continue
        if any(isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in names
               for call in ast.walk(node)):
            return True
    return False


def _missing_library(library: str, config, module) -> str:
    """Why a type whose tiny model needs a library missing here is refused: the library, the
    rotary modules its modeling module defines, and the verdict on its text model, probed alone."""
    own = sorted(name for name, value in vars(module).items() if isinstance(value, type)
                 and value.__module__ == module.__name__ and re.search(r"Rotary\w*Embedding", name))
    return (f"its tiny model needs the {library} library (not installed here), so it was not run; its modeling "
            f"module defines {', '.join(own) or 'no rotary module class'}") + _text_verdict(config)


def _rotating_tower(model_type: str, config) -> str:
    """Why a type holding a timm tower that rotates with timm's code is refused
    (:func:`rope.hf.standins.rotating_tower`), with its text model's verdict and, where that
    passes alone, the submodule :func:`rope.hf.patch` covers alone (found in a skeleton whose
    timm towers are rope's stand-ins)."""
    verdict = _text_verdict(config)
    reason = standins.rotating_tower(config) + verdict
    if " passes alone " not in verdict:
        return reason
    with standins.timm_standins(standins.ROTATING_TOWERS):
        part = text_part(skeleton(model_type, config))
    return reason + (f": rope.hf.patch(model.{part}) patches that part alone" if part else "")


def _text_verdict(config) -> str:
    """For a composite config: its text model's verdict, that type classified alone (``""`` for a
    config that is its own text config)."""
    text = config.get_text_config() if config is not None else None
    if text is None or text is config or text.model_type == config.model_type:
        return ""
    row = classify(text.model_type)
    verdict = f"passes alone ({row.convention} convention)" if row.convention else f"is refused alone: {row.reason}"
    return f"; its text model ({text.model_type}) {verdict}"


CONVENTION_DIFFERENCES = {
}
"""What the rotary functions of the types no convention fits compute instead (:func:`classify`
adds it to the reason)."""


def classify(model_type: str) -> Row:
    """The :class:`Row` of one model type: convention from its code, then the probe; where the
    module computes several conventions and the probed forward calls none of the first's
    functions, the next (Qwen2-VL's vision tower calls ``apply_rotary_pos_emb_vision``, not the
    ``apply_rotary_pos_emb`` of its text model). A type none of them passes gets the first's verdict.
    A composite whose module rotates nothing itself is probed with its text model's row
    (:func:`parts_convention`)."""
    file = source_file(model_type)
    source = str(file.relative_to(pathlib.Path(_transformers().__file__).parent))
    matches = source_matches_llama(model_type)
    try:
        module = importlib.import_module(module_name(model_type))
    except Exception as err:  # a dependency transformers lacks here
        quoted = _checks.first_line(err, 200)
        return Row(model_type, source, None, f"its modeling module does not import here ({quoted})")
    convention = convention_of(module)
    parts = parts_convention(model_type, module) if isinstance(convention, str) else None
    if isinstance(convention, str) and parts is None:
        why = convention + (f": {CONVENTION_DIFFERENCES[model_type]}" if model_type in CONVENTION_DIFFERENCES else "")
        return Row(model_type, source, None, why, matches)
    tried = []
    for convention in [parts] if parts is not None else conventions_of(module):
        reason, feed = probe(model_type, convention)
        tried.append((convention, reason, feed))
        if not reason.startswith("its attention calls none of"):
            break
    convention, reason, feed = next((row for row in tried if not row[1]), tried[0])  # else the first's verdict
    return Row(model_type, source, None if reason else convention.name, reason, matches, Feed() if reason else feed)


def survey(model_types=None) -> list[Row]:
    """:func:`classify` every type of :func:`rotary_model_types` (or ``model_types``), quietly."""
    from transformers.utils import logging
    logging.set_verbosity_error()
    rows = []
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for model_type in model_types or rotary_model_types():
            rows.append(classify(model_type))
    return rows


def write_table(rows: list[Row], path: pathlib.Path) -> None:
    """Write ``rope/hf/coverage_table.py``: ``COVERED`` and ``REFUSED`` from ``rows``."""
    version = _transformers().__version__
    lines = ["# ruff: noqa: E501",
             '"""Generated by ``python -m rope.hf.coverage`` from transformers ' + version + ': do not edit.',
             "",
             "``COVERED``: model_type -> (convention, modeling file in transformers, source equals Llama's);",
             "``FEEDS``: covered model_type -> how the probe ran it, where not on token ids to the model: the part",
             "run, its argument, that argument's shape, the other arguments made (:class:`rope.hf.feeds.Feed`);",
             '``REFUSED``: model_type -> the reason (:mod:`rope.hf.coverage`)."""', "",
             f"TRANSFORMERS_VERSION = {version!r}", "", "COVERED = {"]
    lines += [f"    {r.model_type!r}: ({r.convention!r}, {r.source!r}, {r.source_matches_llama!r})," for r in rows
              if r.convention]
    lines += ["}", "", "FEEDS = {"]
    lines += [f"    {r.model_type!r}: {astuple(r.feed)!r}," for r in rows if r.convention and r.feed != Feed()]
    lines += ["}", "", "REFUSED = {"]
    lines += [f"    {r.model_type!r}: {r.reason!r}," for r in rows if not r.convention]
    lines += ["}", ""]
    path.write_text("\n".join(lines))


README_START = "<!-- rope.hf coverage: generated by python -m rope.hf.coverage, do not edit -->"
README_END = "<!-- end of rope.hf coverage -->"


def readme_table(covered=None, refused=None) -> str:
    """README's table of the covered model types (type, convention, transformers source), by
    convention then type, from :mod:`rope.hf.coverage_table` (or the mappings given), between
    :data:`README_START` and :data:`README_END`."""
    from . import coverage_table
    covered = coverage_table.COVERED if covered is None else covered
    refused = coverage_table.REFUSED if refused is None else refused
    lines = [README_START, "",
             f"{len(covered)} model types of transformers {coverage_table.TRANSFORMERS_VERSION} are covered and "
             f"{len(refused)} with rotary code refused (`rope.hf.coverage_table.REFUSED` gives each reason):", "",
             "| `model_type` | convention | transformers source |", "| --- | --- | --- |"]
    for model_type, (name, source, _) in sorted(covered.items(), key=lambda item: (item[1][0], item[0])):
        lines.append(f"| `{model_type}` | {name} | `{source}` |")
    return "\n".join([*lines, "", README_END])


def write_readme(path: pathlib.Path) -> None:
    """Replace README's coverage table and conventions table (each between its markers) by
    :func:`readme_table` and :func:`rope.hf.families.readme_table`."""
    text = path.read_text()
    for first, last, table in ((README_START, README_END, readme_table()),
                               (families.CONVENTIONS_START, families.CONVENTIONS_END, families.readme_table())):
        start, end = text.index(first), text.index(last) + len(last)
        text = text[:start] + table + text[end:]
    path.write_text(text)


def main(argv=None) -> int:
    """``python -m rope.hf.coverage [model_type ...]``: survey, print, and (all types) write the table."""
    argv = sys.argv[1:] if argv is None else argv
    rows = survey(argv or None)
    for r in rows:
        print(f"{r.model_type:32s} {r.convention or '-':12s} {r.reason}")
    print(f"{sum(bool(r.convention) for r in rows)} covered, {sum(not r.convention for r in rows)} refused")
    if not argv:
        write_table(rows, pathlib.Path(__file__).with_name("coverage_table.py"))
        importlib.reload(importlib.import_module(f"{__package__}.coverage_table"))
        write_readme(pathlib.Path(__file__).parents[2] / "README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
